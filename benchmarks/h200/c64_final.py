"""Measurement (not a test), run on the lent H200 with gpu-lab's real vLLM 0.25.0 (`--load-format dummy`):
issue 19's last GPU proof for 64 users (512 in / 128 out). (a) Does forking the EngineCore
(VLLM_WORKER_MULTIPROC_METHOD=fork, what our units set) cost anything under load against vLLM's default
spawn? (b) Is there a chunk size with ITL p99 <= 30 ms, output throughput >= defaults and TTFT p99 no worse
than defaults?

  export PYTHONPATH=/root/stage/stage/site VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
         VLLM_NO_USAGE_STATS=1   # the bench runs in this process: it needs the bundle's vLLM too
  python3 benchmarks/h200/c64_final.py OUT_DIR CANDIDATES [BUDGET_S] [MIRROR_JSON]

CANDIDATES: a JSON file {name: {"flags": [...], "env": {...}}} (benchmarks/h200/candidates/c64-final.json);
a candidate's env is added to the server's (an empty env leaves vLLM's default spawn: the variable is removed
from this process's environment first, so no candidate inherits it). Every candidate starts at once, cold, as
c64_grid.py starts them (restart_study.start: its own cache root under /root/c64final with VLLM_CACHE_ROOT,
TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR, `--gpu-memory-utilization 0.15`, a fixed 4 GiB KV cache,
`--max-model-len 4096`), is ready by our probe (/health, then one 1-token completion, every 0.1 s) and is
warmed up in the model's own sampling (16 short requests at once, then 9) before any measurement. Then
ROUNDS interleaved rounds (order rotated) of `concurrent` only (64 users, 192 prompts), then one `single`
run (1 user, 12 prompts) per candidate for c=1 TPOT: vLLM's own `vllm bench serve` (tune_grid.bench, in
process), --ignore-eos, a fresh seed per run, no sampling fields (the model's own sampling).
OUT_DIR/NAME/LOAD-rN.json are vLLM's result files; OUT_DIR/c64-final.json the summary, written after every
run (and copied to MIRROR_JSON, if given, so a call cut short still returns it); OUT_DIR/server-NAME.log the
servers' output, each line stamped with seconds since its process started (per-request access lines dropped).
A run is started only while more than RUN_RESERVE_S of BUDGET_S (default 540) is left.
Standard library and gpu-lab's vLLM only; nothing here changes the GPU's settings.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from c64_grid import FIRST_PORT, bench, start, stop  # noqa: E402
from restart_study import sampling_warm_up_all  # noqa: E402
from restart_phases import phases  # noqa: E402
from start_and_metrics import ready  # noqa: E402

ROUNDS = 5
CACHES = Path("/root/c64final")
RUN_RESERVE_S = 30  # a 64-user run took ~10 s (c64_grid); stopping five servers ~10 s
KEYS = ("output_throughput", "p99_ttft_ms", "median_ttft_ms", "p99_itl_ms", "median_itl_ms", "median_tpot_ms",
        "p99_tpot_ms", "duration", "completed")
T0 = time.monotonic()


def summary_of(measured: dict) -> dict:
    return {key: round(measured[key], 2) for key in KEYS if key in measured}


def medians(runs: list[dict]) -> dict:
    return {key: round(statistics.median(run[key] for run in runs), 2) for key in KEYS if runs and key in runs[0]}


def main(out_dir: str, candidates_file: str, budget_s: str = "540", mirror: str | None = None) -> None:
    budget = float(budget_s)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    random.seed(time.time_ns())
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout` cut the call short: still stop the servers
    os.environ.pop("VLLM_WORKER_MULTIPROC_METHOD", None)
    candidates = json.loads(Path(candidates_file).read_text())
    names = list(candidates)
    ports = {name: FIRST_PORT + index for index, name in enumerate(names)}
    result: dict = {"candidates": candidates, "rounds": ROUNDS, "started": {}, "order": [], "runs": {},
                    "skipped": []}

    def save() -> None:
        result["elapsed_s"] = round(time.monotonic() - T0, 1)
        (out / "c64-final.json").write_text(json.dumps(result, indent=1))
        if mirror:
            shutil.copyfile(out / "c64-final.json", mirror)

    def left() -> float:
        return budget - (time.monotonic() - T0)

    servers = {name: start(ports[name], CACHES / name, out / f"server-{name}.log", candidates[name]["flags"],
                           candidates[name]["env"]) for name in names}
    imported = time.monotonic()
    import vllm.benchmarks.serve  # noqa: F401  (paid once, while the servers start)
    result["bench_import_s"] = round(time.monotonic() - imported, 1)
    try:
        for name, (process, started) in servers.items():
            try:
                result["started"][name] = ready(ports[name], process, started, limit_s=max(60.0, left() - 60), poll_s=0.1)
            except RuntimeError as error:
                result["started"][name] = {"error": str(error)}
            print("ready", name, json.dumps(result["started"][name]), flush=True)
        live = [name for name in names if "ready_s" in result["started"][name]]
        warmed = sampling_warm_up_all({name: ports[name] for name in live})
        for name in names:
            started_marks = result["started"][name]
            started_marks["sampling_warm_up"] = warmed.get(name)
            marks = phases(out / f"server-{name}.log")  # engine - api: ~2.5 s forked, ~20 s spawned
            started_marks["log_marks_s"] = marks
        print("started", json.dumps(result["started"]), flush=True)
        save()
        plan = [(round_index, "concurrent") for round_index in range(1, ROUNDS + 1)] + [(1, "single")]
        for round_index, load in plan:
            shift = (round_index - 1) % len(live) if live else 0
            order = live[shift:] + live[:shift]
            result["order"].append({"round": round_index, "load": load, "order": order})
            for name in order:
                if left() < RUN_RESERVE_S:
                    result["skipped"].append(f"{name} {load} r{round_index}")
                    print("skip", name, load, round_index, "(budget)", flush=True)
                    continue
                folder = out / name
                folder.mkdir(exist_ok=True)
                seed = random.randrange(1, 2**31)
                began = time.monotonic()
                measured = bench(ports[name], load, folder / f"{load}-r{round_index}.json", seed)
                summary = summary_of(measured)
                summary.update(round=round_index, seed=seed, wall_s=round(time.monotonic() - began, 1),
                               at_s=round(began - T0, 1))
                result["runs"].setdefault(name, {}).setdefault(load, []).append(summary)
                print("run", round_index, name, load, json.dumps(summary), flush=True)
                save()
        result["median"] = {}
        for name, loads in result["runs"].items():
            concurrent = loads.get("concurrent", [])
            result["median"][name] = {"concurrent_r1_5": medians(concurrent),
                                      "concurrent_r2_5": medians([run for run in concurrent if run["round"] >= 2])}
        save()
    finally:
        stopped: dict = {}
        threads = [threading.Thread(target=lambda n=name, p=process: stopped.__setitem__(n, stop(p) if p.poll() is None else None))
                   for name, (process, _) in servers.items()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        result["stop_s"] = stopped
        save()
        print("done", round(time.monotonic() - T0, 1), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
