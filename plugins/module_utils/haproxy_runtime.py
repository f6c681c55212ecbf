# SPDX-License-Identifier: Apache-2.0
# Part of vllm-provision. Runs on the target (modules haproxy_server and haproxy_routes) and in the audit
# (run there by python3 as a script): standard library only.
"""HAProxy's runtime API on its admin socket, read and parsed, and the drains vllm-provision records.

A drain or maintenance that vllm-provision makes (a rolling change, a replica lost mid-change) is recorded
on the gateway host, one file per server in RECORD_DIR, until vllm-provision puts the server back: so that
a drain left by a failed or interrupted run is known as its own (the next run puts it back once the replica
is ready, and says so), one an operator made is known as theirs (kept, and shown), and a haproxy that
restarts gets the drains back (role gateway's ExecStartPost runs this file: `reapply RECORD_DIR SOCKET`).
"""

from __future__ import annotations

import csv
import json
import os
import re
import socket
import sys
import time

RECORD_DIR = "/var/lib/vllm-provision/gateway-drains"
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


def command(path, text):
    """A command that answers nothing on success (`set server`, `shutdown sessions`): Failure on any answer."""
    answer = ask(path, text).strip()
    if answer:
        hint = " - its stats socket needs 'level admin'" if "Permission denied" in answer else ""
        raise Failure("HAProxy refused '%s': %s%s" % (text, answer, hint))


def parse_stat(text):
    """`show stat` CSV: one dict per row, keyed by the header's names (their order changes between versions)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines or not lines[0].startswith("# "):
        raise Failure("HAProxy answered 'show stat' with: %s" % text.strip())
    names, *rows = csv.reader([lines[0][2:]] + lines[1:])  # a check's text may hold a quoted comma
    return [dict(zip(names, row)) for row in rows]


def parse_servers_state(text):
    """`show servers state [BACKEND]`: a version line, a '# ' header of names, one space-separated row per server."""
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


def one_state(stat, bits):
    """A server's state from its `show stat` row and its srv_admin_state."""
    return dict(admin=admin_state(bits), status=stat["status"], sessions=int(stat["scur"] or 0),
                queue=int(stat["qcur"] or 0), weight=int(stat.get("weight") or 0),
                check_status=stat.get("check_status", ""), check_code=stat.get("check_code", ""),
                last_check=stat.get("last_chk", ""))


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
    return one_state(stats[0], bits)


def read_server(path, backend, server):
    stat_rows = parse_stat(ask(path, "show stat"))
    answer = ask(path, "show servers state %s" % backend)
    if answer.startswith("Can't find backend"):
        return server_state(stat_rows, [], backend, server)  # fails, naming the backends
    return server_state(stat_rows, parse_servers_state(answer), backend, server)


def read_backends(path):
    """Every backend's servers: {backend: {server: state}}, in HAProxy's order (two commands)."""
    stat_rows = parse_stat(ask(path, "show stat"))
    bits = {(row["be_name"], row["srv_name"]): int(row["srv_admin_state"])
            for row in parse_servers_state(ask(path, "show servers state"))}
    backends = {}
    for row in stat_rows:
        key = (row.get("pxname"), row.get("svname"))
        if key in bits:
            backends.setdefault(key[0], {})[key[1]] = one_state(row, bits[key])
    return backends


def last_check(state):
    """The last health check in one phrase: 'L7STS 503: Service Unavailable', 'L4CON: Connection refused'."""
    check = " ".join(part for part in (state["check_status"], state["check_code"]) if part) or "no check result"
    return "%s: %s" % (check, state["last_check"]) if state["last_check"] else check


def is_up(state):
    """UP with full health (not 'UP 1/2': just out of maint, or a check failed), or no check at all."""
    return state["status"] in ("UP", "no check")


def is_serving(state):
    """Takes new requests: in rotation (ready, weight above 0) and its health check passes."""
    return state["admin"] == "ready" and state["weight"] > 0 and is_up(state)


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


# ------------------------------------------------------------------ the drains vllm-provision made


def record_path(folder, backend, server):
    return os.path.join(folder, "%s.%s.json" % (backend, server))


def read_records(folder):
    """The drains recorded in `folder`: {"BACKEND/SERVER": record} (none: an empty dict)."""
    records = {}
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        return records
    for name in names:
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as stream:
                record = json.load(stream)
        except (OSError, ValueError):
            continue  # half written (a power cut): the server is drained, and so shows in the audit
        if isinstance(record, dict) and NAME.match(str(record.get("backend"))) and NAME.match(str(record.get("server"))):
            records["%s/%s" % (record["backend"], record["server"])] = record
    return records


def write_record(folder, backend, server, state, reason, host=None):
    """Record that vllm-provision set BACKEND/SERVER (an instance on `host`) to `state` (drain or maint), and why;
    written whole or not."""
    os.makedirs(folder, mode=0o755, exist_ok=True)
    path = record_path(folder, backend, server)
    record = dict(backend=backend, server=server, host=host, state=state, reason=reason, since=int(time.time()))
    temporary = "%s.%d.tmp" % (path, os.getpid())
    with open(temporary, "w", encoding="utf-8") as stream:
        json.dump(record, stream)
        stream.flush()
        os.fsync(stream.fileno())
    os.replace(temporary, path)
    return record


def remove_record(folder, backend, server):
    try:
        os.remove(record_path(folder, backend, server))
        return True
    except FileNotFoundError:
        return False


def reapply(folder, path):
    """Set each recorded server to its recorded state again (haproxy just started, with every server in
    rotation): one line per server, what was done. A server haproxy no longer has is skipped."""
    lines = []
    for name, record in read_records(folder).items():
        try:
            command(path, "set server %s state %s" % (name, record["state"]))
            lines.append("%s: %s again (recorded %s)" % (name, record["state"], record.get("reason", "")))
        except Failure as failure:
            lines.append("%s: not set: %s" % (name, failure))
    return lines


def worker_pid(path):
    """The pid of the haproxy process that answers on the socket (a reload replaces it)."""
    for line in ask(path, "show info").splitlines():
        if line.startswith("Pid:"):
            return line.split(":", 1)[1].strip()
    raise Failure("HAProxy's 'show info' names no Pid")


def save(state_file, path):
    """Write `show servers state` to `state_file` (haproxy's server-state-file), whole or not at all, and beside
    it the pid of the process it came from (`settle` waits for another one)."""
    answer = ask(path, "show servers state")
    parse_servers_state(answer)  # an answer haproxy could not load again is not written
    pid = worker_pid(path)
    for target, text in ((state_file + ".pid", pid), (state_file, answer)):
        temporary = "%s.%d.tmp" % (target, os.getpid())
        with open(temporary, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.replace(temporary, target)


def forget(state_file):
    """The saved state is loaded once, by the start or the reload right after it was saved: then it goes, so that
    a later start (after a crash, which saves nothing) cannot bring an older state back."""
    for target in (state_file, state_file + ".pid"):
        try:
            os.remove(target)
        except OSError:
            pass


def wait_for_socket(path, old_pid=None, seconds=10.0):
    """Until haproxy answers on the socket (with another process than `old_pid`, after a reload), or `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if worker_pid(path) != old_pid:
                return True
        except Failure:
            pass
        time.sleep(0.1)
    return False


def main(argv):
    """Role gateway's haproxy.service drop-in runs `save STATE SOCKET` before a reload or a stop, `settle FOLDER
    SOCKET STATE` after a reload and after a start (the state loaded: it goes; the recorded drains set again);
    the audit runs `read FOLDER SOCKET` (the backends and the records as JSON)."""
    action, folder, path = argv[1:4]
    if action == "save":
        try:
            save(folder, path)
        except (Failure, OSError) as problem:  # haproxy not running: no state to keep
            print("server state not saved: %s" % problem)
            forget(folder)
        return 0
    if action == "settle":
        state_file = argv[4]
        try:
            with open(state_file + ".pid", encoding="utf-8") as stream:
                old_pid = stream.read().strip()
        except OSError:
            old_pid = None
        if not wait_for_socket(path, old_pid):
            print("haproxy did not answer on %s: the recorded drains are set at its next start" % path)
        forget(state_file)
        print("\n".join(reapply(folder, path)))
        return 0
    try:
        print(json.dumps(dict(backends=read_backends(path), records=read_records(folder))))
    except Failure as failure:
        print(json.dumps(dict(error=str(failure), records=read_records(folder))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
