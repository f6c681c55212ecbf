#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
# Part of vllm-provision (role gateway: rolling restarts behind HAProxy). Runs on the target: standard library only.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: haproxy_server
short_description: Drain a replica out of an HAProxy backend, or put it back once its health check passes
description:
  - Sets the administrative state of one O(server) of one O(backend) through HAProxy's runtime API
    (C(set server BACKEND/SERVER state ready|drain|maint)) on its admin socket, for rolling restarts
    without a failed request - drain each replica of an instance, restart the instance, put it back.
  - O(state=drain) - no new request goes to the server; the ones in flight finish. With O(wait), waits until
    the server has no session and no queued request left (C(show stat) C(scur) and C(qcur)); when
    O(timeout) passes first the task does not fail - it returns RV(drained=false) and the sessions left.
  - O(state=ready) - the server takes requests again. With O(wait), waits until HAProxy's health check says it
    is C(UP) (C(show stat) C(status) C(UP) exactly, or C(no check) for a server without checks); when
    O(timeout) passes first the task fails, naming the server, its status and its last check.
  - O(state=maint) - no request, no health check; returns at once.
  - The administrative state is read from C(show servers state BACKEND) (C(srv_admin_state)'s bits - forced,
    inherited or configured maintenance, forced or inherited drain); C(show stat)'s C(status) would hide
    a drain while the server is C(DOWN).
version_added: "0.1.0"
author: vllm-provision contributors (@vllm-provision)
options:
  socket:
    description: HAProxy's admin socket (C(stats socket PATH level admin) in haproxy.cfg; role gateway writes C(/run/haproxy/admin.sock)).
    type: path
    default: /run/haproxy/admin.sock
  backend:
    description: The backend, e.g. C(public-0) (role gateway names a gateway's routes C(GATEWAY-INDEX)).
    type: str
    required: true
  server:
    description: The server in that backend (role gateway names each one after its instance).
    type: str
    required: true
  state:
    description: The administrative state to set.
    type: str
    choices: [ready, drain, maint]
    required: true
  wait:
    description: For O(state=drain), wait until the server has no session left; for O(state=ready), until it is C(UP).
    type: bool
    default: true
  timeout:
    description: How long to wait, in seconds.
    type: int
    default: 60
  poll_interval:
    description: Seconds between two reads of the server's state while waiting.
    type: float
    default: 0.5
  missing:
    description:
      - What to do when HAProxy is not running (no socket, or one nobody listens on) or has no such backend or server.
      - C(fail) fails naming what exists and the fix; C(ignore) changes nothing and returns RV(found=false) - a rolling
        change drains a replica that a gateway not set up yet, or a route not written yet, does not have.
    type: str
    choices: [fail, ignore]
    default: fail
  shutdown_sessions:
    description:
      - For O(state=drain) or O(state=maint) - when sessions are left once O(timeout) passes (or at once for
        O(state=maint)), end them (C(shutdown sessions server BACKEND/SERVER)) - a drain is bounded, and the dead
        sessions of a lost replica hold no later drain. Returns RV(shutdown).
    type: bool
    default: false
  record_dir:
    description:
      - Where vllm-provision records the drains it makes on this host (one file per server; role gateway re-applies
        them when haproxy starts, the audit reads them). Unset - nothing recorded, every server is set as asked.
      - Set - O(state=drain) or O(state=maint) records the server before it sets it. A server already out of rotation
        with no record is someone else's (an operator's) - it is kept as it is, and RV(owned) is false.
        O(state=ready) removes the record once the server is back in rotation.
    type: path
  reason:
    description: Why the server is taken out, kept in its record (shown by the audit and the next run).
    type: str
    default: vllm-provision
  host:
    description: The host of the server's replica, kept in its record (a later run puts back the servers of a host it reaches).
    type: str
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Reads the server's state, sets nothing and does not wait; predicts C(changed).
  diff_mode:
    support: full
    details: The administrative state before and after, e.g. C(ready) then C(drain).
  platform:
    support: full
    platforms: posix
notes:
  - Needs access to the socket (C(become), or a user of group C(haproxy) for role gateway's C(mode 660)).
  - Prefer O(state=drain) for a restart - HAProxy keeps checking a drained server, so its status follows the
    restart. A server in C(maint) is not checked, and leaving C(maint) counts it C(UP) at once
    (C(UP 1/2), before any check); O(wait) then lasts until its first check passes.
  - The runtime state lives in the haproxy process; role gateway saves it before a reload or a stop and loads it at
    start (C(server-state-file)), and re-applies the recorded drains (O(record_dir)) when haproxy starts - a crash
    saves nothing. The sessions an old process still finishes after a reload are not counted.
"""

EXAMPLES = r"""
- name: Take chat-2 out of its route; the requests in flight finish
  vllm_provision.gpu_host.haproxy_server:
    backend: public-0
    server: chat-2
    state: drain
    timeout: 120
  delegate_to: "{{ groups['gateway'][0] }}"
  become: true
  register: drained

- name: Put it back once HAProxy's health check passes (fails after 300 s)
  vllm_provision.gpu_host.haproxy_server:
    backend: public-0
    server: chat-2
    state: ready
    timeout: 300
  delegate_to: "{{ groups['gateway'][0] }}"
  become: true
"""

RETURN = r"""
before:
  description: The server before the task - administrative state, C(show stat)'s status, current sessions and queue, last check.
  returned: always
  type: dict
  sample: {admin: ready, status: UP, sessions: 1, queue: 0, check_status: L7OK, check_code: "200", last_check: ""}
after:
  description: The same when the task ended (in check mode, as before).
  returned: always
  type: dict
  sample: {admin: drain, status: DRAIN, sessions: 0, queue: 0, check_status: L7OK, check_code: "200", last_check: ""}
found:
  description: Whether HAProxy runs and has the server (false only with O(missing=ignore); then nothing else is returned but RV(msg)).
  returned: always
  type: bool
  sample: true
drained:
  description: For O(state=drain) or O(state=maint), whether the server had no session and no queued request left at the end.
  returned: when state is drain or maint, outside check mode
  type: bool
  sample: true
waited:
  description: Seconds spent waiting (0 without O(wait) and in check mode).
  returned: always
  type: float
  sample: 2.9
owned:
  description: With O(record_dir) - whether the server's drain or maintenance is vllm-provision's (recorded) after the task.
  returned: when record_dir is set and the server was found
  type: bool
  sample: true
shutdown:
  description: With O(shutdown_sessions) - how many sessions were left and shut down.
  returned: when sessions were shut down
  type: int
  sample: 2
msg:
  description: What was done, in one line.
  returned: always
  type: str
  sample: "public-0/chat-2: ready -> drain; drained after 2.9 s"
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vllm_provision.gpu_host.plugins.module_utils.haproxy_runtime import (
    NAME,
    Failure,
    Missing,
    command,
    is_drained,
    is_up,
    last_check,
    read_records,
    read_server,
    remove_record,
    wait_for,
    write_record,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            socket=dict(type="path", default="/run/haproxy/admin.sock"),
            backend=dict(type="str", required=True),
            server=dict(type="str", required=True),
            state=dict(type="str", required=True, choices=["ready", "drain", "maint"]),
            wait=dict(type="bool", default=True),
            timeout=dict(type="int", default=60),
            poll_interval=dict(type="float", default=0.5),
            missing=dict(type="str", default="fail", choices=["fail", "ignore"]),
            shutdown_sessions=dict(type="bool", default=False),
            record_dir=dict(type="path"),
            reason=dict(type="str", default="vllm-provision"),
            host=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    try:
        module.exit_json(**run(module))
    except Missing as missing:
        if module.params["missing"] == "fail":
            module.fail_json(msg=str(missing), **missing.result)
        module.exit_json(changed=False, found=False, waited=0.0, msg="nothing to do: %s" % missing)
    except Failure as failure:
        module.fail_json(msg=str(failure), **failure.result)


def run(module):
    """The task's result; Failure(message, result) when it fails."""
    path, backend, server, wanted, timeout, folder = (
        module.params[key] for key in ("socket", "backend", "server", "state", "timeout", "record_dir"))
    name = "%s/%s" % (backend, server)
    for option in ("backend", "server"):
        if not NAME.match(module.params[option]):
            raise Failure("%s '%s' is not an HAProxy name (letters, digits, '-', '_', '.', ':')"
                          % (option, module.params[option]))

    def read():
        return read_server(path, backend, server)

    before = read()
    recorded = folder is not None and name in read_records(folder)
    # with records: a server out of rotation that vllm-provision did not take out is someone else's: kept
    kept = folder is not None and wanted != "ready" and before["admin"] != "ready" and not recorded
    target = before["admin"] if kept else wanted
    result = dict(changed=before["admin"] != target, found=True, before=before, after=before, waited=0.0)
    if folder is not None:
        result["owned"] = recorded or (wanted != "ready" and not kept)
    if module._diff:
        result["diff"] = dict(before="%s: %s\n" % (name, before["admin"]), after="%s: %s\n" % (name, target))
    if module.check_mode:
        return dict(result, msg="%s: %s %s" % (name, "would set" if result["changed"] else "already", target)
                    + ("; kept: not taken out by vllm-provision" if kept else ""))
    if kept:
        return dict(result, drained=is_drained(before),
                    msg="%s: %s, kept: not taken out by vllm-provision (an operator's?)" % (name, before["admin"]))
    if folder is not None and wanted != "ready":  # recorded first: a run cut off here still knows it is ours
        write_record(folder, backend, server, wanted, module.params["reason"], module.params["host"])
    if before["admin"] != wanted:
        command(path, "set server %s state %s" % (name, wanted))
        result["after"] = read()
        if result["after"]["admin"] != wanted:
            raise Failure("%s is still %s after 'set server %s state %s' (a tracked server's or the configuration's"
                          " state wins)" % (name, result["after"]["admin"], name, wanted), result)
    if folder is not None and wanted == "ready":
        remove_record(folder, backend, server)
    done = is_up if wanted == "ready" else is_drained
    finished = done(result["after"])
    if module.params["wait"] and wanted != "maint":
        result["after"], finished, result["waited"] = wait_for(done, read, timeout, module.params["poll_interval"])
    result["changed"] = before["admin"] != result["after"]["admin"]
    message = "%s: %s" % (name, " -> ".join(dict.fromkeys((before["admin"], result["after"]["admin"]))))
    if wanted == "ready":
        if module.params["wait"] and not finished:
            # while a check runs its status has a '* ' and its code and text are blank: name the one that ended
            last = wait_for(lambda state: not state["check_status"].startswith("* "), read, 5, 0.05)[0]
            raise Failure("%s is not UP after %d s (%s, %s)" % (name, timeout, last["status"], last_check(last)),
                          result)
        return dict(result, msg=message + ("; UP after %g s" % result["waited"] if result["waited"] else ""))
    if finished:
        message += "; drained" + (" after %g s" % result["waited"] if result["waited"] else "")
    elif module.params["shutdown_sessions"]:
        left = result["after"]["sessions"]
        command(path, "shutdown sessions server %s" % name)
        result["after"], finished, dummy = wait_for(is_drained, read, 5, 0.1)
        result["shutdown"] = left
        message += "; %d session(s) shut down%s" % (left, " after %g s" % result["waited"] if result["waited"] else "")
    else:
        left = "%d session(s) and %d queued left" % (result["after"]["sessions"], result["after"]["queue"])
        message += "; " + left
        if module.params["wait"] and wanted == "drain":
            module.warn("%s is not drained after %d s: %s" % (name, timeout, left))
    return dict(result, drained=finished, msg=message)


if __name__ == "__main__":
    main()
