"""The run's events (the collection's callback plugins/callback/provision_events.py) read as task results, each
host's progress and its per-host stats.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field

from provisioner.base.unreachable import explain

RESULT_EVENTS = {
    "runner_on_ok": "ok",
    "runner_on_failed": "failed",
    "runner_on_unreachable": "unreachable",
    "runner_on_skipped": "skipped",
}  # other events (task starts, per-item results that runner_on_* repeats) are not task results


@dataclass
class TaskResult:
    """One task's outcome on one host, as Ansible reported it."""

    host: str
    role: str
    task: str
    status: str  # ok | changed | failed | unreachable | skipped
    message: str = ""
    ignored: bool = False
    diffs: list[dict] = field(default_factory=list)  # Ansible's --diff entries (before/after), with "dest"
    notes: list[str] = field(default_factory=list)  # what a debug task said (check mode's "would ...", warnings)

    @property
    def label(self) -> str:
        return task_label(self.role, self.task)


def task_label(role: str, task: str) -> str:
    """A task as Ansible names it in its output: `role : task`, or the task alone outside a role."""
    return f"{role} : {task}" if role else task


@dataclass
class HostStats:
    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    skipped: int = 0

    @property
    def succeeded(self) -> bool:
        return self.failed == 0 and self.unreachable == 0


@dataclass
class HostProgress:
    """How far a host got, from the run's events as they came (a run stopped before Ansible counted)."""

    done: int = 0
    skipped: int = 0
    changed: list[str] = field(default_factory=list)  # the tasks that changed it, in order
    last: str = ""  # the last task it finished
    running: str = ""  # a task it began and has no result for: cut in the middle of it

    def read(self, result: TaskResult) -> None:
        self.done, self.last, self.running = self.done + 1, result.label, ""
        self.skipped += result.status == "skipped"
        if result.status == "changed":
            self.changed.append(result.label)


def _message(result: dict, unreachable: bool = False) -> str:
    """Why a task failed; for a loop, why each of its failed items did (Ansible says only
    "One or more items failed"). A lost host's reason is said in network terms."""
    failed_items = [item for item in result.get("results") or []
                    if isinstance(item, dict) and (item.get("failed") or item.get("unreachable"))]
    if failed_items:
        return "\n".join(f"{item.get('_ansible_item_label', item.get('item', '?'))}: "
                         f"{_message(item, unreachable=bool(item.get('unreachable')))}" for item in failed_items)
    message = next((str(result[key]).strip() for key in ("msg", "stderr", "module_stderr", "reason") if result.get(key)), "")
    stderr = str(result.get("stderr") or "").strip()
    if stderr and stderr not in message:  # e.g. a template's validate: "failed to validate" + the validator's words
        message += ": " + " / ".join(stderr.splitlines()[-3:])
    return explain(message) if unreachable else message


CENSORED = "censored"  # Ansible hands every callback a no_log result as {"censored": ..., "changed": ...}


ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


def task_result(event: dict) -> TaskResult | None:
    """Turn one event of the run (plugins/callback/provision_events.py) into a TaskResult, or None when
    it is not a task result. A no_log result is censored: no diff of it is shown, only its status (the roles name
    the files such a task changes in the task after it)."""
    name = event.get("event")
    status = RESULT_EVENTS.get(name)
    if status is None:
        return None
    data = event.get("event_data", {})
    result = data.get("res", {}) or {}
    censored = CENSORED in result
    if status == "ok" and result.get("changed"):
        status = "changed"
    diffs = [] if censored else file_diffs(result)
    return TaskResult(
        host=data.get("host", "?"),
        role=data.get("role", "") or "",
        task=data.get("task", "") or "",
        status=status,
        message=_message(result, unreachable=status == "unreachable") if status in ("failed", "unreachable") else "",
        ignored=bool(data.get("ignore_errors")),
        diffs=diffs,
        notes=_notes(data, result) if status in ("ok", "changed") else [],
    )


def _notes(data: dict, result: dict) -> list[str]:
    """What a debug task says (the "would ..." of check mode, warnings), item by item for a loop; and the warnings
    a module gave (module apply_lock: whose lock it took over)."""
    warnings = [f"warning: {str(warning).strip()}" for warning in result.get("warnings") or []]
    if not str(data.get("task_action") or "").endswith("debug"):
        return warnings
    items = [item for item in result.get("results") or [] if isinstance(item, dict)] or [result]
    return [str(item["msg"]).strip() for item in items if item.get("msg") and not item.get("skipped")] + warnings


def _destination(result: dict) -> str:
    """The file a module result is about: its dest or path (the template module's after_header is a temp file)."""
    arguments = (result.get("invocation") or {}).get("module_args") or {}
    return str(result.get("dest") or result.get("path") or arguments.get("dest") or arguments.get("path") or "")


def file_diffs(result: dict) -> list[dict]:
    """Ansible's --diff entries of a result, a loop's items' included, each with the file it is about ("dest")."""
    items = [item for item in result.get("results") or [] if isinstance(item, dict)]
    entries = []
    for source in [result, *items]:
        if CENSORED in source:  # an item of a no_log loop: nothing of it may be shown
            continue
        destination = _destination(source)
        entries.extend({**entry, "dest": destination} for entry in _as_list(source.get("diff")))
    return entries


def _as_list(diff) -> list[dict]:
    if not diff:
        return []
    return [d for d in (diff if isinstance(diff, list) else [diff]) if isinstance(d, dict)]


def unified_diff(entry: dict) -> str:
    """Render one Ansible diff entry: a unified diff labelled with the file's destination, or a change
    of attributes (mode, owner, state)."""
    destination = entry.get("dest") or str(entry.get("before_header") or "").removesuffix(" (content)")
    if "prepared" in entry:
        return str(entry["prepared"])
    before, after = entry.get("before", ""), entry.get("after", "")
    if isinstance(before, dict) and isinstance(after, dict):
        changes = [f"{key} {before.get(key, '(none)')} -> {after[key]}" for key in after
                   if key != "path" and before.get(key) != after[key]]
        return f"{destination}: {', '.join(changes)}\n" if changes else ""
    if not isinstance(before, str) or not isinstance(after, str) or before == after:
        return ""
    return "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            fromfile=f"{destination} (now)" if destination else str(entry.get("before_header", "before")),
            tofile=f"{destination} (after apply)" if destination else str(entry.get("after_header", "after")),
        )
    )


def stats_of_run(event: dict) -> dict[str, HostStats]:
    """Each host's counts from the run's closing event (Ansible's own stats)."""
    counts = {key: event.get("event_data", {}).get(key) or {}
              for key in ("ok", "changed", "failures", "dark", "skipped", "processed")}
    hosts = sorted(set().union(*counts.values()))
    return {
        host: HostStats(
            # Ansible's "ok" counts changed tasks too; report them apart
            ok=counts["ok"].get(host, 0) - counts["changed"].get(host, 0),
            changed=counts["changed"].get(host, 0),
            failed=counts["failures"].get(host, 0),
            unreachable=counts["dark"].get(host, 0),
            skipped=counts["skipped"].get(host, 0),
        )
        for host in hosts
    }


def stats_from_progress(host: str, progress: HostProgress, problems: list[TaskResult]) -> HostStats:
    """A host's counts from its task results, for a run that ended before Ansible counted."""
    failed = sum(problem.host == host and problem.status == "failed" for problem in problems)
    unreachable = sum(problem.host == host and problem.status == "unreachable" for problem in problems)
    changed = len(progress.changed)
    return HostStats(ok=progress.done - progress.skipped - changed - failed - unreachable, changed=changed,
                     failed=failed, unreachable=unreachable, skipped=progress.skipped)
