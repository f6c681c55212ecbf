"""Where the time of a batch-1 decode step goes: vLLM's own torch profiler on a served instance
(started with --profiler-config), driven by `vllm bench serve --profile` (2 requests, 512 in / 128
out, one at a time), then the trace read step by step.

A decode step at batch 1 replays one CUDA graph; its kernels carry the correlation id of the
cudaGraphLaunch. From one graph launch's first kernel to the next one's is one step (wall); the union
of kernel intervals inside it is the GPU's busy time; the rest is the GPU waiting for the host.
Kernel time is also split by kind (GEMM/GEMV, attention, Triton-generated, other) and the top kernels
listed. The torch profiler (CUPTI) adds a little to each kernel: compare `wall` with the bench's ITL.
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import statistics
import subprocess
import time
from pathlib import Path

KINDS = (("gemm", ("gemm", "gemv", "nvjet", "cutlass", "sm90_xmma", "cublas")), ("attention", ("flash", "fmha")),
         ("triton", ("triton",)))


def trace(name: str, port: int, traces: Path, stage: Path, vllm: Path) -> dict:
    """vllm: the `vllm` the units run (benchmarks/h200/run.py's units_vllm)."""
    before = set(glob.glob(str(traces / "*.pt.trace.json*")))
    argv = [str(vllm), "bench", "serve", "--backend", "vllm", "--base-url", f"http://127.0.0.1:{port}",
            "--model", str(stage / "model"), "--tokenizer", str(stage / "tok"), "--dataset-name", "random",
            "--random-input-len", "512", "--random-output-len", "128", "--ignore-eos", "--num-prompts", "2",
            "--max-concurrency", "1", "--seed", str(int(time.time())), "--profile", "--disable-tqdm"]
    bench = subprocess.run(argv, capture_output=True, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # the worker writes the trace after /stop_profile returns
        new = sorted(set(glob.glob(str(traces / "*rank0*.pt.trace.json*"))) - before)
        if new and _complete(new[-1]):
            break
        time.sleep(2)
    else:
        raise SystemExit(f"no trace in {traces}; bench said:\n{bench.stdout[-2000:]}{bench.stderr[-2000:]}")
    summary = analyse(Path(new[-1]))
    summary["bench_itl_line"] = [line for line in bench.stdout.splitlines() if "ITL" in line or "TPOT" in line]
    (traces.parent / f"trace-{name}.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    return summary


def _complete(path: str) -> bool:
    try:
        _load(Path(path))
        return True
    except (OSError, ValueError, EOFError):
        return False


def _load(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as file:
        return json.load(file)["traceEvents"]


def analyse(path: Path) -> dict:
    events = _load(path)
    gpu = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
                 key=lambda e: e["ts"])
    launches = {e["args"]["correlation"] for e in events
                if e.get("cat") == "cuda_runtime" and e.get("name") == "cudaGraphLaunch"}
    first: dict[int, float] = {}
    for kernel in gpu:
        correlation = kernel.get("args", {}).get("correlation")
        if correlation in launches and correlation not in first:
            first[correlation] = kernel["ts"]
    starts = sorted(first.values())
    walls, busys = [], []
    kinds: collections.Counter = collections.Counter()
    names: collections.Counter = collections.Counter()
    counts: list[int] = []
    index = 0
    for start, end in zip(starts, starts[1:]):
        while index < len(gpu) and gpu[index]["ts"] < start:
            index += 1
        inside = []
        while index < len(gpu) and gpu[index]["ts"] < end:
            inside.append(gpu[index])
            index += 1
        busy, low, high = 0.0, None, None
        for kernel in inside:
            begin, finish = kernel["ts"], kernel["ts"] + kernel["dur"]
            if high is None or begin > high:
                busy += (high - low) if high is not None else 0
                low, high = begin, finish
            else:
                high = max(high, finish)
        busy += (high - low) if high is not None else 0
        walls.append(end - start)
        busys.append(busy)
        counts.append(len(inside))
        for kernel in inside:
            kinds[_kind(kernel["name"])] += kernel["dur"]
            names[kernel["name"][:90]] += kernel["dur"]
    steps = len(walls)
    if not steps:
        return {"trace": str(path), "error": "no CUDA-graph decode steps found"}
    # the steady decode steps: drop the slowest 10 % (prefill, the step after it, the end of a request)
    steady = sorted(range(steps), key=lambda i: walls[i])[: max(1, int(steps * 0.9))]
    return {
        "trace": path.name,
        "steps": steps,
        "wall_ms_median": round(statistics.median(walls) / 1e3, 3),
        "gpu_busy_ms_median": round(statistics.median(busys) / 1e3, 3),
        "gpu_idle_ms_median": round(statistics.median([walls[i] - busys[i] for i in steady]) / 1e3, 3),
        "kernels_per_step_median": statistics.median(counts),
        "ms_per_step_by_kind": {kind: round(total / steps / 1e3, 3) for kind, total in kinds.most_common()},
        "top_kernels_ms_per_step": {name: round(total / steps / 1e3, 3) for name, total in names.most_common(15)},
    }


def _kind(name: str) -> str:
    lowered = name.lower()
    return next((kind for kind, marks in KINDS if any(mark in lowered for mark in marks)), "other")
