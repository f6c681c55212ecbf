"""One `provision apply` of a spec at a time on this controller, before any host is touched.

A lock file per spec (named after its resolved path) under $XDG_STATE_HOME/vllm-provision/locks/, held with
flock for the length of the run: the kernel gives it back when the run ends however it ends, so a dead run
never holds it. A real apply holds it alone; check-mode runs share it (they change nothing), but not with a
real apply. The holder writes who it is into the file, for the refusal. Each host has its own lock too, taken by
the playbook itself, also from plain Ansible or another controller (role apply_lock).
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import hashlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

from provisioner.base.runlog import runs_dir

POLL_S = 0.5


class SpecBusy(RuntimeError):
    """Another apply of the spec runs on this controller: nothing was touched."""


def locks_dir() -> Path:
    return runs_dir().parent / "locks"


def lock_path(spec_path: Path) -> Path:
    digest = hashlib.sha256(str(Path(spec_path).resolve()).encode()).hexdigest()[:16]
    return locks_dir() / f"{Path(spec_path).stem}-{digest}.lock"


@contextlib.contextmanager
def spec_lock(spec_path: Path, *, check: bool = False, wait_s: float = 0) -> Iterator[None]:
    """Hold the spec's lock for the block: alone for a real apply, shared for check mode; wait up to `wait_s`
    seconds for another run's, then SpecBusy naming it."""
    path = lock_path(spec_path)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    mode = fcntl.LOCK_SH if check else fcntl.LOCK_EX
    with open(path, "a+") as handle:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(handle, mode | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise SpecBusy(refusal(spec_path, handle, wait_s)) from None
                time.sleep(POLL_S)
        if not check:
            _write(handle, {"pid": os.getpid(), "user": getpass.getuser(), "started": time.time()})
        try:
            yield
        finally:
            if not check:
                _write(handle, None)


def _write(handle, holder: dict | None) -> None:
    handle.seek(0)
    handle.truncate()
    if holder is not None:
        handle.write(json.dumps(holder))
    handle.flush()


def refusal(spec_path: Path, handle, wait_s: float) -> str:
    handle.seek(0)
    try:
        holder = json.loads(handle.read() or "{}")
    except ValueError:
        holder = {}
    who = (f"{holder.get('user', '?')}, pid {holder.get('pid', '?')}, since "
           f"{time.strftime('%H:%M:%S', time.localtime(holder.get('started', 0)))}") if holder else "a check-mode run"
    waited = f" (waited {wait_s:g} s)" if wait_s else ""
    return (f"another provision apply of {spec_path} runs on this controller ({who}){waited}: nothing was touched; "
            "wait for it with --wait-lock SECONDS")
