"""`plan_gpu`: the instances of one GPU side by side, in start order, with the problems and their fixes."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from provisioner.vllm.memory.byte_counts import (
    DEFAULT_OVERHEAD,
    GiB,
    Overhead,
    OverheadModel,
    block_bytes,
    default_batch_settings,
    estimate_overhead,
    logged_kv_tokens,
    weight_bytes,
)
from provisioner.vllm.memory.shapes import ModelShape


@dataclass(frozen=True)
class InstanceDemand:
    """One vLLM instance on the GPU being planned (options as `vllm serve` takes them)."""

    name: str
    shape: ModelShape
    gpu_memory_utilization: float
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    max_num_batched_tokens: int | None = None  # None: vLLM 0.25's default for this GPU
    max_num_seqs: int | None = None  # None: vLLM 0.25's default for this GPU
    tensor_parallel_size: int = 1
    block_size: int = 16
    enforce_eager: bool = False
    performance_mode: str = "balanced"


@dataclass
class InstancePlan:
    """What one instance gets on this GPU (bytes, per GPU)."""

    name: str
    share: float
    budget: int  # ceil(total × share): vLLM's requested memory
    weights: int
    overhead: Overhead
    kv_cache: bool  # False for encoder-only models
    kv_bytes: int  # budget − weights − overhead (negative: does not fit); 0 without a KV cache
    num_blocks: int
    kv_tokens: int  # as vLLM logs "GPU KV cache size"
    max_model_len: int
    max_num_batched_tokens: int
    max_num_seqs: int
    min_share: float  # the smallest share (2 decimals) that fits one max_model_len sequence / the instance
    footprint: int  # what the process holds on the GPU once started (budget or needs, plus outside)
    problems: list[str] = field(default_factory=list)

    @property
    def sequences(self) -> int:
        """Full-length sequences the KV cache holds at once: kv_tokens // max_model_len."""
        return self.kv_tokens // self.max_model_len if self.kv_cache else 0

    @property
    def needs(self) -> int:
        """Bytes inside the budget that are not KV cache: weights + activation peak + non-torch."""
        return self.weights + self.overhead.in_budget


TABLE_COLUMNS = ("instance", "share", "budget GiB", "weights GiB", "overhead GiB", "KV GiB", "KV tokens", "full-length sequences")


@dataclass
class GpuPlan:
    """The instances of one GPU side by side, and every problem found."""

    total_bytes: int
    usable_fraction: float
    instances: list[InstancePlan]
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def shares(self) -> float:
        return sum(instance.share for instance in self.instances)

    @property
    def footprint(self) -> int:
        """Bytes the instances hold in all once started (budgets or needs, plus what lives outside them)."""
        return sum(instance.footprint for instance in self.instances)

    @property
    def spare(self) -> int:
        """total_bytes − footprint: negative when the instances do not fit."""
        return self.total_bytes - self.footprint

    def table_rows(self) -> list[tuple[str, ...]]:
        """One row per instance, in TABLE_COLUMNS order, formatted for a per-GPU table."""
        rows = []
        for item in self.instances:
            if item.kv_cache:
                kv = f"{item.kv_bytes / GiB:.2f}"
                tokens = f"{item.kv_tokens:,}"
                sequences = f"{item.sequences:,} × {item.max_model_len:,}"
            else:
                kv, tokens, sequences = "—", "no KV cache", "—"
            rows.append(
                (
                    item.name,
                    f"{item.share:.2f}",
                    f"{item.budget / GiB:.2f}",
                    f"{item.weights / GiB:.2f}",
                    f"{item.overhead.in_budget / GiB:.2f}",
                    kv,
                    tokens,
                    sequences,
                )
            )
        return rows


def plan_gpu(
    total_bytes: int,
    instances: list[InstanceDemand],
    usable_fraction: float,
    gpu_name: str = "",
    model: OverheadModel = DEFAULT_OVERHEAD,
) -> GpuPlan:
    """Plan the instances that share one GPU, in the order they start.

    total_bytes is CUDA's total memory of the GPU (torch.cuda.mem_get_info()[1]; from nvidia-smi's
    memory.total use `cuda_total_bytes`). Problems: shares above usable_fraction; an instance
    whose weights and overhead do not fit its share; a KV cache smaller than one max_model_len
    sequence (vLLM refuses to start); max_model_len above the model's limit; an encoder that
    uses more than its share; an instance that would fail vLLM's free-memory check at startup
    because those started before it hold too much; the whole set not fitting the GPU.
    """
    plans = [_plan_instance(total_bytes, demand, usable_fraction, gpu_name, model) for demand in instances]
    problems: list[str] = []
    total_share = sum(plan.share for plan in plans)
    if total_share > usable_fraction + 1e-9:
        listed = " + ".join(f"{plan.name} {_fmt(plan.share)}" for plan in plans)
        problems.append(
            f"shares on this GPU ({listed}) add up to {_fmt(total_share)} (limit {_fmt(usable_fraction)}) — "
            f"lower gpu_memory_utilization so they add up to at most {_fmt(usable_fraction)}"
        )
    for plan in plans:
        problems.extend(plan.problems)
    held = 0
    for index, plan in enumerate(plans):
        # vLLM measures free memory after the process's own CUDA context exists (module docstring, 1).
        free = total_bytes - held - model.cuda_context
        if free < plan.budget:
            if index:
                when = "when it starts after " + ", ".join(p.name for p in plans[:index])
            else:
                when = f"when it starts (its own CUDA context holds about {_gib(model.cuda_context)})"
            fits = math.floor(round(free / total_bytes * 100, 9)) / 100
            problems.append(
                f"{plan.name}: would fail vLLM's startup check — about {_gib(free)} free {when}, less than its "
                f"request {_fmt(plan.share)} × {_gib(total_bytes)} = {_gib(plan.budget)} — lower its "
                f"gpu_memory_utilization to at most {_fmt(fits)}"
                + (", or lower the shares started before it" if index else "")
            )
        held += plan.footprint
    if held > total_bytes:
        excess = held - total_bytes
        with_kv = [plan.name for plan in plans if plan.kv_cache]
        lower = (
            f"lower the shares of {', '.join(with_kv)} by about {_fmt(_ceil2(excess / total_bytes))} in all"
            if with_kv
            else "move an instance to another GPU"
        )
        problems.append(
            f"the instances need about {_gib(held)} of this GPU's {_gib(total_bytes)} (budgets, plus per process "
            f"about {_gib(model.cuda_context)} of CUDA context and its CUDA graphs outside the budget), "
            f"{_gib(excess)} too much — {lower}, or use fewer instances"
        )
    return GpuPlan(total_bytes=total_bytes, usable_fraction=usable_fraction, instances=plans, problems=problems)


def _plan_instance(
    total_bytes: int, demand: InstanceDemand, usable_fraction: float, gpu_name: str, model: OverheadModel
) -> InstancePlan:
    shape, tp, name = demand.shape, demand.tensor_parallel_size, demand.name
    problems: list[str] = []
    max_model_len = demand.max_model_len or shape.max_position_embeddings
    if max_model_len > shape.max_position_embeddings:
        problems.append(
            f"{name}: max-model-len {max_model_len:,} is above the model's limit {shape.max_position_embeddings:,} "
            f"(max_position_embeddings; vLLM refuses it) — lower max-model-len to at most {shape.max_position_embeddings:,}"
        )
    tokens, seqs = default_batch_settings(
        total_bytes,
        max_model_len,
        chunked_prefill=not shape.encoder_only,
        max_num_batched_tokens=demand.max_num_batched_tokens,
        max_num_seqs=demand.max_num_seqs,
        gpu_name=gpu_name,
        performance_mode=demand.performance_mode,
    )
    share = demand.gpu_memory_utilization
    budget = math.ceil(total_bytes * share)
    extra = model.load_extra_encoder if shape.encoder_only else model.load_extra_decoder
    weights = weight_bytes(shape, demand.dtype, tp) + extra
    overhead = estimate_overhead(shape, demand.dtype, tokens, seqs, tp, demand.enforce_eager, model)
    needs = weights + overhead.in_budget

    if shape.encoder_only:
        min_share = _ceil2(needs / total_bytes)
        if needs > budget:
            problems.append(
                f"{name}: weights {_gib(weights)} + overhead {_gib(overhead.in_budget)} need more than its share "
                f"{_fmt(share)} × {_gib(total_bytes)} = {_gib(budget)} (vLLM does not hold an encoder-only model to "
                f"its share, so the other instances' budgets are at risk) — raise gpu_memory_utilization to at "
                f"least {_fmt(min_share)}"
                + _beyond(min_share, usable_fraction)
            )
        return InstancePlan(
            name=name, share=share, budget=budget, weights=weights, overhead=overhead, kv_cache=False,
            kv_bytes=0, num_blocks=0, kv_tokens=0, max_model_len=max_model_len, max_num_batched_tokens=tokens,
            max_num_seqs=seqs, min_share=min_share, footprint=max(needs, 0) + overhead.outside_budget,
            problems=problems,
        )

    block = block_bytes(shape, demand.block_size, demand.kv_cache_dtype, demand.dtype, tp)
    blocks_per_sequence = -(-max_model_len // demand.block_size)
    one_sequence = blocks_per_sequence * block
    min_share = _ceil2((needs + one_sequence) / total_bytes)
    kv = budget - needs
    num_blocks = max(kv, 0) // block
    kv_tokens = logged_kv_tokens(num_blocks, max_model_len, demand.block_size)
    if kv <= 0:
        problems.append(
            f"{name}: weights {_gib(weights)} + overhead {_gib(overhead.in_budget)} do not fit in "
            f"{_fmt(share)} × {_gib(total_bytes)} = {_gib(budget)} — raise gpu_memory_utilization to at least "
            f"{_fmt(min_share)} (for one {max_model_len:,}-token sequence), or use a smaller or quantized model"
            + _beyond(min_share, usable_fraction)
        )
    elif num_blocks < blocks_per_sequence:
        longest = num_blocks * demand.block_size
        problems.append(
            f"{name}: KV cache {_gib(kv)} holds {kv_tokens:,} tokens, less than one {max_model_len:,}-token "
            f"sequence (vLLM refuses to start) — lower max-model-len to at most {longest:,} or raise "
            f"gpu_memory_utilization to {_fmt(min_share)}" + _beyond(min_share, usable_fraction)
        )
    return InstancePlan(
        name=name, share=share, budget=budget, weights=weights, overhead=overhead, kv_cache=True, kv_bytes=kv,
        num_blocks=num_blocks, kv_tokens=kv_tokens, max_model_len=max_model_len, max_num_batched_tokens=tokens,
        max_num_seqs=seqs, min_share=min_share, footprint=max(budget, needs) + overhead.outside_budget,
        problems=problems,
    )


def _beyond(min_share: float, usable_fraction: float) -> str:
    if min_share <= usable_fraction:
        return ""
    return (
        f" — more than this GPU's limit {_fmt(usable_fraction)}: use a smaller or quantized model, a shorter "
        "max-model-len, or tensor parallelism over more GPUs"
    )


def _ceil2(fraction: float) -> float:
    """Round a share up to 2 decimals (the precision gpu_memory_utilization is written with)."""
    return math.ceil(round(fraction * 100, 9)) / 100


def _fmt(value: float) -> str:
    return f"{value:.2f}"


def _gib(value: float) -> str:
    return f"{value / GiB:.2f} GiB"
