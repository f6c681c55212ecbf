"""How `provision apply` shows a run: a line per task and host as results arrive, the summary table,
the problems, the JSON summary; the same lines go to the run log. Imported when `apply` runs."""

from __future__ import annotations

from pathlib import Path

from rich.markup import escape
from rich.table import Table

from provisioner.apply import ApplyResult, TaskResult, unified_diff
from provisioner.cli.console import make_console
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
