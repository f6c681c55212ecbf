"""Measurement (not a test), run on the lent H200 with gpu-lab's real vLLM 0.25.0 (`--load-format dummy`):
what an instance's start costs and what its first users meet (issue 19), and the Prometheus metrics it
exports under load (issue 20).

  python3 benchmarks/h200/start_and_metrics.py PHASE OUT_DIR      PHASE: cold-warm | warmup-kv | pair | metrics

cold-warm: a start with an empty compile cache (VLLM_CACHE_ROOT in a fresh folder), then a restart with
  that cache warm. After each, as soon as `/health` answers and one 1-token completion succeeded (what our
  readiness probe checks), a first batch of 16 users (512-token prompts, 128 tokens out, streamed), then
  the same batch again: each request's time to first token. /metrics is saved idle, during the second
  batch, and after it.
warmup-kv: a warm restart whose readiness also runs a warm-up (a 16-user batch of short prompts and
  one 2048-token prefill) before the first users; then a start with a fixed KV cache
  (`--kv-cache-memory-bytes`, no memory-profiling run), and two instances sharing the GPU started
  together with a fixed KV cache each (pair: that alone, and the same two sized by vLLM's profiling).
metrics: /metrics idle, under a load of 64 users streaming 512 tokens each (the busiest of one-a-second
  snapshots), and after it (issue 20's recording: tests/fixtures/vllm/h200-metrics).

Each phase writes OUT_DIR/<phase>.json (timings) and the servers' logs; cold-warm also the /metrics texts.
Standard library only; nothing here changes the GPU's settings.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

STAGE = Path("/root/stage/stage")
BUNDLE_ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
              "VLLM_NO_USAGE_STATS": "1", "PYTHONPATH": str(STAGE / "site")}
SHARE = 0.40
USERS = 16
PROMPT_WORDS = 512
OUT_TOKENS = 128
KV_BYTES = 20 * 1024 ** 3  # a fixed KV cache: what 0.40 of the card leaves after the 14.3 GiB of weights, about
WORDS = [f"w{index}" for index in range(2000)]


def start(port: int, cache: Path, log: Path, *extra: str, share: str | float = SHARE) -> tuple[subprocess.Popen, float]:
    command = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(STAGE / "model"),
               "--tokenizer", str(STAGE / "tok"), "--load-format", "dummy", "--port", str(port),
               "--served-model-name", "m", "--max-model-len", "4096", "--shutdown-timeout", "5", *extra]
    # with a fixed KV cache vLLM 0.25.0 still refuses to start unless the card has the share free (its
    # default, 0.92, when not given): the share goes with it
    command += ["--gpu-memory-utilization", str(share)]
    env = {**os.environ, **BUNDLE_ENV, "VLLM_CACHE_ROOT": str(cache)}
    return subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env,
                            start_new_session=True), time.monotonic()


def request(port: int, method: str, path: str, body: dict | None = None, timeout: float = 30.0) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request(method, path, body=json.dumps(body) if body else None,
                           headers={"Content-Type": "application/json"})
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


def ready(port: int, process: subprocess.Popen, started: float, limit_s: float = 400, poll_s: float = 0.5) -> dict:
    """As our readiness probe: /health 200, then one 1-token completion, polled every poll_s. Seconds
    since the start of each."""
    marks: dict = {}
    while time.monotonic() - started < limit_s:
        if process.poll() is not None:
            raise RuntimeError(f"server on {port} exited {process.returncode}")
        try:
            if "health_s" not in marks and request(port, "GET", "/health", timeout=2)[0] == 200:
                marks["health_s"] = round(time.monotonic() - started, 2)
            if "health_s" in marks:
                status, _ = request(port, "POST", "/v1/completions", {"model": "m", "prompt": "ping", "max_tokens": 1})
                if status == 200:
                    marks["ready_s"] = round(time.monotonic() - started, 2)
                    return marks
        except OSError:
            pass
        time.sleep(poll_s)
    raise RuntimeError(f"server on {port} not ready after {limit_s} s")


GREEDY = {"temperature": 0}


def ttft(port: int, words: int, out_tokens: int, results: list, sampling: dict = GREEDY) -> None:
    """One streamed completion: seconds to its first token, and to its end. `sampling`: the request's
    sampling fields ({} leaves the model's own defaults, its generation_config.json)."""
    prompt = " ".join(random.choice(WORDS) for _ in range(words))
    body = {"model": "m", "prompt": prompt, "max_tokens": out_tokens, "stream": True, "ignore_eos": True,
            **sampling}
    sent = time.monotonic()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    first = None
    try:
        connection.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        answer = connection.getresponse()
        for line in answer:
            if line.startswith(b"data: ") and first is None and b'"text"' in line:
                first = time.monotonic() - sent
        results.append({"ttft_s": round(first, 4) if first else None, "total_s": round(time.monotonic() - sent, 3),
                        "status": answer.status})
    except OSError as error:
        results.append({"error": repr(error)})
    finally:
        connection.close()


def batch(port: int, users: int = USERS, words: int = PROMPT_WORDS, out_tokens: int = OUT_TOKENS,
          sampling: dict = GREEDY) -> dict:
    """`users` streamed completions sent together: their TTFTs (sorted) and the p50/p99/max."""
    results: list = []
    threads = [threading.Thread(target=ttft, args=(port, words, out_tokens, results, sampling)) for _ in range(users)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    times = sorted(r["ttft_s"] for r in results if r.get("ttft_s") is not None)
    pick = lambda q: times[min(len(times) - 1, int(q * len(times)))] if times else None  # noqa: E731
    return {"ttft_p50_s": pick(0.5), "ttft_p99_s": pick(0.99), "ttft_max_s": times[-1] if times else None,
            "ok": len(times), "errors": [r for r in results if "error" in r]}


def warm_up(port: int) -> dict:
    """What a warm readiness step would send: the first users' shapes before any user comes."""
    started = time.monotonic()
    short = batch(port, users=USERS, words=16, out_tokens=8)
    long = batch(port, users=1, words=2048, out_tokens=8)
    return {"seconds": round(time.monotonic() - started, 2), "short": short, "long": long}


def stop(process: subprocess.Popen) -> float:
    started = time.monotonic()
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    return round(time.monotonic() - started, 1)


def metrics(port: int) -> str:
    return request(port, "GET", "/metrics")[1].decode()


def cold_warm(out: Path) -> dict:
    cache = Path("/root/vllm-cache-a")
    result: dict = {}
    for name in ("cold", "warm"):
        process, started = start(8000, cache, out / f"server-{name}.log")
        result[name] = ready(8000, process, started)
        if name == "cold":
            (out / "metrics-idle.txt").write_text(metrics(8000))
        result[name]["first_batch"] = batch(8000)
        texts: list = []
        sampler = threading.Thread(target=lambda: (time.sleep(2), texts.append(metrics(8000))))
        sampler.start()
        result[name]["second_batch"] = batch(8000)
        sampler.join()
        if name == "cold":
            (out / "metrics-under-load.txt").write_text(texts[0])
            (out / "metrics-after.txt").write_text(metrics(8000))
        result[name]["stop_s"] = stop(process)
        print(name, json.dumps(result[name]), flush=True)
    return result


def warmup_kv(out: Path) -> dict:
    cache = Path("/root/vllm-cache-a")
    result: dict = {}
    process, started = start(8000, cache, out / "server-warmup.log")
    result["warm_with_warmup"] = ready(8000, process, started)
    result["warm_with_warmup"]["warm_up"] = warm_up(8000)
    result["warm_with_warmup"]["ready_with_warmup_s"] = round(time.monotonic() - started, 1)
    result["warm_with_warmup"]["first_batch"] = batch(8000)
    result["warm_with_warmup"]["second_batch"] = batch(8000)
    result["warm_with_warmup"]["stop_s"] = stop(process)
    print("warm_with_warmup", json.dumps(result["warm_with_warmup"]), flush=True)

    process, started = start(8000, cache, out / "server-kv.log", "--kv-cache-memory-bytes", str(KV_BYTES))
    result["fixed_kv"] = ready(8000, process, started)
    result["fixed_kv"]["first_batch"] = batch(8000)
    result["fixed_kv"]["stop_s"] = stop(process)
    print("fixed_kv", json.dumps(result["fixed_kv"]), flush=True)

    result.update(pair(out, cache))
    return result


def pair(out: Path, cache: Path) -> dict:
    """Two instances sharing the GPU started at once, each at SHARE: sized by vLLM's memory profiling
    (each counts the other's allocations), then with a fixed KV cache each. Each one's KV cache, from its log."""
    result = {}
    for name, extra in (("two_together_profiled", ()), ("two_together_fixed_kv", ("--kv-cache-memory-bytes", str(KV_BYTES)))):
        servers = {port: start(port, cache, out / f"server-{name}-{port}.log", *extra) for port in (8000, 8001)}
        result[name] = {}
        for port, (process, started) in servers.items():
            try:
                result[name][str(port)] = ready(port, process, started)
            except RuntimeError as error:
                result[name][str(port)] = {"error": str(error)}
            log = (out / f"server-{name}-{port}.log").read_text()
            result[name][str(port)]["kv_cache"] = [line.split("]", 1)[-1].strip() for line in log.splitlines()
                                                   if "GPU KV cache size" in line or "Available KV cache memory" in line]
        for process, _ in servers.values():
            if process.poll() is None:
                stop(process)
        print(name, json.dumps(result[name]), flush=True)
    return result


def metrics_under_load(out: Path) -> dict:
    """/metrics while 64 users stream 512 tokens each (the snapshot with the most requests running), idle
    before, and after."""
    process, started = start(8000, Path("/root/vllm-cache-a"), out / "server-metrics.log")
    result = ready(8000, process, started)
    (out / "metrics-idle.txt").write_text(metrics(8000))
    snapshots: list = []
    done = threading.Event()

    def scrape() -> None:
        while not done.is_set():
            snapshots.append(metrics(8000))
            time.sleep(1)

    scraper = threading.Thread(target=scrape)
    scraper.start()
    result["load"] = batch(8000, users=64, words=PROMPT_WORDS, out_tokens=512)
    done.set()
    scraper.join()
    running = lambda text: max((float(line.rsplit(" ", 1)[1]) for line in text.splitlines()  # noqa: E731
                                if line.startswith("vllm:num_requests_running{")), default=0.0)
    busiest = max(snapshots, key=running)
    result["snapshots"], result["most_running"] = len(snapshots), running(busiest)
    (out / "metrics-under-load.txt").write_text(busiest)
    (out / "metrics-after.txt").write_text(metrics(8000))
    result["stop_s"] = stop(process)
    print("metrics", json.dumps(result), flush=True)
    return result


def main(phase: str, out_dir: str) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    random.seed(time.time_ns())
    phases = {"cold-warm": cold_warm, "warmup-kv": warmup_kv, "pair": lambda out: pair(out, Path("/root/vllm-cache-a")),
              "metrics": metrics_under_load}
    result = phases[phase](out)
    (out / f"{phase}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:])
