"""Measurement (not a test), run on the lent H200 with gpu-lab's real vLLM 0.25.0 (`--load-format dummy`):
where the seconds of a warm restart go, and what the levers a systemd unit can set save (issue 19).

  python3 benchmarks/h200/restart_study.py study|fork OUT_DIR [BUDGET_S]

Every server runs as our units run it: its own cache root with VLLM_CACHE_ROOT, TORCHINDUCTOR_CACHE_DIR and
TRITON_CACHE_DIR under it, `--gpu-memory-utilization 0.15`, a fixed KV cache of 4 GiB, `--max-model-len 4096`,
and here `--max-num-batched-tokens 512` (the configuration whose restart took 71.2 s before).
Each server's output is read through a pipe and every line stamped with the seconds since its process
started (OUT_DIR/server-NAME.log), so the phases of a start are timed to the millisecond.

study: (0) `import vllm.entrypoints.cli.main` timed with no .pyc (the bundle ships none; PYTHONDONTWRITEBYTECODE),
  then writing them, then with them (under -X importtime, its output kept); (1) the cold starts, at once, of `base` and of
  `fewgraphs` (10 CUDA-graph sizes instead of 51; its compile cache differs, so it needs its own cold
  start), each then warmed up in the model's own sampling (16 short requests at once, then 9);
  (2) warm restarts one at a time, each: ready as our probe says (/health, then one 1-token completion),
  then the same sampling warm-up: base with a stack sampler (stack_sampler/sitecustomize.py, 0.2 s) and
  VLLM_LOGGING_LEVEL=DEBUG; base; fewgraphs; base with VLLM_USE_V2_MODEL_RUNNER=0; base again.
  OUT_DIR/study.json; OUT_DIR/levers.json (seconds each lever saved against the mean of the plain base restarts).
fork: the configuration c64_grid.py chose (CHOSEN) started cold alone and restarted warm with
  VLLM_WORKER_MULTIPROC_METHOD=fork, then (budget allowing) restarted warm with vLLM's default spawn and with
  fork again: OUT_DIR/fork.json.
Standard library and gpu-lab's vLLM only; nothing here changes the GPU's settings.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from start_and_metrics import BUNDLE_ENV, STAGE, batch, request, stop  # noqa: E402
from start_and_metrics import ready as probe_ready  # noqa: E402

HERE = Path(__file__).resolve().parent
SHARE = "0.15"
KV_BYTES = str(4 * 1024 ** 3)
BASE = ["--max-num-batched-tokens", "512"]
FEW = ["--cudagraph-capture-sizes", "1", "2", "4", "8", "16", "32", "64", "128", "256", "512"]
CACHES = Path("/root/rstudy")
T0 = time.monotonic()


def cache_env(root: Path) -> dict:
    return {"VLLM_CACHE_ROOT": str(root / "vllm"), "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"),
            "TRITON_CACHE_DIR": str(root / "triton")}


def start(port: int, root: Path, log: Path, flags: list[str], env: dict | None = None) -> tuple[subprocess.Popen, float]:
    """A server as a unit starts it, its output stamped line by line with seconds since its start."""
    command = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(STAGE / "model"),
               "--tokenizer", str(STAGE / "tok"), "--load-format", "dummy", "--port", str(port),
               "--served-model-name", "m", "--max-model-len", "4096", "--shutdown-timeout", "5",
               "--gpu-memory-utilization", SHARE, "--kv-cache-memory-bytes", KV_BYTES, *flags]
    full = {**os.environ, **BUNDLE_ENV, **cache_env(root), "PYTHONUNBUFFERED": "1", **(env or {})}
    started = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=full,
                               start_new_session=True)
    wall = time.time()
    with open("/root/server-pids.txt", "a") as pids:  # process groups a wrapper kills if this script is cut short
        pids.write(f"{process.pid}\n")

    def pump() -> None:
        with log.open("w") as out:
            out.write(f"# started {wall:.3f} (unix) flags {' '.join(flags)} env {json.dumps(env or {})}\n")
            for raw in process.stdout:
                line = raw.decode(errors="replace").rstrip("\n")
                if '"POST /' in line or '"GET /' in line:
                    continue  # per-request access lines
                out.write(f"{time.monotonic() - started:8.3f} {line[-600:]}\n")
                out.flush()

    threading.Thread(target=pump, daemon=True).start()
    return process, started


def start_ready_warm_stop(cache: Path, log: Path, flags: list[str], env: dict) -> dict:
    """One server on port 8100: started, ready (our probe), warmed up in the model's own sampling, stopped;
    the seconds of each, or the error."""
    process, started = start(8100, cache, log, flags, env)
    try:
        marks = ready(8100, process, started)
        marks["sampling_warm_up"] = sampling_warm_up(8100)
        marks["ready_with_warm_up_s"] = round(time.monotonic() - started, 2)
    except RuntimeError as error:
        marks = {"error": str(error)}
    marks["stop_s"] = stop(process) if process.poll() is None else None
    return marks


def ready(port: int, process: subprocess.Popen, started: float) -> dict:
    """Our readiness probe (start_and_metrics.ready), polled every 0.1 s."""
    return probe_ready(port, process, started, poll_s=0.1)


def sampling_warm_up(port: int) -> dict:
    """16 short requests at once, then 9, in the model's own sampling (its top-k/top-p Triton kernel)."""
    began = time.monotonic()
    runs = [batch(port, users=users, words=16, out_tokens=8, sampling={}) for users in (16, 9)]
    return {"seconds": round(time.monotonic() - began, 2), "ttft_max_s": [run["ttft_max_s"] for run in runs]}


def sampling_warm_up_all(ports: dict[str, int]) -> dict[str, dict | None]:
    """sampling_warm_up on every server at once (name -> port); name -> its result (None: it raised)."""
    warmed: dict = {}
    threads = [threading.Thread(target=lambda n=name: warmed.__setitem__(n, sampling_warm_up(ports[n]))) for name in ports]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {name: warmed.get(name) for name in ports}


def timed_import(out: Path) -> dict:
    code = "import time; t = time.monotonic(); import vllm.entrypoints.cli.main; print(time.monotonic() - t)"
    env = {**os.environ, **BUNDLE_ENV}
    result = {}
    for name, extra_env, flags in (("no_pyc", {"PYTHONDONTWRITEBYTECODE": "1"}, []),
                                   ("writing_pyc", {}, []), ("with_pyc_importtime", {}, ["-X", "importtime"])):
        began = time.monotonic()
        done = subprocess.run([sys.executable, *flags, "-c", code], env={**env, **extra_env}, capture_output=True, text=True)
        result[name] = {"import_s": float(done.stdout.strip() or "nan"), "process_s": round(time.monotonic() - began, 2)}
        if "importtime" in name:
            (out / "importtime.txt").write_text(done.stderr)
        print("import", name, result[name], flush=True)
    site = STAGE / "site"
    result["pyc_files_after"] = sum(1 for _ in site.rglob("*.pyc"))
    return result


def study(out: Path, budget_s: float) -> dict:
    result: dict = {"import": timed_import(out)}
    save = lambda: (out / "study.json").write_text(json.dumps(result, indent=1))  # noqa: E731
    save()
    sampler = {"PYTHONPATH": f"{STAGE / 'site'}:{HERE / 'stack_sampler'}", "STACK_SAMPLE_S": "0.5"}
    servers = {"base": start(8100, CACHES / "base", out / "server-cold-base.log", BASE,
                             {**sampler, "STACK_SAMPLE_DIR": str(out / "stacks-cold-base")}),
               "fewgraphs": start(8101, CACHES / "fewgraphs", out / "server-cold-fewgraphs.log", BASE + FEW)}
    result["cold"] = {}
    for (name, (process, started)), port in zip(servers.items(), (8100, 8101)):
        result["cold"][name] = ready(port, process, started)
    for (name, (process, _)), port in zip(servers.items(), (8100, 8101)):
        result["cold"][name]["sampling_warm_up"] = sampling_warm_up(port)
        result["cold"][name]["stop_s"] = stop(process)
        print("cold", name, json.dumps(result["cold"][name]), flush=True)
    save()
    restarts = [("base+sampler+debug", "base", BASE, {**sampler, "STACK_SAMPLE_S": "0.2", "VLLM_LOGGING_LEVEL": "DEBUG",
                                                     "STACK_SAMPLE_DIR": str(out / "stacks-restart-base")}),
                ("base", "base", BASE, {}),
                ("fewgraphs", "fewgraphs", BASE + FEW, {}),
                ("base+v1runner", "base", BASE, {"VLLM_USE_V2_MODEL_RUNNER": "0"}),
                ("base-again", "base", BASE, {})]
    result["restart"] = {}
    for key, root, flags, env in restarts:
        if time.monotonic() - T0 > budget_s - 80:
            print("skip", key, "(budget)", flush=True)
            continue
        marks = start_ready_warm_stop(CACHES / root, out / f"server-restart-{key}.log", flags, env)
        result["restart"][key] = marks
        print("restart", key, json.dumps(marks), flush=True)
        save()
    plain = [result["restart"][k]["ready_s"] for k in ("base", "base-again") if "ready_s" in result["restart"].get(k, {})]
    if plain:
        mean = sum(plain) / len(plain)
        levers = {k: round(mean - v["ready_s"], 2) for k, v in result["restart"].items() if "ready_s" in v}
        result["levers_saved_s"] = levers
        (CACHES / "levers.json").write_text(json.dumps(levers))
    return result


CHOSEN = ["--max-num-batched-tokens", "1024", "--max-cudagraph-capture-size", "1024"]  # c64_grid.py's pick
FORK = {"VLLM_WORKER_MULTIPROC_METHOD": "fork"}


def fork(out: Path, budget_s: float) -> dict:
    """The chosen configuration (CHOSEN) with the EngineCore forked instead of spawned (`vllm serve` sets
    spawn unless VLLM_WORKER_MULTIPROC_METHOD is set): a cold start alone, then a warm restart, each ready and
    then the sampling warm-up; then, if the budget allows, a warm restart with vLLM's default (spawn)."""
    result: dict = {}
    runs = [("cold+fork", FORK), ("warm+fork", FORK), ("warm+spawn", {}), ("warm+fork-again", FORK)]
    for key, env in runs:
        if key != "cold+fork" and time.monotonic() - T0 > budget_s - 75:
            print("skip", key, "(budget)", flush=True)
            continue
        marks = start_ready_warm_stop(CACHES / "chosen", out / f"server-{key}.log", CHOSEN, env)
        result[key] = marks
        print(key, json.dumps(marks), flush=True)
        (out / "fork.json").write_text(json.dumps(result, indent=1))
    return result


def main(phase: str, out_dir: str, budget_s: str = "570") -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    result = {"study": study, "fork": fork}[phase](out, float(budget_s))
    (out / f"{phase}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:])
