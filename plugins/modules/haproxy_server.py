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
author: vllm-provision
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
attributes:
  check_mode:
    support: full
    details: Reads the server's state, sets nothing and does not wait; predicts C(changed).
  diff_mode:
    support: full
    details: The administrative state before and after, e.g. C(ready) then C(drain).
  platform:
    platforms: posix
notes:
  - Needs access to the socket (C(become), or a user of group C(haproxy) for role gateway's C(mode 660)).
  - Prefer O(state=drain) for a restart - HAProxy keeps checking a drained server, so its status follows the
    restart. A server in C(maint) is not checked, and leaving C(maint) counts it C(UP) at once
    (C(UP 1/2), before any check); O(wait) then lasts until its first check passes.
  - The runtime state lives in the haproxy process - a reload forgets it (role gateway keeps no server-state file),
    and the sessions an old process still finishes after a reload are not counted.
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
msg:
  description: What was done, in one line.
  returned: always
  type: str
  sample: "public-0/chat-2: ready -> drain; drained after 2.9 s"
"""

import csv
import re
import socket
import time

from ansible.module_utils.basic import AnsibleModule

# srv_admin_state's bits (HAProxy's management guide, "show servers state")
MAINT_BITS = 0x01 | 0x02 | 0x04 | 0x20  # forced, inherited (tracked server), configured, DNS resolution
DRAIN_BITS = 0x08 | 0x10  # forced, inherited
NAME = re.compile(r"^[A-Za-z0-9_.:-]+$")  # HAProxy's names; anything else could smuggle a second command


class Failure(Exception):
    """A message for the user (the task fails with it), and what the task returns with it."""

    def __init__(self, message, result=None):
        super().__init__(message)
        self.result = result or {}


class Missing(Failure):
    """HAProxy is not running, or has no such backend or server: with missing=ignore, nothing to do."""


def ask(path, command, timeout=10.0):
    """One command on the admin socket: HAProxy answers, then closes (non-interactive mode)."""
    fix = "start haproxy (systemctl start haproxy), or set the module's socket option to its stats socket"
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(timeout)
            connection.connect(path)
            connection.sendall(command.encode() + b"\n")
            chunks = []
            while True:
                chunk = connection.recv(65536)
                if not chunk:
                    return b"".join(chunks).decode("utf-8", "replace")
                chunks.append(chunk)
    except FileNotFoundError:
        raise Missing("HAProxy's admin socket %s does not exist: haproxy is not running, or its configuration has no"
                      " 'stats socket %s level admin' - %s" % (path, path, fix))
    except PermissionError:
        raise Failure("HAProxy's admin socket %s: permission denied - run the task as root (become: true) or as a"
                      " member of the socket's group (haproxy)" % path)
    except ConnectionRefusedError:
        raise Missing("HAProxy's admin socket %s refuses connections: haproxy is not running (the socket file is"
                      " left over) - %s" % (path, fix))
    except socket.timeout:
        raise Failure("HAProxy's admin socket %s did not answer '%s' within %g s" % (path, command, timeout))
    except OSError as error:
        raise Failure("HAProxy's admin socket %s: %s - %s" % (path, error.strerror or error, fix))


def parse_stat(text):
    """`show stat` CSV: one dict per row, keyed by the header's names (their order changes between versions)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines or not lines[0].startswith("# "):
        raise Failure("HAProxy answered 'show stat' with: %s" % text.strip())
    names, *rows = csv.reader([lines[0][2:]] + lines[1:])  # a check's text may hold a quoted comma
    return [dict(zip(names, row)) for row in rows]


def parse_servers_state(text):
    """`show servers state BACKEND`: a version line, a '# ' header of names, one space-separated row per server."""
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) < 2 or lines[0].strip() != "1" or not lines[1].startswith("# "):
        raise Failure("HAProxy answered 'show servers state' with: %s" % text.strip())
    names = lines[1][2:].split()
    return [dict(zip(names, line.split())) for line in lines[2:] if not line.startswith("#")]


def admin_state(bits):
    """srv_admin_state (an int) as the word `set server ... state` takes."""
    if bits & MAINT_BITS:
        return "maint"
    if bits & DRAIN_BITS:
        return "drain"
    return "ready"


def server_state(stat_rows, state_rows, backend, server):
    """The server's state from the two answers; Failure naming what exists when it does not."""
    backends = [row["pxname"] for row in stat_rows if row.get("svname") == "BACKEND"]
    if backend not in backends:
        raise Missing("HAProxy has no backend '%s' (its backends: %s) - fix the backend option (role gateway names"
                      " a gateway's routes <gateway>-<index>: see /etc/haproxy/haproxy.cfg)"
                      % (backend, ", ".join(backends)))
    servers = [row["srv_name"] for row in state_rows if row.get("be_name") == backend]
    stats = [row for row in stat_rows if row.get("pxname") == backend and row.get("svname") == server]
    if server not in servers or not stats:
        raise Missing("HAProxy's backend '%s' has no server '%s' (its servers: %s) - fix the server option (role"
                      " gateway names each server after its instance)" % (backend, server, ", ".join(servers) or "none"))
    (bits,) = [int(row["srv_admin_state"]) for row in state_rows if row["srv_name"] == server]
    stat = stats[0]
    return dict(admin=admin_state(bits), status=stat["status"], sessions=int(stat["scur"] or 0),
                queue=int(stat["qcur"] or 0), check_status=stat.get("check_status", ""),
                check_code=stat.get("check_code", ""), last_check=stat.get("last_chk", ""))


def read_server(path, backend, server):
    stat_rows = parse_stat(ask(path, "show stat"))
    answer = ask(path, "show servers state %s" % backend)
    if answer.startswith("Can't find backend"):
        return server_state(stat_rows, [], backend, server)  # fails, naming the backends
    return server_state(stat_rows, parse_servers_state(answer), backend, server)


def last_check(state):
    """The last health check in one phrase: 'L7STS 503: Service Unavailable', 'L4CON: Connection refused'."""
    check = " ".join(part for part in (state["check_status"], state["check_code"]) if part) or "no check result"
    return "%s: %s" % (check, state["last_check"]) if state["last_check"] else check


def is_up(state):
    """UP with full health (not 'UP 1/2': just out of maint, or a check failed), or no check at all."""
    return state["status"] in ("UP", "no check")


def is_drained(state):
    return state["sessions"] == 0 and state["queue"] == 0


def wait_for(done, read, timeout, interval):
    """Read until done(state) or timeout seconds passed: (state, done, seconds waited)."""
    start = time.monotonic()
    while True:
        state = read()
        waited = time.monotonic() - start
        if done(state) or waited >= timeout:
            return state, done(state), round(waited, 2)
        time.sleep(min(interval, timeout - waited))


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
    path, backend, server, wanted, timeout = (
        module.params[key] for key in ("socket", "backend", "server", "state", "timeout"))
    name = "%s/%s" % (backend, server)
    for option in ("backend", "server"):
        if not NAME.match(module.params[option]):
            raise Failure("%s '%s' is not an HAProxy name (letters, digits, '-', '_', '.', ':')"
                          % (option, module.params[option]))

    def read():
        return read_server(path, backend, server)

    before = read()
    result = dict(changed=before["admin"] != wanted, found=True, before=before, after=before, waited=0.0)
    if module._diff:
        result["diff"] = dict(before="%s: %s\n" % (name, before["admin"]), after="%s: %s\n" % (name, wanted))
    if module.check_mode:
        return dict(result, msg="%s: %s %s" % (name, "would set" if result["changed"] else "already", wanted))
    if before["admin"] != wanted:
        command = "set server %s state %s" % (name, wanted)
        answer = ask(path, command).strip()
        if answer:
            hint = " - its stats socket needs 'level admin'" if "Permission denied" in answer else ""
            raise Failure("HAProxy refused '%s': %s%s" % (command, answer, hint))
        result["after"] = read()
        if result["after"]["admin"] != wanted:
            raise Failure("%s is still %s after '%s' (a tracked server's or the configuration's state wins)"
                          % (name, result["after"]["admin"], command), result)
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
    else:
        left = "%d session(s) and %d queued left" % (result["after"]["sessions"], result["after"]["queue"])
        message += "; " + left
        if module.params["wait"] and wanted == "drain":
            module.warn("%s is not drained after %d s: %s" % (name, timeout, left))
    return dict(result, drained=finished, msg=message)


if __name__ == "__main__":
    main()
