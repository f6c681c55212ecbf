"""The flags `provision tune` searches, their candidate values, and what each does to GPU memory.

Every flag and value is checked against the pinned vLLM's own `vllm serve` options (its catalog,
provisioner/vllm/catalogs) before anything runs; each candidate is then validated as a whole spec.
Verified in vLLM 0.25.0's source (engine/arg_utils.py, config/vllm.py, config/scheduler.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from provisioner.vllm.flags import load_catalog, option_problems
from provisioner.vllm.semantics import flag_kind, why


@dataclass(frozen=True)
class Axis:
    flag: str  # long name without --
    values: tuple[Any, ...]
    changes_memory: bool  # does a value change what the instance holds on its GPU?
    why: str  # what it moves, and why it does (not) change memory


# What moves latency and throughput (Seed 2, docs/bench.md), the strongest first: coordinate descent
# settles the flag that matters most before the others are tried against it.
AXES = {
    "max-num-batched-tokens": Axis("max-num-batched-tokens", (2048, 4096, 8192, 16384), True,
        "the token budget of one step: a long prefill is cut into chunks of it, each stalling the decodes "
        "batched with it (larger: higher ITL p99; smaller: more steps to a first token, higher TTFT). "
        "Memory: vLLM's profile run is one forward pass of this many tokens (the activation peak), and "
        "CUDA-graph sizes are clipped at it"),
    "max-num-seqs": Axis("max-num-seqs", (32, 64, 128, 256), True,
        "how many requests decode at once: fewer cap throughput and queue the rest (TTFT); more make each "
        "step slower (TPOT). Memory: the sampler's logits rows and the CUDA-graph sizes (up to 2 × it, "
        "512 at most) grow with it"),
    "performance-mode": Axis("performance-mode", ("balanced", "interactivity", "throughput"), True,
        "interactivity captures a CUDA graph for every batch size 1..32 (no padding at small batches); "
        "throughput doubles the default max-num-batched-tokens and max-num-seqs. Memory: both change the "
        "graphs captured or the batch sizes (throughput ran out of memory at 64 users on the H200, docs/bench.md)"),
    "async-scheduling": Axis("async-scheduling", (True, False), False,
        "overlaps the scheduling of the next step with the GPU's current one (per-step CPU overhead). "
        "Memory: none sized by it — vLLM's memory profile and the planner do not read it"),
    "max-cudagraph-capture-size": Axis("max-cudagraph-capture-size", (32, 128, 512), True,
        "batches above the largest captured size run without CUDA graphs (a slower step). Memory: every "
        "captured size holds its graph's buffers"),
}
DEFAULT_FLAGS = tuple(AXES)


class SpaceError(ValueError):
    """A flag or value the pinned vLLM would reject; the message names it and the fix."""


def search_space(version: str, overrides: dict[str, tuple[Any, ...]] | None = None,
                 allow_semantic: tuple[str, ...] = ()) -> tuple[Axis, ...]:
    """The axes searched: the default ones, or exactly `overrides` (flag → values, in order) — each
    flag and value checked against `version`'s catalog, and each a performance flag (semantics.yml) unless
    `allow_semantic` names it: a tune never changes what the model generates unasked."""
    if overrides:
        axes = tuple(_axis(flag, values) for flag, values in overrides.items())
    else:
        axes = tuple(AXES[flag] for flag in DEFAULT_FLAGS)
    problems = []
    for axis in axes:
        for value in axis.values:
            for key, message in option_problems(version, option_changes(version, {axis.flag: value},
                                                                           drop_unset=True)).items():
                problems.append(f"{axis.flag}={value}: {message}")
    if problems:
        raise SpaceError("--space: the search space has flags or values vLLM would reject: " + "; ".join(problems))
    semantic = [axis.flag for axis in axes if flag_kind(axis.flag) != "performance" and axis.flag not in allow_semantic]
    if semantic:
        raise SpaceError("--space: " + "; ".join(
            f"{flag} changes what the model generates ({why(flag)})" if flag_kind(flag) == "semantic" else
            f"{flag} is not known to change only speed and memory ({why(flag)})" for flag in semantic)
            + " — provision tune searches only flags that keep the model's outputs; to search "
            + ("it" if len(semantic) == 1 else "them") + " anyway, accept the change for this instance: "
            + " ".join(f"--allow-semantic {flag}" for flag in semantic))
    return axes


def _axis(flag: str, values: tuple[Any, ...]) -> Axis:
    known = AXES.get(flag)
    if known:
        return Axis(flag, values, known.changes_memory, known.why)
    # a flag we have not studied: assume it changes memory (the safe side: it never shares a GPU)
    return Axis(flag, values, True, "not studied by provision tune: assumed to change memory")


def option_changes(version: str, changes: dict[str, Any], drop_unset: bool = False) -> dict[str, Any]:
    """Candidate changes as the spec's options take them: a boolean flag's False becomes its negative
    set to true (`no-async-scheduling: true`: vLLM drops a false boolean in a config file) and the
    other of the pair removed (None). drop_unset: leave out the removals (to check values alone)."""
    catalog = load_catalog(version)
    options: dict[str, Any] = {}
    for flag, value in changes.items():
        negative = catalog.negative_of(flag)
        if negative and isinstance(value, bool):
            options[flag], options[negative] = (True, None) if value else (None, True)
        else:
            options[flag] = value
    return {key: value for key, value in options.items() if value is not None} if drop_unset else options


def memory_neutral(changes: dict[str, Any], axes: tuple[Axis, ...]) -> bool:
    """True when no changed flag changes GPU memory: the candidate holds what the deployed instance holds."""
    by_flag = {axis.flag: axis for axis in axes}
    return all(flag in by_flag and not by_flag[flag].changes_memory for flag in changes)


def side_by_side_groups(candidates: list[dict[str, Any]], axes: tuple[Axis, ...], share: float) -> list[list[int]]:
    """Which candidates (indexes) may be deployed side by side on one GPU, each with the instance's own
    share: only memory-neutral ones (each holds exactly what the deployed instance holds, so the memory
    plan that admitted it admits them), at most 1 // share of them at once. Every other candidate is a
    group of its own. Benches still run one candidate at a time: load on two at once would split the
    GPU's SMs and memory bandwidth between them and falsify both measurements."""
    per_gpu = max(1, int(1 // share)) if share > 0 else 1
    neutral = [index for index, changes in enumerate(candidates) if memory_neutral(changes, axes)]
    groups = [neutral[start:start + per_gpu] for start in range(0, len(neutral), per_gpu)]
    groups += [[index] for index, changes in enumerate(candidates) if index not in neutral]
    return sorted(groups)
