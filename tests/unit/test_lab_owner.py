"""The lab tells its own running bridge from one a killed lab left behind (tests/lab/hosts.py)."""

import os
import subprocess
import sys

from tests.lab.hosts import LabOwner, lab_owner


def test_this_process_is_a_live_owner():
    me = LabOwner.current()
    assert me.pid == os.getpid()
    assert me.alive()


def test_an_exited_process_is_not_alive():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    owner = LabOwner(child.pid, LabOwner.start_time_of(child.pid) or "unknown")
    child.wait()
    assert not owner.alive()


def test_a_reused_pid_with_another_start_time_is_not_the_owner():
    assert not LabOwner(os.getpid(), "0").alive()


def test_the_owner_file_round_trips_and_a_missing_or_garbled_one_means_no_owner(tmp_path, monkeypatch):
    monkeypatch.setattr("tests.lab.hosts.OWNER_DIR", tmp_path)
    assert lab_owner("vpx0") is None
    LabOwner.current().write(tmp_path / "vpx0.pid")
    assert lab_owner("vpx0") == LabOwner.current()
    (tmp_path / "vpx1.pid").write_text("garbage\n")
    assert lab_owner("vpx1") is None
