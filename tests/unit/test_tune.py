"""`provision tune`'s library without a host: the SLO, the search space against the pinned vLLM, the
search order and its budget, the winner and the Pareto front on the run sets recorded on the H200 with
the real vLLM 0.25.0 (tests/fixtures/vllm/h200-bench), and --write's edit of the spec."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from provisioner.bench.command import Endpoint, bench_argv
from provisioner.bench.loads import get_load
from provisioner.bench.results import Run, RunSet, load_run_set
from provisioner.spec import SpecError, load_spec
from provisioner.tune.measure import RecordedResults, parse_label, replay
from provisioner.tune.plot import plot_pareto
from provisioner.tune.search import Budget, Candidate, Outcome, Skipped, choose, evaluate, pareto_front, search
from provisioner.tune.slo import SloError, parse_slo
from provisioner.tune.space import AXES, Axis, SpaceError, option_changes, search_space, side_by_side_groups
from provisioner.tune.write import edit_options, write_winner
from provisioner.vllm.flags import CATALOGS_DIR, supported_versions

RECORDED = Path(__file__).resolve().parent.parent / "fixtures" / "vllm" / "h200-bench" / "results"


# --- the SLO ---------------------------------------------------------------------------------------

def test_an_slo_of_percentile_bounds_reads_each_term():
    slo = parse_slo("ttft_p99<=200ms, itl_p99<=0.03s")
    assert [(b.metric, b.statistic, b.limit_ms, b.key) for b in slo.bounds] == [
        ("ttft", "p99", 200.0, "p99_ttft_ms"), ("itl", "p99", 30.0, "p99_itl_ms")]
    assert slo.text == "ttft_p99<=200ms,itl_p99<=30ms"
    assert slo.goodput_args() == []


def test_a_goodput_slo_becomes_vllms_goodput_arguments():
    slo = parse_slo("goodput>=95%,ttft<=200ms,tpot<=50ms")
    assert slo.min_goodput == 0.95 and slo.goodput_args() == ["ttft:200", "tpot:50"]
    # 0.97 of the requests good against 0.95 needed: 0.03 missed of the 0.05 allowed
    assert slo.ratios({"request_goodput": 9.7, "request_throughput": 10.0}) == {"goodput>=95%": pytest.approx(0.6)}


@pytest.mark.parametrize("version", supported_versions())
def test_the_goodput_bounds_go_to_vllm_bench_serve_as_its_own_option(version):
    argv = bench_argv("vllm", Endpoint("http://127.0.0.1:8000", "chat", "/tok"), get_load("smoke"), 4, 1, "/tmp/r",
                      "c4-r1.json", goodput=tuple(parse_slo("goodput>=95%,ttft<=200ms,e2el<=2s").goodput_args()))
    assert argv[argv.index("--goodput"):argv.index("--goodput") + 3] == ["--goodput", "ttft:200", "e2el:2000"]
    catalog = json.loads((CATALOGS_DIR / f"vllm-{version}.json").read_text())
    assert {word[2:] for word in argv if word.startswith("--")} <= set(catalog["commands"]["bench serve"]["options"])


@pytest.mark.parametrize("text, message", [
    ("", "--slo is empty — write e.g. 'ttft_p99<=200ms,itl_p99<=30ms'"),
    ("ttft_p99=200ms", "--slo term 'ttft_p99=200ms': a latency bound is an upper limit — write ttft_p99<=200ms"),
    ("ttft_p99<=200", "--slo term 'ttft_p99<=200': give the unit — ttft_p99<=200ms"),
    ("latency_p99<=200ms", "--slo term 'latency_p99<=200ms': no metric 'latency' — use one of ttft, tpot, itl, e2el"),
    ("ttft_p95<=200ms", "--slo term 'ttft_p95<=200ms': no statistic 'p95' — use one of p50, p90, p99, mean, median"),
    ("ttft<=200ms", "vLLM's goodput — add the share that must meet them, e.g. goodput>=95%"),
    ("goodput>=95%", "--slo: goodput needs per-request bounds, e.g. goodput>=95%,ttft<=200ms,tpot<=50ms"),
    ("goodput>=95%,itl<=30ms", "vLLM's goodput bounds are ttft, tpot, e2el; for itl, name a statistic: itl_p99<=30ms"),
    ("p99 ttft below 200", "--slo term 'p99 ttft below 200' is not NAME<=LIMIT"),
])
def test_a_malformed_slo_names_the_term_and_the_fix(text, message):
    with pytest.raises(SloError) as error:
        parse_slo(text)
    assert message in str(error.value)


# --- the search space -------------------------------------------------------------------------------

def test_the_default_space_holds_the_flags_that_move_latency_and_every_value_is_known_to_vllm_0_25():
    axes = search_space("0.25.0")
    assert [axis.flag for axis in axes] == ["max-num-batched-tokens", "max-num-seqs", "performance-mode",
                                            "async-scheduling", "max-cudagraph-capture-size"]
    assert [axis.flag for axis in axes if not axis.changes_memory] == ["async-scheduling"]


def test_a_flag_the_pinned_vllm_lacks_is_refused_before_anything_runs():
    with pytest.raises(SpaceError, match=r"max-num-seq=8: vLLM 0.25.0 has no flag --max-num-seq — did you mean "
                                         r"'max-num-seqs'"):
        search_space("0.25.0", {"max-num-seq": (8,)})
    with pytest.raises(SpaceError, match=r"performance-mode=fast: .*interactivity"):
        search_space("0.25.0", {"performance-mode": ("fast",)})


def test_a_false_boolean_becomes_its_negative_flag():
    assert option_changes("0.25.0", {"async-scheduling": False}) == {"async-scheduling": None, "no-async-scheduling": True}
    assert option_changes("0.25.0", {"async-scheduling": True}) == {"async-scheduling": True, "no-async-scheduling": None}


def test_only_memory_neutral_candidates_share_a_gpu_and_no_more_than_the_share_allows():
    axes = search_space("0.25.0")
    candidates = [{}, {"async-scheduling": False}, {"max-num-seqs": 64}, {"async-scheduling": True},
                  {"async-scheduling": False, "max-num-seqs": 64}]
    assert side_by_side_groups(candidates, axes, share=0.3) == [[0, 1, 3], [2], [4]]
    assert side_by_side_groups(candidates, axes, share=0.5) == [[0, 1], [2], [3], [4]]


# --- outcomes, the winner, the Pareto front on the H200 recordings ----------------------------------

def _outcomes(slo_text, names=("conc-defaults", "conc-latency")):
    slo = parse_slo(slo_text)
    return [evaluate(load_run_set(RECORDED / name), slo) for name in names]


def test_the_slo_holds_at_every_concurrency_and_throughput_is_read_at_the_highest():
    defaults, latency = _outcomes("ttft_p99<=760ms")
    assert defaults.concurrency == 64 and round(defaults.throughput) == 5548 and round(latency.throughput) == 5631
    assert round(defaults.values["ttft_p99<=760ms"], 1) == 745.0 and defaults.meets
    assert round(latency.values["ttft_p99<=760ms"], 1) == 793.5 and not latency.meets


def test_the_winner_is_the_highest_throughput_that_meets_the_slo():
    assert choose(_outcomes("ttft_p99<=760ms")).winner.name == "conc-defaults"  # latency is faster but late
    assert choose(_outcomes("ttft_p99<=800ms")).winner.name == "conc-latency"
    assert choose(_outcomes("itl_p99<=126ms,ttft_p99<=800ms")).winner.name == "conc-latency"
    single = _outcomes("ttft_p99<=25ms", [path.name for path in sorted(RECORDED.glob("single-*"))])
    assert choose(single).winner.name == "single-latency-cublaslt"  # 211.2 tok/s of 203.2 … 211.2


def test_a_winner_within_the_noise_of_the_baseline_leaves_the_config_as_it_is():
    defaults, latency = _outcomes("ttft_p99<=800ms")
    choice = choose([defaults, latency], reference=defaults)
    assert choice.winner is defaults
    assert choice.note == "conc-latency was +1.5 % faster, within the 2 % noise: the deployed config stays"


def test_when_nothing_meets_the_slo_the_closest_is_named():
    choice = choose(_outcomes("ttft_p99<=700ms"))
    assert choice.winner is None and choice.closest.name == "conc-defaults"


def test_the_pareto_front_drops_what_another_beats_on_both():
    assert [o.name for o in pareto_front(_outcomes("ttft_p99<=800ms"))] == ["conc-defaults", "conc-latency"]
    assert [o.name for o in pareto_front(_outcomes("itl_p99<=126ms,ttft_p99<=800ms"))] == ["conc-latency"]


def test_the_pareto_plot_is_a_png(tmp_path):
    path = plot_pareto(_outcomes("ttft_p99<=800ms"), tmp_path / "pareto.png", title="H200")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


# --- the search --------------------------------------------------------------------------------------

def _fake(table: dict[str, tuple[float, float]], slo_text="ttft_p99<=100ms"):
    """measure() from a table label → (tok/s, TTFT p99 ms); the labels measured, in order."""
    slo, measured = parse_slo(slo_text), []

    def measure(candidate: Candidate) -> Outcome:
        measured.append(candidate.label)
        if candidate.label not in table:
            raise Skipped("not in the table")
        throughput, ttft = table[candidate.label]
        run_set = RunSet(candidate.label, {})
        run_set.runs.append(Run(16, 1, 1, {"completed": 10, "output_throughput": throughput, "median_tpot_ms": 1.0,
                                           "p99_ttft_ms": ttft}))
        return evaluate(run_set, slo, candidate.label, candidate.as_dict())
    return measure, measured


AXES_AB = (Axis("a", (1, 2), True, ""), Axis("b", (1, 2), True, ""))


def test_the_search_goes_one_flag_at_a_time_keeping_what_measurably_helps():
    measure, measured = _fake({
        "baseline": (1000, 50), "a=1": (1100, 60), "a=2": (1300, 120),  # a=2: fastest, but misses the SLO
        "a=1,b=1": (1110, 60), "a=1,b=2": (1200, 90),  # b=1: +0.9 %, noise; b=2: +9 %
    })
    result = search(AXES_AB, measure)
    assert measured == ["baseline", "a=1", "a=2", "a=1,b=1", "a=1,b=2"]
    assert result.kept.label == "a=1,b=2"
    assert result.choice.winner.name == "a=1,b=2"
    # a strategy that took the highest throughput whatever the SLO would have picked a=2
    assert max(result.outcomes, key=lambda o: o.throughput).name == "a=2"


def test_a_value_the_deployed_config_has_is_not_measured_again():
    measure, measured = _fake({"baseline": (1000, 50), "a=2": (900, 50), "b=1": (950, 50), "b=2": (990, 50)})
    search(AXES_AB, measure, deployed={"a": 1})
    assert measured == ["baseline", "a=2", "b=1", "b=2"]


def test_the_budget_stops_the_search_and_says_where():
    measure, measured = _fake({"baseline": (1000, 50), "a=1": (1100, 60), "a=2": (1300, 60)})
    result = search(AXES_AB, measure, Budget(candidates=2))
    assert measured == ["baseline", "a=1"] and result.notes == ["stopped at the budget of 2 candidates"]
    now = [0.0]
    measure, measured = _fake({"baseline": (1000, 50), "a=1": (1100, 60), "a=2": (1300, 60)})

    def ten_seconds_each(candidate):
        now[0] += 10
        return measure(candidate)
    result = search(AXES_AB, ten_seconds_each, Budget(seconds=25, clock=lambda: now[0]))
    assert measured == ["baseline", "a=1"]
    assert result.notes == ["stopped at the time budget: 20 s of 25 s spent, a candidate takes about 10 s"]


def test_a_candidate_that_cannot_be_measured_is_skipped_with_a_note():
    measure, measured = _fake({"baseline": (1000, 50), "a=2": (1100, 60)})
    result = search(AXES_AB[:1], measure)
    assert result.notes == ["a=1: skipped — not in the table"] and result.kept.label == "a=2"


def test_a_recorded_folder_replays_the_search_offline(tmp_path):
    """The H200 recordings as a candidate folder: the deployed defaults, then performance-mode."""
    shutil.copytree(RECORDED / "conc-defaults", tmp_path / "baseline")
    shutil.copytree(RECORDED / "conc-latency", tmp_path / "performance-mode=interactivity")
    axes = (AXES["performance-mode"],)
    result = replay(tmp_path, parse_slo("itl_p99<=126ms,ttft_p99<=800ms"), axes)
    assert [o.name for o in result.outcomes] == ["baseline", "performance-mode=interactivity"]
    assert result.notes == ["performance-mode=balanced: skipped — not recorded (no " f"{tmp_path}/performance-mode=balanced)",
                            "performance-mode=throughput: skipped — not recorded (no " f"{tmp_path}/performance-mode=throughput)"]
    assert result.choice.winner.name == "performance-mode=interactivity"
    assert result.choice.winner.changes == {"performance-mode": "interactivity"}
    # the baseline meets a looser SLO, and +1.5 % is noise: nothing changes
    assert replay(tmp_path, parse_slo("ttft_p99<=800ms"), axes).choice.winner.name == "baseline"
    assert RecordedResults(tmp_path, parse_slo("ttft_p99<=800ms")).all()[1].changes == {"performance-mode": "interactivity"}


def test_a_candidate_label_reads_back_to_its_changes():
    label = Candidate().set("max-num-seqs", 64).set("async-scheduling", False).label
    assert label == "max-num-seqs=64,async-scheduling=false"
    assert parse_label(label) == {"max-num-seqs": 64, "async-scheduling": False}
    assert parse_label("baseline") == {} and parse_label("conc-defaults") == {}


# --- --write -----------------------------------------------------------------------------------------

SPEC = """\
version: 1
hosts:
  - name: gpu1
    address: 10.0.0.5
    gpus:
      devices:
        - {index: 0, uuid: GPU-00000000-1111-2222-3333-000000000001, model: NVIDIA GeForce RTX 3090}
instances:
  # the chat model (this comment stays)
  - name: chat
    host: gpu1
    model: Qwen/Qwen3-1.7B
    gpus: [0]
    gpu_memory_utilization: 0.6
    options:
      max-model-len: 4096  # long enough
      max-num-seqs: 8
  - {name: side, host: gpu1, model: Qwen/Qwen3-1.7B, gpus: [0], port: 8001, gpu_memory_utilization: 0.3,
     options: {max-model-len: 4096}}
"""


def test_write_puts_the_winner_into_the_instance_options_with_a_comment_and_the_spec_revalidates(tmp_path):
    path = tmp_path / "spec.yml"
    path.write_text(SPEC)
    changes = option_changes("0.25.0", {"max-num-seqs": 64, "async-scheduling": False})
    spec = write_winner(path, "chat", changes, "2026-12-03: run set tune-1/max-num-seqs=64, load concurrent")
    assert path.read_text() == SPEC.replace(
        "    options:\n      max-model-len: 4096  # long enough\n      max-num-seqs: 8\n",
        "    # provision tune 2026-12-03: run set tune-1/max-num-seqs=64, load concurrent\n"
        "    options:\n      max-model-len: 4096  # long enough\n      max-num-seqs: 64\n"
        "      no-async-scheduling: true\n")
    assert spec.instances[0].options == {"max-model-len": 4096, "max-num-seqs": 64, "no-async-scheduling": True}
    assert load_spec(path).instances[1].options == {"max-model-len": 4096}


def test_write_into_a_flow_style_instance_and_again_replaces_the_comment(tmp_path):
    path = tmp_path / "spec.yml"
    path.write_text(SPEC)
    write_winner(path, "side", {"performance-mode": "interactivity"}, "first")
    write_winner(path, "side", {"max-num-seqs": 32}, "second")
    text = path.read_text()
    assert text.endswith("  # provision tune second\n  - {name: side, host: gpu1, model: Qwen/Qwen3-1.7B, gpus: [0], port: 8001, "
                         "gpu_memory_utilization: 0.3,\n     options: {max-model-len: 4096, performance-mode: "
                         "interactivity, max-num-seqs: 32}}\n")
    assert "provision tune first" not in text


def test_write_leaves_the_spec_alone_when_the_result_would_not_validate(tmp_path):
    path = tmp_path / "spec.yml"
    path.write_text(SPEC)
    with pytest.raises(SpecError):
        write_winner(path, "chat", {"max-num-seqs": "many"}, "bad")
    assert path.read_text() == SPEC
    assert yaml.safe_load(edit_options(SPEC, "chat", {"max-num-seqs": None}, "x"))["instances"][0]["options"] == {
        "max-model-len": 4096}


# --- the command line, offline (--from-results): nothing reaches a host -----------------------------

def _cli(tmp_path, *args):
    from typer.testing import CliRunner

    from provisioner.cli.main import app
    spec = tmp_path / "spec.yml"
    if not spec.exists():
        spec.write_text(SPEC)
    recorded = tmp_path / "recorded"
    if not recorded.exists():
        shutil.copytree(RECORDED / "conc-defaults", recorded / "baseline")
        shutil.copytree(RECORDED / "conc-latency", recorded / "performance-mode=interactivity")
    return CliRunner().invoke(app, ["tune", "chat", "--spec", str(spec), "--from-results", str(recorded), *args],
                              env={"COLUMNS": "200", "NO_COLOR": "1", "PROVISION_SPEC": ""})


def test_tune_from_recorded_results_prints_the_table_the_winner_and_writes_it(tmp_path):
    outcome = _cli(tmp_path, "--slo", "itl_p99<=126ms,ttft_p99<=800ms", "--space",
                   "performance-mode=interactivity", "--write")
    assert outcome.exit_code == 0, outcome.output
    lines = outcome.output.splitlines()
    assert any("baseline" in line and "5548" in line and "127.71" in line and "no" in line for line in lines), outcome.output
    assert any("performance-mode=interactivity" in line and "5631" in line and "+1.5 %" in line and "yes" in line
               for line in lines), outcome.output
    assert "winner: performance-mode=interactivity — 5631 output tok/s at concurrency 64, meets " \
           "itl_p99<=126ms,ttft_p99<=800ms" in outcome.output
    assert "side by side on one GPU: none of these candidates" in outcome.output
    assert (tmp_path / "recorded" / "pareto.png").stat().st_size > 10_000
    written = load_spec(tmp_path / "spec.yml")
    assert written.instances[0].options == {"max-model-len": 4096, "max-num-seqs": 8, "performance-mode": "interactivity"}
    assert "    # provision tune " in (tmp_path / "spec.yml").read_text()
    assert f"run set {tmp_path}/recorded/performance-mode=interactivity, load concurrent, SLO itl_p99<=126ms," \
           "ttft_p99<=800ms: 5631 output tok/s at concurrency 64\n" in (tmp_path / "spec.yml").read_text()


def test_tune_when_nothing_meets_the_slo_names_the_closest_writes_nothing_and_exits_1(tmp_path):
    outcome = _cli(tmp_path, "--slo", "ttft_p99<=700ms", "--space", "performance-mode=interactivity", "--write")
    assert outcome.exit_code == 1, outcome.output
    assert "no candidate meets ttft_p99<=700ms; the closest: baseline (ttft_p99<=700ms: 106 % of its limit)" in outcome.output
    assert (tmp_path / "spec.yml").read_text() == SPEC


@pytest.mark.parametrize("args, message", [
    (("--slo", "ttft_p99<200ms"), "error: --slo term 'ttft_p99<200ms': a latency bound is an upper limit"),
    (("--slo", "ttft_p99<=200ms", "--space", "max_num_seq=8"),
     "error: --space: the search space has flags or values vLLM would reject: max-num-seq=8: vLLM 0.25.0 has no flag "
     "--max-num-seq — did you mean 'max-num-seqs'"),
    (("--slo", "ttft_p99<=200ms", "--space", "generation-config=vllm,auto"),
     "error: --space: generation-config changes what the model generates (vllm ignores the model's "
     "generation_config.json: "),
    (("--slo", "ttft_p99<=200ms", "--space", "generation_config=vllm", "--space", "max-num-seqs=8",
      "--allow-semantic", "max-num-seqs"),
     "to search it anyway, accept the change for this instance: --allow-semantic generation-config"),
    (("--slo", "ttft_p99<=200ms", "--load", "chatt"), "error: --load 'chatt': no load profile of that name — choose one of: chat,"),
    (("--slo", "ttft_p99<=200ms", "--from-results", "/nonexistent/t"), "error: --from-results /nonexistent/t: no "
     "such folder — give the folder holding one run set per candidate"),
])
def test_tune_refuses_bad_input_in_one_line_before_anything_runs(tmp_path, args, message):
    outcome = _cli(tmp_path, *args)
    assert outcome.exit_code == 2, outcome.output
    assert message in outcome.output.replace("\n", " ")
    assert outcome.exception is None or isinstance(outcome.exception, SystemExit)
    assert not (tmp_path / "recorded" / "pareto.png").exists()


def test_tune_from_a_folder_holding_no_run_set_names_the_folders_below_it_that_do(tmp_path):
    """A tune's RESULTS given instead of RESULTS/NAME once crashed the table (an internal IndexError)."""
    shutil.copytree(RECORDED / "conc-defaults", tmp_path / "recorded" / "tune-chat" / "baseline")
    outcome = _cli(tmp_path, "--slo", "ttft_p99<=800ms")
    assert outcome.exit_code == 2, outcome.output
    assert f"error: --from-results {tmp_path}/recorded: no run set recorded there — give the folder holding one run " \
           f"set per candidate (DIR/<candidate>/runset.json), a tune's RESULTS/NAME: {tmp_path}/recorded/tune-chat" \
           in outcome.output.replace("\n", " "), outcome.output
    assert outcome.exception is None or isinstance(outcome.exception, SystemExit)
