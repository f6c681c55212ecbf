"""One ansible-playbook run: started in a process group of its own, its events and output followed as they come, a
signal passed on at a task boundary; the result with each host's stats.
"""

from __future__ import annotations

import collections
import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from provisioner.apply.controls import Controls, check_controls
from provisioner.apply.events import (
    ANSI_ESCAPE,
    HostProgress,
    HostStats,
    TaskResult,
    stats_from_progress,
    stats_of_run,
    task_label,
    task_result,
)
from provisioner.base import module_utils, paths
from provisioner.base.ansible_config import ansible_environment, collections_paths, events_environment
from provisioner.base.rollout import HostTurn, Timeline
from provisioner.base.signals import signals_interrupt

INTERRUPTED_RC = 130  # 128 + SIGINT, as a shell reports a command stopped by Ctrl-C


ANSIBLE_INTERRUPTED_RC = 99  # ansible-playbook's "User interrupted execution"


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
            stats = stats_of_run(event)
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
        if not interrupted_by and (rc == ANSIBLE_INTERRUPTED_RC or rc < 0 or died_of_a_signal(output_lines)):
            interrupted_by = "a signal to ansible-playbook"  # the signal went to it alone
        interrupted = bool(interrupted_by)
        if not stats and (interrupted or any(host.done for host in progress.values())):
            # Ansible stopped before it counted (interrupted, or a worker died): what the events said
            stats = {host: stats_from_progress(host, progress[host], problems) for host in progress}
        # Ansible's own last lines where nothing else says why the run failed
        failed_unsaid = rc != 0 and not interrupted and not problems
        output_tail = "\n".join(line for line in output_lines if line.strip()) if failed_unsaid or not stats else ""
    return ApplyResult(rc=INTERRUPTED_RC if interrupted else rc, stats=stats, problems=problems,
                       output_tail=output_tail, turns=timeline.turns, turns_since=timeline.started_at,
                       interrupted=interrupted, interrupted_by=interrupted_by, stopped_before=stopped_before,
                       progress=progress, lock_run=lock_run)


def died_of_a_signal(output_lines: list[str]) -> bool:
    """ansible-playbook's own signal handler raised KeyboardInterrupt: a SIGINT reached it, which it does not
    always turn into its exit status 99 (a worker caught mid-lock ends it with 1, "A worker was found in a dead
    state")."""
    return any(line.strip().startswith("KeyboardInterrupt") for line in output_lines)


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
