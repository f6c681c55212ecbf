"""P2P between the GPUs of a tensor-parallel group, for the planner's warnings.

Tensor parallelism exchanges activations between its GPUs at every layer. Without
P2P (peer-to-peer: one GPU reading the other's memory over PCIe or NVLink) NCCL
copies through host memory — and where a driver claims P2P it cannot do (GeForce
cards on a PHB path, seed 3), NCCL can hang. The planner warns and suggests one
instance per GPU, or NCCL_P2P_DISABLE=1.

The spec's host and instances are read duck-typed (no spec import here): host.gpus.devices
(index, uuid, model), instance.name / gpus / options / env.
"""

from __future__ import annotations

from itertools import combinations
from typing import Any

from provisioner.gpu.facts import GpuFacts, GpuLink

P2P_DISABLE = "NCCL_P2P_DISABLE"
# Without facts from the host: GeForce cards get no P2P over PCIe from NVIDIA's driver (an
# RTX 3090 pair has it only over an NVLink bridge, which `provision facts` shows).
NO_P2P_WITHOUT_FACTS = "GeForce cards: NVIDIA's driver offers no P2P over PCIe, only over an NVLink bridge"


def tensor_parallel_p2p_warnings(host: Any, instances: list[Any], facts: GpuFacts | None = None) -> list[str]:
    """One warning per instance whose tensor-parallel group spans GPUs without P2P.

    With `facts` (read on the host) the P2P status decides; without, the listed models do
    (GeForce pairs count as without P2P). Instances that set NCCL_P2P_DISABLE are left alone.
    """
    warnings = []
    for instance in instances:
        size = _tensor_parallel_size(instance)
        if size < 2 or P2P_DISABLE in instance.serve_env:
            continue
        indexes = [index for index in (_device_index(host, ref) for ref in instance.gpus) if index is not None]
        groups = [indexes[start:start + size] for start in range(0, len(indexes), size)]
        blocked = [
            (first, second, reason)
            for group in groups
            for first, second in combinations(group, 2)
            if (reason := _no_p2p_reason(host, facts, first, second))
        ]
        if blocked:
            warnings.append(_warning(instance.name, size, indexes, blocked))
    return warnings


def _warning(name: str, size: int, indexes: list[int], blocked: list[tuple[int, int, str]]) -> str:
    pairs = "; ".join(f"GPUs {first} and {second}: {reason}" for first, second, reason in blocked)
    return (
        f"{name}: tensor-parallel-size {size} spans GPUs {', '.join(map(str, indexes))} without P2P ({pairs}) — "
        "NCCL then copies through host memory, or hangs where the driver claims P2P it cannot do; "
        f"run one instance per GPU, or set env {P2P_DISABLE}: \"1\" on this instance"
    )


def _no_p2p_reason(host: Any, facts: GpuFacts | None, first: int, second: int) -> str | None:
    """Why two GPUs have no P2P, or None when they have it (or it cannot be told)."""
    link = facts.link(first, second) if facts else None
    if link is not None and link.p2p is not None:
        return None if link.p2p else describe_link(link)
    models = [_model(host, index) for index in (first, second)]
    if all("GeForce" in model for model in models):
        return NO_P2P_WITHOUT_FACTS
    return None


def describe_link(link: GpuLink) -> str:
    """'PCIe path PHB, P2P read gpu not supported, write gpu not supported'"""
    parts = []
    if link.pcie_path:
        parts.append(f"PCIe path {link.pcie_path}")
    if link.nvlink:
        parts.append("NVLink")
    for direction, status in (("read", link.p2p_read), ("write", link.p2p_write)):
        parts.append(f"P2P {direction} {(status or 'unknown').replace('_', ' ')}")
    return ", ".join(parts)


def _tensor_parallel_size(instance: Any) -> int:
    options = instance.serve_options
    value = options.get("tensor-parallel-size", options.get("tensor_parallel_size", 1))
    return value if isinstance(value, int) and not isinstance(value, bool) else 1


def _device_index(host: Any, ref: int | str) -> int | None:
    if isinstance(ref, int):
        return ref
    return next((device.index for device in host.gpus.devices if device.uuid == ref), None)


def _model(host: Any, index: int) -> str:
    device = next((device for device in host.gpus.devices if device.index == index), None)
    return (device.model or "") if device else ""


def multinode_split_warnings(instances: list[Any]) -> list[str]:
    """One warning per multi-node instance led from this host (node rank 0) whose split sends the most traffic
    between hosts: tensor parallel exchanges activations at every layer, so a tensor-parallel group larger than a
    node's GPUs runs its all-reduces over the network (vLLM's advice: tensor-parallel-size = GPUs per node,
    pipeline-parallel-size = nodes); without InfiniBand (nccl.ib_disable) that network is TCP sockets."""
    warnings = []
    for instance in instances:
        if getattr(instance, "multinode", None) is None or instance.node_rank != 0:
            continue
        size, per_node = _tensor_parallel_size(instance), len(instance.gpus)
        nodes = len(instance.multinode.followers) + 1
        if size > per_node:
            over = "TCP sockets (nccl.ib_disable)" if instance.multinode.nccl.ib_disable else "the network"
            warnings.append(
                f"{instance.name}: tensor-parallel-size {size} spans {nodes} hosts of {per_node} GPU(s) each — its "
                f"all-reduces at every layer go over {over} between hosts; set tensor-parallel-size {per_node} "
                f"and pipeline-parallel-size {nodes} (only pipeline stages cross hosts)")
    return warnings
