"""Measurement (not a test), run on the lent H200 with gpu-lab's real vLLM 0.25.0: what a vLLM server
does with its in-flight requests when it is told to stop, with and without `--shutdown-timeout`.

  python3 benchmarks/h200/drain.py OUT_FILE

Two servers share the GPU (ports 8000 and 8001, `--shutdown-timeout 0` and `30`). Each gets, in two
rounds, a steady load of long streamed completions; a few seconds in, SIGTERM goes either to the API
server alone (what `docker stop`, `podman stop` and a unit with `KillMode=mixed` do) or to the server's
whole process group (what a unit with systemd's default `KillMode=control-group` does: every process of
the unit's cgroup gets it). While it stops, `/health` is polled and new short requests are sent. Each
request's outcome (finished, tokens streamed, how it ended) and the timeline go to OUT_FILE as JSON:
the recording the stand-in server's drain is checked against (tests/fixtures/vllm/h200-drain).

Standard library only; nothing here changes the GPU's settings.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

STAGE = Path("/root/stage/stage")
BUNDLE_ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
              "VLLM_NO_USAGE_STATS": "1", "PYTHONPATH": str(STAGE / "site")}
SERVERS = {8000: 0, 8001: 30}  # port: --shutdown-timeout
SHARE = 0.40
IN_FLIGHT = 16  # long streamed completions, sent together
LONG_TOKENS = 3000  # ~20 s at 16 streams on this model: still running when the signal comes
SIGNAL_AFTER_S = 5.0
WATCH_S = 45.0  # how long /health and new requests are watched after the signal
PROMPT = "the quick brown fox jumps over the lazy dog " * 24


def now(start: float) -> float:
    return round(time.monotonic() - start, 3)


def start_server(port: int, shutdown_timeout: int, log: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(STAGE / "model"),
               "--tokenizer", str(STAGE / "tok"), "--load-format", "dummy", "--port", str(port),
               "--served-model-name", "m", "--gpu-memory-utilization", str(SHARE), "--max-model-len", "4096",
               "--shutdown-timeout", str(shutdown_timeout)]
    return subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            env={**os.environ, **BUNDLE_ENV}, start_new_session=True)


def get(port: int, path: str, timeout: float = 2.0) -> int | str:
    try:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        connection.request("GET", path)
        status = connection.getresponse().status
        connection.close()
        return status
    except OSError as error:
        return type(error).__name__


def wait_healthy(port: int, process: subprocess.Popen, limit_s: float = 400) -> float:
    start = time.monotonic()
    while time.monotonic() - start < limit_s:
        if process.poll() is not None:
            raise RuntimeError(f"server on {port} exited {process.returncode} while starting")
        if get(port, "/health") == 200:
            return round(time.monotonic() - start, 1)
        time.sleep(1)
    raise RuntimeError(f"server on {port} not healthy after {limit_s} s")


def completion(port: int, max_tokens: int, start: float, timeout: float = 120.0, host: str = "127.0.0.1",
               model: str = "m") -> dict:
    """One streamed completion: when it started and ended, how many text chunks came, how it ended."""
    outcome = {"sent_s": now(start), "chunks": 0, "finish_reason": None, "status": None, "error": None,
               "done": False}
    body = json.dumps({"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True,
                       "stream": True, "temperature": 0})
    try:
        connection = http.client.HTTPConnection(host, port, timeout=timeout)
        connection.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        outcome["status"] = response.status
        if response.status != 200:
            outcome["error"] = response.read(300).decode(errors="replace")
        else:
            for raw in response:
                line = raw.decode(errors="replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    outcome["done"] = True
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    outcome["error"] = json.dumps(chunk["error"])[:300]
                    continue
                choice = chunk["choices"][0]
                outcome["chunks"] += 1
                outcome["finish_reason"] = choice.get("finish_reason") or outcome["finish_reason"]
        connection.close()
    except (OSError, http.client.HTTPException, ValueError) as error:
        outcome["error"] = f"{type(error).__name__}: {error}"[:300]
    outcome["ended_s"] = now(start)
    return outcome


def in_threads(results: list, target, *args) -> threading.Thread:
    thread = threading.Thread(target=lambda: results.append(target(*args)), daemon=True)
    thread.start()
    return thread


def round_of(port: int, process: subprocess.Popen, whole_group: bool, long_tokens: int = LONG_TOKENS,
             signal_after_s: float = SIGNAL_AFTER_S, watch_s: float = WATCH_S) -> dict:
    """Load, the signal, and what the server answers while it stops (`process` leads its process group)."""
    start = time.monotonic()
    long_requests: list[dict] = []
    threads = [in_threads(long_requests, completion, port, long_tokens, start) for _ in range(IN_FLIGHT)]
    time.sleep(signal_after_s)
    signalled = now(start)
    if whole_group:
        os.killpg(process.pid, signal.SIGTERM)
    else:
        process.send_signal(signal.SIGTERM)
    health, new_requests, exited = [], [], None
    while time.monotonic() - start < signalled + watch_s:
        health.append((now(start), get(port, "/health", timeout=1.0)))
        new_requests.append(completion(port, 8, start, timeout=5.0))
        if exited is None and process.poll() is not None:
            exited = now(start)
        if exited is not None and all(not thread.is_alive() for thread in threads) and now(start) > exited + 2:
            break
        time.sleep(0.25)
    for thread in threads:
        thread.join(timeout=60)
    if exited is None:
        try:
            process.wait(timeout=60)
            exited = now(start)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            exited = f"killed after {now(start)}"
    return {"signal": "SIGTERM to the process group" if whole_group else "SIGTERM to the API server",
            "signalled_s": signalled, "server_exited_s": exited, "exit_code": process.returncode,
            "in_flight": sorted(long_requests, key=lambda r: r["sent_s"]), "health": health,
            "new_requests": [{key: r[key] for key in ("sent_s", "ended_s", "status", "error", "chunks")}
                             for r in new_requests]}


def summary(result: dict) -> dict:
    in_flight = result["in_flight"]
    new = result["new_requests"]
    return {"in_flight": len(in_flight),
            "completed": sum(r["done"] and r["finish_reason"] == "length" for r in in_flight),
            "cut_off": sum(not (r["done"] and r["finish_reason"] == "length") for r in in_flight),
            "new_requests_served": sum(r["status"] == 200 and r["chunks"] > 0 for r in new),
            "new_requests_refused": sorted({str(r["status"] or r["error"]) for r in new
                                            if not (r["status"] == 200 and r["chunks"] > 0)}),
            "health_answers": sorted({str(status) for _, status in result["health"]})}


CLOCKS_APART_S = 0.1  # how far apart two threads may see one moment


def behaviour(result: dict) -> dict:
    """What a round shows, in terms a stand-in's round can be compared with: how the streams in flight
    ended, what a new request and /health got once the signal had been handled (0.2 s on), and when the
    server exited."""
    in_flight = result["in_flight"]
    ends = {"finished" if r["finish_reason"] == "length" else r["finish_reason"] or r["error"] for r in in_flight}
    after = result["signalled_s"] + 0.2
    new = {"served" if r["status"] == 200 and r["chunks"] else str(r["status"] or r["error"].split(":")[0])
           for r in result["new_requests"] if r["sent_s"] >= after}
    health = {str(status) for at, status in result["health"] if at >= after}
    last_stream = max(r["ended_s"] for r in in_flight)
    exited = result["server_exited_s"]
    # the exit and the streams' ends are seen by different threads: an exit seen up to CLOCKS_APART_S before the
    # last stream's end is the same moment (a stream cut by an early exit shows in how it ended, not here)
    return {"streams_in_flight": sorted(ends),
            "streams_end_cleanly": all(r["status"] == 200 and r["done"] and not r["error"] for r in in_flight),
            "streams_end": "at the signal" if last_stream - result["signalled_s"] < 1 else "after the signal",
            "new_requests": sorted(new), "health": sorted(health),
            "exits": "before the last stream" if exited - last_stream < -CLOCKS_APART_S else
                     "with the last stream" if exited - last_stream < 6 else "later"}


def main(out_file: str) -> None:
    logs = Path("/root/drain-logs")
    logs.mkdir(exist_ok=True)
    recording = {"vllm": "0.25.0", "model": "Qwen2.5-7B-shaped, --load-format dummy", "gpu": "NVIDIA H200",
                 "in_flight_requests": IN_FLIGHT, "max_tokens": LONG_TOKENS, "signal_after_s": SIGNAL_AFTER_S,
                 "rounds": []}
    for whole_group in (False, True):
        processes = {}
        for port, timeout in SERVERS.items():
            processes[port] = start_server(port, timeout, logs / f"{port}-{int(whole_group)}.log")
            time.sleep(20)  # the second's memory profiling after the first's
        ready = {port: wait_healthy(port, process) for port, process in processes.items()}
        for port in processes:  # a first request compiles what the first request compiles
            completion(port, 16, time.monotonic())
        results: dict[int, dict] = {}
        rounds = [threading.Thread(target=lambda p=port: results.__setitem__(p, round_of(p, processes[p], whole_group)))
                  for port in processes]
        for thread in rounds:
            thread.start()
        for thread in rounds:
            thread.join()
        for port, timeout in SERVERS.items():
            result = {"shutdown_timeout_s": timeout, "ready_after_s": ready[port], **results[port]}
            result["summary"] = summary(result)
            log_tail = (logs / f"{port}-{int(whole_group)}.log").read_text(errors="replace").splitlines()[-25:]
            result["log_tail"] = log_tail
            recording["rounds"].append(result)
            print(json.dumps({"shutdown_timeout_s": timeout, "signal": result["signal"],
                              "exited_s": result["server_exited_s"], "signalled_s": result["signalled_s"],
                              **result["summary"]}), flush=True)
    Path(out_file).write_text(json.dumps(recording, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
