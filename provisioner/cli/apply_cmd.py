"""`provision apply`: run our playbooks on the spec's hosts, with live progress and a per-host summary."""

from __future__ import annotations

import getpass
import json
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from provisioner.ansible_config import AnsibleConfigError, ansible_environment
from provisioner.apply import ApplyResult, ControlError, Controls, TaskResult, apply_spec, check_controls, split_tags
from provisioner.apply import unified_diff
from provisioner.cli.common import (
    USAGE_ERROR,
    HostsArgument,
    SpecOption,
    find_spec_or_exit,
    load_spec_or_exit,
    select_or_exit,
)
from provisioner.cli.console import make_console
from provisioner.plan import build_plan
from provisioner.runlog import RunLog
from provisioner.secrets import redact, redact_data


class Output:
    """Where apply's lines go: the terminal (stdout; stderr under --json) and the run log, alike."""

    def __init__(self, to_stderr: bool = False):
        self.consoles = [make_console(stderr=to_stderr)]

    def keep_log(self, log: RunLog) -> None:
        self.consoles.append(make_console(file=log))  # not a terminal: no colours, no line cut

    def print(self, *objects, **options) -> None:
        for console in self.consoles:
            console.print(*objects, **options)


console = Output()

STATUS_STYLE = {
    "ok": "green",
    "changed": "yellow",
    "failed": "bold red",
    "unreachable": "bold red",
    "skipped": "cyan",
}


def print_result(result: TaskResult, console: Output = console) -> None:
    """One line per task and host, as results arrive."""
    if result.status == "skipped":
        return
    style = STATUS_STYLE[result.status]
    line = f"[{style}]{result.status:>11}[/] {result.host:<16} {result.label}"
    if result.message:
        line += f"\n{'':>12} [red]{escape(redact(result.message))}[/]"
    console.print(line)
    for note in result.notes:
        console.print(f"{'':>12} {redact(note)}", markup=False, style="dim")
    for entry in result.diffs:
        text = unified_diff(entry)
        if text:
            console.print(redact(text), markup=False, style="dim")


def summary_table(result: ApplyResult, check: bool) -> Table:
    title = "apply --check (nothing was changed)" if check else "apply"
    table = Table(title=title)
    for column in ("host", "ok", "changed" if not check else "would change", "failed", "unreachable", "skipped"):
        table.add_column(column, justify="left" if column == "host" else "right")
    for host, stats in result.stats.items():
        style = "" if stats.succeeded else "bold red"
        table.add_row(
            host, str(stats.ok), str(stats.changed), str(stats.failed),
            str(stats.unreachable), str(stats.skipped), style=style,
        )
    return table


def apply(
    hosts: HostsArgument = None,
    spec: SpecOption = None,
    check: Annotated[bool, typer.Option("--check", help="Show what would change; change nothing.")] = False,
    diff: Annotated[bool, typer.Option("--diff", help="Show file differences.")] = False,
    tags: Annotated[list[str] | None, typer.Option(
        "--tags", "-t", metavar="TAG[,TAG]", help="Run only these roles (the site playbook's role tags).")] = None,
    skip_tags: Annotated[list[str] | None, typer.Option(
        "--skip-tags", metavar="TAG[,TAG]", help="Run every role but these.")] = None,
    extra_vars: Annotated[list[str] | None, typer.Option(
        "--extra-vars", "-e", metavar="VAR=VALUE|@FILE", help="Extra variables for Ansible, as ansible-playbook "
        "takes them (repeatable).")] = None,
    verbose: Annotated[int, typer.Option(
        "--verbose", "-v", count=True, help="Ansible's own output too (-vvv: more of it).")] = 0,
    forks: Annotated[int | None, typer.Option("--forks", "-f", help="Hosts Ansible works on at once.")] = None,
    ask_become_pass: Annotated[bool, typer.Option(
        "--ask-become-pass", "-K", help="Ask for the sudo password (sent to Ansible's prompt, never stored).")] = False,
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print a JSON summary on stdout; progress goes to stderr.")] = False,
) -> None:
    """Apply the spec to its hosts (or the HOSTs and GROUPs named): sysctls, nouveau blacklist, /dev/shm,
    NVIDIA settings, vLLM. Every apply keeps a run log; its last line names it."""
    out = Output(to_stderr=True) if as_json else console
    spec = find_spec_or_exit(spec)
    loaded = load_spec_or_exit(spec)
    chosen = [host.name for host in select_or_exit(loaded, hosts)]
    controls = Controls(tags=split_tags(tags or []), skip_tags=split_tags(skip_tags or []),
                        extra_vars=tuple(extra_vars or []), verbosity=verbose, forks=forks)
    try:
        check_controls(controls)
        ansible_environment()
    except (ControlError, AnsibleConfigError) as error:
        typer.echo(redact(str(error)), err=True)
        raise typer.Exit(USAGE_ERROR) from None
    memory = [problem for plan in build_plan(loaded) if plan.host in chosen for problem in plan.memory_problems]
    if memory:  # vLLM would refuse to start: touch no host
        for problem in memory:
            out.print(f"[bold red]memory:[/] {escape(problem)}")
        out.print("nothing applied: fix the spec (`provision plan` shows each GPU's memory)")
        raise typer.Exit(1)
    if ask_become_pass:
        with warnings.catch_warnings():  # no terminal (a pipe, CI): getpass says so in its own words
            warnings.simplefilter("ignore", getpass.GetPassWarning)
            controls = replace(controls, become_password=getpass.getpass("BECOME password: "))
    log = RunLog(spec.stem)
    out.keep_log(log)
    out.print(f"provision apply {' '.join(chosen)} (spec {spec}{', check mode' if check else ''})", markup=False)
    try:
        result = apply_spec(loaded, hosts=chosen, check=check, diff=diff, controls=controls,
                            on_result=lambda task: print_result(task, out),
                            on_output=lambda line: out.print(redact(line), markup=False, style="dim"))
        show_summary(out, result, check)
        out.print(f"run log: {log.path}", markup=False)
    finally:
        log.close()
    if as_json:
        typer.echo(json.dumps(summary_json(spec, result, check, log.path), indent=2))
    if not result.succeeded:
        raise typer.Exit(1)


def show_summary(out: Output, result: ApplyResult, check: bool) -> None:
    out.print(summary_table(result, check))
    if result.succeeded:
        return
    for problem in result.problems:
        out.print(f"[bold red]{problem.host}[/]: {escape(problem.label)}: {escape(redact(problem.message))}")
    if not result.stats:
        out.print(f"[bold red]ansible-playbook exited {result.rc} before running any task:[/]")
        out.print(redact(result.output_tail), markup=False)


def summary_json(spec: Path, result: ApplyResult, check: bool, log: Path) -> dict:
    """apply's outcome for programs: per host the counts, the problems, the run log (secrets redacted)."""
    return redact_data({
        "spec": str(spec),
        "check": check,
        "succeeded": result.succeeded,
        "rc": result.rc,
        "hosts": {host: {"ok": stats.ok, "changed": stats.changed, "failed": stats.failed,
                         "unreachable": stats.unreachable, "skipped": stats.skipped, "succeeded": stats.succeeded}
                  for host, stats in result.stats.items()},
        "problems": [{"host": problem.host, "task": problem.label, "status": problem.status,
                      "message": problem.message} for problem in result.problems],
        "ansible_output": result.output_tail if not result.stats else "",
        "run_log": str(log),
    })
