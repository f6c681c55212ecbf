"""A real HAProxy (the `haproxy` binary on PATH) in front of completions replicas (TEST DOUBLES of vLLM,
completions_replica.py), all on 127.0.0.1 ports chosen free, with its own admin socket in a folder of the
caller's: for tests/unit/test_haproxy_server.py and the recordings of tests/fixtures/haproxy/ (record.py).

Its backends are built as role gateway builds them (roles/gateway/templates/haproxy.cfg.j2): the request
body's "model" picks backend public-<index>, each replica a `server` checked by a 1-token
`POST /v1/completions` that expects 200 - every 200 ms here (2 s in the role), so that tests are quick.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

REPLICA = Path(__file__).with_name("completions_replica.py")
HAPROXY = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/sbin")

CONFIG = """\
global
    stats socket {socket} mode 660 level admin
    pidfile {folder}/haproxy.pid

defaults
    mode http
    timeout connect 2s
    timeout client 1m
    timeout server 1m
    timeout check 2s

frontend public
    bind 127.0.0.1:{port}
    http-request wait-for-body time 2s
    http-request set-var(txn.model) req.body,json_query('$.model')
{routes}
"""
ROUTE = """\
    use_backend public-{index} if {{ var(txn.model) -m str '{model}' }}
"""
BACKEND = """
backend public-{index}
    balance leastconn
    option httpchk
    http-check send meth POST uri /v1/completions ver HTTP/1.1 hdr Host public hdr Content-Type application/json body '{{"model": "{model}", "prompt": "ping", "max_tokens": 1}}'
    http-check expect status 200
    default-server check inter 200ms fall 2 rise 1
{servers}"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_listening(process: subprocess.Popen, port: int, what: str, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds  # generous: CI runs this beside the lab's hosts
    while time.monotonic() < deadline:
        with socket.socket() as attempt:
            if attempt.connect_ex(("127.0.0.1", port)) == 0:
                return
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited {process.returncode} while starting")
        time.sleep(0.025)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port}")


def wait_for_socket(process: subprocess.Popen, path: Path, seconds: float = 20) -> None:
    """HAProxy's admin socket answers (its port may listen first; another process on a port taken since
    free_port chose it would too: then haproxy has exited)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"haproxy exited {process.returncode} while starting (see haproxy.log beside {path})")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as attempt:
            if path.exists() and attempt.connect_ex(str(path)) == 0:
                return
        time.sleep(0.025)
    raise RuntimeError(f"haproxy's admin socket {path} did not answer")


def query(path: str | Path, command: str) -> str:
    """One command on HAProxy's admin socket (non-interactive: it answers, then closes)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.settimeout(5)
        connection.connect(str(path))
        connection.sendall(command.encode() + b"\n")
        chunks = []
        while chunk := connection.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode()


class Gateway:
    """HAProxy with one route per model: {model: [replica name, ...]}; replicas started by start()."""

    def __init__(self, folder: Path, routes: dict[str, list[str]]):
        self.folder, self.routes = folder, routes
        self.socket = folder / "admin.sock"
        self.port = free_port()
        self.ports = {name: free_port() for names in routes.values() for name in names}
        self.replicas: dict[str, subprocess.Popen] = {}
        self.haproxy: subprocess.Popen | None = None

    def config(self) -> str:
        models = list(self.routes)
        return CONFIG.format(
            socket=self.socket, folder=self.folder, port=self.port,
            routes="".join(ROUTE.format(index=index, model=model) for index, model in enumerate(models)),
        ) + "".join(
            BACKEND.format(index=index, model=model, servers="".join(
                f"    server {name} 127.0.0.1:{self.ports[name]}\n" for name in self.routes[model]))
            for index, model in enumerate(models))

    def start(self) -> Gateway:
        for name in self.ports:
            self.start_replica(name)
        (self.folder / "haproxy.cfg").write_text(self.config())
        self.haproxy = subprocess.Popen([HAPROXY, "-db", "-f", str(self.folder / "haproxy.cfg")],
                                        stdout=(self.folder / "haproxy.log").open("w"), stderr=subprocess.STDOUT)
        wait_listening(self.haproxy, self.port, "haproxy")
        wait_for_socket(self.haproxy, self.socket)
        return self

    def start_replica(self, name: str, status: int = 200) -> None:
        self.stop_replica(name)
        self.replicas[name] = subprocess.Popen([sys.executable, str(REPLICA), str(self.ports[name]), str(status)])
        wait_listening(self.replicas[name], self.ports[name], f"replica {name}")

    def stop_replica(self, name: str) -> None:
        replica = self.replicas.pop(name, None)
        if replica:
            replica.kill()
            replica.wait()

    def stop(self) -> None:
        for name in list(self.replicas):
            self.stop_replica(name)
        if self.haproxy:
            self.haproxy.kill()
            self.haproxy.wait()

    def query(self, command: str) -> str:
        return query(self.socket, command)

    def server_line(self, backend: str, server: str) -> dict[str, str]:
        """The server's row of `show stat`, by the header's names."""
        header, *rows = self.query("show stat").splitlines()
        names = header.lstrip("# ").split(",")
        for row in rows:
            values = dict(zip(names, row.split(",")))
            if values.get("pxname") == backend and values.get("svname") == server:
                return values
        raise KeyError(f"{backend}/{server}")

    def wait_status(self, backend: str, server: str, status: str, seconds: float = 20) -> None:
        deadline = time.monotonic() + seconds
        while self.server_line(backend, server)["status"] != status:
            if time.monotonic() > deadline:
                raise AssertionError(f"{backend}/{server} is not {status}: {self.server_line(backend, server)}")
            time.sleep(0.05)

    def request(self, model: str, sleep: float = 0) -> threading.Thread:
        """A completion through the gateway, in a thread (result: thread.status, thread.ended)."""
        def send() -> None:
            body = json.dumps({"model": model, "prompt": "hello", "max_tokens": 1, "sleep": sleep}).encode()
            request = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/completions", data=body,
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=60) as answer:
                    thread.status = answer.status
            except urllib.error.HTTPError as error:
                thread.status = error.code
            thread.ended = time.monotonic()
        thread = threading.Thread(target=send, daemon=True)
        thread.status, thread.ended = None, None
        thread.start()
        return thread
