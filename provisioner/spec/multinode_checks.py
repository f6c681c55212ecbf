"""Pass 2 for multi-node instances (an instance's `multinode:` section): the followers' hosts, the same GPU count
and vLLM on every node, where the rendezvous is, and what the multi-node launcher does not run with.

vLLM 0.25.0's launcher (vllm/entrypoints/cli/serve.py, run_headless; vllm/v1/executor/multiproc_executor.py):
node rank 0 runs the API and the rendezvous (torch.distributed's TCPStore on --master-addr:--master-port); the
nodes of rank 1… run headless and join it; every node runs world size / --nnodes workers, one per GPU. The GPU
references, shares and parallel sizes of the followers are checked with the instance's own (cross_checks).
"""

from __future__ import annotations

import difflib
import ipaddress

from provisioner.spec.errors import Problem
from provisioner.spec.models import Host, Instance, nccl_env
from provisioner.spec.parts import SpecParts, present

UNREACHABLE = ("localhost", "0.0.0.0", "::")  # no other host reaches the leader there (nor at 127.0.0.0/8, ::1)


def multinode_problems(parts: SpecParts) -> list[Problem]:
    hosts = {host.name: (index, host) for index, host in present(parts.hosts)}
    problems = []
    for index, instance in present(parts.instances):
        if instance.multinode is None:
            continue
        where = f"instances[{index}]"
        problems += _runtime_problems(where, instance)
        problems += _nccl_env_problems(where, instance)
        problems += _follower_problems(where, instance, hosts, parts.host_names)
        if instance.host in hosts:
            problems += _rendezvous_problems(where, instance, hosts[instance.host][1])
    return problems


def _runtime_problems(where: str, instance: Instance) -> list[Problem]:
    problems = []
    if instance.container is not None:
        problems.append(Problem(f"{where}.container", "a multi-node instance runs in the hosts' venvs: podman and "
                                "docker do not run one yet — remove container: (or multinode:)"))
    backend = {key.replace("_", "-"): value for key, value in instance.options.items()}.get(
        "distributed-executor-backend")
    if backend not in (None, "mp"):
        problems.append(Problem(f"{where}.options.distributed-executor-backend",
                                f"multinode: runs vLLM's own multi-node launcher, which needs the mp backend, not "
                                f"{backend!r} (a Ray cluster is yours to run) — remove the option or set it to mp"))
    return problems


# the nccl: settings, by the environment variable each one sets
NCCL_SETTINGS = {"NCCL_SOCKET_IFNAME": "socket_ifname", "GLOO_SOCKET_IFNAME": "socket_ifname",
                 "NCCL_P2P_DISABLE": "p2p_disable", "NCCL_IB_DISABLE": "ib_disable"}


def _nccl_env_problems(where: str, instance: Instance) -> list[Problem]:
    """A variable both env: and multinode.nccl set: the nccl setting won, and env's value was dropped unsaid."""
    made = nccl_env(instance.multinode.nccl)
    return [Problem(f"{where}.env.{name}", f"multinode.nccl.{NCCL_SETTINGS[name]} sets {name} too "
                    f"({made[name]!r}, which wins over {value!r}) — set it in one place: remove it from env:, or "
                    f"the nccl setting")
            for name, value in instance.env.items() if name in made]


def _follower_problems(where: str, instance: Instance, hosts: dict[str, tuple[int, Host]],
                       known: list[str] | None) -> list[Problem]:
    problems = []
    nodes = {instance.host: "its leader (host:)"}
    leader = hosts.get(instance.host)
    for rank, follower in enumerate(instance.multinode.followers, start=1):
        at = f"{where}.multinode.followers[{rank - 1}]"
        if follower.host in nodes:
            problems.append(Problem(f"{at}.host", f"host {follower.host} is already a node of this instance "
                                    f"({nodes[follower.host]}) — each node is another host"))
            continue
        nodes[follower.host] = f"followers[{rank - 1}]"
        if follower.host not in hosts:
            if known is not None and follower.host not in known:
                guess = difflib.get_close_matches(follower.host, known, n=1)
                hint = f"did you mean '{guess[0]}'? " if guess else ""
                problems.append(Problem(f"{at}.host", f"unknown host '{follower.host}' — {hint}hosts in this spec: "
                                        f"{', '.join(known) or 'none'}"))
            continue
        if len(follower.gpus) != len(instance.gpus):
            problems.append(Problem(f"{at}.gpus", f"{len(follower.gpus)} GPU(s) on {follower.host}, "
                                    f"{len(instance.gpus)} on the leader {instance.host} — vLLM runs as many workers "
                                    "on every node: give each node the same number of GPUs"))
        host_index, host = hosts[follower.host]
        if leader is not None and host.vllm.package_version != leader[1].vllm.package_version:
            problems.append(Problem(f"{at}.host", f"host {host.name} runs vLLM {host.vllm.package_version}, the "
                                    f"leader {instance.host} {leader[1].vllm.package_version} — every node runs the "
                                    f"same vLLM: give hosts[{host_index}].vllm and hosts[{leader[0]}].vllm the same "
                                    "version and cuda"))
    return problems


def _rendezvous_problems(where: str, instance: Instance, leader: Host) -> list[Problem]:
    multinode = instance.multinode
    address = multinode.master_addr or leader.address
    at = f"{where}.multinode.master_addr"
    problems = []
    if _unreachable(address):
        given = "" if multinode.master_addr else f" (the leader {leader.name}'s address: set master_addr)"
        problems.append(Problem(at, f"the followers cannot reach the rendezvous at {address}{given} — give an "
                                f"address of host {leader.name} they reach (e.g. its address on the nodes' network)"))
    return problems


def _unreachable(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address.lower() in UNREACHABLE
    return ip.is_loopback or ip.is_unspecified
