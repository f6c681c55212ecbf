"""provisioner/base/spec_lock.py: one real apply of a spec at a time on a controller; check-mode runs share it."""

from __future__ import annotations

import multiprocessing
import time

import pytest

from provisioner.base.spec_lock import SpecBusy, lock_path, spec_lock


def hold(spec_path, check, ready, seconds):
    with spec_lock(spec_path, check=check):
        ready.set()
        time.sleep(seconds)


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path


def holder(spec_path, *, check=False, seconds=30.0):
    """Another run holding the spec's lock, in a process of its own (flock is per open file)."""
    ready = multiprocessing.Event()
    process = multiprocessing.Process(target=hold, args=(spec_path, check, ready, seconds))
    process.start()
    assert ready.wait(20)
    return process


def test_a_second_real_apply_is_refused_naming_the_first(state):
    spec = state / "provision.yml"
    first = holder(spec)
    try:
        with pytest.raises(SpecBusy, match=rf"another provision apply of {spec} runs on this controller "
                                           rf"\(\S+, pid {first.pid}, since [0-9:]+\): nothing was touched; "
                                           "wait for it with --wait-lock SECONDS"):
            with spec_lock(spec):
                pass
        with pytest.raises(SpecBusy):  # nor does a check-mode run read a state being changed
            with spec_lock(spec, check=True):
                pass
    finally:
        first.kill()
        first.join()
    with spec_lock(spec):  # the kernel gave it back with the process
        pass
    assert lock_path(spec).read_text() == ""


def test_check_mode_runs_share_it_and_another_spec_has_its_own(state):
    spec = state / "provision.yml"
    first = holder(spec, check=True)
    try:
        with spec_lock(spec, check=True):
            pass
        with spec_lock(state / "other.yml"):
            pass
        with pytest.raises(SpecBusy, match=r"\(a check-mode run\)"):
            with spec_lock(spec):
                pass
    finally:
        first.kill()
        first.join()


def test_a_wait_takes_it_once_the_holder_ends(state):
    spec = state / "provision.yml"
    first = holder(spec, seconds=2)
    started = time.monotonic()
    with spec_lock(spec, wait_s=30):
        waited = time.monotonic() - started
    first.join()
    assert 0.5 < waited < 20
    with pytest.raises(SpecBusy, match=r"waited 1 s"):
        other = holder(spec, seconds=10)
        try:
            with spec_lock(spec, wait_s=1):
                pass
        finally:
            other.kill()
            other.join()
