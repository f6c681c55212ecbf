# SPDX-License-Identifier: Apache-2.0
# Part of vllm-provision (role apply_lock). Standard library only: the action plugin apply_lock, provision apply
# (provisioner.base.module_utils) and, sent as it is over ssh, the hosts use it.
"""Who holds a host's apply lock: a run is a process on a controller (its machine id, pid and start time), so a
run that is gone is seen from its own controller; and the give-back of a run's own lock."""

from __future__ import annotations

import fcntl
import getpass
import json
import socket
import time


def machine_id() -> str:
    try:
        with open("/etc/machine-id") as handle:
            return handle.read().strip()[:12] or socket.gethostname()
    except OSError:
        return socket.gethostname()


def process_start(pid: int):
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22): with the pid, one process."""
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def run_of(pid: int) -> dict:
    """The run that process `pid` of this controller is."""
    return {"id": "%s/%d/%s" % (machine_id(), pid, process_start(pid)), "user": getpass.getuser(),
            "controller": socket.gethostname(), "pid": pid, "started": time.time()}


def gone_from_here(holder: dict) -> bool:
    """The holder ran on this controller and its process is no more (or is another process with its pid)."""
    machine, dummy, rest = str(holder.get("id", "")).partition("/")
    pid, dummy, start = rest.partition("/")
    return machine == machine_id() and pid.isdigit() and process_start(int(pid)) != start


def release_if_ours(path: str, run_id: str) -> bool:
    """Give the lock in `path` back when run `run_id` holds it (under flock); another run's is left alone."""
    try:
        handle = open(path, "r+")
    except OSError:
        return False
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            record = json.loads(handle.read() or "{}")
        except ValueError:
            return False
        if not isinstance(record, dict) or record.get("id") != run_id:
            return False
        handle.seek(0)
        handle.truncate()
        return True
