"""How `provision apply` shows a run: a line per task and host as results arrive, the summary table,
the problems, the JSON summary; the same lines go to the run log. Imported when `apply` runs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from provisioner.apply.events import HostProgress, TaskResult, unified_diff
from provisioner.apply.playbook import ApplyResult
from provisioner.base.runlog import RunLog
from provisioner.base.secrets import redact, redact_data
from provisioner.cli.console import make_console


class Output:
    """Where apply's lines go: the terminal (stdout; stderr under --json) and the run log, alike."""

    def __init__(self, to_stderr: bool = False, quiet: bool = False):
        self.consoles = [make_console(stderr=to_stderr)]
        self.quiet = quiet  # the terminal shows no task that found its host as it should be; the run log does

    def keep_log(self, log: RunLog) -> None:
        self.consoles.append(make_console(file=log))  # not a terminal: no colours, no line cut

    def print(self, *objects, log_only: bool = False, **options) -> None:
        for console in self.consoles[1:] if log_only else self.consoles:
            console.print(*objects, **options)


STATUS_STYLE = {
    "ok": "green",
    "changed": "yellow",
    "failed": "bold red",
    "unreachable": "bold red",
    "skipped": "cyan",
}


def print_result(result: TaskResult, console: Output) -> None:
    """One line per task and host, as results arrive."""
    if result.status == "skipped":
        return
    log_only = console.quiet and result.status == "ok" and not result.notes  # what a task says is shown
    style = STATUS_STYLE[result.status]
    line = f"[{style}]{result.status:>11}[/] {result.host:<16} {result.label}"
    if result.message:
        line += f"\n{'':>12} [red]{escape(redact(result.message))}[/]"
    console.print(line, log_only=log_only)
    for note in result.notes:
        console.print(f"{'':>12} {redact(note)}", markup=False, style="dim", log_only=log_only)
    for entry in result.diffs:
        text = unified_diff(entry)
        if text:
            console.print(redact(text), markup=False, style="dim", log_only=log_only)


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


# the role rollout's tasks whose failure means the host was not changed (roles/rollout/tasks/start.yml)
STOPPED_TASK = "Stop the rollout when earlier batches failed"
CAPACITY_TASK = "Check each route keeps enough replicas serving while this batch changes"


def host_outcome(result: ApplyResult, host: str) -> str:
    """A host's true state after a rolling apply: changed, no change, rolled back (what), lost mid-batch,
    refused or not reached (untouched), interrupted, failed (why)."""
    turn, stats = result.turns.get(host), result.stats.get(host)
    problems = [problem for problem in result.problems if problem.host == host]
    if turn is None:
        return "not reached: the run was interrupted before its batch" if result.interrupted else \
            "not reached: the rollout stopped before its batch"
    for problem in problems:
        if problem.status == "unreachable":
            return f"lost mid-batch (unreachable at {problem.label}): {problem.message}"
        if problem.task == STOPPED_TASK:
            return "not reached: the rollout stopped before its batch"
        if problem.task == CAPACITY_TASK:  # the route, what its other replicas do, the fix
            return f"refused before any drain: {problem.message}"
        if "rollback" in problem.task.lower():
            return f"rolled back: {problem.message}"
    if stats is None:
        return "interrupted during its turn"
    if not stats.succeeded:
        return "failed" + (f": {problems[0].label}: {problems[0].message}" if problems else "")
    return f"changed {stats.changed}" if stats.changed else "no change"


def rollout_rows(result: ApplyResult, hosts: list[str]) -> list[dict]:
    """What a rolling apply did where, host by host in the order they ran: the batch (1: the canary), its
    window in seconds since the run started, and the host's true state (host_outcome)."""
    def order(host: str) -> tuple:
        turn = result.turns.get(host)
        return (0, turn.batch, turn.started) if turn else (1, 0, 0.0)

    rows = []
    for host in sorted(hosts, key=order):
        turn = result.turns.get(host)
        rows.append({"host": host, "batch": turn.batch if turn else None,
                     "from": round(turn.started, 1) if turn else None, "to": round(turn.ended, 1) if turn else None,
                     "outcome": redact(host_outcome(result, host))})
    return rows


def rollout_table(rows: list[dict]) -> Table:
    table = Table(title="rollout (batch 1: the canary; seconds since the start)")
    for column in ("host", "batch", "from", "to", "outcome"):
        table.add_column(column, justify="left" if column in ("host", "outcome") else "right")
    for row in rows:
        table.add_row(row["host"], *(("-" if row[key] is None else str(row[key])) for key in ("batch", "from", "to")),
                      row["outcome"], style="" if row["outcome"].startswith(("changed", "no change")) else "bold red")
    return table


def show_summary(out: Output, result: ApplyResult, check: bool, rolled: list[str] | None = None) -> None:
    """The per-host table (and, for a rolling apply over `rolled`, what was done where), then the problems."""
    out.print(summary_table(result, check))
    if rolled is not None:
        out.print(rollout_table(rollout_rows(result, rolled)))
        for said in result.recovery:
            text = said.message if said.status in ("failed", "unreachable") else "; ".join(said.notes)
            out.print(f"gateway {escape(said.host)}: {escape(redact(text))}")
    if result.interrupted:
        out.print(f"[bold red]interrupted[/] ({escape(result.interrupted_by)}): {escape(how_it_stopped(result))}"
                  + ("; the gateways' drains: above" if result.recovery else ""))
        for host, progress in result.progress.items():
            out.print(f"  {escape(host)}: {escape(how_far(progress))}")
    if result.succeeded:
        return
    for problem in result.problems:
        out.print(f"[bold red]{problem.host}[/]: {escape(problem.label)}: {escape(redact(problem.message))}")
    if not result.interrupted and not result.problems and result.output_tail:
        when = "after its tasks began, with no task failed" if result.stats else "before running any task"
        out.print(f"[bold red]ansible-playbook exited {result.rc} {when}:[/]")
        out.print(redact(result.output_tail), markup=False)


SHOWN_CHANGES = 8  # the changed tasks named per host after an interrupt; the run log has every one


def how_it_stopped(result: ApplyResult) -> str:
    cut = [host for host, progress in result.progress.items() if progress.running]
    if result.stopped_before and not cut:
        said = f"stopped before `{result.stopped_before}`, no task cut"
    else:
        said = "stopped at once" + (f", in the middle of a task on {', '.join(cut)}" if cut else "")
    return said + "; the hosts not reached are unchanged; `provision apply` again finishes the run"


def how_far(progress: HostProgress) -> str:
    """What a host had done when the run was interrupted: tasks, the changes by name, a task cut in the middle."""
    said = f"{progress.done} tasks done, {len(progress.changed)} changed"
    if progress.changed:
        shown = progress.changed[:SHOWN_CHANGES]
        more = len(progress.changed) - len(shown)
        said += f" ({'; '.join(shown)}{f'; and {more} more' if more else ''})"
    if progress.running:
        return said + f"; cut in the middle of `{progress.running}`: its change may be half made"
    return said + (f"; last: `{progress.last}`" if progress.last else "")


def summary_json(spec: Path, result: ApplyResult, check: bool, log: Path, rolled: list[str] | None = None) -> dict:
    """apply's outcome for programs: per host the counts, the problems, the run log (secrets redacted);
    for a rolling apply, the rollout's rows."""
    return redact_data({
        **({"rollout": rollout_rows(result, rolled)} if rolled is not None else {}),
        **({"gateways": [{"host": said.host, "status": said.status, "said": said.message or "; ".join(said.notes)}
                         for said in result.recovery]} if result.recovery else {}),
        "interrupted": result.interrupted,
        **({"interrupted_by": result.interrupted_by, "stopped_before": result.stopped_before,
            "progress": {host: dataclasses.asdict(progress) for host, progress in result.progress.items()}}
           if result.interrupted else {}),
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
