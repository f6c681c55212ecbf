"""Measurement (not a test), run on the lent H200 with gpu-lab's real vLLM 0.25.0 (`--load-format dummy`):
can 64 users (512 in / 128 out) get ITL p99 <= 30 ms with throughput >= defaults and TTFT p99 no worse than
defaults (issue 19)? And a warm restart of the chosen candidate (restart_study.py's levers applied).

  python3 benchmarks/h200/c64_grid.py OUT_DIR CANDIDATES

Every candidate starts at once (cold: its own cache root, VLLM_CACHE_ROOT, TORCHINDUCTOR_CACHE_DIR,
TRITON_CACHE_DIR under it; restart_study.start), each with `--gpu-memory-utilization 0.15` and a fixed 4 GiB KV
cache. Each is warmed up in the model's own sampling (16 short requests at once, then 9: the top-k/top-p
Triton kernel's JIT) before any measurement. Then ROUNDS interleaved rounds (order rotated) of vLLM's own
`vllm bench serve` (tune_grid.bench, in process): `single` (1 user, 12 prompts) and `concurrent` (64 users,
192 prompts), 512 in / 128 out, --ignore-eos, a fresh seed per run: OUT_DIR/NAME/LOAD-rN.json, summary
OUT_DIR/c64.json. Last, the chosen candidate (ITL p99 <= 30 ms in rounds 2-3 with the lowest TTFT p99;
else mnbt1024) restarted alone with its warm caches, plus the env levers that /root/rstudy/levers.json says
saved more than 1 s: ready, then the sampling warm-up.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from restart_study import ready, sampling_warm_up, sampling_warm_up_all, start  # noqa: E402
from start_and_metrics import stop  # noqa: E402
from tune_grid import bench  # noqa: E402

ROUNDS = 3
FIRST_PORT = 8200
CACHES = Path("/root/c64")
ENV_LEVERS = {"base+v1runner": {"VLLM_USE_V2_MODEL_RUNNER": "0"}}


def main(out_dir: str, candidates_file: str) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    random.seed(time.time_ns())
    candidates = json.loads(Path(candidates_file).read_text())
    names = list(candidates)
    ports = {name: FIRST_PORT + index for index, name in enumerate(names)}
    result: dict = {"started": {}, "runs": {}}
    save = lambda: (out / "c64.json").write_text(json.dumps(result, indent=1))  # noqa: E731
    servers = {name: start(ports[name], CACHES / name, out / f"server-{name}.log", candidates[name]) for name in names}
    for name, (process, started) in servers.items():
        result["started"][name] = ready(ports[name], process, started)
    for name, warmed in sampling_warm_up_all(ports).items():
        result["started"][name]["sampling_warm_up"] = warmed
    print("started", json.dumps(result["started"]), flush=True)
    save()
    for round_index in range(1, ROUNDS + 1):
        order = names[(round_index - 1) % len(names):] + names[:(round_index - 1) % len(names)]
        for name in order:
            for load in ("single", "concurrent"):
                folder = out / name
                folder.mkdir(exist_ok=True)
                measured = bench(ports[name], load, folder / f"{load}-r{round_index}.json", random.randrange(1, 2**31))
                summary = {key: round(measured[key], 2) for key in
                           ("output_throughput", "p99_ttft_ms", "median_ttft_ms", "median_tpot_ms", "p99_itl_ms",
                            "median_itl_ms") if key in measured}
                result["runs"].setdefault(name, {}).setdefault(load, []).append(summary)
                print("run", round_index, name, load, json.dumps(summary), flush=True)
                save()
    for process, _ in servers.values():
        stop(process)

    def median(name: str, key: str) -> float:
        return statistics.median(run[key] for run in result["runs"][name]["concurrent"])

    fitting = [n for n in names if median(n, "p99_itl_ms") <= 30]
    chosen = min(fitting, key=lambda n: median(n, "p99_ttft_ms")) if fitting else "mnbt1024"
    levers_file = Path("/root/rstudy/levers.json")
    levers = json.loads(levers_file.read_text()) if levers_file.exists() else {}
    env: dict = {}
    for key, saved in levers.items():
        if saved > 1.0 and key in ENV_LEVERS:
            env.update(ENV_LEVERS[key])
    result["restart"] = {"chosen": chosen, "env": env, "levers_from_study": levers}
    process, started = start(FIRST_PORT, CACHES / chosen, out / f"server-restart-{chosen}.log", candidates[chosen], env)
    result["restart"].update(ready(FIRST_PORT, process, started))
    result["restart"]["sampling_warm_up"] = sampling_warm_up(FIRST_PORT)
    result["restart"]["ready_with_warm_up_s"] = round(time.monotonic() - started, 2)
    result["restart"]["stop_s"] = stop(process)
    print("restart", json.dumps(result["restart"]), flush=True)
    save()


if __name__ == "__main__":
    main(*sys.argv[1:])
