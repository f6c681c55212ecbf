"""Measurement (not a test), run on the lent H200 with gpu-lab's real vLLM 0.25.0 (`--load-format dummy`):
the candidates `provision tune` searches, measured side by side, and what a restart costs (issue 19).

  python3 benchmarks/h200/tune_grid.py grid OUT_DIR CANDIDATES     CANDIDATES: a JSON file {name: [flags]}
  python3 benchmarks/h200/tune_grid.py restart OUT_DIR CANDIDATES  the same names, their caches from `grid`

grid: every candidate starts at once, each on its own port and compile cache (VLLM_CACHE_ROOT under
  /root/tune-cache/NAME), each with the same share of the card and the same fixed KV cache (so that
  they start together without mis-sizing each other, vllm#55827, and so that a flag that changes memory
  use changes only that instance's activations). Then ROUNDS interleaved rounds (the candidates' order
  rotated each round): per candidate the load `single` (1 user) and `concurrent` (64 users), measured
  one at a time by vLLM's own `vllm bench serve` (called in this process, vllm.benchmarks.serve.main, so
  vLLM's import is paid once), 512 tokens in, 128 out, `--ignore-eos`, a fresh seed per run. Each run
  is vLLM's own result JSON: OUT_DIR/NAME/LOAD-rROUND.json. The servers' start to ready:
  OUT_DIR/grid.json, their logs OUT_DIR/server-NAME.log.
restart: each candidate restarted alone with its compile cache from `grid` (what a unit restart meets),
  twice: ready as our probe says (/health, then one 1-token completion), and ready after a warm-up
  (64 short requests at once, then one long prefill); then the first batch of 64 users (512-token
  prompts, 128 out) and the same batch again: their TTFTs. OUT_DIR/restart.json.
proof: both of the above in one call for a few candidates (cold start together, first users; warm
  restart alone with a warm-up; side by side in interleaved rounds): OUT_DIR/proof.json, NAME/LOAD-rN.json.
sampling-warm-up: the first candidate started cold, warmed up in the model's own sampling (16 short
  requests at once), then two batches of 64 users in that sampling: OUT_DIR/sampling-warm-up.json.

Standard library and gpu-lab's vLLM only; nothing here changes the GPU's settings.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from start_and_metrics import STAGE, batch, ready, start, stop  # noqa: E402

ROUNDS = 3
SHARE = "0.15"
KV_BYTES = str(4 * 1024 ** 3)
LOADS = {"single": {"max_concurrency": 1, "num_prompts": 12},
         "concurrent": {"max_concurrency": 64, "num_prompts": 192}}
FIRST_PORT = 8100
USERS = 64  # the first users after a restart: the concurrent load
WARM_UP_PREFILL_WORDS = 3000


def bench(port: int, load: str, out: Path, seed: int) -> dict:
    """One `vllm bench serve` run of `load` against the server on `port`, its result JSON kept in `out`."""
    from vllm.benchmarks.serve import add_cli_args, main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    settings = LOADS[load]
    args = parser.parse_args([
        "--backend", "vllm", "--base-url", f"http://127.0.0.1:{port}", "--model", "m",
        "--tokenizer", str(STAGE / "tok"), "--dataset-name", "random", "--random-input-len", "512",
        "--random-output-len", "128", "--ignore-eos", "--num-prompts", str(settings["num_prompts"]),
        "--max-concurrency", str(settings["max_concurrency"]), "--seed", str(seed),
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
        "--save-result", "--result-dir", str(out.parent), "--result-filename", out.name,
        "--disable-tqdm"])
    return bench_main(args)


def candidates_of(path: str) -> dict[str, list[str]]:
    return json.loads(Path(path).read_text())


def grid(out: Path, candidates: dict[str, list[str]]) -> dict:
    servers = {}
    for index, (name, flags) in enumerate(candidates.items()):
        port = FIRST_PORT + index
        servers[name] = (port, *start(port, Path("/root/tune-cache") / name, out / f"server-{name}.log",
                                      "--kv-cache-memory-bytes", KV_BYTES, *flags, share=SHARE))
    result: dict = {"started": {}, "runs": {}}
    for name, (port, process, started) in servers.items():
        result["started"][name] = ready(port, process, started, limit_s=600)
        print("ready", name, result["started"][name], flush=True)
        (out / "grid.json").write_text(json.dumps(result, indent=1))  # kept as it grows: a call may end first
    names = list(candidates)
    for round_index in range(1, ROUNDS + 1):
        order = names[round_index - 1:] + names[:round_index - 1]
        for name in order:
            port = servers[name][0]
            for load in LOADS:
                folder = out / name
                folder.mkdir(exist_ok=True)
                measured = bench(port, load, folder / f"{load}-r{round_index}.json", random.randrange(1, 2**31))
                summary = {key: round(measured[key], 2) for key in
                           ("output_throughput", "p99_ttft_ms", "median_tpot_ms", "p99_itl_ms") if key in measured}
                result["runs"].setdefault(name, {}).setdefault(load, []).append(summary)
                print("run", round_index, name, load, json.dumps(summary), flush=True)
                (out / "grid.json").write_text(json.dumps(result, indent=1))
    for _, process, _ in servers.values():
        stop(process)
    return result


def restart(out: Path, candidates: dict[str, list[str]]) -> dict:
    """Each candidate restarted alone, twice, with its warm compile cache: once ready as our probe says
    (then the first 64-user batch meets whatever the probe did not trigger), once with a warm-up after
    the probe (64 short requests at once, then one prefill as long as a chunk) — each then the first
    batch of 64 users and the same again."""
    result: dict = {}
    for name, flags in candidates.items():
        for warmed in (False, True):
            key = f"{name}{'+warm-up' if warmed else ''}"
            process, started = start(FIRST_PORT, Path("/root/tune-cache") / name, out / f"server-restart-{key}.log",
                                     "--kv-cache-memory-bytes", KV_BYTES, *flags, share=SHARE)
            result[key] = ready(FIRST_PORT, process, started, limit_s=600)
            if warmed:
                result[key]["warm_up"] = warm_up(FIRST_PORT)
                result[key]["ready_with_warm_up_s"] = round(time.monotonic() - started, 1)
            result[key]["first_batch"] = batch(FIRST_PORT, users=USERS)
            result[key]["second_batch"] = batch(FIRST_PORT, users=USERS)
            result[key]["stop_s"] = stop(process)
            print("restart", key, json.dumps(result[key]), flush=True)
            (out / "restart.json").write_text(json.dumps(result, indent=1))
    return result


def warm_up(port: int) -> dict:
    """What a warm readiness step sends before any user comes: USERS short requests at once (the decode
    batch sizes), then one prompt of WARM_UP_PREFILL_WORDS (a full prefill chunk)."""
    started = time.monotonic()
    short = batch(port, users=USERS, words=16, out_tokens=8)
    long = batch(port, users=1, words=WARM_UP_PREFILL_WORDS, out_tokens=8)
    return {"seconds": round(time.monotonic() - started, 2), "short": short, "long": long}


def proof(out: Path, candidates: dict[str, list[str]]) -> dict:
    """One device call: (1) every candidate started cold at once, ready as our probe says, then its first
    batch of 64 users and the same again; (2) the last one restarted alone with its now warm cache, ready, then
    warmed up, then the two batches; (3) all started again at once (warm), warmed up, and measured side by
    side in ROUNDS interleaved rounds of `single` and `concurrent`, as `grid` does."""
    result: dict = {"cold": {}, "restart": {}}
    names = list(candidates)
    ports = {name: FIRST_PORT + index for index, name in enumerate(names)}

    def start_all(tag: str) -> dict:
        return {name: start(ports[name], Path("/root/tune-cache") / name, out / f"server-{tag}-{name}.log",
                            "--kv-cache-memory-bytes", KV_BYTES, *candidates[name], share=SHARE) for name in names}

    def save() -> None:
        (out / "proof.json").write_text(json.dumps(result, indent=1))

    servers = start_all("cold")
    for name, (process, started) in servers.items():
        result["cold"][name] = ready(ports[name], process, started, limit_s=400)
    for name in names:
        result["cold"][name]["first_batch"] = batch(ports[name], users=USERS)
        result["cold"][name]["second_batch"] = batch(ports[name], users=USERS)
        print("cold", name, json.dumps(result["cold"][name]), flush=True)
    for process, _ in servers.values():
        stop(process)
    save()
    for name in names[-1:]:  # the last candidate (the tuned one): a device call has room for one restart
        process, started = start(ports[name], Path("/root/tune-cache") / name, out / f"server-restart-{name}.log",
                                 "--kv-cache-memory-bytes", KV_BYTES, *candidates[name], share=SHARE)
        marks = ready(ports[name], process, started, limit_s=400)
        marks["warm_up"] = warm_up(ports[name])
        marks["ready_with_warm_up_s"] = round(time.monotonic() - started, 1)
        marks["first_batch"] = batch(ports[name], users=USERS)
        marks["second_batch"] = batch(ports[name], users=USERS)
        marks["stop_s"] = stop(process)
        result["restart"][name] = marks
        print("restart", name, json.dumps(marks), flush=True)
        save()
    servers = start_all("side-by-side")
    result["side_by_side"] = {"started": {}, "runs": {}}
    for name, (process, started) in servers.items():
        result["side_by_side"]["started"][name] = ready(ports[name], process, started, limit_s=400)
    for name in names:
        result["side_by_side"]["started"][name]["warm_up"] = warm_up(ports[name])
    save()
    for round_index in range(1, ROUNDS + 1):
        order = names[(round_index - 1) % len(names):] + names[:(round_index - 1) % len(names)]
        for name in order:
            for load in LOADS:
                folder = out / name
                folder.mkdir(exist_ok=True)
                measured = bench(ports[name], load, folder / f"{load}-r{round_index}.json", random.randrange(1, 2**31))
                summary = {key: round(measured[key], 2) for key in
                           ("output_throughput", "p99_ttft_ms", "median_tpot_ms", "p99_itl_ms") if key in measured}
                result["side_by_side"]["runs"].setdefault(name, {}).setdefault(load, []).append(summary)
                print("run", round_index, name, load, json.dumps(summary), flush=True)
                save()
    for process, _ in servers.values():
        stop(process)
    return result


def sampling_warm_up(out: Path, candidates: dict[str, list[str]]) -> dict:
    """The first candidate started cold, ready as our probe says; then a warm-up in the model's own
    sampling (no sampling fields: its generation_config.json's top-k/top-p, which vLLM runs through a
    Triton kernel JIT-compiled at the first batch of 8 or more rows): 16 short requests at once, then 9; then the first batch of 64 users
    and the same again, both in the model's own sampling too."""
    name, flags = next(iter(candidates.items()))
    process, started = start(FIRST_PORT, Path("/root/tune-cache") / name, out / f"server-sampling-{name}.log",
                             "--kv-cache-memory-bytes", KV_BYTES, *flags, share=SHARE)
    result = ready(FIRST_PORT, process, started, limit_s=300)
    warm = time.monotonic()
    # Triton specializes an int argument on whether it divides by 16: a batch of 16 rows and one of 9
    result["warm_up"] = [batch(FIRST_PORT, users=users, words=16, out_tokens=8, sampling={}) for users in (16, 9)]
    result["warm_up_s"] = round(time.monotonic() - warm, 2)
    result["first_batch"] = batch(FIRST_PORT, users=USERS, sampling={})
    result["second_batch"] = batch(FIRST_PORT, users=USERS, sampling={})
    result["stop_s"] = stop(process)
    print("sampling", name, json.dumps(result), flush=True)
    return result


def main(phase: str, out_dir: str, candidates_file: str) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    random.seed(time.time_ns())
    result = {"grid": grid, "restart": restart, "proof": proof, "sampling-warm-up": sampling_warm_up}[phase](out, candidates_of(candidates_file))
    (out / f"{phase}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:])
