"""The stand-in's multi-node rendezvous (TEST DOUBLE vllm/standin_rendezvous.py), run as the units run it: node
rank 0 serves only once every follower joined; a wrong rank, size or model ends both sides with exit 1; a node
that loses its peer exits 1, so that systemd's Restart= brings the group back together."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.unit.standin import CATALOG, MODEL, STANDIN_PACKAGE, free_port, listening, stop


def node(tmp_path: Path, rank: int, nnodes: int, master_port: int, http_port: int, *extra: str,
         model: str = MODEL) -> subprocess.Popen:
    """`vllm serve MODEL --nnodes N --node-rank R --master-addr 127.0.0.1 --master-port P` (+ --headless on rank ≥ 1),
    its output in tmp_path/node<rank>.log."""
    options = ["--nnodes", str(nnodes), "--node-rank", str(rank), "--master-addr", "127.0.0.1",
               "--master-port", str(master_port), *(["--headless"] if rank > 0 else []), *extra]
    log = tmp_path / f"node{rank}.log"
    return subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model, "--host", "127.0.0.1",
         "--port", str(http_port), *options],
        env={**os.environ, "PYTHONPATH": str(STANDIN_PACKAGE), "VLLM_STANDIN_CATALOG": str(CATALOG),
             "STANDIN_RENDEZVOUS_RETRY_S": "0.1", "STANDIN_RENDEZVOUS_HELLO_S": "0.5"},
        stdout=log.open("a"), stderr=subprocess.STDOUT, start_new_session=True)


def ended(process: subprocess.Popen, within: float = 20) -> int:
    return process.wait(timeout=within)


def log_of(tmp_path: Path, rank: int) -> str:
    return (tmp_path / f"node{rank}.log").read_text()


def wait_listening(port: int, within: float = 20) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if listening(port):
            return True
        time.sleep(0.05)
    return False


def health(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as answer:
        return answer.status


def complete(port: int) -> str:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", method="POST",
                                     data=json.dumps({"model": MODEL, "prompt": "ping", "max_tokens": 1}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())["choices"][0]["finish_reason"]


@pytest.fixture
def ports():
    return free_port(), free_port()


@pytest.fixture
def nodes():
    started: list[subprocess.Popen] = []
    yield started
    for process in started:
        stop(process)


@pytest.fixture
def group(tmp_path, ports, nodes) -> tuple[subprocess.Popen, subprocess.Popen]:
    """A leader and its follower on 127.0.0.1, once the leader serves."""
    master, http = ports
    nodes.append(leader := node(tmp_path, 0, 2, master, http))
    nodes.append(follower := node(tmp_path, 1, 2, master, http + 1))
    assert wait_listening(http), log_of(tmp_path, 0)
    return leader, follower


def test_the_leader_serves_only_once_its_follower_joined(tmp_path, ports, nodes):
    master, http = ports
    nodes.append(leader := node(tmp_path, 0, 2, master, http))
    assert wait_listening(master), log_of(tmp_path, 0)
    time.sleep(1)
    assert not listening(http), "node rank 0 opened its API before the group was complete"
    assert leader.poll() is None
    nodes.append(node(tmp_path, 1, 2, master, http + 1))
    assert wait_listening(http), log_of(tmp_path, 0)
    assert health(http) == 200
    assert complete(http) == "length"
    assert "node rank 1 joined" in log_of(tmp_path, 0)
    assert "joined the group of 2" in log_of(tmp_path, 1)


def test_an_idle_group_stays_together(tmp_path, ports, group):
    """Longer than a registration may take (STANDIN_RENDEZVOUS_HELLO_S): a joined node is watched without a timeout."""
    (_, http), (leader, follower) = ports, group
    time.sleep(1.5)
    assert leader.poll() is None and follower.poll() is None, log_of(tmp_path, 0)
    assert complete(http) == "length"


def test_a_follower_started_first_waits_for_its_leader(tmp_path, ports, nodes):
    master, http = ports
    nodes.append(follower := node(tmp_path, 1, 2, master, http + 1))
    time.sleep(1)
    assert follower.poll() is None, log_of(tmp_path, 1)
    nodes.append(node(tmp_path, 0, 2, master, http))
    assert wait_listening(http), log_of(tmp_path, 0)
    assert health(http) == 200


@pytest.mark.parametrize(("follower_options", "follower_model", "leader_says"), [
    (["--nnodes", "3"], MODEL, "node rank 1 says --nnodes 3, node rank 0 has --nnodes 2"),
    ([], "another-model", "node rank 1 runs model 'another-model', node rank 0 'm'"),
])
def test_a_follower_that_does_not_match_ends_both_sides(tmp_path, ports, nodes, follower_options, follower_model,
                                                        leader_says):
    master, http = ports
    nodes.append(leader := node(tmp_path, 0, 2, master, http))
    assert wait_listening(master)
    # the last --nnodes given wins, as in argparse
    nodes.append(follower := node(tmp_path, 1, 2, master, http + 1, *follower_options, model=follower_model))
    assert ended(leader) == 1
    assert ended(follower) == 1
    assert f"rendezvous: refused 127.0.0.1: {leader_says}" in log_of(tmp_path, 0)
    assert f"refused node rank 1: {leader_says}" in log_of(tmp_path, 1)
    assert not listening(http)


def test_two_followers_of_the_same_rank_end_the_leader(tmp_path, ports, nodes):
    master, http = ports
    nodes.append(leader := node(tmp_path, 0, 3, master, http))
    assert wait_listening(master)
    nodes.append(node(tmp_path, 1, 3, master, http + 1))
    time.sleep(1)
    nodes.append(node(tmp_path, 1, 3, master, http + 2))
    assert ended(leader) == 1
    assert "node rank 1 joined twice" in log_of(tmp_path, 0)


@pytest.mark.parametrize(("rank", "nnodes", "headless", "says"), [
    (0, 2, True, "node rank 0 serves the API: run it without --headless"),
    (1, 2, False, "node rank 1 runs headless: add --headless"),
    (2, 2, True, "node rank 2 is not one of 0…1 (--nnodes 2)"),
])
def test_an_impossible_node_fails_at_start(tmp_path, ports, nodes, rank, nnodes, headless, says):
    master, http = ports
    options = ["--nnodes", str(nnodes), "--node-rank", str(rank), "--master-port", str(master),
               *(["--headless"] if headless else [])]
    log = tmp_path / "node.log"
    process = subprocess.run(
        [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", MODEL, "--port", str(http), *options],
        env={**os.environ, "PYTHONPATH": str(STANDIN_PACKAGE), "VLLM_STANDIN_CATALOG": str(CATALOG)},
        stdout=log.open("w"), stderr=subprocess.STDOUT, timeout=30)
    assert process.returncode == 1
    assert f"rendezvous: {says}" in log.read_text()


def test_a_node_that_comes_after_the_group_formed_is_refused_and_the_group_goes_on(tmp_path, ports, group):
    (master, http), (leader, _) = ports, group
    late = node(tmp_path, 2, 3, master, http + 2)
    assert ended(late) == 1
    assert "refused node rank 2: the group is already complete" in log_of(tmp_path, 2)
    assert leader.poll() is None
    assert complete(http) == "length"


def test_the_leader_ends_when_a_follower_dies(tmp_path, group):
    leader, follower = group
    stop(follower)  # SIGKILL: the follower's connection closes
    assert ended(leader) == 1
    assert "rendezvous: node rank 1 left the group" in log_of(tmp_path, 0)


def test_a_follower_ends_when_its_leader_dies(tmp_path, ports, group):
    (master, _), (leader, follower) = ports, group
    stop(leader)
    assert ended(follower) == 1
    assert f"rendezvous: lost the leader at 127.0.0.1:{master}" in log_of(tmp_path, 1)


def test_sigterm_ends_a_waiting_node_cleanly(tmp_path, ports, nodes):
    master, http = ports
    nodes.append(follower := node(tmp_path, 1, 2, master, http + 1))
    time.sleep(0.5)
    follower.terminate()
    assert ended(follower) == 0
