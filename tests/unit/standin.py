"""The TEST DOUBLE vLLM server (tests/doubles/vllm_package) run on 127.0.0.1 for a unit test, as a unit
starts vLLM: `vllm serve m --host 127.0.0.1 --port PORT ...`, from the source tree or from a venv's
`vllm` script, in a session of its own (its EngineCore child ends with it)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STANDIN_PACKAGE = ROOT / "tests" / "doubles" / "vllm_package"
CATALOG = ROOT / "provisioner" / "vllm" / "catalogs" / "vllm-0.25.0.json"
MODEL = "m"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def listening(port: int) -> bool:
    with socket.socket() as attempt:
        return attempt.connect_ex(("127.0.0.1", port)) == 0


def standin(port: int, log: Path, *options: str, vllm: Path | None = None, **env: str) -> subprocess.Popen:
    """The stand-in serving MODEL on 127.0.0.1:port with `options`, once it listens (its output in `log`).
    From the source tree unless `vllm` names an installed `vllm` script; `env` (STANDIN_*) over the
    defaults: 5 ms to the first token, 5 ms a token after it."""
    command = [str(vllm)] if vllm else [sys.executable, "-m", "vllm.entrypoints.cli.main"]
    source = {} if vllm else {"PYTHONPATH": str(STANDIN_PACKAGE), "VLLM_STANDIN_CATALOG": str(CATALOG)}
    server = subprocess.Popen(
        [*command, "serve", MODEL, "--host", "127.0.0.1", "--port", str(port), *options],
        env={**os.environ, **source, "STANDIN_TTFT_MS": "5", "STANDIN_TPOT_MS": "5", **env},
        stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    for _ in range(200):
        if listening(port):
            return server
        if server.poll() is not None:
            raise AssertionError(f"the stand-in exited {server.returncode} while starting: {log.read_text()[-2000:]}")
        time.sleep(0.05)
    stop(server)
    raise AssertionError("the stand-in did not listen")


def stop(server: subprocess.Popen) -> None:
    """Kill what is left of the stand-in's session (the server, its EngineCore child)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGKILL)
    server.wait(timeout=10)


@contextlib.contextmanager
def running(port: int, log: Path, *options: str, **env: str) -> Iterator[subprocess.Popen]:
    """`standin(...)`, killed at the end of the block if it is still there."""
    server = standin(port, log, *options, **env)
    try:
        yield server
    finally:
        stop(server)
