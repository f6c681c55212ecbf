"""`provision apply`: run our playbooks on the spec's hosts, with live progress and a per-host summary."""

from __future__ import annotations

from typing import Annotated

import typer

from provisioner.cli.common import (
    INTERRUPTED,
    PROBLEMS_FOUND,
    STDOUT,
    USAGE_ERROR,
    HostsArgument,
    SpecOption,
    exit_with,
    gate_or_exit,
    preflight_or_exit,
    refusal_note,
)

NOTHING_APPLIED = "nothing applied"

app = typer.Typer()


@app.command()
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
    quiet: Annotated[bool, typer.Option(
        "--quiet", "-q", help="Show only the tasks that changed something, failed or said something (check mode's "
        "\"would …\", warnings), and the summary; the run log keeps every task.")] = False,
    forks: Annotated[int | None, typer.Option("--forks", "-f", help="Hosts Ansible works on at once.")] = None,
    ask_become_pass: Annotated[bool, typer.Option(
        "--ask-become-pass", "-K", help="Ask for the sudo password (sent to Ansible's prompt, never stored).")] = False,
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print a JSON summary on stdout; progress goes to stderr.")] = False,
    rolling: Annotated[bool, typer.Option(
        "--rolling", help="Change the hosts a batch at a time, a canary host first; each host out of the "
        "gateways while it changes, back once ready; a failed batch stops the rollout.")] = False,
    batch: Annotated[str, typer.Option(
        "--batch", metavar="N|N%", help="With --rolling: hosts per batch after the canary.")] = "1",
    max_fail: Annotated[str, typer.Option(
        "--max-fail", metavar="N|N%", help="With --rolling: hosts that may fail before the rollout stops.")] = "0",
    min_serving: Annotated[str, typer.Option(
        "--min-serving", metavar="N|N%", help="With --rolling: replicas each gateway route keeps serving outside a "
        "batch; a batch that would leave fewer is refused before any drain (0: accept an outage).")] = "1",
    wait_lock: Annotated[int, typer.Option(
        "--wait-lock", metavar="SECONDS", min=0, help="Wait this long for another apply of the spec (on this "
        "controller) or of a host (from anywhere) to end; 0: refuse at once, naming it.")] = 0,
) -> None:
    """Apply the spec to its hosts (or the HOSTs and GROUPs named): sysctls, nouveau blacklist, /dev/shm,
    NVIDIA settings, vLLM. Every apply keeps a run log; its last line names it."""
    import getpass
    import json
    import warnings
    from dataclasses import replace

    from rich.markup import escape

    from provisioner.apply.controls import ControlError, Controls, split_tags
    from provisioner.apply.hosts import apply_spec, check_apply
    from provisioner.base.ansible_config import AnsibleConfigError
    from provisioner.base.rollout import Rollout
    from provisioner.base.runlog import RunLog
    from provisioner.base.secrets import redact
    from provisioner.base.signals import signals_interrupt
    from provisioner.base.spec_lock import SpecBusy
    from provisioner.cli.apply_view import Output, print_result, show_summary, summary_json
    from provisioner.validation.preflight import PreflightError

    out = Output(to_stderr=as_json, quiet=quiet)
    json_to = STDOUT if as_json else None
    gated = gate_or_exit(spec, hosts, preflight=False, json_to=json_to, nothing=NOTHING_APPLIED)  # usage errors first
    spec, loaded, chosen = gated.path, gated.spec, [host.name for host in gated.hosts]
    if not rolling and (batch, max_fail, min_serving) != ("1", "0", "1"):
        exit_with(USAGE_ERROR, "--batch, --max-fail and --min-serving say how a rolling apply goes — add --rolling")
    controls = Controls(tags=split_tags(tags or []), skip_tags=split_tags(skip_tags or []),
                        extra_vars=tuple(extra_vars or []), verbosity=verbose, forks=forks,
                        rollout=Rollout(batch=batch, max_fail=max_fail, min_serving=min_serving) if rolling else None,
                        wait_lock=wait_lock)
    try:
        check_apply(loaded, chosen, controls)  # apply_spec checks again; here: before the password prompt
    except (ControlError, AnsibleConfigError) as error:
        exit_with(USAGE_ERROR, redact(str(error)))
    except PreflightError:  # vLLM would refuse to start: the gate's refusal, no host touched
        preflight_or_exit(gated, json_to=json_to, nothing=NOTHING_APPLIED)
    if ask_become_pass:
        with warnings.catch_warnings():  # no terminal (a pipe, CI): getpass says so in its own words
            warnings.simplefilter("ignore", getpass.GetPassWarning)
            controls = replace(controls, become_password=getpass.getpass("BECOME password: "))
    log = RunLog(spec.stem)
    out.keep_log(log)
    out.print(f"provision apply {' '.join(chosen)} (spec {spec}{', check mode' if check else ''})", markup=False)
    result, failed_with = None, PROBLEMS_FOUND
    try:
        try:
            with signals_interrupt():  # SIGTERM, SIGHUP: as Ctrl-C
                result = apply_spec(loaded, hosts=chosen, check=check, diff=diff, controls=controls,
                                    on_result=lambda task: print_result(task, out),
                                    on_output=lambda line: out.print(redact(line), markup=False, style="dim"),
                                    on_notice=lambda text: out.print(f"[bold yellow]{escape(text)}[/]"))
        except KeyboardInterrupt as interrupt:  # before the playbook ran (host keys, drivers) or after it
            out.print(f"[bold red]interrupted[/] ({escape(str(interrupt) or 'Ctrl-C')}) outside the playbook's run: "
                      "no task was cut; `provision apply` again finishes the run")
            failed_with = INTERRUPTED
        except PreflightError as refused:  # a driver read from a host is too old: the playbook did not run
            show_refusal(out, refused)
        except SpecBusy as busy:  # another apply of the spec runs here: no host was touched
            out.print(f"[bold red]busy:[/] {escape(str(busy))}")
        else:
            show_summary(out, result, check, chosen if rolling else None)
        out.print(f"run log: {log.path}", markup=False)
    finally:
        log.close()
    if result is None:
        exit_with(failed_with)
    if as_json:
        typer.echo(json.dumps(summary_json(spec, result, check, log.path, chosen if rolling else None), indent=2))
    if result.interrupted:
        exit_with(INTERRUPTED)
    if not result.succeeded:
        exit_with(PROBLEMS_FOUND)


def show_refusal(out, refused) -> None:
    """Each reason the preflight refused the run once apply read the drivers (provisioner/validation/preflight.py): no host
    was changed."""
    from rich.markup import escape

    from provisioner.spec.wording import printable

    for problem in refused.problems:
        out.print(f"[bold red]{problem.kind}:[/] {escape(printable(problem.message))}")
    out.print(refusal_note({problem.kind for problem in refused.problems}, NOTHING_APPLIED), markup=False)
