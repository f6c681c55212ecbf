"""The memory plan of a host: for each GPU its instances use, the planner's table (memory.plan_gpu).

The GPU's memory comes from the spec (`gpus.devices[].memory_mib`, what nvidia-smi's memory.total
says) or, for the cards in tests/fixtures/gpu, from the model name. A model's shape comes from its
local config.json or the built-in shapes (memory.load_model_shape). Where either is unknown the GPU
gets a note saying what to add, not a guess. Instances sharing a GPU start in spec order (the units'
After=), which is the order the planner checks vLLM's startup memory test in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from provisioner.spec import Host, Instance, gpu_label
from provisioner.vllm.flags import length
from provisioner.vllm.memory import GpuPlan, InstanceDemand, cuda_total_bytes, load_model_shape, plan_gpu

# nvidia-smi's memory.total (MiB) of the cards in tests/fixtures/gpu (H200: recorded; the others: public specifications)
GPU_MEMORY_MIB = {
    "NVIDIA H200": 143771,
    "NVIDIA GeForce RTX 3090": 24576,
    "NVIDIA GeForce RTX 4090": 24564,
    "NVIDIA GeForce RTX 4070": 12282,
}


@dataclass
class GpuMemory:
    """One GPU of a host and what the planner says of the instances on it."""

    label: str  # "GPU 0"
    instances: list[str]
    plan: GpuPlan | None = None
    note: str | None = None  # why there is no plan
    problems: list[str] = field(default_factory=list)


def host_memory(host: Host, instances: list[Instance]) -> list[GpuMemory]:
    """A GpuMemory per GPU that the host's instances use, in the order of first use."""
    users: dict[str, list[Instance]] = {}
    for instance in instances:
        for label in dict.fromkeys(gpu_label(host, ref) for ref in instance.gpus):
            users.setdefault(label, []).append(instance)
    return [gpu_memory(host, label, on_gpu) for label, on_gpu in users.items()]


def gpu_memory(host: Host, label: str, instances: list[Instance]) -> GpuMemory:
    result = GpuMemory(label, [instance.name for instance in instances])
    device = next((device for device in host.gpus.devices if f"GPU {device.index}" == label), None)
    mib = device_memory_mib(device)
    if mib is None:
        model = device.model if device and device.model else "this GPU"
        result.note = (f"memory of {label} ({model}) unknown — set its memory_mib (nvidia-smi "
                       "--query-gpu=memory.total) to check the instances' memory")
        return result
    demands = []
    for instance in instances:
        try:
            demands.append(demand_of(instance))
        except ValueError as error:  # ModelShapeError too: an unknown model, an unreadable length
            result.note = f"{instance.name}: {error}"
            return result
    result.plan = plan_gpu(cuda_total_bytes(mib * 2**20), demands, host.gpus.memory_share_limit,
                           gpu_name=device.model or "")
    result.problems = result.plan.problems
    return result


def device_memory_mib(device) -> int | None:
    if device is None:
        return None
    if device.memory_mib:
        return device.memory_mib
    return GPU_MEMORY_MIB.get(device.model or "")


def demand_of(instance: Instance) -> InstanceDemand:
    """What the planner needs of an instance: its model's shape and the flags that size memory."""
    options = {key.replace("_", "-"): value for key, value in instance.serve_options.items()}
    return InstanceDemand(
        name=instance.name,
        shape=load_model_shape(instance.model),
        gpu_memory_utilization=instance.gpu_memory_utilization,
        dtype=str(options.get("dtype", "auto")),
        kv_cache_dtype=str(options.get("kv-cache-dtype", "auto")),
        max_model_len=length(options.get("max-model-len")),
        max_num_batched_tokens=length(options.get("max-num-batched-tokens")),
        max_num_seqs=length(options.get("max-num-seqs")),
        tensor_parallel_size=int(options.get("tensor-parallel-size", 1)),
        block_size=int(options.get("block-size", 16)),
        enforce_eager=options.get("enforce-eager") is True,
        performance_mode=str(options.get("performance-mode", "balanced")),
    )
