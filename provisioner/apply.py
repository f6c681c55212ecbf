"""Run our playbook against a generated inventory and report per task and per host.

Ansible is driven through ansible-runner, which streams Ansible's own callback
events; we turn them into `TaskResult`s (live progress) and `HostStats`
(the per-host summary).  Importable and usable without the CLI.
"""

from __future__ import annotations

import difflib
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


from provisioner import paths
from provisioner.inventory import write_inventory
from provisioner.spec import Spec

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
    diffs: list[dict] = field(default_factory=list)  # Ansible's --diff entries (before/after)

    @property
    def label(self) -> str:
        return f"{self.role} : {self.task}" if self.role else self.task


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
class ApplyResult:
    rc: int
    stats: dict[str, HostStats] = field(default_factory=dict)
    problems: list[TaskResult] = field(default_factory=list)
    output_tail: str = ""  # Ansible's own last output lines, for errors before any task ran

    @property
    def succeeded(self) -> bool:
        return self.rc == 0 and all(s.succeeded for s in self.stats.values())

    @property
    def changed(self) -> int:
        return sum(s.changed for s in self.stats.values())


def _message(result: dict) -> str:
    """Why a task failed; for a loop, why each of its failed items did (Ansible says only
    "One or more items failed")."""
    failed_items = [item for item in result.get("results") or [] if isinstance(item, dict) and item.get("failed")]
    if failed_items:
        return "\n".join(f"{item.get('_ansible_item_label', item.get('item', '?'))}: {_message(item)}"
                         for item in failed_items)
    message = next((str(result[key]).strip() for key in ("msg", "stderr", "module_stderr", "reason") if result.get(key)), "")
    stderr = str(result.get("stderr") or "").strip()
    if stderr and stderr not in message:  # e.g. a template's validate: "failed to validate" + the validator's words
        message += ": " + " / ".join(stderr.splitlines()[-3:])
    return message


def task_result(event: dict) -> TaskResult | None:
    """Turn one ansible-runner event into a TaskResult, or None when it is not a task result."""
    name = event.get("event")
    status = RESULT_EVENTS.get(name)
    if status is None:
        return None
    data = event.get("event_data", {})
    result = data.get("res", {}) or {}
    if status == "ok" and result.get("changed"):
        status = "changed"
    return TaskResult(
        host=data.get("host", "?"),
        role=data.get("role", "") or "",
        task=data.get("task", "") or "",
        status=status,
        message=_message(result) if status in ("failed", "unreachable") else "",
        ignored=bool(data.get("ignore_errors")),
        diffs=_as_list(result.get("diff")),
    )


def _as_list(diff) -> list[dict]:
    if not diff:
        return []
    return [d for d in (diff if isinstance(diff, list) else [diff]) if isinstance(d, dict)]


def unified_diff(entry: dict) -> str:
    """Render one Ansible diff entry as a unified diff (or its prepared text)."""
    if "prepared" in entry:
        return str(entry["prepared"])
    before, after = entry.get("before", ""), entry.get("after", "")
    if not isinstance(before, str) or not isinstance(after, str):
        return ""
    return "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            fromfile=str(entry.get("before_header", "before")),
            tofile=str(entry.get("after_header", "after")),
        )
    )


def _stats(event: dict) -> dict[str, HostStats]:
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


def run_playbook(
    inventory_dir: Path,
    *,
    limit: str | None = None,
    check: bool = False,
    diff: bool = False,
    on_result: Callable[[TaskResult], None] | None = None,
    playbook: Path | None = None,
) -> ApplyResult:
    """Run playbooks/site.yml (or `playbook`) on the inventory; call on_result per task result."""
    playbook = playbook or paths.site_playbook()
    problems: list[TaskResult] = []
    stats: dict[str, HostStats] = {}

    def handle(event: dict) -> bool:
        nonlocal stats
        if event.get("event") == "playbook_on_stats":
            stats = _stats(event)
        result = task_result(event)
        if result is not None:
            if result.status in ("failed", "unreachable") and not result.ignored:
                problems.append(result)
            if on_result is not None:
                on_result(result)
        return False  # do not keep events in memory

    options = []
    if check:
        options.append("--check")
    if diff:
        options.append("--diff")
    # ansible-runner starts ansible-playbook from PATH: the one installed beside this Python
    venv_bin = Path(sys.executable).parent
    with tempfile.TemporaryDirectory(prefix="provision-run-") as private_dir:
        import ansible_runner  # only here: the other commands run where Ansible is not installed (a GPU host)

        runner = ansible_runner.run(
            private_data_dir=private_dir,
            playbook=str(playbook),
            inventory=str(Path(inventory_dir).resolve()),
            limit=limit,
            cmdline=" ".join(options) or None,
            envvars={
                "ANSIBLE_CONFIG": str(paths.ansible_cfg()),
                "ANSIBLE_FORCE_COLOR": "0",
                "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}",
            },
            event_handler=handle,
            quiet=True,
            suppress_env_files=True,
        )
        rc = runner.rc if runner.rc is not None else 1
        output_tail = "" if stats else "\n".join(runner.stdout.read().strip().splitlines()[-20:])
    return ApplyResult(rc=rc, stats=stats, problems=problems, output_tail=output_tail)


def apply_spec(
    spec: Spec,
    *,
    limit: str | None = None,
    check: bool = False,
    diff: bool = False,
    on_result: Callable[[TaskResult], None] | None = None,
) -> ApplyResult:
    """Generate the spec's inventory into a private folder and run the playbook on it."""
    with tempfile.TemporaryDirectory(prefix="provision-inventory-") as inventory_dir:
        write_inventory(spec, Path(inventory_dir))
        return run_playbook(Path(inventory_dir), limit=limit, check=check, diff=diff, on_result=on_result)
