#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
# Part of vllm-provision (role rollout: the drains a rollout left behind). Runs on the target: standard library only.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: haproxy_drains
short_description: Put back the servers vllm-provision drained once they are ready, take out those whose host is lost
description:
  - Works on the drains vllm-provision recorded on a gateway host (O(record_dir); module haproxy_server writes them,
    with the replica's host) after a rolling change that failed, was interrupted or lost a host, and at the next run.
  - A server whose replica's host is in O(lost) is set to C(maint) and its sessions are shut down (HAProxy sends it
    nothing, not even health checks, and its dead sessions hold no later drain); the record stays.
  - A recorded server in C(maint) whose host is not lost goes to C(drain) - health-checked again, still no traffic.
  - A recorded server in C(drain) whose health check passes is put back in rotation and its record removed; one whose
    check fails stays drained and recorded (RV(kept) says why) - the next run tries again.
  - A server out of rotation with no record is someone else's (an operator's) - never touched, listed in RV(others).
version_added: "0.1.0"
author: vllm-provision contributors (@vllm-provision)
options:
  socket:
    description: HAProxy's admin socket.
    type: path
    default: /run/haproxy/admin.sock
  record_dir:
    description: Where the drains are recorded (module haproxy_server's O(record_dir)).
    type: path
    default: /var/lib/vllm-provision/gateway-drains
  lost:
    description: Hosts lost (unreachable) during the run - their servers go to maintenance.
    type: list
    elements: str
    default: []
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Reads, and says what a real run would do; sets nothing.
  diff_mode:
    support: none
  platform:
    support: full
    platforms: posix
"""

EXAMPLES = r"""
- name: Put back what a failed rollout left drained; take out the servers of a lost host
  vllm_provision.gpu_host.haproxy_drains:
    lost: [gpu3]
  delegate_to: gw1
"""

RETURN = r"""
restored:
  description: The servers put back in rotation (C(BACKEND/SERVER)).
  returned: always
  type: list
  elements: str
forgotten:
  description: Recorded servers someone had put back in rotation already - only their record was removed.
  returned: always
  type: list
  elements: str
maintained:
  description: The servers set to maintenance because their host was lost, with the sessions shut down.
  returned: always
  type: dict
  sample: {public-0/chat-2: 3}
kept:
  description: Recorded servers left out of rotation, and why.
  returned: always
  type: dict
  sample: {public-0/chat-1: "drain: its check fails (DOWN, L4CON: Connection refused)"}
others:
  description: Servers out of rotation that vllm-provision did not take out (an operator's), with their state.
  returned: always
  type: dict
msg:
  description: What was done, in one line.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vllm_provision.gpu_host.plugins.module_utils.haproxy_runtime import (
    RECORD_DIR,
    Failure,
    Missing,
    command,
    last_check,
    read_backends,
    read_records,
    remove_record,
    write_record,
)


def plan(backends, records, lost):
    """What to do with each recorded server, and each one someone else took out: [(name, action, why)], action one
    of maint, drain, ready, forget (the record alone: the server is back already), keep, other."""
    steps = []
    for backend, servers in backends.items():
        for server, state in servers.items():
            name = "%s/%s" % (backend, server)
            record = records.get(name)
            if record is None:
                if state["admin"] != "ready":
                    steps.append((name, "other", state["admin"]))
            elif record.get("host") in lost:
                if state["admin"] != "maint" or state["sessions"]:
                    steps.append((name, "maint", "its host %s was lost" % record.get("host")))
                else:
                    steps.append((name, "keep", "maint: its host %s was lost" % record.get("host")))
            elif state["admin"] == "maint":
                steps.append((name, "drain", "its host answers again: health-checked, no traffic yet"))
            elif state["admin"] == "ready":  # put back by someone already: only the record goes
                steps.append((name, "forget", "already in rotation"))
            elif state["status"] in ("DRAIN", "no check"):
                steps.append((name, "ready", "its check passes"))
            else:
                steps.append((name, "keep", "%s: its check fails (%s, %s)"
                              % (state["admin"], state["status"], last_check(state))))
    return steps


def main():
    module = AnsibleModule(
        argument_spec=dict(
            socket=dict(type="path", default="/run/haproxy/admin.sock"),
            record_dir=dict(type="path", default=RECORD_DIR),
            lost=dict(type="list", elements="str", default=[]),
        ),
        supports_check_mode=True,
    )
    path, folder = module.params["socket"], module.params["record_dir"]
    result = dict(changed=False, restored=[], forgotten=[], maintained={}, kept={}, others={})
    try:
        backends = read_backends(path)
    except Missing as missing:
        module.exit_json(msg="nothing to do: %s" % missing, **result)
    except Failure as failure:
        module.fail_json(msg=str(failure), **result)
    records = read_records(folder)
    for name, action, why in plan(backends, records, module.params["lost"]):
        backend, server = name.split("/", 1)
        if action == "other":
            result["others"][name] = why
            continue
        if action == "keep":
            result["kept"][name] = why
            continue
        result["changed"] = True
        if action == "forget":
            if not module.check_mode:
                remove_record(folder, backend, server)
            result["forgotten"].append(name)
            continue
        if module.check_mode:
            {"maint": result["maintained"], "drain": result["kept"]}.get(action, {})[name] = why
            if action == "ready":
                result["restored"].append(name)
            continue
        try:
            if action == "maint":
                host = records[name].get("host")
                write_record(folder, backend, server, "maint", "host %s lost mid-rollout" % host, host)
                command(path, "set server %s state maint" % name)
                result["maintained"][name] = backends[backend][server]["sessions"]
                command(path, "shutdown sessions server %s" % name)
            elif action == "drain":
                write_record(folder, backend, server, "drain", records[name].get("reason", "vllm-provision"),
                             records[name].get("host"))
                command(path, "set server %s state drain" % name)
                result["kept"][name] = "drain: " + why
            else:
                command(path, "set server %s state ready" % name)
                remove_record(folder, backend, server)
                result["restored"].append(name)
        except Failure as failure:
            module.fail_json(msg=str(failure), **result)
    words = []
    words += ["put back %s" % ", ".join(result["restored"])] if result["restored"] else []
    words += ["forgot the drain records of %s (back in rotation already)" % ", ".join(result["forgotten"])] \
        if result["forgotten"] else []
    words += ["maintenance for %s (host lost)" % ", ".join(result["maintained"])] if result["maintained"] else []
    words += ["kept out: %s" % "; ".join("%s (%s)" % item for item in result["kept"].items())] if result["kept"] else []
    words += ["not ours, kept: %s" % "; ".join("%s (%s)" % item for item in result["others"].items())] if result["others"] else []
    module.exit_json(msg="; ".join(words) or "nothing to do", **result)


if __name__ == "__main__":
    main()
