"""Benchmark (not a test), run on the lent H200 with gpu-lab's real vLLM 0.25.0 (issue 37, point 4): the planner
`provision tune --capacity` finds one instance's capacity at the SLO, and runs at that rate (SLO met) and at 1.2x
it (SLO missed) check the figure; then the planner profiles against vLLM's defaults with requests arriving at a
rate (Poisson and bursty), 3 rounds, side by side.

  python3 -m benchmarks.h200.rates serve          the spec (this GPU), vLLM as the units run it, both instances up
  python3 -m benchmarks.h200.rates campaign OUT   the runs: OUT/campaign.json (written after every run), OUT/table.md

With RATES_ONLY=capacity in the environment, both serve the tuned instance alone and the campaign is the capacity
and its check (for a session with little device time left); with RATES_ONLY=side, the campaign is the side-by-side
rounds alone (for a card whose capacity is already measured).

Both instances share the GPU (0.45 each), started as their units would (benchmarks/h200/run.py); one is loaded
at a time, the order alternating by round so a drift of the machine spreads over both. Every run goes through
the package's own bench (provision.bench: `vllm bench serve` as `provision bench` and `provision tune` run it),
the SLO judged as `provision tune` judges it. Profile `throughput` renders vLLM's defaults (no flag of its own),
so `defaults` measures it too; `campaign` checks that from the plan. Nothing here changes the GPU's settings.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from benchmarks.h200 import run as harness
from provisioner.bench.loads import MAX_IN_FLIGHT, Arrivals, get_load
from provisioner.bench.results import Run, RunSet
from provisioner.bench.session import BenchError, run_bench
from provisioner.bench.target import bench_target
from provisioner.plan import build_plan
from provisioner.spec import load_spec
from provisioner.tune.search import evaluate
from provisioner.tune.slo import parse_slo

INSTANCES = {"defaults": (8001, None, {}, {}), "latency": (8002, "latency", {}, {})}
SHARE = 0.45
LOAD = "single"  # 512 in / 128 out, the lengths of gpu-lab's reference runs
SLO = "ttft_p99<=300ms,itl_p99<=40ms"
SECONDS = 6.0  # each run sends rate x this many requests
# Budget, measured on a lent H100 (2026-12-07, benchmarks/h200/results/2026-12-07-h100-campaign/): the two servers
# ready 184 s after the start, `tune --capacity` 255 s, the 2 checks 78 s, the 18 side-by-side runs 10.7 min (a run
# 27-43 s, of which ~20 s is `vllm bench serve` starting: its imports, the 152k-word tokenizer); ~19.5 min in all,
# of a session's 30. After failed starts, RATES_ONLY=capacity or RATES_ONLY=side splits it over two sessions.
ROUNDS = 3
CHECK_ROUNDS = 1  # the check: a run at the capacity (met) and one at OVER x it (missed)
CONDITIONS = tuple(Arrivals(rate, burstiness, MAX_IN_FLIGHT, SECONDS)
                   for rate, burstiness in ((20.0, 1.0), (40.0, 1.0), (40.0, 0.25)))  # Poisson at two rates, a burst
CAPACITY_START = 32.0
CAPACITY_TRIALS = 5
OVER = 1.2  # the check: at the capacity the SLO holds, at 1.2x it does not
TUNED = "latency"
PARTS = {"": ("capacity", "side"), "capacity": ("capacity",), "side": ("side",)}  # RATES_ONLY: what is run


def campaign_parts(only: str) -> tuple[str, ...]:
    """What the campaign runs for RATES_ONLY=`only` ("": all of it). A value it does not know stops it before a
    server starts: a typo would otherwise spend a whole device session on the full campaign."""
    if only not in PARTS:
        sys.exit(f"RATES_ONLY={only!r}: give capacity, side, or nothing for the whole campaign")
    return PARTS[only]


RUNS = campaign_parts(os.environ.get("RATES_ONLY", ""))
ONLY_CAPACITY, ONLY_SIDE = "side" not in RUNS, "capacity" not in RUNS
COLUMNS = (("request_throughput", "req/s", 1), ("output_throughput", "tok/s", 0), ("p50_ttft_ms", "TTFT p50", 1),
           ("p99_ttft_ms", "TTFT p99", 1), ("p99_itl_ms", "ITL p99", 1), ("p50_tpot_ms", "TPOT p50", 2))


def served() -> dict:
    return {TUNED: INSTANCES[TUNED]} if ONLY_CAPACITY else INSTANCES


def serve() -> None:
    harness.stop()
    harness.prepare(served(), SHARE)
    harness.serve(list(served()), {name: spec[0] for name, spec in served().items()})


def same_flags_as_defaults(profile: str) -> bool:
    """Whether an instance with `profile` renders the same `vllm serve` config as `defaults` (its name, port
    and served name aside)."""
    spec = yaml.safe_load(harness.SPEC.read_text())
    base = next(item for item in spec["instances"] if item["name"] == "defaults")
    spec["instances"] = [base, {**base, "name": "profiled", "port": base["port"] + 100, "profile": profile}]
    probe = harness.WORK / "profile-probe.yml"
    probe.write_text(yaml.safe_dump(spec, sort_keys=False))
    units = {unit.instance: yaml.safe_load(unit.config_file.content) for unit in build_plan(load_spec(probe))[0].units}
    strip = ("port", "served-model-name", "served_model_name")
    return ({k: v for k, v in units["defaults"].items() if k not in strip}
            == {k: v for k, v in units["profiled"].items() if k not in strip})


def campaign(out: Path) -> None:
    """The runs of the module docstring, in order of what matters most if the machine goes back early (the capacity
    and its check, then the side-by-side rounds); OUT/campaign.json is written after every run."""
    out.mkdir(parents=True, exist_ok=True)
    spec = load_spec(harness.SPEC)
    vllm = str(harness.units_vllm(build_plan(spec)[0].units))
    targets = {name: bench_target(spec, name, vllm) for name in served()}
    record: dict = {"slo": SLO, "load": LOAD, "share": SHARE, "rounds": ROUNDS,
                    "conditions": [arrivals.label for arrivals in CONDITIONS],
                    "throughput_renders_defaults": None if ONLY_CAPACITY else same_flags_as_defaults("throughput"),
                    "configs": {name: target.config_text for name, target in targets.items()},
                    "runs": [], "side_by_side": {}, "capacity": None, "check": []}

    def save() -> None:
        (out / "campaign.json").write_text(json.dumps(record, indent=1) + "\n")

    log(out, f"throughput renders defaults: {record['throughput_renders_defaults']}")
    record["capacity"] = None if ONLY_SIDE else capacity(out, vllm)
    save()
    rate = (record["capacity"] or {}).get("rate")
    for label, at in ((("at the capacity", rate), (f"at {OVER:g}x", round(rate * OVER, 3))) if rate else ()):
        record["check"].append(check(targets[TUNED], label, Arrivals(at, 1.0, MAX_IN_FLIGHT, SECONDS), out))
        save()
    (out / "table.md").write_text(table(record))
    if not ONLY_CAPACITY:
        side_by_side(targets, out, record, save)
        (out / "table.md").write_text(table(record))
    log(out, "done")


def side_by_side(targets: dict, out: Path, record: dict, save) -> None:
    """Every instance at every arrival pattern, ROUNDS rounds, the instances' order alternating by round."""
    load, slo = get_load(LOAD), parse_slo(SLO)
    sets = {name: RunSet(name, {"instance": name}) for name in INSTANCES}
    lost: dict[tuple[str, str], int] = {}  # (instance, arrivals): runs that lost requests
    for round_ in range(1, ROUNDS + 1):
        order = list(INSTANCES) if round_ % 2 else list(reversed(INSTANCES))
        for arrivals in CONDITIONS:
            for name in order:
                run = one(targets[name], load, arrivals, round_, out)
                if isinstance(run, str):  # the SLO is missed there, whatever the other runs measured
                    lost[name, arrivals.label] = lost.get((name, arrivals.label), 0) + 1
                    record["runs"].append({"instance": name, "round": round_, "arrivals": arrivals.label, "lost": run})
                    save()
                    continue
                sets[name].runs.append(run)
                record["runs"].append({"instance": name, "round": round_, "arrivals": arrivals.label,
                                       **{key: run.result.get(key) for key, _, _ in COLUMNS}})
                log(out, f"round {round_} {name} {arrivals.label}: " + ", ".join(
                    f"{title} {run.result.get(key, float('nan')):.{digits}f}" for key, title, digits in COLUMNS))
                save()
    for name, run_set in sets.items():
        medians = run_set.rate_summary()
        record["side_by_side"][name] = {
            arrivals.label: {**medians.get(arrivals, {}), "slo": (
                f"missed (requests lost in {lost[name, arrivals.label]} of {ROUNDS} runs)" if (name, arrivals.label) in lost
                else verdict(evaluate(run_set, slo, name, {}, arrivals)))}
            for arrivals in CONDITIONS if arrivals in medians or (name, arrivals.label) in lost}
    save()


def check(target, label: str, arrivals: Arrivals, out: Path) -> dict:
    """CHECK_ROUNDS runs of the tuned instance at `arrivals`: the SLO's verdict on each and on their medians."""
    load, slo = get_load(LOAD), parse_slo(SLO)
    runs, rounds = [], []
    for round_ in range(1, CHECK_ROUNDS + 1):
        run = one(target, load, arrivals, round_, out, "check")
        if isinstance(run, str):
            rounds.append(f"missed (requests lost: {run})")
        else:
            runs.append(run)
            rounds.append(verdict(evaluate(RunSet("one", {}, [run]), slo, "one", {}, arrivals)))
        log(out, f"check {label} ({arrivals.label}) round {round_}: {rounds[-1]}")
    together = RunSet(f"check-{arrivals.key}", {}, runs)
    lost = len(rounds) - len(runs)
    median = (f"missed (requests lost in {lost} of {CHECK_ROUNDS} runs)" if lost
              else verdict(evaluate(together, slo, together.name, {}, arrivals)))
    return {"what": label, "arrivals": arrivals.label, "rounds": rounds, "median": median,
            **together.rate_summary().get(arrivals, {})}


def one(target, load, arrivals: Arrivals, round_: int, out: Path, folder: str | None = None) -> Run | str:
    """One run at `arrivals` (round_ as its repeat), kept under OUT/runs/FOLDER (default: the instance's name);
    where requests were lost (the bench refuses such a result), why, logged: the SLO is missed there."""
    try:
        run_set = run_bench(target, load, 1, target.name, concurrencies=(), arrivals=(arrivals,))
    except BenchError as error:
        why = str(error).splitlines()[0]
        log(out, f"round {round_} {target.name} {arrivals.label}: {why}")
        return why
    (run,) = run_set.runs
    run = Run(run.concurrency, round_, run.seed, run.result, run.arrivals)
    kept = out / "runs" / (folder or target.name)
    kept.mkdir(parents=True, exist_ok=True)
    (kept / run.file_name).write_text(json.dumps(run.to_json()) + "\n")
    return run


def verdict(outcome) -> str:
    terms = ", ".join(f"{term} {'n/a' if value is None else f'{value:.1f}'}" for term, value in outcome.values.items())
    return f"{'met' if outcome.meets else 'missed'} ({terms})"


def capacity(out: Path, vllm: str) -> dict | None:
    """`provision tune TUNED --capacity`, as a user runs it (its baseline alone: --max-candidates 1)."""
    argv = [sys.executable, "-m", "provisioner.cli.main", "tune", TUNED, "--spec", str(harness.SPEC), "--slo", SLO,
            "--load", LOAD, "--repeats", "1", "--max-candidates", "1", "--rate", f"{CAPACITY_START:g}",
            "--rate-seconds", f"{SECONDS:g}", "--capacity", "--capacity-trials", str(CAPACITY_TRIALS),
            "--results", str(out / "tune"), "--name", "capacity", "--vllm", vllm]
    begin = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "COLUMNS": "160"})
    (out / "tune.txt").write_text(f"$ provision {' '.join(argv[3:])}\nexit {done.returncode} after "
                                  f"{time.monotonic() - begin:.0f} s\n{done.stdout}{done.stderr}")
    log(out, f"tune --capacity: exit {done.returncode} after {time.monotonic() - begin:.0f} s")
    found = out / "tune" / "capacity" / "capacity.json"
    return json.loads(found.read_text()) if found.is_file() else None


def table(record: dict) -> str:
    lines = [f"SLO {record['slo']}; load {record['load']} (512 in / 128 out); medians of {record['rounds']} rounds; "
             f"each instance at {record['share']} of the GPU", "",
             "| arrivals | instance | " + " | ".join(title for _, title, _ in COLUMNS) + " | SLO |",
             "|---|---|" + "---|" * (len(COLUMNS) + 1)]
    for label in record["conditions"]:
        for name, by_label in record["side_by_side"].items():
            medians = by_label.get(label)
            if medians:
                cells = " | ".join(f"{medians[key]:.{digits}f}" if key in medians else "—" for key, _, digits in COLUMNS)
                lines.append(f"| {label} | {name} | {cells} | {medians['slo']} |")
    if record.get("capacity"):
        found = record["capacity"]
        lines += ["", f"capacity of `{TUNED}` (provision tune --capacity): {found.get('rate')} req/s; trials: "
                  + ", ".join(f"{t['rate']:g} {'met' if t['meets'] else 'missed'}" for t in found.get("trials", []))]
    for check in record.get("check", []):
        lines.append(f"- {check['what']} ({check['arrivals']}): median {check['median']}; rounds: "
                     + "; ".join(check["rounds"]))
    return "\n".join(lines) + "\n"


def log(out: Path, line: str) -> None:
    text = f"{time.strftime('%H:%M:%S')} {line}"
    print(text, flush=True)
    with open(out / "campaign.log", "a") as handle:
        handle.write(text + "\n")


def main(argv: list[str]) -> None:
    if argv[:1] == ["serve"]:
        serve()
    elif argv[:1] == ["campaign"] and len(argv) == 2:
        campaign(Path(argv[1]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
