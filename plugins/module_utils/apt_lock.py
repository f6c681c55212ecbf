# SPDX-License-Identifier: Apache-2.0
# Part of vllm-provision. Runs on the target (modules apt_packages and nvidia_driver): standard library only.
"""apt's locks, waited for within a bound, then reported.

Another process may hold apt's locks when a task runs apt-get (unattended-upgrades, apt-daily's
`apt-get update`, an operator's apt): apt-get then fails at once. The commands here wait for them, at most
LOCK_TIMEOUT_S (the task's lock_timeout) for all the commands of one task together, and past that fail
with one sentence: the package manager is busy, apt's own line naming the process that holds the lock,
how long the task waited.

What apt does with its locks, seen on Debian 12 (apt 2.6.2, dpkg 1.21.23) on a lab host while another
process held each lock (an fcntl lock, as apt's own: flock(1) cannot stand in for it) - recorded by
tests/fixtures/apt/record.py into recorded.json:
- `apt-get update` takes /var/lib/apt/lists/lock and never waits for it, `-o DPkg::Lock::Timeout=20` or
  not: exit 100 at once, "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 86
  (python3)". It takes no dpkg lock (it ran while /var/lib/dpkg/lock-frontend was held). The retries
  here wait for it: again every RETRY_INTERVAL_S while apt says it could not get a lock.
- `apt-get install` with `-o DPkg::Lock::Timeout=N` waits up to N s for /var/lib/dpkg/lock-frontend and
  /var/lib/dpkg/lock itself, printing once a second on stdout "Waiting for cache lock: Could not get lock
  /var/lib/dpkg/lock-frontend. It is held by process 181 (python3)..." (not with -qq): held 6 s, it
  installed after waiting; held 30 s with N=4, it gave up after 4.0 s with only "E: Unable to acquire the
  dpkg frontend lock (/var/lib/dpkg/lock-frontend), is another process using it?" on stderr (the holder is
  named on stdout's last waiting line). Without the option it fails at once, naming the holder.
- `apt-get install` does not wait for /var/cache/apt/archives/lock (taken to download; apt-get's and
  unattended-upgrades' downloads hold it), option or not: "E: Could not get lock
  /var/cache/apt/archives/lock. It is held by process 503 (python3)" at once - retried here as the lists'.
  It takes no lists lock (it installed while /var/lib/apt/lists/lock was held).
- `apt-mark hold` runs `dpkg --set-selections`, which fails at once on either dpkg lock ("dpkg: error:
  dpkg frontend lock was locked by another process with pid 782"): retried here too.
The messages are read in the C locale: the commands run with LC_ALL=C (ENVIRONMENT).
"""

from __future__ import annotations

import re
import time

LOCK_TIMEOUT_S = 300  # how long one task waits for apt's locks, all its commands together
RETRY_INTERVAL_S = 2  # between two tries of a command apt refused for a lock it does not wait for
ENVIRONMENT = {"DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C"}

# apt's GetLock: "Could not get lock PATH. It is held by process PID (NAME)" (or no name, or nothing after PATH)
COULD_NOT_GET = re.compile(r"^E: (Could not get lock \S+?(?:\. It is held by process \d+(?: \([^)\n]*\))?)?)$", re.M)
# apt's own wait for the dpkg locks (DPkg::Lock::Timeout), a line a second on stdout
WAITING = re.compile(r"^Waiting for cache lock: (Could not get lock .*?)\.\.\.\s*$", re.M)
# apt after its own wait, when the dpkg locks stayed held
GAVE_UP = re.compile(
    r"^E: (Unable to acquire the dpkg frontend lock .*|Unable to lock the administration directory .*)$", re.M)
# dpkg's own (apt-mark runs dpkg --set-selections)
DPKG_LOCKED = re.compile(r"^dpkg: error: (dpkg (?:frontend|database) lock was locked by another process with pid \d+)$",
                         re.M)


class Busy(Exception):
    """apt's locks stayed held for the whole bound: the task fails with this sentence."""


def wait_options(seconds):
    """apt-get's options that make it wait up to `seconds` for the dpkg locks itself (apt >= 1.9.11)."""
    return ["-o", "DPkg::Lock::Timeout=%d" % max(0, int(seconds))]


def lock_line(out, err):
    """apt's (or dpkg's) line saying which lock another process holds, naming the process where it can, from a
    command's output; None when it did not fail for a lock."""
    for pattern, text in ((COULD_NOT_GET, err), (DPKG_LOCKED, err)):
        found = pattern.findall(text or "")
        if found:
            return found[-1]
    gave_up = GAVE_UP.findall(err or "")
    if gave_up:
        waiting = WAITING.findall(out or "")  # the holder, named on apt's last waiting line
        return waiting[-1] if waiting else gave_up[-1]
    return None


def command_name(argv):
    """`apt-get update`, `apt-get install`, `apt-mark hold`: the command and its verb, for messages."""
    words = [word for word in argv[1:] if not word.startswith("-") and "::" not in word]
    return " ".join([argv[0].rsplit("/", 1)[-1]] + words[:1])


class LockWait:
    """The apt commands of one task, each tried again while another process holds one of apt's locks, all of
    them within one bound (`timeout` seconds from the first command).

    run(argv) -> (rc, stdout, stderr) runs a command (AnsibleModule.run_command with ENVIRONMENT, on a host);
    `clock` and `sleep` are time's (tests pass their own)."""

    def __init__(self, run, timeout=LOCK_TIMEOUT_S, clock=time.monotonic, sleep=time.sleep, interval=RETRY_INTERVAL_S):
        self._run, self.timeout, self._clock, self._sleep, self.interval = run, timeout, clock, sleep, interval
        self._start = None
        self.waited = 0.0  # seconds spent waiting for a lock, so far
        self.held_by = None  # apt's last line naming the lock's holder, once one was seen

    def left(self):
        if self._start is None:
            self._start = self._clock()
        return max(0.0, self.timeout - (self._clock() - self._start))

    def run(self, argv, apt_waits=False):
        """Run `argv` until it does not fail for a lock, or the bound has passed: (rc, stdout, stderr) of the
        last try (a failure of another kind is the caller's to report); raises Busy when the bound passed.
        apt_waits: the command waits for the dpkg locks itself (apt-get install, remove, purge): it is given
        the time left (wait_options, after its name); the tries cover the locks it does not wait for."""
        while True:
            left = self.left()  # the bound starts with the task's first command
            tried = argv[:1] + wait_options(left) + argv[1:] if apt_waits else list(argv)
            began = self._clock()
            rc, out, err = self._run(tried)
            spent = self._clock() - began
            waiting = WAITING.findall(out or "") if apt_waits else []  # apt's own wait: a line a second
            line = lock_line(out, err) if rc != 0 else None
            if line is None:
                if waiting:
                    self.waited += min(len(waiting), spent)
                    self.held_by = waiting[-1]
                return rc, out, err
            self.waited += spent
            if not (GAVE_UP.match("E: " + line) and self.held_by):
                self.held_by = line
            # past the bound, or apt waited all that was left of it itself (but the fraction of a second)
            if self.left() <= 0 or (apt_waits and GAVE_UP.search(err or "")):
                raise Busy(busy_sentence(argv, self.waited, self.held_by))
            pause = min(self.interval, self.left())
            self._sleep(pause)
            self.waited += pause


def busy_sentence(argv, waited, held_by):
    """The task's failure once the bound has passed: the package manager is busy, apt's line, how long."""
    return ("The package manager is busy: `%s` waited %d s for apt's lock, and another process still holds it"
            " (\"%s\") - let that process finish (often unattended-upgrades or apt-daily), or stop it, then run"
            " again" % (command_name(argv), round(waited), held_by))


def waited_note(lock_wait):
    """' after waiting N s for apt's lock ("...")' where the task waited for one, else ''."""
    if not lock_wait.held_by:
        return ""
    return " after waiting %d s for apt's lock (\"%s\")" % (round(lock_wait.waited), lock_wait.held_by)
