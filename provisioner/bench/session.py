"""One run set: every concurrency of a load profile, `repeats` times, each run with a fresh seed (the
same prompts twice would hit the prefix cache and flatter TTFT), repeats interleaved (r1: c1 c16 c64,
r2: …) so a drift of the host spreads over all concurrencies. vLLM writes each result on the host;
it is read back and kept here, one JSON per run."""

from __future__ import annotations

import dataclasses
import json
import secrets
import shlex
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from provisioner.bench.command import bench_argv, shell_command
from provisioner.bench.floor import Bandwidth, measure_bandwidth, tpot_floor_ms
from provisioner.bench.loads import Arrivals, Load
from provisioner.bench.results import Run, RunSet
from provisioner.bench.target import BenchTarget
from provisioner.fleet.remote import RemoteError
from provisioner.vllm.memory import load_model_shape, weight_bytes

RUN_TIMEOUT_S = 3600

OnRun = Callable[[str, int, int, Run | None], None]  # (event "start" | "done", concurrency, repeat, run)


class BenchError(RuntimeError):
    """A run failed or lost requests; the message says which and why."""


def run_set_name(target: BenchTarget, now: datetime | None = None) -> str:
    return f"{target.name}-{(now or datetime.now(timezone.utc)).strftime('%Y%m%d-%H%M%S')}"


def run_bench(target: BenchTarget, load: Load, repeats: int, name: str, on_run: OnRun | None = None,
              meta: dict[str, Any] | None = None, goodput: tuple[str, ...] = (),
              arrivals: tuple[Arrivals, ...] = (), concurrencies: tuple[int, ...] | None = None) -> RunSet:
    """Run the load `repeats` times against the target: its concurrencies (or `concurrencies`), then each of
    `arrivals`; every request must complete (goodput: see bench_argv)."""
    shell = target.shell
    remote_dir = shell.run("mktemp -d /tmp/provision-bench.XXXXXX").stdout.strip()
    run_set = RunSet(name, {**describe(target, load, repeats), **(meta or {})})
    points = [(concurrency, None) for concurrency in (load.concurrency if concurrencies is None else concurrencies)]
    points += [(pace.max_concurrency, pace) for pace in arrivals]
    try:
        for repeat in range(1, repeats + 1):
            for concurrency, pace in points:
                if on_run:
                    on_run("start", concurrency, repeat, None)
                run = one_run(target, load, concurrency, repeat, remote_dir, goodput, pace)
                run_set.runs.append(run)
                if on_run:
                    on_run("done", concurrency, repeat, run)
    finally:
        shell.run(f"rm -rf {shlex.quote(remote_dir)}", check=False)
    return run_set


def one_run(target: BenchTarget, load: Load, concurrency: int, repeat: int, remote_dir: str,
            goodput: tuple[str, ...] = (), arrivals: Arrivals | None = None) -> Run:
    seed = secrets.randbelow(2**31)
    file_name = Run(concurrency, repeat, seed, {}, arrivals).file_name
    argv = bench_argv(target.vllm, target.endpoint, load, concurrency, seed, remote_dir, file_name,
                      metadata={"instance": target.name, "load": load.name}, goodput=goodput, arrivals=arrivals)
    command = shell_command(argv, env=target.environment, key_on_stdin=target.api_key is not None)
    stdin = f"{target.api_key}\n" if target.api_key is not None else None
    try:
        output = target.shell.run(command, stdin=stdin, timeout=RUN_TIMEOUT_S)
        result = json.loads(target.shell.read_text(f"{remote_dir}/{file_name}"))
    except (RemoteError, ValueError) as error:
        raise BenchError(f"{target.name}: `vllm bench serve` at concurrency {concurrency} failed: {error}") from None
    expected = arrivals.num_prompts(load.min_prompts) if arrivals else load.num_prompts(concurrency)
    if result.get("completed") != expected or result.get("failed"):
        tail = "\n".join(output.stdout.splitlines()[-15:])
        where = f"at {arrivals.label}" if arrivals else f"at concurrency {concurrency}"
        raise BenchError(f"{target.name}: {where}, {result.get('completed')} of {expected} "
                         f"requests completed ({result.get('failed')} failed) — the server is overloaded or "
                         f"erroring; its journal says why. vllm bench serve said:\n{tail}")
    return Run(concurrency, repeat, seed, result, arrivals)


def describe(target: BenchTarget, load: Load, repeats: int) -> dict[str, Any]:
    """What a run set measured, stored with it: the instance, its live config file, the load."""
    live = target.shell.run(f"cat {shlex.quote(target.config_path)}", check=False)
    return {
        "instance": target.name,
        "host": target.shell.name,
        "model": target.instance.model,
        "url": target.endpoint.base_url,
        "load": dataclasses.asdict(load),
        "repeats": repeats,
        "server_config": live.stdout if live.returncode == 0 else None,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def tpot_floor(target: BenchTarget) -> dict[str, Any]:
    """The batch-1 TPOT floor of the target's model on its GPU, or a note saying why there is none."""
    try:
        dtype = str(target.instance.serve_options.get("dtype", "auto"))
        weights = weight_bytes(load_model_shape(target.instance.model), dtype)
    except (ValueError, KeyError) as error:  # ModelShapeError is a ValueError
        return {"note": f"no floor: the model's size is unknown ({error})"}
    bandwidth = measure_bandwidth(target.shell, target.python, ",".join(target.gpu_uuids) or None)
    if not isinstance(bandwidth, Bandwidth):
        return {"note": bandwidth, "weight_bytes": weights}
    return {
        "weight_bytes": weights,
        "bandwidth": dataclasses.asdict(bandwidth),
        "tpot_floor_ms": tpot_floor_ms(weights, bandwidth.copy_gbps),
    }
