"""Capacity (issue 37, point 3): the highest request rate an instance sustains within its SLO, found by
`provision tune --capacity`, kept with its measurement and in the instance's `capacity:`; `provision plan` sizes a
gateway route's stated rate by it. The search is replayed here over run sets in the form a live tune saves them
(RESULTS/NAME/capacity-q<RATE>-b<B>/, vLLM's result files); the live path runs vLLM's bench client on a lab host
(tests/integration/test_tune.py) and on the H200 (issue 37, point 4)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from provisioner.bench.loads import Arrivals
from provisioner.bench.results import Run, RunSet
from provisioner.cli.main import app
from provisioner.plan import build_plan
from provisioner.spec import SpecError, load_spec, validate_spec
from provisioner.tune.capacity import PRECISION, STEP, find_capacity
from provisioner.tune.search import Outcome, Skipped
from provisioner.tune.write import edit_key, write_instance_key
from tests.unit.conftest import instance, spec_data
from tests.unit.test_tune import RECORDED, SPEC

SLO = "ttft_p99<=300ms,itl_p99<=40ms"


def server(limit: float):
    """What a server's measurements look like to the search: the SLO holds up to `limit` requests/s."""
    asked = []

    def measure_at(arrivals: Arrivals) -> Outcome:
        asked.append(arrivals.rate)
        worst = arrivals.rate / limit
        return Outcome(f"capacity-{arrivals.key}", {}, 0.0, {"ttft_p99<=300ms": worst}, {}, 0)
    return measure_at, asked


@pytest.mark.parametrize("start, limit", [(36, 52), (80, 52), (1, 52), (52, 52), (10, 10.4)])
def test_the_search_brackets_the_rate_where_the_slo_stops_holding_to_within_5_percent(start, limit):
    measure_at, asked = server(limit)
    found = find_capacity(measure_at, Arrivals(start), SLO)
    held, missed = found.bracket
    assert found.rate == held <= limit < missed and (missed - held) / held <= PRECISION
    assert [trial.rate for trial in found.trials] == asked and len(set(asked)) == len(asked)  # none measured twice
    assert all(trial.meets == (trial.rate <= limit) for trial in found.trials)
    assert found.arrivals == {"burstiness": 1.0, "max_concurrency": 1024, "seconds": 30.0} and found.notes == []


def test_from_36_a_server_good_to_52_is_measured_at_36_72_then_between():
    measure_at, asked = server(52)
    found = find_capacity(measure_at, Arrivals(36), SLO)
    assert asked == [36, 36 * STEP, 54, 45, 49.5, 51.75] and found.rate == 51.75  # 54 - 51.75: within 5 %


def test_a_slo_never_met_or_always_met_says_so_within_the_trials():
    measure_at, _ = server(0.0001)
    never = find_capacity(measure_at, Arrivals(10), SLO, max_trials=4)
    assert never.rate is None and never.notes == ["the SLO was not met at any rate tried, down to 1.25/s"]
    measure_at, _ = server(10**9)
    always = find_capacity(measure_at, Arrivals(10), SLO, max_trials=3)
    assert always.rate == 40 and always.notes == [
        "the SLO held at every rate tried, up to 40/s: the capacity is at least that"]


def test_a_rate_that_cannot_be_measured_ends_the_search_with_what_was_measured():
    def measure_at(arrivals: Arrivals) -> Outcome:
        if arrivals.rate > 40:
            raise Skipped("not recorded")
        return Outcome("x", {}, 0.0, {"t": 0.5}, {}, 0)
    found = find_capacity(measure_at, Arrivals(36), SLO)
    assert found.rate == 36 and found.notes[0] == "72/s Poisson: not measured — not recorded"


# --- the command line, offline: trials recorded as a live tune saves them ----------------------------------

TRIALS_MEASURED = "2026-12-07T00:10:00+00:00"  # a run set's `created`


def trial_run_set(rate: float, ttft_p99: float, itl_p99: float) -> RunSet:
    arrivals = Arrivals(rate, 1.0, 1024, 30)
    result = {"completed": 100, "failed": 0, "output_throughput": rate * 128, "request_throughput": rate,
              "median_tpot_ms": 8.0, "p99_ttft_ms": ttft_p99, "p99_itl_ms": itl_p99, "request_rate": float(rate),
              "burstiness": 1.0, "max_concurrency": 1024}
    return RunSet(f"capacity-{arrivals.key}", {"created": TRIALS_MEASURED},
                  [Run(1024, 1, 1, result, arrivals)])


def recorded_tune(folder: Path) -> tuple[Path, float, float]:
    """The H200's run sets of the search (tests/fixtures/vllm/h200-bench: the winner, `latency`'s interactivity
    mode, served 5631/128 requests/s at 64 users), and a capacity trial at each rate the search visits from there,
    its TTFT p99 the latency flags' H200 figure at 40/s (127 ms) up to 52/s and at 56/s (565 ms, then over 800 ms)
    above (field-notes.md, "Measured here"). Returns the folder, the capacity the trials hold and the first trial's
    rate (80 % of the requests/s the winner served at 64 users)."""
    shutil.copytree(RECORDED / "conc-defaults", folder / "baseline")
    shutil.copytree(RECORDED / "conc-latency", folder / "performance-mode=interactivity")
    served = json.loads((folder / "performance-mode=interactivity" / "summary.json").read_text())["64"]
    start = round(served["request_throughput"] * 0.8, 3)
    measure_at, visited = server(52)
    expected = find_capacity(measure_at, Arrivals(start), SLO).rate
    for rate in visited:
        trial_run_set(rate, 127 if rate <= 52 else 900, 24.0).save(folder / f"capacity-q{rate:g}-b1")
    return folder, expected, start


def tune(tmp_path, *args):
    spec = tmp_path / "spec.yml"
    if not spec.exists():
        spec.write_text(SPEC)
    return CliRunner().invoke(app, ["tune", "chat", "--spec", str(spec), "--slo", "itl_p99<=126ms,ttft_p99<=800ms",
                                    "--space", "performance-mode=interactivity", *args],
                              env={"COLUMNS": "250", "NO_COLOR": "1", "PROVISION_SPEC": ""})


def test_tune_capacity_replays_the_trials_keeps_the_result_and_writes_it_into_the_instance(tmp_path):
    folder, expected, start = recorded_tune(tmp_path / "recorded")
    outcome = tune(tmp_path, "--from-results", str(folder), "--capacity", "--write")
    assert outcome.exit_code == 0, outcome.output
    assert f"capacity: {expected:g} requests/s within itl_p99<=126ms,ttft_p99<=800ms (Poisson arrivals, at most " \
           f"1024 in flight); trials: {start:g}/s meets (19 %), {start * 2:g}/s misses (112 %), " in outcome.output
    kept = json.loads((folder / "capacity.json").read_text())
    assert kept["rate"] == expected and kept["changes"] == {"performance-mode": "interactivity"}
    written = load_spec(tmp_path / "spec.yml").instances[0]
    assert written.options["performance-mode"] == "interactivity"
    assert (written.capacity.rate, written.capacity.slo) == (expected, "itl_p99<=126ms,ttft_p99<=800ms")
    assert kept["measured"] == TRIALS_MEASURED  # replayed: when its trials were measured, not when replayed
    assert written.capacity.measured == f"{folder}/capacity.json, {TRIALS_MEASURED}"


def test_a_replayed_capacity_whose_trials_carry_no_time_says_so(tmp_path):
    folder, expected, _ = recorded_tune(tmp_path / "recorded")
    for runset in folder.glob("capacity-*/runset.json"):
        meta = json.loads(runset.read_text())
        del meta["created"]
        runset.write_text(json.dumps(meta))
    outcome = tune(tmp_path, "--from-results", str(folder), "--capacity")
    assert outcome.exit_code == 0, outcome.output
    kept = json.loads((folder / "capacity.json").read_text())
    assert (kept["rate"], kept["measured"]) == (expected, "time not recorded")


def test_tune_capacity_without_a_winner_measures_nothing_more(tmp_path):
    folder, _, _ = recorded_tune(tmp_path / "recorded")
    outcome = tune(tmp_path, "--from-results", str(folder), "--capacity", "--slo", "ttft_p99<=100ms")
    assert outcome.exit_code == 1, outcome.output
    assert "no candidate meets ttft_p99<=100ms" in outcome.output and not (folder / "capacity.json").exists()


# --- writing it into the spec -------------------------------------------------------------------------------

@pytest.mark.parametrize("before, after", [
    ("  - name: chat\n    host: a\n    options:\n      x: 1\n  - name: b\n",
     "  - name: chat\n    host: a\n    options:\n      x: 1\n    capacity: {rate: 52.5, slo: s}\n  - name: b\n"),
    ("  - {name: chat, host: a}\n", "  - {name: chat, host: a, capacity: {rate: 52.5, slo: s}}\n"),
    ("  - name: chat\n    capacity:\n      rate: 3\n      slo: x\n    options: {}\n",
     "  - name: chat\n    capacity: {rate: 52.5, slo: s}\n    options: {}\n"),
    ("  - name: chat\n    capacity: {rate: 3, slo: x}  # measured\n", "  - name: chat\n    capacity: {rate: 52.5, slo: s}  # measured\n"),
], ids=["block, added", "flow", "block value replaced", "flow value replaced, comment kept"])
def test_the_capacity_goes_into_the_instance_the_rest_of_the_file_as_it_was(before, after):
    assert edit_key(f"version: 1\ninstances:\n{before}", "chat", "capacity", {"rate": 52.5, "slo": "s"}) == \
        f"version: 1\ninstances:\n{after}"


def test_a_capacity_the_spec_would_refuse_is_not_written(tmp_path):
    path = tmp_path / "spec.yml"
    path.write_text(SPEC)
    with pytest.raises(SpecError, match=r"instances\[0\]\.capacity\.rate: must be greater than 0\.0, got -1"):
        write_instance_key(path, "chat", "capacity", {"rate": -1, "slo": "x", "measured": "y"})
    assert path.read_text() == SPEC


# --- plan: how many replicas a route's rate takes -------------------------------------------------------------

def gateway_plan(rate: float, capacities: list[float | None]):
    instances = [instance(f"r{index}", 8000 + index, 0.3, bind="0.0.0.0", options={"served-model-name": "chat"},
                          **({"capacity": {"rate": capacity, "slo": SLO, "measured": f"t{index}/capacity.json"}}
                             if capacity else {}))
                 for index, capacity in enumerate(capacities)]
    data = {**spec_data(instances=instances),
            "gateways": [{"name": "public", "host": "ws4070", "port": 8080, "rates": {"chat": rate}}]}
    (host_plan,) = build_plan(validate_spec(data, check_files=False))
    (route,) = host_plan.routes
    return route.carries, host_plan.warnings


def test_plan_says_a_route_with_enough_measured_replicas_has_enough():
    carries, warnings = gateway_plan(100, [52, 56])
    assert carries == (f"100/s takes 2 replica(s) at 52/s each (r0, SLO {SLO}, measured: t0/capacity.json); "
                       "the route has 2: enough")
    assert not [warning for warning in warnings if "route" in warning]


def test_plan_warns_when_a_route_is_short_of_replicas_naming_how_many():
    carries, warnings = gateway_plan(120, [52, 52])
    assert carries.startswith("120/s takes 3 replica(s) at 52/s each (r0,") and carries.endswith(
        "the route has 2: short by 1: add replicas")
    assert f"gateway public's route chat: {carries}" in warnings


def test_plan_says_unmeasured_where_a_replica_has_no_capacity():
    carries, _ = gateway_plan(100, [None, None])
    assert carries == ("100/s: unmeasured — no replica has a capacity, the route has 2; unmeasured: r0, r1 "
                       "(`provision tune INSTANCE --slo … --capacity --write` measures one)")
    carries, _ = gateway_plan(40, [52, None])
    assert carries.endswith("the route has 2: enough; unmeasured: r1 (`provision tune INSTANCE --slo … --capacity "
                            "--write` measures one)")


@pytest.mark.parametrize("rates, message", [
    ({"other": 10}, "gateways[0].rates.other: the gateway has no route 'other' (its routes: chat)"),
    ({"chat": 0}, "gateways[0].rates.chat: 0.0 is not a rate — give the requests per second the route must carry"),
    ({"chat": float("inf")}, "gateways[0].rates.chat: inf is not a rate"),
])
def test_a_rate_of_no_route_or_no_rate_is_refused_naming_the_field(rates, message):
    data = {**spec_data(instances=[instance("r0", 8000, 0.3, bind="0.0.0.0", options={"served-model-name": "chat"})]),
            "gateways": [{"name": "public", "host": "ws4070", "port": 8080, "rates": rates}]}
    with pytest.raises(SpecError) as refused:
        validate_spec(data, check_files=False)
    assert message in str(refused.value)


def test_a_rate_at_which_requests_are_lost_is_not_sustained_and_says_why():
    """At a rate the server cannot take, vLLM's client may lose requests; the bench then refuses the run (BenchError)
    and the trial counts as a miss, its reason kept, not as an error that ends the tune."""
    from provisioner.tune.capacity import unsustained

    def measure_at(arrivals: Arrivals) -> Outcome:
        if arrivals.rate > 50:
            return unsustained(f"capacity-{arrivals.key}", {}, "chat: at 72/s Poisson, 1990 of 2160 requests completed")
        return Outcome("x", {}, 0.0, {"t": 0.5}, {}, 0)
    found = find_capacity(measure_at, Arrivals(36), SLO)
    assert [(trial.rate, trial.meets, trial.worst) for trial in found.trials][:2] == [(36, True, 0.5), (72, False, None)]
    assert found.rate == 49.5 and found.bracket == (49.5, 51.75)
    assert found.notes[0] == "72/s Poisson: chat: at 72/s Poisson, 1990 of 2160 requests completed"


def test_tune_capacity_that_finds_no_rate_exits_1_and_writes_no_capacity(tmp_path):
    """The search has a winner but no trial is recorded at the rate the capacity search starts from: the capacity
    --capacity asked for is unknown: exit 1, and --write puts the winner's options in but no capacity."""
    folder, _, start = recorded_tune(tmp_path / "recorded")
    for trial in folder.glob("capacity-*"):
        shutil.rmtree(trial)
    outcome = tune(tmp_path, "--from-results", str(folder), "--capacity", "--write")
    assert outcome.exit_code == 1, outcome.output
    assert "capacity: no rate was measured" in outcome.output
    assert f"note: {start:g}/s Poisson: not measured — not recorded" in outcome.output
    written = load_spec(tmp_path / "spec.yml").instances[0]
    assert written.capacity is None and written.options["performance-mode"] == "interactivity"


# --- the lent H100's capacity run (issue 37, point 4), replayed ----------------------------------------------

H100_RUNS = Path(__file__).resolve().parents[2] / "benchmarks/h200/results"
H100_RUN = H100_RUNS / "2026-12-07-h100-capacity"  # the morning's: `latency` alone on the card
H100_CAMPAIGN = H100_RUNS / "2026-12-07-h100-campaign"  # the afternoon's: `defaults` idle beside it
ROUTE_150 = "gateways:\n- {name: public, host: h200, rates: {/root/stage/stage/model: 150}}\n"  # both runs' model


def replay_h100_trials(run: Path, tmp_path: Path, gateways: str = "") -> tuple[Path, dict, Path]:
    """`provision tune latency --capacity --from-results … --write` over a lent H100's recorded trials, as the live
    tune ran them: the folder replayed, the capacity.json the live tune kept, the spec written."""
    folder = tmp_path / "capacity"
    shutil.copytree(run / "tune/capacity", folder)
    live = json.loads((folder / "capacity.json").read_text())
    (folder / "capacity.json").unlink()
    spec = tmp_path / "spec.yml"
    spec.write_text((run / "spec.yml").read_text() + gateways)
    outcome = CliRunner().invoke(app, ["tune", "latency", "--spec", str(spec), "--slo", SLO, "--load", "single",
                                       "--max-candidates", "1", "--rate", "32", "--rate-seconds", "6", "--capacity",
                                       "--capacity-trials", "5", "--from-results", str(folder), "--write"],
                                 env={"COLUMNS": "250", "NO_COLOR": "1", "PROVISION_SPEC": ""})
    assert outcome.exit_code == 0, outcome.output
    assert json.loads((folder / "capacity.json").read_text()) == live
    return folder, live, spec


def test_the_h100_trials_replayed_give_the_capacity_the_live_tune_kept_and_plan_sizes_a_route_by_it(tmp_path):
    """benchmarks/h200/rates.py ran `provision tune --capacity` on the lent H100 (its trials and capacity.json
    are kept): replaying those trials finds the same answer, to the field, and plan counts replicas by it."""
    folder, live, spec = replay_h100_trials(H100_RUN, tmp_path, ROUTE_150)
    assert live["rate"] == 60 and [(trial["rate"], trial["meets"]) for trial in live["trials"]] == [
        (32, True), (64, False), (48, True), (56, True), (60, True)]
    (host_plan,) = build_plan(load_spec(spec))
    (route,) = host_plan.routes
    assert route.carries == (f"150/s takes 3 replica(s) at 60/s each (latency, SLO {SLO}, measured: "
                             f"{folder}/capacity.json, {live['measured']}); the route has 1: short by 2: add replicas")


def test_the_second_h100_run_replayed_gives_its_own_capacity_one_trial_apart(tmp_path):
    """The same search on the same kind of card hours later found 56, not 60: its 60/s trial missed (103 % of the
    TTFT limit). The replay gives that run's answer, not the first one's, and writes it into `latency` alone; a
    route over both of that run's instances counts by the measured one and names the other unmeasured."""
    folder, live, spec = replay_h100_trials(H100_CAMPAIGN, tmp_path, ROUTE_150)
    assert live["rate"] == 56 and [(trial["rate"], trial["meets"]) for trial in live["trials"]] == [
        (32, True), (64, False), (48, True), (56, True), (60, False)]
    instances = {item.name: item.capacity for item in load_spec(spec).instances}
    assert instances["defaults"] is None and instances["latency"].rate == 56
    (host_plan,) = build_plan(load_spec(spec))
    (route,) = host_plan.routes
    assert route.carries.startswith(
        f"150/s takes 3 replica(s) at 56/s each (latency, SLO {SLO}, measured: {folder}/capacity.json, "
        f"{live['measured']}); the route has 2: short by 1: add replicas; unmeasured: defaults"), route.carries
