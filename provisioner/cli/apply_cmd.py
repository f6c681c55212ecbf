"""`provision apply`: run our playbooks on the spec's hosts, with live progress and a per-host summary."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.console import Console
from rich.table import Table

from provisioner.apply import ApplyResult, TaskResult, apply_spec, unified_diff
from provisioner.plan import build_plan
from provisioner.cli.common import LimitOption, SpecArgument, check_limit, load_spec_or_exit
from provisioner.secrets import redact

console = Console(highlight=False, soft_wrap=True)

STATUS_STYLE = {
    "ok": "green",
    "changed": "yellow",
    "failed": "bold red",
    "unreachable": "bold red",
    "skipped": "cyan",
}


def print_result(result: TaskResult) -> None:
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
    spec: SpecArgument,
    limit: LimitOption = None,
    check: Annotated[bool, typer.Option("--check", help="Show what would change; change nothing.")] = False,
    diff: Annotated[bool, typer.Option("--diff", help="Show file differences.")] = False,
) -> None:
    """Apply the spec to its hosts: sysctls, nouveau blacklist, /dev/shm, vLLM units."""
    loaded = load_spec_or_exit(spec)
    check_limit(loaded, limit, spec)
    memory = [problem for plan in build_plan(loaded) if limit in (None, plan.host) for problem in plan.memory_problems]
    if memory:  # vLLM would refuse to start: touch no host
        for problem in memory:
            console.print(f"[bold red]memory:[/] {escape(problem)}")
        console.print("nothing applied: fix the spec (`provision plan` shows each GPU's memory)")
        raise typer.Exit(1)
    result = apply_spec(loaded, limit=limit, check=check, diff=diff, on_result=print_result)
    console.print(summary_table(result, check))
    if not result.succeeded:
        for problem in result.problems:
            console.print(f"[bold red]{problem.host}[/]: {escape(problem.label)}: {escape(redact(problem.message))}")
        if not result.stats:
            console.print(f"[bold red]ansible-playbook exited {result.rc} before running any task:[/]")
            console.print(redact(result.output_tail), markup=False)
        raise typer.Exit(1)
