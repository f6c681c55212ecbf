# SPDX-License-Identifier: Apache-2.0
# Part of vllm-provision (role apply_lock). Runs on the controller: who this run is, and how long to wait.
"""The controller's half of module apply_lock: names this run (the ansible-playbook process on this controller),
asks the host for its lock, breaks a lock whose run is gone from this controller, and waits up to `wait` seconds
for one held by a live run; then fails, naming the holder."""

from __future__ import annotations

import os
import time

from ansible.plugins.action import ActionBase
from ansible_collections.vllm_provision.gpu_host.plugins.module_utils.apply_lock_run import gone_from_here, run_of

MODULE = "vllm_provision.gpu_host.apply_lock"
POLL_S = 5


def this_run() -> dict:
    """This run: the ansible-playbook process this task runs under (provision apply names it the same way)."""
    return run_of(playbook_pid())


def playbook_pid() -> int:
    """The ansible-playbook process this task runs under (its workers are forks of it, with its command line)."""
    pid = os.getpid()
    try:
        while _is_playbook(_parent(pid)):
            pid = _parent(pid)
    except (OSError, ValueError):
        pass
    return pid


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as handle:
        return int(handle.read().rsplit(")", 1)[1].split()[1])


def _is_playbook(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return any(os.path.basename(arg) == b"ansible-playbook" for arg in handle.read().split(b"\0")[:3])
    except OSError:
        return False


def describe(holder: dict) -> str:
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(holder.get("started", 0))))
    return (f"{holder.get('user', '?')} from {holder.get('controller', '?')} (pid {holder.get('pid', '?')}), "
            f"since {since}")


class ActionModule(ActionBase):
    _requires_connection = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        wait = int(args.pop("wait", 0) or 0)
        args.setdefault("run", this_run())
        deadline = time.monotonic() + wait
        while True:
            answer = self._execute_module(module_name=MODULE, module_args=args, task_vars=task_vars)
            if answer.get("failed") or answer.get("acquired") or args.get("state", "acquired") != "acquired":
                break
            holder = answer["holder"]
            if gone_from_here(holder) and args.get("break_run") != holder["id"]:
                args["break_run"] = holder["id"]
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                answer.update(failed=True, msg=(
                    f"another apply holds this host: {describe(holder)}, renewed {holder.get('age', '?')} s ago; "
                    + (f"waited {wait} s. " if wait else "")
                    + "wait for it with `provision apply --wait-lock SECONDS` (plain Ansible: -e apply_lock_wait="
                    f"SECONDS); a run that is gone without giving it back loses it {holder.get('lease', '?')} s after "
                    "it last renewed it, or at once to the next run from its own controller"))
                break
            time.sleep(min(POLL_S, left))
        result.update(answer)
        if answer.get("took_over"):
            result["warnings"] = [f"took over the apply lock of {describe(answer['holder'])}: {answer['took_over']}"]
        return result
