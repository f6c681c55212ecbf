"""Requests arriving at a rate (issue 37, point 2): `provision tune --rate` measures each candidate with vLLM's
own `bench serve --request-rate R --burstiness B` besides the load's bursts, keeps those runs apart in its run
sets, and judges the SLO there. The runs here are `vllm bench serve` result files as the real client writes them
(keys as in tests/fixtures/vllm/h200-c64-final: request_rate "inf" for a burst, the rate as a float otherwise)."""

from __future__ import annotations

import json

import pytest

from provisioner.bench.command import Endpoint, bench_argv
from provisioner.bench.loads import Arrivals, get_load
from provisioner.bench.results import Run, RunSet, load_run_set
from provisioner.tune.search import evaluate
from provisioner.tune.slo import parse_slo
from provisioner.vllm.flags import CATALOGS_DIR, supported_versions

ENDPOINT = Endpoint("http://127.0.0.1:8000", "chat", "/models/chat")
AT_36 = Arrivals(36, 1.0, 64, 30)


def result(ttft_p99: float, itl_p99: float, tokens: float, rate: float | str = "inf", **extra) -> dict:
    return {"completed": 100, "failed": 0, "output_throughput": tokens, "request_throughput": tokens / 128,
            "median_tpot_ms": 8.0, "p99_ttft_ms": ttft_p99, "p99_itl_ms": itl_p99, "request_rate": rate,
            "burstiness": 1.0, **extra}


@pytest.mark.parametrize("version", supported_versions())
def test_a_run_at_a_rate_asks_vllm_bench_serve_for_it_with_flags_the_pinned_vllm_has(version):
    argv = bench_argv("vllm", ENDPOINT, get_load("concurrent"), 64, 7, "/tmp/r", "q36-b1-r1.json",
                      arrivals=Arrivals(36, 0.5, 64, 30))
    flags = {word: argv[index + 1] for index, word in enumerate(argv) if word.startswith("--") and index + 1 < len(argv)}
    assert (flags["--request-rate"], flags["--burstiness"], flags["--max-concurrency"], flags["--num-prompts"]) == (
        "36", "0.5", "64", "1080")  # 36/s for 30 s
    catalog = json.loads((CATALOGS_DIR / f"vllm-{version}.json").read_text())
    assert {word[2:] for word in argv if word.startswith("--")} <= set(catalog["commands"]["bench serve"]["options"])
    burst = bench_argv("vllm", ENDPOINT, get_load("concurrent"), 64, 7, "/tmp/r", "c64-r1.json")
    assert burst[burst.index("--request-rate") + 1] == "inf" and "--burstiness" not in burst


def test_a_short_run_at_a_low_rate_still_sends_the_loads_fewest_prompts():
    assert Arrivals(0.5, seconds=4).num_prompts(10) == 10 and Arrivals(8, seconds=3).num_prompts(4) == 24
    assert (AT_36.label, Arrivals(36, 0.5).label, AT_36.key) == ("36/s Poisson", "36/s gamma 0.5", "q36-b1")


def run_set() -> RunSet:
    """A burst of 64 that misses the SLO (ITL p99 139 ms), Poisson arrivals at 36/s that meet it (the H200's
    figures for the latency flags, field-notes.md), two repeats each."""
    runs = [Run(64, repeat, repeat, result(779, 139.5, 5480)) for repeat in (1, 2)]
    runs += [Run(64, repeat, 10 + repeat, result(94 + repeat, 21.6, 4600, rate=36.0), AT_36) for repeat in (1, 2)]
    return RunSet("latency", {}, runs)


def test_runs_at_a_rate_are_kept_apart_and_come_back_from_disk_as_they_went(tmp_path):
    saved = run_set()
    saved.save(tmp_path / "latency")
    assert sorted(path.name for path in (tmp_path / "latency" / "runs").iterdir()) == [
        "c64-r1.json", "c64-r2.json", "q36-b1-r1.json", "q36-b1-r2.json"]
    loaded = load_run_set(tmp_path / "latency")
    assert [(run.concurrency, run.repeat, run.arrivals) for run in loaded.runs] == [
        (64, 1, None), (64, 2, None), (64, 1, AT_36), (64, 2, AT_36)]
    assert loaded.concurrencies == [64] and loaded.arrivals == [AT_36]
    assert loaded.summary()[64]["p99_itl_ms"] == 139.5 and loaded.summary()[64]["repeats"] == 2
    assert loaded.rate_summary()[AT_36]["p99_ttft_ms"] == 95.5
    assert set(json.loads((tmp_path / "latency" / "summary.json").read_text())) == {"64", "q36-b1"}


def test_the_slo_is_judged_at_the_rate_when_given_and_at_every_concurrency_otherwise():
    slo = parse_slo("ttft_p99<=300ms,itl_p99<=40ms")
    at_once = evaluate(run_set(), slo)
    assert not at_once.meets and at_once.values == {"ttft_p99<=300ms": 779, "itl_p99<=40ms": 139.5}
    arriving = evaluate(run_set(), slo, at=AT_36)
    assert arriving.meets and arriving.values == {"ttft_p99<=300ms": 95.5, "itl_p99<=40ms": 21.6}
    assert (arriving.throughput, arriving.concurrency) == (5480, 64)  # the objective: tok/s at the burst
    elsewhere = evaluate(run_set(), slo, at=Arrivals(52, 1.0, 64, 30))  # not measured at 52/s
    assert not elsewhere.meets and set(elsewhere.ratios.values()) == {None}


def test_tune_refuses_arrival_shapes_without_a_rate(tmp_path):
    from typer.testing import CliRunner

    from provisioner.cli.main import app

    outcome = CliRunner().invoke(app, ["tune", "chat", "--slo", "ttft_p99<=300ms", "--burstiness", "0.5",
                                       "--spec", str(tmp_path / "none.yml")], env={"COLUMNS": "200"})
    assert outcome.exit_code == 2, outcome.output
    assert "--burstiness and --rate-seconds shape the arrivals of --rate — give --rate REQ/S too" in outcome.output
