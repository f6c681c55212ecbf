"""A multi-node instance (`multinode:`): every validation message word for word (each names the field and the
fix), and what each node runs: its flags, environment and unit on its own host."""

from __future__ import annotations

import dataclasses
import json

import pytest

from provisioner.base.rollout import Rollout
from provisioner.fleet.inventory import build_inventory, host_units
from provisioner.plan import build_plan
from provisioner.spec import validate_spec
from tests.unit.conftest import host, instance, problems_of, spec_data

UUID_A = "GPU-aaaaaaaa-0000-4000-8000-000000000000"
UUID_B = "GPU-bbbbbbbb-0000-4000-8000-000000000000"
UUID_C = "GPU-cccccccc-0000-4000-8000-000000000000"
H200 = "NVIDIA H200"


def gpu_host(name: str, address: str, uuid: str, **fields) -> dict:
    return host(name, address, gpus={"devices": [{"index": 0, "uuid": uuid, "model": H200}]}, **fields)


def group_spec(*, followers: list[dict] | None = None, options: dict | None = None, hosts: list[dict] | None = None,
               **multinode) -> dict:
    """A leader on gpu-a and a follower on gpu-b, one GPU each, pipeline-parallel-size 2."""
    big = instance("big", 8000, 0.9, on="gpu-a", options={"pipeline-parallel-size": 2, **(options or {})},
                   multinode={"followers": followers or [{"host": "gpu-b", "gpus": [0]}], **multinode})
    return spec_data(hosts=hosts or [gpu_host("gpu-a", "10.0.0.1", UUID_A), gpu_host("gpu-b", "10.0.0.2", UUID_B)],
                     instances=[big])


def test_a_valid_group_places_one_node_on_each_host():
    assert validate_spec(group_spec(nccl={"socket_ifname": "^docker,lo"})).instances[0].serve_env[
        "NCCL_SOCKET_IFNAME"] == "^docker,lo"
    spec = validate_spec(group_spec(nccl={"socket_ifname": "eth1", "ib_disable": True}))
    leader, = spec.instances_on("gpu-a")
    follower, = spec.instances_on("gpu-b")
    group = {"nnodes": 2, "master-addr": "10.0.0.1", "master-port": 29501, "pipeline-parallel-size": 2}
    assert leader.serve_options == {**group, "node-rank": 0}
    assert follower.serve_options == {**group, "node-rank": 1, "headless": True}
    assert follower.gpus == [0] and follower.host == "gpu-b"
    assert leader.serve_env == follower.serve_env == {"NCCL_SOCKET_IFNAME": "eth1", "GLOO_SOCKET_IFNAME": "eth1",
                                                      "NCCL_IB_DISABLE": "1"}
    # the spec's own entry is the leader: the gateway and bench route to it alone
    assert spec.instances[0].serve_options == leader.serve_options


def test_the_master_address_given_wins_over_the_leaders():
    spec = validate_spec(group_spec(master_addr="10.1.0.1", master_port=29600))
    assert {node.serve_options["master-addr"] for host in ("gpu-a", "gpu-b") for node in spec.instances_on(host)} \
        == {"10.1.0.1"}


def test_each_node_gets_its_unit_leader_probed_followers_headless():
    plans = {plan.host: plan for plan in build_plan(validate_spec(group_spec()))}
    leader, follower = plans["gpu-a"].units[0].unit.content, plans["gpu-b"].units[0].unit.content
    assert ", node 0 of 2 on port 8000\n" in leader
    assert ", node 1 of 2 (headless)\n" in follower
    assert "ExecStartPost=" in leader and "ExecStartPost=" not in follower
    for unit in (leader, follower):
        assert "Restart=always\nRestartSec=3\n" in unit
        assert "StartLimitIntervalSec=0\n" in unit
    assert "headless: true\n" in plans["gpu-b"].units[0].config_file.content
    assert "headless" not in plans["gpu-a"].units[0].config_file.content


def test_an_instance_on_one_host_keeps_its_restart_policy():
    unit = build_plan(validate_spec(spec_data()))[0].units[0].unit.content
    assert "Restart=on-failure\nRestartSec=10\n" in unit and "StartLimitIntervalSec" not in unit


PROBLEMS = [
    ({"followers": [{"host": "gpu-c", "gpus": [0]}]},
     "instances[0].multinode.followers[0].host: unknown host 'gpu-c' — did you mean 'gpu-b'? hosts in this spec: "
     "gpu-a, gpu-b"),
    ({"followers": [{"host": "gpu-a", "gpus": [0]}]},
     "instances[0].multinode.followers[0].host: host gpu-a is already a node of this instance (its leader (host:)) "
     "— each node is another host"),
    ({"followers": [{"host": "gpu-b", "gpus": [3]}]},
     "instances[0].multinode.followers[0].gpus[0]: GPU index 3 is not among host gpu-b's devices (indexes: 0) — "
     "use a listed index or add the GPU to hosts[1].gpus.devices"),
    ({"options": {"pipeline-parallel-size": 4}},
     "instances[0].options.pipeline-parallel-size: pipeline-parallel-size 4 makes vLLM use 4 GPUs, but the instance "
     "has 2 GPUs on 2 hosts ([0] on gpu-a, [0] on gpu-b) — set pipeline-parallel-size: 2, or list 4 GPUs under gpus"),
    ({"options": {"nnodes": 2}},
     "instances[0].options.nnodes: 'nnodes' is set by the instance's own field — remove it from options and set "
     "`multinode:` instead"),
    ({"options": {"headless": True}},
     "instances[0].options.headless: 'headless' is set by the instance's own field — remove it from options and set "
     "`multinode:` instead"),
    ({"options": {"distributed-executor-backend": "ray"}},
     "instances[0].options.distributed-executor-backend: multinode: runs vLLM's own multi-node launcher, which needs "
     "the mp backend, not 'ray' (a Ray cluster is yours to run) — remove the option or set it to mp"),
    ({"master_addr": "127.0.0.1"},
     "instances[0].multinode.master_addr: the followers cannot reach the rendezvous at 127.0.0.1 — give an address "
     "of host gpu-a they reach (e.g. its address on the nodes' network)"),
    ({"master_port": 8000},
     "instances[0].multinode.master_port: port 8000 on host gpu-a is already used by instance 'big' "
     "(instances[0].port) — give the rendezvous a port of its own (vLLM's default: 29501)"),
    ({"followers": []},
     "instances[0].multinode.followers: needs at least 1 entry, got none"),
    ({"master_port": 0},
     "instances[0].multinode.master_port: must be at least 1, got 0 (int)"),
    ({"nccl": {"socket_ifname": "eth1; rm"}},
     "instances[0].multinode.nccl.socket_ifname: 'eth1; rm' is not a network interface for NCCL — an interface name "
     "or prefix (e.g. eth1, ib0, ens5f0), several comma-separated, ^ before them to exclude, = to match exactly"),
    ({"nccl": {"p2p": True}},
     "instances[0].multinode.nccl.p2p: unknown key 'p2p' — allowed keys: socket_ifname, "
     "p2p_disable, ib_disable"),
]


@pytest.mark.parametrize(("change", "problem"), PROBLEMS, ids=[problem.split(":")[0] + str(index)
                                                                for index, (_, problem) in enumerate(PROBLEMS)])
def test_a_wrong_group_names_the_field_and_the_fix(change, problem):
    options = change.pop("options", None) if "options" in change else None
    data = group_spec(options=options, **change) if options is not None else group_spec(**change)
    if "followers" in change and not change["followers"]:
        data["instances"][0]["multinode"]["followers"] = []
    assert problems_of(data) == [problem]


def test_every_node_runs_the_same_vllm():
    data = group_spec(hosts=[gpu_host("gpu-a", "10.0.0.1", UUID_A),
                             gpu_host("gpu-b", "10.0.0.2", UUID_B, vllm={"version": "0.33.0"})])
    assert problems_of(data) == [
        "instances[0].multinode.followers[0].host: host gpu-b runs vLLM 0.33.0, the leader gpu-a 0.25.0 — every node "
        "runs the same vLLM: give hosts[1].vllm and hosts[0].vllm the same version and cuda"]


def test_every_node_gives_as_many_gpus():
    two = {"devices": [{"index": 0, "uuid": UUID_B, "model": H200}, {"index": 1, "uuid": UUID_C, "model": H200}]}
    data = group_spec(hosts=[gpu_host("gpu-a", "10.0.0.1", UUID_A), host("gpu-b", "10.0.0.2", gpus=two)],
                      followers=[{"host": "gpu-b", "gpus": [0, 1]}], options={"pipeline-parallel-size": 3})
    assert problems_of(data) == [
        "instances[0].multinode.followers[0].gpus: 2 GPU(s) on gpu-b, 1 on the leader gpu-a — vLLM runs as many "
        "workers on every node: give each node the same number of GPUs"]


def test_a_leader_known_only_by_a_loopback_address_needs_a_master_address():
    data = group_spec(hosts=[gpu_host("gpu-a", "127.0.0.1", UUID_A), gpu_host("gpu-b", "10.0.0.2", UUID_B)])
    assert problems_of(data) == [
        "instances[0].multinode.master_addr: the followers cannot reach the rendezvous at 127.0.0.1 (the leader "
        "gpu-a's address: set master_addr) — give an address of host gpu-a they reach (e.g. its address on the "
        "nodes' network)"]


def test_a_multinode_instance_is_refused_in_a_container():
    data = group_spec()
    data["instances"][0]["container"] = {"engine": "podman"}
    assert problems_of(data) == [
        "instances[0].container: a multi-node instance runs in the hosts' venvs: podman and docker do not run one yet "
        "— remove container: (or multinode:)"]


def test_a_followers_gpu_shares_count_on_its_host():
    data = group_spec()
    data["instances"].append(instance("small", 8001, 0.3, on="gpu-b"))
    assert problems_of(data) == [
        "instances[1].gpu_memory_utilization: shares on GPU 0 of host gpu-b add up to 1.2 (limit 0.95) — lower "
        "gpu_memory_utilization of big (0.9), small (0.3) so they add up to at most 0.95"]


def test_the_planner_warns_where_tensor_parallel_crosses_hosts():
    data = group_spec(options={"pipeline-parallel-size": 1, "tensor-parallel-size": 2}, nccl={"ib_disable": True})
    plans = {plan.host: plan for plan in build_plan(validate_spec(data))}
    assert plans["gpu-a"].warnings == [
        "big: tensor-parallel-size 2 spans 2 hosts of 1 GPU(s) each — its all-reduces at every layer go over TCP "
        "sockets (nccl.ib_disable) between hosts; set tensor-parallel-size 1 and pipeline-parallel-size 2 (only "
        "pipeline stages cross hosts)"]
    assert plans["gpu-b"].warnings == []  # said once, on the leader's host


def test_pipeline_stages_across_hosts_are_not_warned_about():
    assert [plan.warnings for plan in build_plan(validate_spec(group_spec()))] == [[], []]


# ------------------------------------------------------------------ rolling changes: a group is one unit


def test_the_inventory_lists_a_groups_hosts_together_and_a_rollout_batches_them_whole():
    hosts = [gpu_host("gpu-a", "10.0.0.1", UUID_A), gpu_host("gpu-x", "10.0.0.9", UUID_C),
             gpu_host("gpu-b", "10.0.0.2", UUID_B)]
    spec = validate_spec(group_spec(hosts=hosts))
    assert host_units(spec) == [["gpu-a", "gpu-b"], ["gpu-x"]]
    assert list(build_inventory(spec)["hosts.yml"]["all"]["children"]["vllm_hosts"]["hosts"]) == \
        ["gpu-a", "gpu-b", "gpu-x"]
    assert host_units(spec, ["gpu-x", "gpu-b"]) == [["gpu-x"], ["gpu-b"]]


@pytest.mark.parametrize(("units", "rollout", "batches"), [
    ((2, 1), Rollout(), [2, 1]),  # the canary grows to the group's two hosts
    ((1, 2, 1, 1), Rollout(batch="2"), [1, 2, 2]),
    ((1, 3, 1), Rollout(batch="2"), [1, 3, 1]),  # a batch grows to the end of the group it would cut
    ((1, 1, 2), Rollout(batch="50%", canary=2), [2, 2]),
    ((1, 1, 1), Rollout(batch="2"), [1, 2]),  # no group: N and N% as Ansible reads them
])
def test_a_rollout_keeps_each_group_in_one_batch(units, rollout, batches):
    rolled = dataclasses.replace(rollout, units=units)
    expected = batches if any(size > 1 for size in units) else [rollout.canary, int(rollout.batch)]
    assert json.loads(rolled.extra_vars())["rollout_batches"] == expected
    if any(size > 1 for size in units):
        assert sum(batches) == sum(units)


def test_a_variable_both_env_and_nccl_set_is_refused_not_dropped():
    data = group_spec(nccl={"socket_ifname": "eth1"})
    data["instances"][0]["env"] = {"NCCL_SOCKET_IFNAME": "ib0", "NCCL_DEBUG": "INFO"}
    assert problems_of(data) == [
        "instances[0].env.NCCL_SOCKET_IFNAME: multinode.nccl.socket_ifname sets NCCL_SOCKET_IFNAME too ('eth1', which "
        "wins over 'ib0') — set it in one place: remove it from env:, or the nccl setting"]
    data = group_spec()
    data["instances"][0]["env"] = {"NCCL_SOCKET_IFNAME": "ib0"}  # no nccl setting: env's is the one
    assert validate_spec(data).instances[0].serve_env["NCCL_SOCKET_IFNAME"] == "ib0"
