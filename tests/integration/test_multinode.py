"""One instance across two real systemd test hosts (bookworm, systemd-nspawn, over SSH): vLLM's multi-node
launcher as the stand-in (TEST DOUBLE vllm/standin_rendezvous.py) runs it: node rank 0 on the leader serves
the API once the headless node rank 1 on the follower joined its rendezvous; a wrong rank, size or model ends
both (tests/unit/test_standin_rendezvous.py).

One module-scoped pair of hosts, shared by the tests in order: check mode on the fresh hosts, apply twice,
the group serving, the audit (and a drifted follower, put back by a rolling apply that keeps the group in one
batch), a node killed on each side and the group back together,
a follower rebooted.
"""

from __future__ import annotations

import json
import re
import urllib.request

import pytest
import yaml

from provisioner.apply.controls import Controls
from provisioner.apply.hosts import apply_spec
from provisioner.audit.expectations import spec_targets
from provisioner.audit.running import NO_RESTART_PENDING
from provisioner.audit.runner import audit_hosts
from provisioner.base.rollout import Rollout
from provisioner.spec import load_spec
from tests.integration.conftest import audit_failures, check_then_apply_twice, disk_state
from tests.integration.test_gateway import wait_for
from tests.lab.specs import MODEL, VLLM_BIN, host_entry, install_standin, instance_entry

UNIT = "vllm-big.service"
CONFIG = "/etc/vllm/big.yaml"
MASTER_PORT = 29501


@pytest.fixture(scope="module")
def hosts(lab):
    start = lab.boot_count
    booted = lab.boot_many([f"mn{start}", f"mn{start + 1}"])
    for host in booted:
        install_standin(host)
    yield booted
    for host in booted:
        lab.destroy(host)


@pytest.fixture(scope="module")
def spec_path(hosts, tmp_path_factory):
    leader, follower = hosts
    big = instance_entry(leader, "big", 8000, 0.9, options={"max-model-len": 4096, "pipeline-parallel-size": 2},
                         multinode={"followers": [{"host": follower.name, "gpus": [0]}],
                                    "master_port": MASTER_PORT, "nccl": {"ib_disable": True}})
    path = tmp_path_factory.mktemp("multinode") / "spec.yml"
    path.write_text(yaml.safe_dump({"version": 1, "hosts": [host_entry(leader), host_entry(follower)],
                                    "instances": [big]}, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def runs(hosts, spec_path):
    """Check mode on the fresh hosts (the follower's disk before and after), then the first and second apply."""
    leader, follower = hosts
    record = check_then_apply_twice(spec_path, follower, f"test -e {VLLM_BIN}")
    record["leader disk"] = disk_state(leader)
    return record


SERVICE_FILES = ["Create the service group", "Create the service user", "Create the home and the model cache",
                 "Create the configuration and probe directories", "Install the readiness probe", "Install the flag check",
                 "Write the env files", "Write the config files", "Write the units"]
SAID_HOME = "Say the home and the model cache would be created (check mode)"
SAID_START, SAID_ENABLE = ("Say which new instances would be started (check mode)",
                           "Say which new instances would be enabled (check mode)")
RESTARTED, STARTED = ("Restart the changed instances, in list order",
                      "Enable and start the instances in the venv, in list order")
# the transaction's commit: the files that got ready kept for a rollback (roles/vllm_service/tasks/commit.yml)
KEPT = ["Create the folder of the previous files", "Keep the env files that got ready", "Keep the config files that got ready",
        "Keep the units, quadlets and compose files that got ready"]


def service_changes(events, host) -> list[str]:
    return [event.task for event in events if event.host == host.name and "vllm_service" in event.role
            and event.status == "changed"]


def complete(leader) -> str:
    """One completion from the bastion through node rank 0's API: its finish_reason."""
    request = urllib.request.Request(f"http://{leader.address}:8000/v1/completions", method="POST",
                                     data=json.dumps({"model": MODEL, "prompt": "ping", "max_tokens": 2}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())["choices"][0]["finish_reason"]


def serves(leader) -> bool:
    try:
        return complete(leader) == "length"
    except OSError:
        return False


def main_pid(host) -> str:
    return host.ssh(f"systemctl show {UNIT} -p MainPID --value").stdout.strip()


def journal(host, since: str = "") -> str:
    return host.ssh(f"journalctl -u {UNIT} --no-pager -o cat {since}", check=False).stdout


def test_check_mode_on_fresh_hosts_changes_nothing_and_predicts_the_run(hosts, runs):
    leader, follower = hosts
    assert runs["check"].succeeded, runs["check"].problems
    assert runs["disk after check"] == runs["disk before"], "check mode changed files on the follower"
    assert runs["installed after check"] != 0, "check mode installed vLLM"
    # each change of role vllm_service on each node (the leader's and the headless follower's alike), said
    # beforehand by check mode, one for one
    for host in hosts:
        assert service_changes(runs["events"]["check"], host) == [*SERVICE_FILES[:2], SAID_HOME, *SERVICE_FILES[3:],
                                                                  SAID_START, SAID_ENABLE, *KEPT]
        assert service_changes(runs["events"]["first"], host) == [*SERVICE_FILES, RESTARTED, STARTED, *KEPT]


def test_apply_converges_then_changes_nothing(hosts, runs):
    leader, follower = hosts
    assert runs["first"].succeeded, runs["first"].problems
    assert runs["second"].succeeded, runs["second"].problems
    assert {name: stats.changed for name, stats in runs["second"].stats.items()} == {leader.name: 0, follower.name: 0}
    for host in hosts:
        assert host.ssh(f"systemctl is-active {UNIT}; systemctl is-enabled {UNIT}").stdout.split() == ["active", "enabled"]
    assert leader.ssh(f"grep -E '^(nnodes|node-rank|headless|master-addr)' {CONFIG}").stdout.splitlines() == [
        f'master-addr: "{leader.address}"', "nnodes: 2", "node-rank: 0"]
    assert follower.ssh(f"grep -E '^(nnodes|node-rank|headless|master-addr)' {CONFIG}").stdout.splitlines() == [
        "headless: true", f'master-addr: "{leader.address}"', "nnodes: 2", "node-rank: 1"]
    assert "Environment=NCCL_IB_DISABLE=1" in follower.ssh(f"systemctl cat {UNIT}").stdout


def test_the_group_serves_through_node_rank_0_once_the_follower_joined(hosts, runs):
    leader, follower = hosts
    assert complete(leader) == "length"
    assert f"rendezvous: node rank 1 joined from {follower.address}" in journal(leader)
    assert f"joined the group of 2 at {leader.address}:{MASTER_PORT}" in journal(follower)
    # the follower serves no API
    assert follower.ssh("ss -Hltn 'sport = :8000'").stdout.strip() == ""


def test_the_audit_passes_on_both_nodes_then_names_a_drifted_follower(hosts, runs, spec_path):
    leader, follower = hosts
    reports = audit_hosts(spec_targets(load_spec(spec_path)))
    rows = {name: {check.check: check.status for check in report.checks} for name, report in reports.items()}
    assert {name: [row for row, status in checks.items() if status == "failed"] for name, checks in rows.items()} == \
        {leader.name: [], follower.name: []}
    assert rows[leader.name][f"{UNIT}: node 0 of 2, rendezvous {leader.address}:{MASTER_PORT}"] == "passed"
    assert rows[leader.name][f"{UNIT}: ready (one request served)"] == "passed"
    assert rows[follower.name][f"{UNIT}: node 1 of 2, rendezvous {leader.address}:{MASTER_PORT}"] == "passed"
    assert not any("ready" in row for row in rows[follower.name] if row.startswith(UNIT)), "a headless node probed"

    follower.ssh(f"sed -i 's/^node-rank: 1$/node-rank: 2/' {CONFIG}")
    drifted = audit_failures(spec_path)
    assert drifted[leader.name] == {}
    pending = drifted[follower.name].pop(f"{UNIT}: restart pending")  # the file changed, the node runs rank 1 still
    assert drifted[follower.name] == {
        f"{UNIT}: config file {CONFIG}": ("as rendered (14 lines)", "line 13: 'node-rank: 2' instead of 'node-rank: 1'")}
    assert pending[0] == NO_RESTART_PENDING and re.fullmatch(
        rf"restart pending: {CONFIG} \(changed [-0-9: ]+ UTC\), after pid \d+ started [-0-9: ]+ UTC", pending[1]), pending
    # a rolling apply puts it back, the group's two hosts in one batch (the canary's, grown to hold the group):
    # the follower restarts, the leader loses it and restarts too, the group meets again
    again = apply_spec(load_spec(spec_path), controls=Controls(rollout=Rollout()))
    assert again.succeeded, again.problems
    assert {name: turn.batch for name, turn in again.turns.items()} == {leader.name: 1, follower.name: 1}
    assert again.stats[follower.name].changed > 0 and again.stats[leader.name].changed == 0
    assert serves(leader)
    assert audit_failures(spec_path) == {leader.name: {}, follower.name: {}}


@pytest.mark.parametrize("killed", ["follower", "leader"])
def test_a_killed_node_takes_the_group_down_and_it_comes_back_together(hosts, runs, spec_path, killed):
    leader, follower = hosts
    victim, peer = (follower, leader) if killed == "follower" else (leader, follower)
    assert serves(leader)
    before = {host.name: main_pid(host) for host in hosts}
    since = "--since '{}'".format(leader.ssh("date '+%Y-%m-%d %H:%M:%S'").stdout.strip())
    victim.ssh(f"systemctl kill --signal=KILL {UNIT}")
    lost = "node rank 1 left the group" if killed == "follower" else f"lost the leader at {leader.address}"
    assert wait_for(lambda: lost in journal(peer, since), timeout=30), journal(peer, since)
    assert wait_for(lambda: serves(leader), timeout=90), journal(leader, since)
    assert {host.name: main_pid(host) for host in hosts} != before
    assert all(main_pid(host) != before[host.name] for host in hosts), "a node kept its process: the group split"
    assert audit_failures(spec_path) == {leader.name: {}, follower.name: {}}


def test_the_group_meets_again_after_the_follower_reboots(hosts, runs, spec_path):
    leader, follower = hosts
    follower.reboot(timeout=180)
    assert wait_for(lambda: serves(leader), timeout=120), journal(leader)
    assert follower.ssh(f"systemctl is-active {UNIT}").stdout.strip() == "active"
    assert audit_failures(spec_path) == {leader.name: {}, follower.name: {}}
