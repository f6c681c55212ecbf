"""The readiness probe's warm-up (roles/vllm_service/files/wait-ready --warm-up) against the TEST DOUBLE
vllm server whose sampler stalls as vLLM 0.25.0's did on the H200 (tests/doubles/vllm_package/vllm/
standin_sampler.py; recorded: tests/fixtures/vllm/h200-tune): the first batch of 8 or more requests
sampling with the model's defaults waits for a compile. Ready after the warm-up, the first users do not
wait; ready on the 1-token probe alone, they do."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.lab.load import first_token_seconds
from tests.unit.standin import MODEL, free_port, running

READY_PROBE = Path(__file__).resolve().parents[2] / "roles" / "vllm_service" / "files" / "wait-ready"
JIT_S = 3.0  # the double's compile; the H200's took 7-9 s of the first users' time
USERS = 16


@pytest.fixture
def server(tmp_path):
    """A fresh stand-in server (its sampler not compiled yet); requests wait 100 ms before they are
    scheduled, so that the ones sent together are in flight together."""
    port = free_port()
    with running(port, tmp_path / "standin.log", STANDIN_SAMPLER_JIT_S=str(JIT_S), STANDIN_TTFT_MS="100",
                 STANDIN_TPOT_MS="1"):
        yield port


def wait_ready(port: int, *options: str) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    run = subprocess.run([sys.executable, str(READY_PROBE), "--base-url", f"http://127.0.0.1:{port}",
                          "--model", MODEL, "--timeout", "30", *options], capture_output=True, text=True, timeout=60)
    return run, time.monotonic() - started


def first_tokens(port: int, sampling: dict) -> list[float]:
    return first_token_seconds("127.0.0.1", port, MODEL, USERS, sampling)


def test_after_the_warm_up_the_first_users_do_not_wait_for_the_compile(server):
    run, seconds = wait_ready(server, "--warm-up")
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith(f"wait-ready: ready: http://127.0.0.1:{server}/health answered 200, "
                                 "POST /v1/completions answered 200 with choices; warmed up: 16 then 9 completions "
                                 "at once in the model's own sampling (")
    assert seconds >= JIT_S  # the compile happened inside the warm-up
    assert first_tokens(server, {})[-1] < JIT_S / 2


def test_ready_on_the_probe_alone_the_first_users_wait_for_the_compile(server):
    run, seconds = wait_ready(server)
    assert run.returncode == 0 and "warmed up" not in run.stdout
    assert seconds < JIT_S
    assert first_tokens(server, {})[-1] >= JIT_S  # the recorded stall, in the double


def test_greedy_requests_do_not_compile_the_sampler(server):
    """Why the warm-up sends no sampling fields: a warm-up of greedy requests leaves the compile to the users."""
    assert first_tokens(server, {"temperature": 0})[-1] < JIT_S / 2
    assert first_tokens(server, {})[-1] >= JIT_S


def test_the_warm_up_is_not_for_the_audit_s_single_probe(server):
    run, _ = wait_ready(server, "--warm-up", "--once")
    assert run.returncode == 2 and "--warm-up is for a server that starts, not with --once" in run.stderr
