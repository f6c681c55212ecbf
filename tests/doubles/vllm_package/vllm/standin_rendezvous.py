"""TEST DOUBLE: the rendezvous of vLLM's multi-node launcher (`vllm serve … --nnodes N --node-rank R
--master-addr A --master-port P`, `--headless` on the nodes of rank ≥ 1), small enough to read, matched to what
the real one needs before node rank 0 serves.

What it is matched to (vLLM 0.25.0): vllm/entrypoints/cli/serve.py (`run_headless`: a node of rank > 0 runs
only its workers, a MultiprocExecutor joining the torch.distributed group whose store is at
--master-addr:--master-port), vllm/v1/executor/multiproc_executor.py (its workers and their monitor: a worker
that dies ends the executor) and torch.distributed's TCPStore (rank 0 hosts the store; the others connect,
retrying until the store answers or the timeout, and the group forms only once every rank has joined). Real
vLLM opens its API only after the engine, and with it the whole group, is up: until then /health is
connection refused; a node whose peer dies fails its collectives and exits non-zero.

The stand-in's handshake, one JSON line each way over TCP:
- node rank 0 listens on the master port (every address, as TCPStore's server) and waits until every rank
  1…N-1 has sent `{"rank", "nnodes", "version", "model"}` matching its own nnodes, vLLM version and model;
  then it answers each `{"ok": true}`, and only then starts its API (so /health answers 200 only once the
  group is complete). A follower that sends a wrong rank, nnodes, version or model gets `{"ok": false,
  "error": …}`: both print `rendezvous: …` on stderr and exit 1.
- a follower (rank ≥ 1, --headless) connects, retrying every STANDIN_RENDEZVOUS_RETRY_S (1) until the leader
  answers or STANDIN_RENDEZVOUS_TIMEOUT_S (600) passes (then exits 1), registers, and stays connected.
- once formed, each side watches the other: a follower whose leader's connection closes exits 1
  ("lost the leader"); the leader exits 1 when a follower's connection closes ("node rank R left"). systemd's
  Restart= then brings each node back to wait for the group again.
- a node rank outside 0…N-1, --headless on rank 0, or a rank ≥ 1 without it: exit 1 at start.
SIGTERM ends either side with exit 0, as vLLM's own stop.
"""

import json
import os
import socket
import sys
import threading
import time

POLL_S = 0.05


class GroupLost(Exception):
    pass


def fail(message):
    """As both sides of a failed rendezvous end: the reason on stderr, exit status 1."""
    sys.stderr.write(f"rendezvous: {message}\n")
    sys.stderr.flush()
    os._exit(1)


def say(message):
    print(f"rendezvous: {message}", flush=True)


def node_of(options):
    """(nnodes, rank, master address, master port, headless) of the command line; exits on an impossible one."""
    nnodes = int(options.get("nnodes") or 1)
    rank = int(options.get("node_rank") or 0)
    headless = bool(options.get("headless"))
    if not 0 <= rank < max(nnodes, 1):
        fail(f"node rank {rank} is not one of 0…{nnodes - 1} (--nnodes {nnodes})")
    if nnodes > 1 and rank == 0 and headless:
        fail("node rank 0 serves the API: run it without --headless")
    if rank > 0 and not headless:
        fail(f"node rank {rank} runs headless: add --headless")
    return nnodes, rank, options.get("master_addr") or "127.0.0.1", int(options.get("master_port") or 29501), headless


def lead(nnodes, port, identity, stop):
    """Node rank 0: wait for ranks 1…nnodes-1 to register with a matching identity; then watch them (a
    follower's connection closing ends this process). Returns once the group is complete; None on SIGTERM."""
    server = socket.socket(socket.AF_INET6 if socket.has_ipv6 else socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if server.family == socket.AF_INET6:
        server.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    server.bind(("", port))
    server.listen(16)
    server.settimeout(POLL_S)
    say(f"node rank 0 of {nnodes} waiting for ranks 1…{nnodes - 1} on port {port}")
    joined = {}
    while len(joined) < nnodes - 1:
        if stop.is_set():
            return None
        try:
            connection, address = server.accept()
        except TimeoutError:
            continue
        connection.settimeout(float(os.environ.get("STANDIN_RENDEZVOUS_HELLO_S", "30")))  # its registration
        try:
            hello = json.loads(connection.makefile().readline())
        except (ValueError, OSError):  # no registration (a port probe): not a node
            connection.close()
            continue
        peer = address[0].removeprefix("::ffff:")
        problem = mismatch(hello, identity, nnodes, joined)
        if problem:
            send(connection, {"ok": False, "error": problem})
            fail(f"refused {peer}: {problem}")
        connection.settimeout(None)  # joined: watched from here on, however long the group stays idle
        joined[hello["rank"]] = connection
        say(f"node rank {hello['rank']} joined from {peer} ({len(joined) + 1} of {nnodes})")
    for connection in joined.values():
        send(connection, {"ok": True, "nnodes": nnodes})
    say(f"group of {nnodes} nodes complete")
    for rank, connection in joined.items():
        threading.Thread(target=watch, args=(connection, f"node rank {rank} left the group"), daemon=True).start()
    threading.Thread(target=refuse_late, args=(server,), daemon=True).start()
    return joined


def mismatch(hello, identity, nnodes, joined):
    """Why a follower's registration does not fit this group (None: it fits)."""
    if not isinstance(hello, dict):
        return f"not a registration: {hello!r}"
    rank = hello.get("rank")
    if hello.get("nnodes") != nnodes:
        return f"node rank {rank} says --nnodes {hello.get('nnodes')}, node rank 0 has --nnodes {nnodes}"
    if not isinstance(rank, int) or not 1 <= rank < nnodes:
        return f"node rank {rank} is not one of 1…{nnodes - 1}"
    if rank in joined:
        return f"node rank {rank} joined twice"
    for key in ("version", "model"):
        if hello.get(key) != identity[key]:
            return f"node rank {rank} runs {key} {hello.get(key)!r}, node rank 0 {identity[key]!r}"
    return None


def refuse_late(server):
    """After the group formed: a node that comes now belongs to no group (this one already lost it or is full)."""
    server.settimeout(None)
    while True:
        connection, _ = server.accept()
        send(connection, {"ok": False, "error": "the group is already complete"})
        connection.close()


def follow(rank, nnodes, address, port, identity, stop):
    """A node of rank ≥ 1: register with the leader, retrying until it answers; then watch it (its connection
    closing ends this process). Returns once the group is complete; None on SIGTERM."""
    retry = float(os.environ.get("STANDIN_RENDEZVOUS_RETRY_S", "1"))
    deadline = time.monotonic() + float(os.environ.get("STANDIN_RENDEZVOUS_TIMEOUT_S", "600"))
    say(f"node rank {rank} of {nnodes} joining {address}:{port}")
    while True:
        if stop.is_set():
            return None
        try:
            connection = socket.create_connection((address, port), timeout=5)
            break
        except OSError as error:
            if time.monotonic() >= deadline:
                fail(f"no leader at {address}:{port} ({error.strerror or error})")
            stop.wait(retry)
    send(connection, {"rank": rank, "nnodes": nnodes, **identity})
    connection.settimeout(None)
    try:
        answer = json.loads(connection.makefile().readline() or "{}")
    except (ValueError, OSError):
        answer = {}
    if not answer.get("ok"):
        fail(f"node rank 0 at {address}:{port} refused node rank {rank}: {answer.get('error', 'connection closed')}")
    say(f"node rank {rank} joined the group of {nnodes} at {address}:{port}")
    threading.Thread(target=watch, args=(connection, f"lost the leader at {address}:{port}"), daemon=True).start()
    return connection


def watch(connection, message):
    """Block until the peer's connection closes; then end this process with exit 1."""
    try:
        while connection.recv(1024):
            pass
    except OSError:
        pass
    fail(message)


def send(connection, message):
    try:
        connection.sendall((json.dumps(message) + "\n").encode())
    except OSError:
        pass
