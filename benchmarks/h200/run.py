"""Benchmark (not a test), run on the lent H200 with gpu-lab's real vLLM 0.25.0 (a Qwen2.5-7B-shaped
model, --load-format dummy): vLLM's defaults against the planner profiles `latency` and `throughput`,
side by side on one GPU, through `provision bench`.

  python3 -m benchmarks.h200.run prepare            wrappers, spec (this GPU's UUID), rendered config files
  python3 -m benchmarks.h200.run serve NAME…        start the instances as their units would, one after another
  python3 -m benchmarks.h200.run trace NAME         where the time of a batch-1 decode step goes (torch profiler)
  python3 -m benchmarks.h200.run stop

The machine is lent bare (no systemd, no network, no vllm console script): `prepare` lays vLLM out as
the role vllm_install would (the `vllm` the rendered units' ExecStart names, /opt/vllm/venvs/0.25.0/bin/vllm,
and the venv's python beside it, here wrappers around the bundle's `python3 -m vllm.entrypoints.cli.main`) and
writes what apply would write (/etc/vllm/<name>.yaml and .env, rendered by the same plan); `serve` starts each server with its unit's ExecStart and environment,
and waits with its ExecStartPost readiness probe. Each instance gets 0.15 of the GPU, so all six fit.
Nothing here changes the GPU's settings.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

from provisioner.plan import build_plan
from provisioner.spec import load_spec

STAGE = Path("/root/stage/stage")
WORK = Path("/root/h200")
SPEC = WORK / "spec.yml"
LOGS = WORK / "logs"
TRACES = WORK / "traces"
BUNDLE_ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
              "VLLM_NO_USAGE_STATS": "1"}
SHARE = 0.15
PROFILER = {"profiler": "torch", "torch_profiler_dir": str(TRACES), "torch_profiler_with_stack": False,
            "ignore_frontend": True}
# name: (port, profile, extra options, extra env)
INSTANCES = {
    "defaults": (8001, None, {}, {}),
    "latency": (8002, "latency", {}, {}),
    "throughput": (8003, "throughput", {}, {}),
    "latency-v1runner": (8004, "latency", {}, {"VLLM_USE_V2_MODEL_RUNNER": "0"}),
    "latency-cublaslt": (8005, "latency", {}, {"TORCH_BLAS_PREFER_CUBLASLT": "1"}),
    "trace": (8006, "latency", {"profiler-config": PROFILER}, {}),
}
KV_LINE = re.compile(r"GPU KV cache size: ([\d,]+) tokens")


def gpu_device() -> dict:
    """GPU 0 of this machine: the spec's device is the card the run is on (the H200, or a lent H100)."""
    return gpu0(subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True).stdout)


def gpu0(listing: str) -> dict:
    """GPU 0 as `nvidia-smi -L` lists it, as a spec's device; a listing without it stops the run, saying so."""
    found = re.search(r"^GPU 0: (.+?) \(UUID: (GPU-[0-9a-f-]+)\)", listing, re.MULTILINE)
    if not found:
        sys.exit(f"nvidia-smi -L lists no GPU 0 with a UUID; it said: {listing.strip()[:200] or 'nothing'}")
    return {"index": 0, "uuid": found.group(2), "model": found.group(1)}


def prepare(instances: dict | None = None, share: float = SHARE) -> None:
    """The spec, the files apply would write, and vLLM laid out where the rendered units run it."""
    WORK.mkdir(parents=True, exist_ok=True)
    SPEC.write_text(yaml.safe_dump(harness_spec(gpu_device(), instances, share), sort_keys=False))
    (plan,) = build_plan(load_spec(SPEC))
    if plan.memory_problems:
        sys.exit("\n".join(plan.memory_problems))
    for unit in plan.units:
        for planned in (unit.config_file, unit.env_file, unit.unit):
            Path(planned.path).parent.mkdir(parents=True, exist_ok=True)
            Path(planned.path).write_text(planned.content)
    venv_bin = units_vllm(plan.units).parent
    venv_bin.mkdir(parents=True, exist_ok=True)
    path = f"export PYTHONPATH={STAGE}/site${{PYTHONPATH:+:$PYTHONPATH}}\n"
    (venv_bin / "vllm").write_text(f"#!/bin/sh\n{path}exec python3 -m vllm.entrypoints.cli.main \"$@\"\n")
    (venv_bin / "python").write_text(f"#!/bin/sh\n{path}exec python3 \"$@\"\n")
    for name in ("vllm", "python"):
        (venv_bin / name).chmod(0o755)
    print(json.dumps({"spec": str(SPEC), "vllm": str(venv_bin / "vllm"), "units": [unit.instance for unit in plan.units]}))


def units_vllm(units: list) -> Path:
    """The `vllm` every rendered unit's ExecStart runs (one venv for all of them)."""
    (vllm,) = {shlex.split(_service(unit.unit.content)["ExecStart"])[0] for unit in units}
    return Path(vllm)


def harness_spec(device: dict, instances: dict | None = None, share: float = SHARE) -> dict:
    """The spec of the instances (default: INSTANCES), each at `share` of the GPU `device`."""
    return {
        "version": 1,
        "hosts": [{"name": "h200", "address": "127.0.0.1", "settings": {"nouveau_blacklist": False},
                   "gpus": {"devices": [device]},
                   "vllm": {"version": "0.25.0", "install_path": "/opt/vllm"}}],
        "instances": [
            {"name": name, "host": "h200", "model": str(STAGE / "model"), "port": port, "gpus": [0],
             "gpu_memory_utilization": share, **({"profile": profile} if profile else {}),
             "options": {"tokenizer": str(STAGE / "tok"), "load-format": "dummy", **options},
             "env": {**BUNDLE_ENV, **env}}
            for name, (port, profile, options, env) in (instances or INSTANCES).items()
        ],
    }


def _units() -> dict:
    (plan,) = build_plan(load_spec(SPEC))
    return {unit.instance: unit for unit in plan.units}


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


def serve(names: list[str], ports: dict[str, int] | None = None) -> None:
    """Start each instance as its unit would (ExecStart, Environment=), the next one once the previous
    has its KV cache (vLLM's memory check has passed), then wait for each with ExecStartPost's probe."""
    LOGS.mkdir(parents=True, exist_ok=True)
    TRACES.mkdir(parents=True, exist_ok=True)
    units = _units()
    # ExecStartPost's probe, from this checkout (the role installs the same file at vllm_service_wait_ready)
    probe = Path(__file__).resolve().parents[2] / "roles/vllm_service/files/wait-ready"
    started = {}
    for name in names:
        unit = units[name]
        port = (ports or {n: spec[0] for n, spec in INSTANCES.items()})[name]
        if healthy(port):
            print(f"{name}: already serving on {port}", flush=True)
            continue
        service = _service(unit.unit.content)
        env = {**os.environ, **unit.environment}
        env.pop("VLLM_API_KEY", None)
        env.pop("PYTHONPATH", None)  # a unit sets none: the venv's `vllm` finds its own packages
        log = open(LOGS / f"{name}.log", "w")
        begin = time.monotonic()
        home = Path(unit.environment["HF_HOME"]).parent  # the unit's WorkingDirectory (vllm_service_home)
        Path(unit.environment["HF_HOME"]).mkdir(parents=True, exist_ok=True)
        process = subprocess.Popen(shlex.split(service["ExecStart"]), env=env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True, cwd=home)
        started[name] = (process, begin, service)
        while process.poll() is None and not KV_LINE.search((LOGS / f"{name}.log").read_text(errors="replace")):
            time.sleep(1)
        print(f"{name}: KV cache after {time.monotonic() - begin:.0f} s", flush=True)
    timings = {}
    for name, (process, begin, service) in started.items():
        post = shlex.split(service["ExecStartPost"].replace("${MAINPID}", str(process.pid)))
        post = [sys.executable, str(probe), *post[2:]]
        post[post.index("--timeout") + 1] = "600"
        ready = subprocess.run(post, capture_output=True, text=True)
        text = (LOGS / f"{name}.log").read_text(errors="replace")
        kv = KV_LINE.search(text)
        timings[name] = {"ready_rc": ready.returncode, "seconds_to_ready": round(time.monotonic() - begin, 1),
                         "kv_tokens": int(kv.group(1).replace(",", "")) if kv else None,
                         "probe": (ready.stdout + ready.stderr).strip()[-300:]}
        print(name, json.dumps(timings[name]), flush=True)
        if ready.returncode:
            print(text[-3000:], flush=True)
    failed = [name for name, timing in timings.items() if timing["ready_rc"]]
    if failed:  # what runs after (a bench, an audit) must not run against a server that is not there
        sys.exit(f"not ready: {', '.join(failed)} (their logs: {LOGS})")


def _service(content: str) -> dict[str, str]:
    return {key: value for key, _, value in (line.partition("=") for line in content.splitlines())
            if key in ("ExecStart", "ExecStartPost")}


def stop() -> None:
    subprocess.run(["pkill", "-f", "vllm.entrypoints.cli.main serve"], check=False)


def main(argv: list[str]) -> None:
    command, *rest = argv
    if command == "prepare":
        prepare()
    elif command == "serve":
        serve(rest or list(INSTANCES))
    elif command == "trace":
        from benchmarks.h200.decode_trace import trace

        trace(rest[0] if rest else "trace", INSTANCES[rest[0] if rest else "trace"][0], TRACES, STAGE,
              units_vllm(list(_units().values())))
    elif command == "stop":
        stop()
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
