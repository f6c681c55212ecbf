#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
# Part of vllm-provision (role rollout: capacity kept while a batch changes). Runs on the target: standard library only.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: haproxy_routes
short_description: Read an HAProxy's routes, and refuse a batch of replicas whose drain would leave a route too few
description:
  - Reads every backend's servers through HAProxy's runtime API (C(show stat), C(show servers state)) - the
    administrative state (ready, drain, maint), the health check's status, the weight and the sessions - and the
    drains vllm-provision recorded on the host (O(record_dir); module haproxy_server writes them).
  - With O(out) - the servers a batch of a rolling change is about to drain - each backend that holds one of them
    must keep at least O(min_serving) servers B(outside) the batch that serve (in rotation, weight above 0, health
    check passing); a server an operator drained or put in maintenance counts as not serving. When a backend would
    fall below, the task fails naming the route, what each other server is doing and the fix, before anything is
    drained. Nothing is ever changed.
version_added: "0.1.0"
author: vllm-provision contributors (@vllm-provision)
options:
  socket:
    description: HAProxy's admin socket (role gateway writes C(/run/haproxy/admin.sock)).
    type: path
    default: /run/haproxy/admin.sock
  record_dir:
    description: Where vllm-provision records the drains it makes (module haproxy_server's O(record_dir)).
    type: path
    default: /var/lib/vllm-provision/gateway-drains
  out:
    description: The servers the batch takes out, each C({backend, server}); extra keys (C(model)) name the route in messages.
    type: list
    elements: dict
    default: []
  min_serving:
    description:
      - Servers each backend in O(out) must keep serving outside the batch - a number, or a percentage of the backend's
        servers (rounded up). C(0) accepts that a route goes out of service.
    type: str
    default: "1"
  missing:
    description: What to do when HAProxy is not running - C(ignore) returns RV(found=false) (a gateway not set up yet has nothing to keep); C(fail) fails.
    type: str
    choices: [fail, ignore]
    default: ignore
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Read-only - the same reads and the same refusal as a real run.
  diff_mode:
    support: none
  platform:
    support: full
    platforms: posix
notes:
  - Needs access to the socket (C(become), or a member of group C(haproxy) for role gateway's C(mode 660)).
"""

EXAMPLES = r"""
- name: Refuse a batch that would leave a route without a serving replica
  vllm_provision.gpu_host.haproxy_routes:
    out:
      - {backend: public-0, server: chat-1}
      - {backend: public-0, server: chat-2}
    min_serving: "1"
  delegate_to: "{{ groups['gateway'][0] }}"
  become: true
"""

RETURN = r"""
found:
  description: Whether HAProxy runs (false only with O(missing=ignore)).
  returned: always
  type: bool
  sample: true
backends:
  description: Every backend's servers and their state.
  returned: when found
  type: dict
  sample: {public-0: {chat-1: {admin: ready, status: UP, weight: 1, sessions: 0, queue: 0, check_status: L7OK}}}
records:
  description: The drains vllm-provision recorded, by C(BACKEND/SERVER).
  returned: always
  type: dict
  sample: {public-0/chat-1: {backend: public-0, server: chat-1, state: drain, reason: "rollout: gpu1", since: 1790000000}}
routes:
  description: For each backend O(out) touches - the servers it has, those serving outside the batch, how many are needed.
  returned: when found
  type: dict
  sample: {public-0: {servers: 3, batch: [chat-1], serving: [chat-0, chat-2], needed: 1, ok: true}}
others:
  description: Servers out of rotation that vllm-provision did not take out (an operator's drain or maintenance), by C(BACKEND/SERVER).
  returned: when found
  type: dict
  sample: {public-0/chat-2: drain}
msg:
  description: The routes and what they keep, in one line.
  returned: always
  type: str
"""

import math
import re

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vllm_provision.gpu_host.plugins.module_utils.haproxy_runtime import (
    RECORD_DIR,
    Failure,
    Missing,
    is_serving,
    last_check,
    read_backends,
    read_records,
)

COUNT = re.compile(r"^([0-9]+)(%?)$")


def needed(min_serving, servers):
    """min_serving ("N" or "N%") of a backend of `servers` servers, as a count (a percentage rounded up)."""
    count = COUNT.match(min_serving)
    number = int(count.group(1))
    return int(math.ceil(servers * number / 100.0)) if count.group(2) else number


def why_not_serving(name, state, records):
    """A server out of rotation in a few words: who took it out, or what its check says."""
    if state["admin"] != "ready":
        record = records.get(name)
        who = "by vllm-provision (%s)" % record.get("reason", "") if record else "not by vllm-provision: an operator's?"
        return "%s %s" % (state["admin"], who)
    if state["weight"] == 0:
        return "weight 0"
    return "%s (%s)" % (state["status"], last_check(state))


def capacity(backends, records, out, min_serving):
    """Per backend `out` touches: what it keeps serving outside the batch; the refusals' messages."""
    routes, refusals = {}, []
    for backend in dict.fromkeys(entry["backend"] for entry in out):
        servers = backends.get(backend)
        if servers is None:
            continue  # a route the gateway does not have yet: nothing serves it to keep
        batch = [entry["server"] for entry in out if entry["backend"] == backend]
        serving = [name for name, state in servers.items() if name not in batch and is_serving(state)]
        route = dict(servers=len(servers), batch=batch, serving=serving, needed=needed(min_serving, len(servers)))
        route["ok"] = len(serving) >= route["needed"]
        routes[backend] = route
        if not route["ok"]:
            model = next((entry.get("model") for entry in out if entry["backend"] == backend and entry.get("model")), "")
            others = ["%s: %s" % (name, "serving" if name in serving else why_not_serving(
                "%s/%s" % (backend, name), state, records)) for name, state in servers.items() if name not in batch]
            refusals.append(
                "route %s%s would keep %d of its %d replicas serving while %s change%s, fewer than --min-serving %s "
                "(%d)%s - drain fewer at once (a smaller --batch), bring the others back first, or accept the outage "
                "with --min-serving 0 (rollout_min_serving)"
                % (backend, " (%s)" % model if model else "", len(serving), len(servers), ", ".join(batch),
                   "s" if len(batch) == 1 else "", min_serving, route["needed"],
                   " (the others: %s)" % "; ".join(others) if others else ""))
    return routes, refusals


def main():
    module = AnsibleModule(
        argument_spec=dict(
            socket=dict(type="path", default="/run/haproxy/admin.sock"),
            record_dir=dict(type="path", default=RECORD_DIR),
            out=dict(type="list", elements="dict", default=[]),
            min_serving=dict(type="str", default="1"),
            missing=dict(type="str", default="ignore", choices=["fail", "ignore"]),
        ),
        supports_check_mode=True,
    )
    params = module.params
    if not COUNT.match(params["min_serving"]) or (params["min_serving"].endswith("%")
                                                  and int(params["min_serving"][:-1]) > 100):
        module.fail_json(msg="min_serving '%s': give a number of replicas (0 or more) or a percentage of a route's "
                         "replicas (0%%-100%%)" % params["min_serving"])
    for entry in params["out"]:
        if not isinstance(entry.get("backend"), str) or not isinstance(entry.get("server"), str):
            module.fail_json(msg="out: each entry needs a backend and a server, got %s" % entry)
    records = read_records(params["record_dir"])
    try:
        backends = read_backends(params["socket"])
    except Missing as missing:
        if params["missing"] == "fail":
            module.fail_json(msg=str(missing), records=records)
        module.exit_json(changed=False, found=False, records=records, msg="nothing to keep: %s" % missing)
    except Failure as failure:
        module.fail_json(msg=str(failure), records=records)
    others = {"%s/%s" % (backend, name): state["admin"] for backend, servers in backends.items()
              for name, state in servers.items()
              if state["admin"] != "ready" and "%s/%s" % (backend, name) not in records}
    routes, refusals = capacity(backends, records, params["out"], params["min_serving"])
    result = dict(changed=False, found=True, backends=backends, records=records, routes=routes, others=others)
    if refusals:
        module.fail_json(msg="; ".join(refusals), **result)
    module.exit_json(msg="; ".join("%s keeps %d serving (needs %d)" % (backend, len(route["serving"]), route["needed"])
                                   for backend, route in routes.items()) or "no route touched", **result)


if __name__ == "__main__":
    main()
