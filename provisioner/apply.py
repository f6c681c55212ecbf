"""Run our playbook against a generated inventory and report per task and per host.

ansible-playbook runs with the collection's event callback, whose events
we read as they come and turn into `TaskResult`s (live progress) and `HostStats`
(the per-host summary).  Importable and usable without the CLI.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import dataclasses
import difflib
import functools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from provisioner.base import module_utils, paths
from provisioner.fleet.selection import select_hosts
from provisioner.base.ansible_config import ansible_environment, collections_paths, events_environment
from provisioner.base.hostkeys import Endpoint, check_hosts, trust_command
from provisioner.fleet.inventory import host_units, write_inventory
from provisioner.fleet.remote import HostShell
from provisioner.base.signals import signals_held, signals_interrupt
from provisioner.base.spec_lock import spec_lock
from provisioner.base.unreachable import CONNECT_TIMEOUT_S, explain
from provisioner.validation.preflight import (
    DriverReader,
    check_preflight,
    check_readings,
    driver_checks,
    hosts_to_read,
    read_driver,
    read_drivers,
)
from provisioner.base.rollout import HostTurn, Rollout, Timeline
from provisioner.spec import Host, Spec

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


INTERRUPTED_RC = 130  # 128 + SIGINT, as a shell reports a command stopped by Ctrl-C
ANSIBLE_INTERRUPTED_RC = 99  # ansible-playbook's "User interrupted execution"


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


@dataclass
class ApplyResult:
    rc: int
    stats: dict[str, HostStats] = field(default_factory=dict)
    problems: list[TaskResult] = field(default_factory=list)
    output_tail: str = ""  # Ansible's own last output lines, for errors before any task ran
    turns: dict[str, HostTurn] = field(default_factory=dict)  # each host's batch and time window
    turns_since: float | None = None  # the wall clock (time.time()) the turns' seconds count from
    interrupted: bool = False  # Ctrl-C, SIGTERM or SIGHUP stopped the playbook, or a signal to ansible-playbook
    interrupted_by: str = ""  # which: "Ctrl-C", "SIGTERM", "SIGHUP", "a signal to ansible-playbook"
    stopped_before: str = ""  # the task the run stopped before, at a task boundary (no task was cut)
    progress: dict[str, HostProgress] = field(default_factory=dict)  # each host's, from the events
    lock_run: str = ""  # the run's id in the hosts' apply locks (role apply_lock): its ansible-playbook process
    # a rolling apply that did not succeed: what the gateways did with the drains it left (rollout_recover)
    recovery: list[TaskResult] = field(default_factory=list)

    @property
    def succeeded(self) -> bool:
        return self.rc == 0 and not self.interrupted and all(s.succeeded for s in self.stats.values())

    @property
    def lost(self) -> list[str]:
        """The hosts that went unreachable during the run."""
        return [host for host, stats in self.stats.items() if stats.unreachable]

    @property
    def changed(self) -> int:
        return sum(s.changed for s in self.stats.values())


# --------------------------------------------------------------------------- what the user passes to Ansible

# extra vars that would undo how ssh checks the host's key (provisioner/base/hostkeys.py): refused
TRUST_VARS = ("ansible_host_key_checking", "ansible_ssh_host_key_checking", "ansible_ssh_args",
              "ansible_ssh_common_args")


class ControlError(ValueError):
    """An option for ansible-playbook that cannot be used (an unknown tag, a bad -e): nothing was run."""


@dataclass(frozen=True)
class Controls:
    """What `provision apply` passes on to ansible-playbook, besides --check/--diff and the hosts."""

    tags: tuple[str, ...] = ()
    skip_tags: tuple[str, ...] = ()
    extra_vars: tuple[str, ...] = ()  # each VAR=VALUE (several, space-separated), YAML/JSON, or @FILE
    verbosity: int = 0
    forks: int | None = None
    become_password: str | None = field(default=None, repr=False)  # to ansible-playbook's standard input, never written
    rollout: Rollout | None = None  # --rolling: batches, a canary first (provisioner/base/rollout.py)
    wait_lock: int = 0  # seconds to wait for another run's lock: the spec's here, each host's (role apply_lock)

    def options(self) -> list[str]:
        """ansible-playbook's options for these controls (the become password is not one of them)."""
        options = [f"--tags={','.join(self.tags)}"] if self.tags else []
        options += [f"--skip-tags={','.join(self.skip_tags)}"] if self.skip_tags else []
        for extra in self.extra_vars:
            options += ["--extra-vars", extra]
        options += ["-" + "v" * min(self.verbosity, 6)] if self.verbosity else []
        options += [f"--forks={self.forks}"] if self.forks is not None else []
        # read from ansible-playbook's standard input (run_playbook writes it there)
        options += ["--become-password-file", "-"] if self.become_password is not None else []
        options += ["--extra-vars", self.rollout.extra_vars()] if self.rollout is not None else []
        options += ["--extra-vars", json.dumps({"apply_lock_wait": self.wait_lock})] if self.wait_lock else []
        return options


@functools.cache
def site_tags() -> list[str]:
    """The tags of the site playbook's roles (playbooks/site.yml), in play order."""
    tags: list[str] = []
    for role in _site_roles():
        role_tags = (role.get("tags") or []) if isinstance(role, dict) else []
        tags += [tag for tag in role_tags if tag not in tags]
    return tags


@functools.cache
def phase_tags() -> list[str]:
    """The tags of the roles' phases (sysctl_preflight, vllm_service_configure, ...: the tags on the
    imports of each site role's tasks/main.yml), in play order."""
    tags: list[str] = []
    for role in _site_roles():
        name = (role.get("role") if isinstance(role, dict) else role).rsplit(".", 1)[-1]
        for task in yaml.safe_load((paths.role_dir(name) / "tasks" / "main.yml").read_text(encoding="utf-8")) or []:
            tags += [tag for tag in task.get("tags") or [] if tag not in tags]
    return tags


def _site_roles() -> list[dict | str]:
    """The role entries of the site playbook's plays, in play order."""
    plays = yaml.safe_load((paths.PLAYBOOKS_DIR / "site.yml").read_text(encoding="utf-8")) or []
    return [role for play in plays for role in play.get("roles") or []]


def split_tags(values: Sequence[str]) -> tuple[str, ...]:
    """`--tags a,b --tags c` -> ("a", "b", "c")."""
    return tuple(dict.fromkeys(tag.strip() for value in values for tag in value.split(",") if tag.strip()))


def extra_vars_data(extra: str) -> dict:
    """What one -e value sets, read as ansible-playbook reads it (ansible's own parsers)."""
    from ansible.errors import AnsibleError
    from ansible.parsing.dataloader import DataLoader
    from ansible.parsing.splitter import parse_kv

    try:
        if extra.startswith("@"):
            data = DataLoader().load_from_file(os.path.expanduser(extra[1:]))
        elif extra.lstrip().startswith(("{", "[")):
            data = DataLoader().load(extra)
        else:
            data = parse_kv(extra)
    except AnsibleError as error:
        raise ControlError(f"-e {extra}: {str(error.message).splitlines()[0]} — write VAR=VALUE, or @FILE "
                           "with a YAML or JSON mapping") from None
    if not isinstance(data, dict) or not data or "_raw_params" in data:
        raise ControlError(f"-e {extra}: sets no variable — write VAR=VALUE, or @FILE with a YAML or JSON mapping")
    return data


def check_controls(controls: Controls) -> None:
    """Raise ControlError for anything ansible-playbook would refuse or that would weaken host key
    checking, before any host is touched."""
    roles, phases = site_tags(), phase_tags()
    for option, tags in (("--tags", controls.tags), ("--skip-tags", controls.skip_tags)):
        unknown = [tag for tag in tags if tag not in roles + phases]
        if unknown:
            raise ControlError(f"{option}: no role tagged {', '.join(map(repr, unknown))} — the tags are: "
                               f"{', '.join(roles)}, and a role's phases: {', '.join(phases)}")
    for extra in controls.extra_vars:
        refused = sorted(set(extra_vars_data(extra)) & set(TRUST_VARS))
        if refused:
            raise ControlError(f"-e {extra}: {', '.join(refused)} would change how ssh checks host keys — "
                               "vllm-provision checks them against the spec's known_hosts; leave it out")
    if controls.forks is not None and controls.forks < 1:
        raise ControlError(f"--forks {controls.forks}: give 1 or more")
    for problem in controls.rollout.problems() if controls.rollout is not None else []:
        raise ControlError(problem)


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
    it is not a task result. A no_log result is censored: its diff is never shown, only that it changes."""
    name = event.get("event")
    status = RESULT_EVENTS.get(name)
    if status is None:
        return None
    data = event.get("event_data", {})
    result = data.get("res", {}) or {}
    censored = CENSORED in result
    if status == "ok" and result.get("changed"):
        status = "changed"
    if censored:
        diffs = [{"hidden": True}] if status == "changed" else []
    else:
        diffs = file_diffs(result)
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
    """Render one Ansible diff entry: a unified diff labelled with the file's destination, a change
    of attributes (mode, owner, state), or only that a censored (no_log) result changes."""
    destination = entry.get("dest") or str(entry.get("before_header") or "").removesuffix(" (content)")
    if entry.get("hidden"):
        return f"{destination or 'a no_log result'}: content changes (not shown: no_log)\n"
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


class AppendedLines:
    """The whole lines appended to a file since the last read (the file may not exist yet)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._stream = None
        self._partial = ""

    def read(self) -> list[str]:
        if self._stream is None:
            if not self._path.exists():
                return []
            self._stream = open(self._path, encoding="utf-8", errors="replace")  # noqa: SIM115 (kept open)
        lines = (self._partial + self._stream.read()).split("\n")
        self._partial = lines.pop()
        return lines

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()


POLL_SECONDS = 0.05  # how often the run's event and output files are read while it goes on


def run_playbook(
    inventory_dir: Path,
    *,
    limit: str | None = None,
    check: bool = False,
    diff: bool = False,
    on_result: Callable[[TaskResult], None] | None = None,
    playbook: str | Path | None = None,
    controls: Controls = Controls(),
    on_output: Callable[[str], None] | None = None,
    on_event: Callable[[dict], None] | None = None,
    on_notice: Callable[[str], None] | None = None,
) -> ApplyResult:
    """Run the collection's site playbook (or `playbook`) on the inventory; call on_result per task
    result, on_event with each raw event (tests/lab/record_events.py records them), with
    controls.verbosity, on_output with Ansible's own output lines, and on_notice with what the run does about
    an interrupt (Ctrl-C, SIGTERM, SIGHUP: it stops before the next task; a second time, at once: _run_streaming).

    ansible-playbook runs as typed in the current folder, with the collection's event callback
    (plugins/callback/provision_events.py) appending the run's events to a file of a private folder,
    read as they come; the become password goes to it on its standard input, never to a file. Ansible
    reads the user's own configuration; provisioner.base.ansible_config says which of our settings win.
    Raises ControlError / AnsibleConfigError before anything runs."""
    check_controls(controls)
    environment = ansible_environment()
    playbook = playbook or paths.site_playbook()
    problems: list[TaskResult] = []
    stats: dict[str, HostStats] = {}
    timeline = Timeline()
    output_lines: list[str] = []

    progress: dict[str, HostProgress] = {}
    stopped_before = ""

    def handle(event: dict) -> None:
        nonlocal stats, stopped_before
        if on_event is not None:
            on_event(event)
        timeline.read(event)
        name, data = event.get("event"), event.get("event_data") or {}
        if name == "playbook_on_stats":
            stats = _stats(event)
        elif name == "runner_on_start":
            progress.setdefault(data.get("host", "?"), HostProgress()).running = task_label(data.get("role") or "",
                                                                                            data.get("task") or "")
        elif name == "provision_stopped":
            stopped_before = task_label(data.get("role") or "", data.get("task") or "")
        result = task_result(event)
        if result is not None:
            progress.setdefault(result.host, HostProgress()).read(result)
            if result.status in ("failed", "unreachable") and not result.ignored:
                problems.append(result)
            if on_result is not None:
                on_result(result)

    def output(line: str) -> None:
        output_lines.append(line)
        del output_lines[:-20]  # the tail is kept, for a run that ends before its stats
        if on_output is not None and controls.verbosity:
            on_output(ANSI_ESCAPE.sub("", line))

    options = ["--check"] if check else []
    options += ["--diff"] if diff else []
    options += ["--limit", limit] if limit else []
    options += controls.options()
    venv_bin = Path(sys.executable).parent  # the ansible-playbook installed beside this Python
    with tempfile.TemporaryDirectory(prefix="provision-run-") as private_dir:
        events_file, output_file = Path(private_dir) / "events.jsonl", Path(private_dir) / "output.txt"
        command = [str(venv_bin / "ansible-playbook"), "-i", str(Path(inventory_dir).resolve()), str(playbook),
                   *options]
        variables = {
            **os.environ,
            **environment,
            **events_environment(events_file),
            # our collection first: its roles, modules, callback and playbook by their names
            "ANSIBLE_COLLECTIONS_PATH": os.pathsep.join(
                [str(paths.collections_dir(Path(private_dir) / "collections")), *collections_paths()]),
            "ANSIBLE_FORCE_COLOR": "0",
            "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        stop_file = Path(private_dir) / "stop"
        variables["PROVISION_STOP_FILE"] = str(stop_file)
        with signals_interrupt():
            rc, interrupted_by, lock_run = _run_streaming(
                command, variables, controls.become_password, events_file, output_file, stop_file,
                on_event_line=lambda line: handle(json.loads(line)), on_output_line=output, on_notice=on_notice)
        if not interrupted_by and (rc == ANSIBLE_INTERRUPTED_RC or rc < 0):  # the signal went to it alone
            interrupted_by = "a signal to ansible-playbook"
        interrupted = bool(interrupted_by)
        if interrupted and not stats:  # Ansible stops before it counts: what the events said
            stats = {host: _tally(host, progress[host], problems) for host in progress}
        output_tail = "" if stats else "\n".join(line for line in output_lines if line.strip())
    return ApplyResult(rc=INTERRUPTED_RC if interrupted else rc, stats=stats, problems=problems,
                       output_tail=output_tail, turns=timeline.turns, turns_since=timeline.started_at,
                       interrupted=interrupted, interrupted_by=interrupted_by, stopped_before=stopped_before,
                       progress=progress, lock_run=lock_run)


def _tally(host: str, progress: HostProgress, problems: list[TaskResult]) -> HostStats:
    """A host's counts from its task results, for a run that ended before Ansible counted."""
    failed = sum(problem.host == host and problem.status == "failed" for problem in problems)
    unreachable = sum(problem.host == host and problem.status == "unreachable" for problem in problems)
    changed = len(progress.changed)
    return HostStats(ok=progress.done - progress.skipped - changed - failed - unreachable, changed=changed,
                     failed=failed, unreachable=unreachable, skipped=progress.skipped)


def _run_streaming(command: list[str], variables: dict[str, str], password: str | None, events_file: Path,
                   output_file: Path, stop_file: Path, *, on_event_line: Callable[[str], None],
                   on_output_line: Callable[[str], None],
                   on_notice: Callable[[str], None] | None = None) -> tuple[int, str, str]:
    """Run ansible-playbook in a session of its own, its output to `output_file`; read its events file and its
    output as they come (every POLL_SECONDS), each complete line to its callback; the become password (if any)
    on its standard input. (Its exit code, what interrupted it ("" when nothing did), and its run's id in the
    hosts' apply locks.)

    Interrupted once (Ctrl-C, or SIGTERM/SIGHUP under signals_interrupt): `stop_file` asks it to stop at the
    next task boundary (plugins/callback/provision_events.py), and it is waited for. Twice, or by an error in a
    callback: its whole process group gets SIGINT and stops at once, as on Ctrl-C, its workers with it."""
    events, lines = AppendedLines(events_file), AppendedLines(output_file)
    with open(output_file, "wb") as output_stream:
        process = subprocess.Popen(command, env=variables, stdout=output_stream, stderr=subprocess.STDOUT,
                                   stdin=subprocess.PIPE if password is not None else subprocess.DEVNULL,
                                   start_new_session=True, preexec_fn=_interrupted_with_parent(os.getpid()))
    lock_run = module_utils.apply_lock_run.run_of(process.pid)["id"]  # as the action plugin apply_lock names it
    interrupted_by = ""
    pending: collections.deque[str] = collections.deque()  # read, not handled yet: none lost to an interrupt
    try:
        if password is not None:  # read by --become-password-file - until the pipe closes
            try:
                process.stdin.write(password.encode() + b"\n")
                process.stdin.close()
            except BrokenPipeError:  # it stopped before reading it: its output says why
                pass
        while True:
            try:
                ended = process.poll() is not None
                pending.extend(line for line in events.read() if line.strip())
                while pending:
                    on_event_line(pending[0])
                    pending.popleft()
                for line in lines.read():
                    on_output_line(line)
                if ended:
                    break
                time.sleep(POLL_SECONDS)
            except KeyboardInterrupt as interrupt:
                if interrupted_by:  # the second: at once
                    raise
                interrupted_by = str(interrupt) if str(interrupt).startswith("SIG") else "Ctrl-C"
                stop_file.touch()
                if on_notice is not None:
                    on_notice(f"{interrupted_by}: stopping before the next task (again: at once, cutting the tasks "
                              "that run)")
    except KeyboardInterrupt as interrupt:  # stopped at once below; what it did so far is reported
        interrupted_by = interrupted_by or (str(interrupt) if str(interrupt).startswith("SIG") else "Ctrl-C")
    finally:
        if process.poll() is None:  # interrupted twice, or an error here: Ansible stops as on Ctrl-C, at once
            os.killpg(process.pid, signal.SIGINT)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            for line in [*pending, *events.read()]:  # what it said on its way out
                if line.strip():
                    on_event_line(line)
        events.close()
        lines.close()
    return process.returncode, interrupted_by, lock_run


PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent ends


def _interrupted_with_parent(parent: int) -> Callable[[], None]:
    """For ansible-playbook, in a session of its own: SIGINT when `parent` (this process) ends however it ends,
    killed included, so no run goes on unseen. SIGINT is what stops it (here too, on a second Ctrl-C), so it
    gets SIGINT's default whatever this process inherited (a shell script's `provision apply &` ignores it, and
    so would ansible-playbook, which sets its handler only where SIGINT is not ignored). Runs in the child
    between fork and exec (Linux)."""
    def set_signal() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal(signal.SIGINT, signal.SIG_DFL)  # libc's: Python's signal.signal works in the main thread only
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGINT)
        if os.getppid() != parent:  # it ended before the signal was set
            os.kill(os.getpid(), signal.SIGINT)
    return set_signal


def check_apply(spec: Spec, hosts: Sequence[str], controls: Controls) -> list[Host]:
    """The hosts `hosts` stand for, once the names, the controls, the user's Ansible configuration and
    the preflight (provisioner.validation.preflight: memory, and the drivers the spec names) allow a run: else
    SelectionError, ControlError, AnsibleConfigError or PreflightError, and no host is touched."""
    chosen = select_hosts(spec, hosts)
    check_controls(controls)
    check_preflight(spec, chosen)  # vLLM would refuse to start: before Ansible is loaded (it makes ~/.ansible/tmp)
    ansible_environment()  # the user's configuration is usable, before any host is contacted
    return chosen


def apply_spec(
    spec: Spec,
    *,
    hosts: Sequence[str] = (),
    check: bool = False,
    diff: bool = False,
    controls: Controls = Controls(),
    on_result: Callable[[TaskResult], None] | None = None,
    on_output: Callable[[str], None] | None = None,
    on_notice: Callable[[str], None] | None = None,
    read_driver: DriverReader = read_driver,
) -> ApplyResult:
    """Generate the spec's inventory into a private folder and run the playbook on `hosts` (host or
    group names, `all`; none: every host of the spec).

    First `check_apply` (nothing touched when it raises); then the spec's lock on this controller, for the
    whole run (provisioner/base/spec_lock.py: SpecBusy when another apply of it runs here, after
    `controls.wait_lock` seconds; each host's lock is the playbook's, role apply_lock); then every chosen host's
    key (all at once):
    a host whose key is unknown or changed is not run on; it is reported unreachable, with the
    fingerprints and the fix, and the others go on. Then the NVIDIA driver of each host whose driver the
    spec does not name (`read_driver`, one command each, all at once): one that cannot be read is
    reported unreachable, as a refused key; one too old (or none) raises PreflightError before the
    playbook runs on any host."""
    chosen = check_apply(spec, hosts, controls)
    with spec_lock(spec.source_path, check=check, wait_s=controls.wait_lock) if spec.source_path \
            else contextlib.nullcontext():
        return _apply_hosts(spec, chosen, check=check, diff=diff, controls=controls, on_result=on_result,
                            on_output=on_output, on_notice=on_notice, read_driver=read_driver)


def _apply_hosts(spec: Spec, chosen: list[Host], *, check: bool, diff: bool, controls: Controls,
                 on_result: Callable[[TaskResult], None] | None, on_output: Callable[[str], None] | None,
                 on_notice: Callable[[str], None] | None, read_driver: DriverReader) -> ApplyResult:
    checks = check_hosts([Endpoint(host.name, host.address, host.ssh.port, host.ssh.known_hosts,
                                   trust_command(spec.source_path, host.name)) for host in chosen])
    refusals = [TaskResult(name, "", f"connect to {module_utils.value_rules.host_port(check.address, check.port)}",
                           "unreachable", check.reason())
                for name, check in checks.items() if check.refused]
    for refusal in refusals:
        if on_result is not None:
            on_result(refusal)
    allowed = [host.name for host in chosen if not checks[host.name].refused]
    refusals += read_host_drivers(spec, [host for host in chosen if host.name in allowed], read_driver, on_result)
    allowed = [name for name in allowed if name not in {refusal.host for refusal in refusals}]
    if not allowed:
        result = ApplyResult(rc=1)
    else:
        with tempfile.TemporaryDirectory(prefix="provision-inventory-") as inventory_dir:
            write_inventory(spec, Path(inventory_dir))
            limit = None if len(allowed) == len(spec.hosts) else ",".join(allowed)
            if controls.rollout is not None:  # a multi-node instance's hosts change in one batch
                units = tuple(len(unit) for unit in host_units(spec, allowed))
                controls = dataclasses.replace(controls, rollout=dataclasses.replace(controls.rollout, units=units))
            result = run_playbook(Path(inventory_dir), limit=limit, check=check, diff=diff, controls=controls,
                                  on_result=on_result, on_output=on_output, on_notice=on_notice)
            if not check:  # the hosts that failed ran no later play: their locks too
                give_back_locks(spec, allowed, result.lock_run)
            say_how_lost_hosts_answer_now(spec, result)
            if controls.rollout is not None and not check and not result.succeeded and spec.gateways:
                result.recovery = recover_gateways(Path(inventory_dir), result.lost, controls, on_result)
    refused_stats = {refusal.host: HostStats(unreachable=1) for refusal in refusals}
    result.stats = {host.name: refused_stats.get(host.name) or result.stats[host.name]
                    for host in chosen if host.name in refused_stats or host.name in result.stats}
    result.problems[:0] = refusals
    return result


APPLY_LOCK = "/var/lib/vllm-provision/apply.lock"  # role apply_lock's apply_lock_path


def give_back_locks(spec: Spec, names: list[str], run_id: str) -> None:
    """The host locks run `run_id` still holds, given back (all hosts at once): those of hosts that failed, whose
    later plays did not run, or of a run interrupted. A host that does not answer keeps it: the next run from here
    takes it over (its run is gone). Never raises."""
    source = paths.module_utils_file("apply_lock_run").read_text()
    program = f"{source}\nrelease_if_ours({APPLY_LOCK!r}, {run_id!r})\n"

    def give_back(host: Host) -> None:
        try:
            HostShell.for_host(host, spec.source_path).run("sudo -n python3 -" if host.ssh.become else "python3 -",
                                                           stdin=program, check=False, timeout=CONNECT_TIMEOUT_S + 10)
        except Exception:  # noqa: BLE001 - lost, refused: the lock stays for the next run to take over
            pass

    hosts = [host for host in spec.hosts if host.name in names]
    with signals_held(), ThreadPoolExecutor(max_workers=max(len(hosts), 1)) as pool:
        list(pool.map(give_back, hosts))


def say_how_lost_hosts_answer_now(spec: Spec, result: ApplyResult) -> None:
    """The hosts lost during the run, connected to once more (all at once, each within ssh's connect
    timeout): what the network says now is added to why each was lost."""
    lost = [host for host in spec.hosts if host.name in result.lost]
    if not lost:
        return
    with ThreadPoolExecutor(max_workers=len(lost)) as pool:
        now = dict(zip([host.name for host in lost],
                       pool.map(lambda host: HostShell.for_host(host, spec.source_path).answers(), lost)))
    for problem in result.problems:
        if problem.status == "unreachable" and problem.host in now and now[problem.host] != problem.message:
            problem.message += f"; connected to again: {now[problem.host]}"


RECOVER_PLAYBOOK = f"{paths.COLLECTION}.rollout_recover"


def recover_gateways(inventory_dir: Path, lost: list[str], controls: Controls,
                     on_result: Callable[[TaskResult], None] | None) -> list[TaskResult]:
    """After a rolling apply that failed, was interrupted or lost hosts: on every gateway host, put back the
    drains the rollout recorded where the replica is ready, keep the others (said why), take the servers of
    the `lost` hosts out (maintenance, sessions shut down): playbooks/rollout_recover.yml. What each gateway
    said, as task results (its debug notes and its failures)."""
    said: list[TaskResult] = []

    def keep(task: TaskResult) -> None:
        if task.notes or task.status in ("failed", "unreachable"):
            said.append(task)
        if on_result is not None:
            on_result(task)

    extra = json.dumps({"rollout_lost_hosts": lost})
    recovery_controls = dataclasses.replace(controls, rollout=None, tags=(), skip_tags=(),
                                            extra_vars=(*controls.extra_vars, extra))
    result = run_playbook(inventory_dir, playbook=RECOVER_PLAYBOOK, controls=recovery_controls, on_result=keep)
    if result.interrupted:
        said.append(TaskResult("(gateways)", "rollout", "put back the drains", "failed",
                               "interrupted again: the drains stay recorded; the next apply puts them back"))
    return said


READ_DRIVER_TASK = "read the NVIDIA driver"


def read_host_drivers(spec: Spec, hosts: list[Host], read: DriverReader,
                      on_result: Callable[[TaskResult], None] | None) -> list[TaskResult]:
    """Read the driver of the `hosts` whose driver the spec does not name, say what was read (and its
    warnings) per host, and refuse (PreflightError) when one is too old or missing. Returns the hosts
    whose driver could not be read, as unreachable."""
    to_read = hosts_to_read(spec, hosts)
    readings = read_drivers(spec, to_read, read)
    refusals = [TaskResult(name, "", READ_DRIVER_TASK, "unreachable", why) for name, why in readings.failed.items()]
    read_hosts = [host for host in to_read if host.name in readings.found]
    said = [TaskResult(check.host, "", READ_DRIVER_TASK, "ok",
                       notes=[*check.notes, *(f"warning: {warning}" for warning in check.warnings)])
            for check in driver_checks(spec, read_hosts, readings)]
    for result in [*said, *refusals] if on_result is not None else []:
        on_result(result)
    check_readings(spec, read_hosts, readings)
    return refusals
