"""Waiting for apt's locks (plugins/module_utils/apt_lock.py), against what apt 2.6.2 said on a Debian 12 lab host
while another process held each lock (tests/fixtures/apt/recorded.json, recorded by record.py there): which line
names the holder, which failures are tried again, the bound shared by a task's commands, the sentence past it. The
commands run on a TEST DOUBLE host (FakeApt below) that answers with those recorded outputs on a fake clock, as
apt did: `apt-get update` refuses at once, `apt-get install -o DPkg::Lock::Timeout=N` waits up to N s itself.
Then the module apt_packages as Ansible runs it (ad hoc, on this machine: check mode, and a run with nothing to
install, neither running apt) and its documentation."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from provisioner.base.module_utils import apt_lock
from provisioner.base.paths import COLLECTION, collections_dir

ROOT = Path(__file__).resolve().parents[2]
RECORDED = json.loads((ROOT / "tests" / "fixtures" / "apt" / "recorded.json").read_text())
LISTS_LINE = "Could not get lock /var/lib/apt/lists/lock. It is held by process 86 (python3)"


def answer(case: str) -> tuple[int, str, str]:
    recorded = RECORDED[case]
    return recorded["rc"], recorded["stdout"], recorded["stderr"]


# ------------------------------------------------------------------ apt's lines, as recorded


def test_the_recording_is_apt_2_6_2_on_debian_12():
    assert RECORDED["versions"][0] == "apt 2.6.2 (amd64)"


@pytest.mark.parametrize("case, line", [
    ("update-lists-held", LISTS_LINE),
    # DPkg::Lock::Timeout changes nothing for the lists' lock: refused at once all the same
    ("update-lists-held-lock-timeout",
     "Could not get lock /var/lib/apt/lists/lock. It is held by process 109 (python3)"),
    ("install-frontend-held", "Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 159 (python3)"),
    # apt waited, then named no holder on stderr: its last waiting line on stdout does
    ("install-frontend-held-times-out",
     "Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 437 (python3)"),
    ("install-frontend-held-times-out-qq",  # -qq: no waiting lines, apt's last word only
     "Unable to acquire the dpkg frontend lock (/var/lib/dpkg/lock-frontend), is another process using it?"),
    ("install-dpkg-held-times-out", "Could not get lock /var/lib/dpkg/lock. It is held by process 481 (python3)"),
    ("install-archives-held", "Could not get lock /var/cache/apt/archives/lock. It is held by process 503 (python3)"),
    ("apt-mark-frontend-held", "dpkg frontend lock was locked by another process with pid 782"),
    ("apt-mark-dpkg-held", "dpkg database lock was locked by another process with pid 808"),
])
def test_each_refusal_for_a_lock_gives_the_line_naming_its_holder(case, line):
    rc, out, err = answer(case)
    assert rc == 100 and RECORDED[case]["holder"] is not None
    assert apt_lock.lock_line(out, err) == line


@pytest.mark.parametrize("case", ["update-free", "update-frontend-held", "install-frontend-held-waits",
                                  "install-lists-held"])
def test_what_ran_is_no_refusal(case):
    rc, out, err = answer(case)
    assert rc == 0 and apt_lock.lock_line(out, err) is None


def test_what_apt_did_with_its_locks_as_recorded():
    """The facts the waiting is built on (module_utils/apt_lock.py's docstring)."""
    seconds = {case: (RECORDED[case]["rc"], RECORDED[case]["seconds"]) for case in RECORDED if case != "versions"}
    assert seconds["update-lists-held-lock-timeout"] == (100, 0.0)  # update never waits
    assert seconds["update-frontend-held"][0] == 0  # nor takes a dpkg lock
    assert seconds["install-frontend-held"] == (100, 0.0)  # install without the option: at once
    rc, waited = seconds["install-frontend-held-waits"]  # held 6 s (0.5 s before it started), timeout 20
    assert rc == 0 and waited >= 5.5
    assert len(apt_lock.WAITING.findall(RECORDED["install-frontend-held-waits"]["stdout"])) in (5, 6)
    assert seconds["install-frontend-held-times-out"] == (100, 4.0)  # held 30 s, timeout 4
    assert seconds["install-dpkg-held-times-out"] == (100, 4.0)  # dpkg's own lock too
    assert seconds["install-archives-held"] == (100, 0.0)  # the archives' lock: never waited for
    assert seconds["install-lists-held"][0] == 0  # install takes no lists lock


def test_a_failure_of_another_kind_is_no_lock():
    assert apt_lock.lock_line("", "E: Unable to locate package nosuch\n") is None
    assert apt_lock.lock_line("", "E: Could not open lock file /var/lib/apt/lists/lock - open (13: Permission "
                                  "denied)\n") is None  # not root: waiting would not help


# ------------------------------------------------------------------ a TEST DOUBLE host on a fake clock


class FakeApt:
    """A host whose locks are held until `free_at` (seconds on its clock), per lock: answers apt-get update,
    install and apt-mark as apt 2.6.2 did (the recorded outputs), each command taking `takes` seconds."""

    def __init__(self, free_at: dict[str, float], takes: float = 0.1):
        self.now, self.free_at, self.takes = 0.0, free_at, takes
        self.calls: list[tuple[float, list[str]]] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.now += seconds

    def held(self, lock: str) -> bool:
        return self.now < self.free_at.get(lock, 0.0)

    def run(self, argv: list[str]) -> tuple[int, str, str]:
        self.calls.append((self.now, argv))
        self.now += self.takes
        if argv[:2] == ["apt-get", "update"]:
            return answer("update-lists-held" if self.held("lists") else "update-free")
        if argv[0] == "apt-mark":
            return answer("apt-mark-frontend-held" if self.held("frontend") else "update-free")
        timeouts = [int(word.split("=", 1)[1]) for word in argv if word.startswith("DPkg::Lock::Timeout=")]
        timeout = timeouts[0] if timeouts else 0
        if self.held("frontend"):
            left = self.free_at["frontend"] - self.now
            if left > timeout:  # apt waits the whole timeout, a line a second, then gives up
                self.now += timeout
                rc, out, err = answer("install-frontend-held-times-out" if timeout else "install-frontend-held")
                waiting = out.splitlines()[:1] * timeout
                return rc, "\n".join(waiting) + ("\n" if waiting else ""), err
            self.now += left
            rc, out, err = answer("install-frontend-held-waits")
            lines = out.splitlines()
            return rc, "\n".join(lines[:1] * math.ceil(left) + [line for line in lines if "Waiting" not in line]), err
        if self.held("archives"):
            return answer("install-archives-held")
        return answer("install-lists-held")


INSTALL = ["apt-get", "install", "--yes", "--no-install-recommends", "haproxy"]


def waiting_for(host: FakeApt, timeout: float = 300) -> apt_lock.LockWait:
    return apt_lock.LockWait(host.run, timeout=timeout, clock=host.clock, sleep=host.sleep)


def test_update_is_tried_again_every_2_s_while_the_lists_lock_is_held_then_runs():
    host = FakeApt({"lists": 20})
    locks = waiting_for(host)
    rc, _, _ = locks.run(["apt-get", "update", "-q"])
    assert rc == 0
    assert [round(at, 1) for at, _ in host.calls] == [round(n * 2.1, 1) for n in range(11)]  # 2 s apart, 0.1 s each
    assert all(argv == ["apt-get", "update", "-q"] for _, argv in host.calls)  # no option it would ignore
    assert round(locks.waited) == 21 and locks.held_by == LISTS_LINE
    assert apt_lock.waited_note(locks) == f' after waiting 21 s for apt\'s lock ("{LISTS_LINE}")'


def test_update_past_the_bound_fails_with_one_sentence_naming_the_holder_and_the_wait():
    host = FakeApt({"lists": 1000})
    with pytest.raises(apt_lock.Busy) as busy:
        waiting_for(host, timeout=5).run(["apt-get", "update", "-q"])
    assert str(busy.value) == (
        'The package manager is busy: `apt-get update` waited 5 s for apt\'s lock, and another process still holds '
        f'it ("{LISTS_LINE}") - let that process finish (often unattended-upgrades or apt-daily), or stop it, then '
        "run again")
    assert host.now == pytest.approx(5.1)  # the last try at the bound, none after it


def test_install_waits_for_the_dpkg_lock_itself_given_the_time_left():
    host = FakeApt({"frontend": 7.5})
    locks = waiting_for(host, timeout=60)
    rc, out, _ = locks.run(INSTALL, apt_waits=True)
    assert rc == 0 and "Setting up haproxy" in out
    ((_, argv),) = host.calls  # one try: apt waited
    assert argv == ["apt-get", "-o", "DPkg::Lock::Timeout=60", *INSTALL[1:]]
    # apt's waiting lines (one a second), at most the time it ran
    assert locks.waited == pytest.approx(7.5) and "lock-frontend. It is held by process 181 (python3)" in locks.held_by


def test_install_past_the_bound_names_the_holder_from_apts_waiting_lines():
    host = FakeApt({"frontend": 1000})
    with pytest.raises(apt_lock.Busy) as busy:
        waiting_for(host, timeout=30).run(INSTALL, apt_waits=True)
    assert len(host.calls) == 1  # apt waited the 30 s itself: no second try
    assert "`apt-get install` waited 30 s" in str(busy.value)
    assert '("Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 437 (python3)")' in str(busy.value)


def test_the_archives_lock_which_apt_does_not_wait_for_is_tried_again():
    host = FakeApt({"archives": 5})
    locks = waiting_for(host)
    assert locks.run(INSTALL, apt_waits=True)[0] == 0
    assert len(host.calls) == 4 and "/var/cache/apt/archives/lock. It is held by process 503" in locks.held_by
    # each try is given what is left of the bound
    assert [argv[2] for _, argv in host.calls] == ["DPkg::Lock::Timeout=300", "DPkg::Lock::Timeout=297",
                                                   "DPkg::Lock::Timeout=295", "DPkg::Lock::Timeout=293"]


def test_the_bound_is_shared_by_the_tasks_commands():
    host = FakeApt({"lists": 8, "frontend": 1000})
    locks = waiting_for(host, timeout=20)
    assert locks.run(["apt-get", "update", "-q"])[0] == 0
    with pytest.raises(apt_lock.Busy) as busy:
        locks.run(INSTALL, apt_waits=True)
    # update took 8.4 s of the 20: install was given 11, which apt waited, then it gave up: no second try
    assert host.calls[-1][1][2] == "DPkg::Lock::Timeout=11" and host.calls[-2][1][1] == "update"
    assert locks.waited == pytest.approx(19.5) and host.now == pytest.approx(19.6)  # all but the update that ran
    assert "`apt-get install` waited 20 s" in str(busy.value) and "lock-frontend" in str(busy.value)


def test_apt_mark_refused_by_dpkgs_lock_is_tried_again():
    host = FakeApt({"frontend": 3})
    locks = waiting_for(host)
    assert locks.run(["apt-mark", "hold", "haproxy"])[0] == 0
    assert len(host.calls) == 3 and locks.held_by == "dpkg frontend lock was locked by another process with pid 782"


def test_a_failure_of_another_kind_is_returned_at_once():
    calls = []

    def run(argv):
        calls.append(argv)
        return 100, "Reading package lists...\n", "E: Unable to locate package nosuch\n"

    locks = apt_lock.LockWait(run, sleep=lambda seconds: pytest.fail("slept"))
    assert locks.run(["apt-get", "install", "--yes", "nosuch"], apt_waits=True)[0] == 100
    assert len(calls) == 1 and locks.held_by is None and apt_lock.waited_note(locks) == ""


def test_no_bound_means_one_try():
    host = FakeApt({"lists": 10})
    with pytest.raises(apt_lock.Busy, match="waited 0 s"):
        waiting_for(host, timeout=0).run(["apt-get", "update"])
    assert len(host.calls) == 1


# ------------------------------------------------------------------ the module, as Ansible runs it


def ansible_env(tmp_path: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("ANSIBLE_", "VIRTUAL_ENV"))}
    env.update(ANSIBLE_COLLECTIONS_PATH=str(collections_dir(tmp_path / "collections")),
               ANSIBLE_HOME=str(tmp_path / "ansible-home"), ANSIBLE_LOCALHOST_WARNING="false", NO_COLOR="1")
    return env


def ad_hoc(tmp_path: Path, arguments: dict, *options: str) -> tuple[int, dict]:
    tree = tmp_path / "tree"
    done = subprocess.run(
        [str(Path(sys.executable).parent / "ansible"), "localhost", "-c", "local", "-e",
         f"ansible_python_interpreter={sys.executable}", "-t", str(tree), "-m", f"{COLLECTION}.apt_packages",
         "-a", json.dumps(arguments), *options],
        env=ansible_env(tmp_path), capture_output=True, text=True, timeout=120)
    return done.returncode, json.loads((tree / "localhost").read_text())


def test_check_mode_says_what_it_would_install_and_runs_no_apt(tmp_path):
    rc, result = ad_hoc(tmp_path, {"packages": ["dpkg", "vp-no-such-package", "coreutils=0.0-vp"]}, "--check")
    assert rc == 0, result
    assert result["changed"] is True and result["commands"] == []
    assert result["installed"] == ["vp-no-such-package", "coreutils=0.0-vp"]
    assert result["found"]["vp-no-such-package"] is None and result["found"]["dpkg"]
    assert result["msg"] == f"would install vp-no-such-package, coreutils=0.0-vp (now {result['found']['coreutils']})"


def test_what_is_installed_already_is_left_alone_without_apt(tmp_path):
    rc, result = ad_hoc(tmp_path, {"packages": ["dpkg", "coreutils"], "lock_timeout": 5})
    assert rc == 0, result
    assert (result["changed"], result["installed"], result["commands"]) == (False, [], [])
    assert result["msg"] == "installed already: dpkg, coreutils"


def test_what_is_not_a_package_is_refused_before_anything_runs(tmp_path):
    rc, result = ad_hoc(tmp_path, {"packages": ["-o", "APT::Get::Fix-Broken=1", "haproxy"]}, "--check")
    assert rc != 0 and result["commands"] == []
    assert result["msg"] == ("not a package (NAME or NAME=VERSION, Debian's names and versions): '-o', "
                             "'APT::Get::Fix-Broken=1'")


def test_the_module_documentation_renders(tmp_path):
    module = f"{COLLECTION}.apt_packages"
    doc = subprocess.run([str(Path(sys.executable).parent / "ansible-doc"), "--type", "module", "--json", module],
                         env=ansible_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert doc.returncode == 0, doc.stderr
    entry = json.loads(doc.stdout)[module]
    assert set(entry["doc"]["options"]) == {"packages", "update_cache", "install_recommends", "allow_downgrades",
                                            "allow_change_held_packages", "lock_timeout"}
    assert entry["doc"]["options"]["lock_timeout"]["default"] == apt_lock.LOCK_TIMEOUT_S
    assert entry["doc"]["attributes"]["check_mode"]["support"] == "full"
    assert set(entry["return"]) == {"installed", "found", "waited", "held_by", "commands", "msg"}
