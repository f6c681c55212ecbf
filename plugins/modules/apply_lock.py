#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
# Part of vllm-provision (role apply_lock: one apply per host at a time). Runs on the target: standard library only.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: apply_lock
short_description: Take, renew or give back a host's apply lock - one vllm-provision run on a host at a time
description:
  - The lock is a record in O(path) - which run holds it (O(run)), since when, when it last renewed it, for how long
    (O(lease)) - read and written under C(flock) on that file, so two runs that ask at once get one answer each.
  - C(state=acquired) takes it when no run holds it, when this run already does, when the holder's lease ran out
    (renewed more than O(lease) seconds ago), or when the holder is O(break_run) (its action plugin found that run
    gone on this controller). Otherwise RV(acquired) is false and RV(holder) says who holds it; the action plugin of
    the same name waits or refuses (it never fails here).
  - C(state=renewed) renews this run's lease, and fails when another run holds the lock (it took over an expired lease).
  - C(state=released) gives the lock back when this run holds it, and leaves another run's alone.
  - The lock is bookkeeping of the run, not the host's configuration - it never reports a change.
version_added: "0.1.0"
author: vllm-provision contributors (@vllm-provision)
options:
  state:
    description: Take, renew or give back the lock.
    type: str
    choices: [acquired, renewed, released]
    default: acquired
  run:
    description: This run - C(id) (unique per run), C(user), C(controller), C(pid) (the run's process on its
      controller), C(started) (epoch seconds). The action plugin of the same name sets it.
    type: dict
    default: {}
  lease:
    description: Seconds a holder that does not renew keeps the lock.
    type: int
    default: 3600
  break_run:
    description: The id of a run known to be gone; its lock is taken over.
    type: str
  path:
    description: The lock's record.
    type: path
    default: /var/lib/vllm-provision/apply.lock
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Says whether the lock would be taken or who holds it; writes nothing.
  diff_mode:
    support: none
  platform:
    support: full
    platforms: posix
"""

EXAMPLES = r"""
- name: Take the host's apply lock (the action plugin fills in the run and waits up to apply_lock_wait seconds)
  vllm_provision.gpu_host.apply_lock:
    state: acquired
"""

RETURN = r"""
acquired:
  description: Whether this run holds the lock now (in check mode - would hold it).
  returned: always
  type: bool
holder:
  description: The run that holds the lock when this one could not take it, or the one whose lock was taken over
    (RV(took_over)) - C(id), C(user), C(controller), C(pid), C(started), C(renewed), C(lease), and C(age) (seconds
    since it renewed).
  returned: when another run holds or held it
  type: dict
took_over:
  description: Why the lock was taken from another run - its lease ran out, or it is gone.
  returned: when the lock was taken from another run
  type: str
"""

import fcntl
import json
import os
import time

from ansible.module_utils.basic import AnsibleModule

RUN_FIELDS = ("id", "user", "controller", "pid", "started")


def read_record(handle) -> dict | None:
    handle.seek(0)
    text = handle.read()
    try:
        record = json.loads(text) if text.strip() else None
    except ValueError:
        return None  # a torn or foreign file holds no lock
    return record if isinstance(record, dict) and record.get("id") else None


def write_record(handle, record: dict | None) -> None:
    handle.seek(0)
    handle.truncate()
    if record is not None:
        handle.write(json.dumps(record, sort_keys=True))
    handle.flush()
    os.fsync(handle.fileno())


def decide(state: str, current: dict | None, run: dict, lease: int, break_run: str | None, now: float):
    """(the record to write, or None to leave it; the result) for `state` over `current`."""
    held = current is not None and current["id"] != run["id"]
    expired = held and now - float(current.get("renewed", 0)) > float(current.get("lease", lease))
    holder = dict(current, age=round(now - float(current.get("renewed", now)))) if held else None
    if state == "released":
        return ("remove" if current is not None and not held else None), dict(acquired=False)
    if state == "renewed":
        if held:
            return None, dict(acquired=False, holder=holder,
                              failed=True, msg="the apply lock was taken over by another run: %s" % describe(holder))
        return dict(run, started=(current or run).get("started", now), renewed=now, lease=lease), dict(acquired=True)
    if held and not expired and current["id"] != break_run:
        return None, dict(acquired=False, holder=holder)
    result = dict(acquired=True)
    if held:
        result.update(holder=holder, took_over="its lease ran out" if expired else "that run is gone")
    started = current["started"] if current is not None and not held else run.get("started", now)
    return dict(run, started=started, renewed=now, lease=lease), result


def describe(holder: dict) -> str:
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(holder.get("started", 0))))
    return "%s from %s (pid %s), since %s, renewed %s s ago" % (
        holder.get("user", "?"), holder.get("controller", "?"), holder.get("pid", "?"), since, holder.get("age", "?"))


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", choices=["acquired", "renewed", "released"], default="acquired"),
            run=dict(type="dict", default={}),
            lease=dict(type="int", default=3600),
            break_run=dict(type="str"),
            path=dict(type="path", default="/var/lib/vllm-provision/apply.lock"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    run = {key: params["run"].get(key) for key in RUN_FIELDS}
    if not run["id"]:
        module.fail_json(msg="run.id is required: the run's unique id (the action plugin apply_lock sets it)")
    path = params["path"]
    if not os.path.exists(path):
        if module.check_mode or params["state"] != "acquired":
            module.exit_json(changed=False, acquired=params["state"] != "released")
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    with open(path, "a+" if not module.check_mode else "r") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        current = read_record(handle)
        record, result = decide(params["state"], current, run, params["lease"], params["break_run"], time.time())
        if record is not None and not module.check_mode:
            write_record(handle, None if record == "remove" else record)
    if result.pop("failed", False):
        module.fail_json(changed=False, **result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
