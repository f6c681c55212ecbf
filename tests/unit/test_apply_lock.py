"""Module apply_lock and its action plugin, as Ansible runs them (`ansible localhost -m ...apply_lock`): one run on a
host at a time; a live holder refuses or is waited for, a gone or expired one is taken over. Two real applies on a
lab host: tests/integration/test_faults.py."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from provisioner.base import module_utils
from tests.unit.adhoc import run_module

action = module_utils.apply_lock_run  # who a run is (the action plugin's and provision's)


class Lock:
    """The lock file in `work`, and `ansible localhost -m apply_lock` on it (each call is a run of its own)."""

    def __init__(self, work: Path):
        self.work, self.path = work, work / "apply.lock"

    def __call__(self, *options: str, **args) -> dict:
        result, done = run_module(self.work, "apply_lock", {"path": str(self.path), **args}, *options)
        return {**result, "rc": done.returncode, "output": done.stdout + done.stderr}

    def record(self) -> dict | None:
        text = self.path.read_text() if self.path.exists() else ""
        return json.loads(text) if text else None

    def hold(self, pid: int, *, machine: str | None = None, renewed: float | None = None, lease: int = 3600) -> dict:
        """Write the record of a run whose process is `pid` (on this machine, unless `machine` is given)."""
        start = action.process_start(pid) or "0"
        record = {"id": f"{machine or action.machine_id()}/{pid}/{start}", "user": "alice", "controller": "bastion-2",
                  "pid": pid, "started": time.time() - 60, "renewed": time.time() if renewed is None else renewed,
                  "lease": lease}
        self.path.write_text(json.dumps(record))
        return record


@pytest.fixture
def lock(tmp_path) -> Lock:
    return Lock(tmp_path)


@pytest.fixture
def live_run():
    """A process standing for another run that is still going."""
    process = subprocess.Popen(["sleep", "300"])
    yield process
    process.kill()
    process.wait()


def test_a_free_lock_is_taken_naming_this_run_and_given_back(lock):
    taken = lock(state="acquired")
    assert (taken["rc"], taken["acquired"], taken["changed"]) == (0, True, False)
    record = lock.record()
    assert record["controller"] == os.uname().nodename and record["lease"] == 3600
    machine, pid, start = record["id"].split("/")
    assert (machine, start) == (action.machine_id(), action.process_start(int(pid)) or start)
    # another run (another ansible process) gives back only its own lock
    assert lock(state="released")["rc"] == 0 and lock.record() is not None
    lock.path.write_text(json.dumps(dict(record, id="x/1/1")))
    assert lock(state="released", run={"id": "x/1/1"})["rc"] == 0 and lock.record() is None


def test_a_live_holder_is_named_in_the_refusal(lock, live_run):
    lock.hold(live_run.pid)
    refused = lock(state="acquired")
    assert refused["rc"] != 0 and refused["acquired"] is False
    assert f"another apply holds this host: alice from bastion-2 (pid {live_run.pid}), since " in refused["msg"]
    assert "--wait-lock SECONDS" in refused["msg"] and "apply_lock_wait" in refused["msg"]
    assert lock.record()["pid"] == live_run.pid


def test_a_wait_takes_the_lock_once_the_holder_gives_it_back(lock, live_run):
    lock.hold(live_run.pid)
    threading.Timer(3, lambda: lock.path.write_text("")).start()
    started = time.monotonic()
    taken = lock(state="acquired", wait=60)
    assert taken["rc"] == 0 and taken["acquired"] is True
    assert 3 <= time.monotonic() - started < 30
    assert lock.record()["pid"] != live_run.pid


def test_a_wait_that_runs_out_fails_naming_the_holder(lock, live_run):
    lock.hold(live_run.pid)
    started = time.monotonic()
    refused = lock(state="acquired", wait=2)
    assert refused["rc"] != 0 and "waited 2 s" in refused["msg"] and time.monotonic() - started >= 2


def test_the_lock_of_a_run_gone_from_this_controller_is_taken_over_with_a_warning(lock):
    gone = subprocess.Popen(["true"])
    gone.wait()
    lock.hold(gone.pid)
    taken = lock(state="acquired")
    assert taken["rc"] == 0 and taken["took_over"] == "that run is gone"
    assert "took over the apply lock of alice from bastion-2" in taken["output"]


def test_another_controller_s_lock_is_kept_until_its_lease_runs_out(lock):
    """A run on another controller cannot be seen from here: only its lease tells it is gone."""
    lock.hold(1, machine="other-machine", renewed=time.time() - 100, lease=3600)
    assert lock(state="acquired")["rc"] != 0
    lock.hold(1, machine="other-machine", renewed=time.time() - 100, lease=60)
    taken = lock(state="acquired")
    assert taken["rc"] == 0 and taken["took_over"] == "its lease ran out"


def test_renewing_a_lock_another_run_took_over_fails(lock, live_run):
    lock.hold(live_run.pid)
    renewed = lock(state="renewed")
    assert renewed["rc"] != 0 and "taken over by another run: alice from bastion-2" in renewed["msg"]


def test_check_mode_says_who_holds_it_and_writes_nothing(lock, live_run):
    assert lock("--check", state="acquired")["acquired"] is True and not lock.path.exists()
    held = lock.hold(live_run.pid)
    assert lock("--check", state="acquired")["rc"] != 0
    assert lock.record() == held


def test_a_torn_record_holds_no_lock(lock):
    lock.path.write_text('{"id": "x/1')
    assert lock(state="acquired")["acquired"] is True
