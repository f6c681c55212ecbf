"""The side-by-side table of docs/bench.md (issue 37, point 4: the planner's `latency` against vLLM's defaults
under requests arriving at a rate, medians of 3 rounds, on a lent H100) is what the recorded runs give: each row
recomputed here from vLLM's own result files in benchmarks/h200/results/, with the SLO judged as `provision tune`
judges it. A number edited by hand, or a run added or lost, fails here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from provisioner.bench.results import Run, RunSet
from provisioner.tune.search import evaluate
from provisioner.tune.slo import parse_slo

ROOT = Path(__file__).resolve().parents[2]
CAMPAIGN = ROOT / "benchmarks/h200/results/2026-12-07-h100-campaign"
SLO = parse_slo("ttft_p99<=300ms,itl_p99<=40ms")
INSTANCES = ("defaults", "latency")


def recorded(instance: str) -> RunSet:
    paths = sorted((CAMPAIGN / "runs" / instance).glob("*.json"))
    return RunSet(instance, {}, [Run.from_json(json.loads(path.read_text()), str(path)) for path in paths])


def expected_row(run_set: RunSet, arrivals) -> tuple[str, str]:
    """How the row of `arrivals` must begin (the medians, the SLO judged on them) and end (the rounds that met it)."""
    medians = run_set.rate_summary()[arrivals]
    outcome = evaluate(run_set, SLO, run_set.name, {}, arrivals)
    alone = [evaluate(RunSet("one", {}, [run]), SLO, "one", {}, arrivals).meets
             for run in run_set.runs if run.arrivals == arrivals]
    cells = [arrivals.label, run_set.name, f"{medians['request_throughput']:.1f}",
             *(f"{medians[key]:.1f} ms" for key in ("p50_ttft_ms", "p99_ttft_ms", "p99_itl_ms")),
             f"{medians['p50_tpot_ms']:.2f} ms"]
    return "| " + " | ".join(cells) + f" | {'met' if outcome.meets else 'missed'}", f"{sum(alone)} of {len(alone)} |"


@pytest.mark.parametrize("instance", INSTANCES)
def test_every_pattern_ran_three_rounds_and_no_request_was_lost(instance):
    run_set = recorded(instance)
    assert [arrivals.label for arrivals in run_set.arrivals] == ["20/s Poisson", "40/s gamma 0.25", "40/s Poisson"]
    for arrivals in run_set.arrivals:
        runs = [run for run in run_set.runs if run.arrivals == arrivals]
        assert sorted(run.repeat for run in runs) == [1, 2, 3]
        assert all(run.result["failed"] == 0 and run.result["completed"] == arrivals.rate * arrivals.seconds
                   for run in runs)


@pytest.mark.parametrize("instance", INSTANCES)
def test_the_docs_side_by_side_rows_are_the_medians_of_the_recorded_runs(instance):
    doc = (ROOT / "docs/bench.md").read_text().splitlines()
    run_set = recorded(instance)
    for arrivals in run_set.arrivals:
        start, end = expected_row(run_set, arrivals)
        shown = [line for line in doc if line.startswith(f"| {arrivals.label} | {instance} |")]
        assert len(shown) == 1 and shown[0].startswith(start) and shown[0].endswith(end), (shown, start, end)
