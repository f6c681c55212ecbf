"""`provision bench` without a server: the command line it runs, run sets recorded on the H200 with the
real vLLM 0.25.0 (tests/fixtures/vllm/h200-bench), medians, comparisons, plots, sweep parsing."""

from __future__ import annotations

import json
import shutil
import statistics
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from provisioner.bench.command import Endpoint, bench_argv, shell_command
from provisioner.bench.compare import compare
from provisioner.bench.loads import get_load, load_profiles
from provisioner.bench.plots import plot_run_sets
from provisioner.bench.results import ResultError, Run, find_run_set, load_run_set
from provisioner.bench.sweep import parse_sweep, swept_specs
from provisioner.cli.main import app
from provisioner.spec import SpecError, validate_spec
from provisioner.vllm.flags import CATALOGS_DIR, supported_versions

RECORDED = Path(__file__).resolve().parent.parent / "fixtures" / "vllm" / "h200-bench" / "results"
ENDPOINT = Endpoint("http://127.0.0.1:8000", "chat", "/models/tok")


def test_every_load_profile_is_complete_and_sized_per_concurrency():
    profiles = load_profiles()
    assert {"chat", "single", "concurrent", "smoke"} <= set(profiles)
    chat = profiles["chat"]
    assert (chat.input_len, chat.output_len, chat.concurrency) == (512, 128, (1, 16, 64))
    assert [chat.num_prompts(c) for c in chat.concurrency] == [10, 80, 320]


def test_an_unknown_load_profile_names_the_known_ones():
    with pytest.raises(ValueError, match=r"--load 'chatt': no load profile of that name — choose one of: chat, "):
        get_load("chatt")


@pytest.mark.parametrize("version", supported_versions())
def test_the_bench_command_uses_only_options_the_pinned_vllm_bench_serve_has(version):
    argv = bench_argv("/opt/vllm/venv/bin/vllm", ENDPOINT, get_load("chat"), 16, 1234, "/tmp/r", "c16-r1.json",
                      metadata={"instance": "chat"})
    assert argv[:3] == ["/opt/vllm/venv/bin/vllm", "bench", "serve"]
    used = {word[2:] for word in argv if word.startswith("--")}
    catalog = json.loads((CATALOGS_DIR / f"vllm-{version}.json").read_text())
    known = set(catalog["commands"]["bench serve"]["options"])
    assert used <= known, used - known
    assert argv[argv.index("--num-prompts") + 1] == "80" and argv[argv.index("--max-concurrency") + 1] == "16"
    assert argv[argv.index("--seed") + 1] == "1234"


def test_the_api_key_goes_on_stdin_never_on_the_command_line():
    argv = bench_argv("vllm", ENDPOINT, get_load("smoke"), 1, 1, "/tmp/r", "x.json")
    command = shell_command(argv, env={"HF_HOME": "/var/lib/vllm/hf"}, key_on_stdin=True)
    assert command.startswith("export HF_HOME=/var/lib/vllm/hf; IFS= read -r OPENAI_API_KEY; export OPENAI_API_KEY; exec ")
    assert "secret" not in command


def test_a_recorded_run_set_gives_the_median_of_its_repeats():
    run_set = load_run_set(RECORDED / "single-latency")
    assert [run.concurrency for run in run_set.runs] == [1, 1, 1]
    assert len({run.seed for run in run_set.runs}) == 3  # a fresh seed per run
    raw = [json.loads(path.read_text())["p50_tpot_ms"] for path in sorted((RECORDED / "single-latency/runs").glob("*.json"))]
    assert run_set.summary()[1]["p50_tpot_ms"] == statistics.median(raw)
    assert run_set.summary()[1]["repeats"] == 3


def test_the_latency_profile_beats_vllm_defaults_on_the_h200():
    """The recorded H200 runs: defaults vs our `latency` profile (same GPU, same run)."""
    single = compare(load_run_set(RECORDED / "single-defaults"), load_run_set(RECORDED / "single-latency"))
    tpot = next(row for row in single if row.metric == "TPOT p50 ms")
    assert tpot.verdict(1) == "better" and -0.06 < tpot.delta(1) < -0.02
    loaded = compare(load_run_set(RECORDED / "conc-defaults"), load_run_set(RECORDED / "conc-latency"))
    assert {row.concurrency for row in loaded} == {16, 64}
    for row in loaded:
        if row.metric == "output tok/s":
            assert row.delta(1) > 0, row
        if row.metric == "ITL p99 ms":
            assert row.verdict(1) in ("better", "same"), row


def test_run_sets_with_no_common_concurrency_compare_to_nothing():
    assert compare(load_run_set(RECORDED / "single-defaults"), load_run_set(RECORDED / "conc-defaults")) == []


def test_a_file_that_is_not_a_bench_result_is_refused():
    with pytest.raises(ResultError, match="not a `vllm bench serve` result — missing completed, output_throughput"):
        Run.from_json({"max_concurrency": 4, "median_tpot_ms": 1.0}, "x.json")


def test_an_unknown_run_set_names_the_known_ones():
    with pytest.raises(ResultError, match="no run set 'nope' — known in .*: conc-defaults, conc-latency"):
        find_run_set("nope", RECORDED)


def test_the_plot_is_a_png_with_the_floor(tmp_path):
    run_sets = [load_run_set(RECORDED / name) for name in ("single-defaults", "single-latency")]
    path = plot_run_sets(run_sets, tmp_path / "c1.png", title="c=1", floor_ms=3.52)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_compare_on_the_command_line_prints_deltas_and_writes_the_plot(tmp_path):
    results = shutil.copytree(RECORDED, tmp_path / "results")
    outcome = CliRunner().invoke(app, ["bench", "compare", "conc-defaults", "conc-latency", "--results", str(results)],
                                 env={"COLUMNS": "200"})
    assert outcome.exit_code == 0, outcome.output
    assert "conc-defaults (reference) vs conc-latency" in outcome.output
    assert "+4.7 %" in outcome.output  # output tok/s at c=16: 2526 against 2413
    assert (results / "compare-conc-defaults-vs-conc-latency.png").stat().st_size > 10_000


def test_compare_without_matplotlib_prints_the_tables_and_how_to_get_plots(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` fails as where the extra `plot` is not installed
    results = shutil.copytree(RECORDED, tmp_path / "results")
    outcome = CliRunner().invoke(app, ["bench", "compare", "conc-defaults", "conc-latency", "--results", str(results)],
                                 env={"COLUMNS": "200"})
    assert outcome.exit_code == 0, outcome.output
    assert outcome.exception is None
    assert "conc-defaults (reference) vs conc-latency" in outcome.output and "+4.7 %" in outcome.output
    assert ("no plot drawn: matplotlib is not installed — for plots: pipx inject vllm-provision matplotlib, "
            "or pip install 'vllm-provision[plot]'") in outcome.output
    assert not list(results.glob("*.png"))


def test_a_sweep_reads_flag_and_values():
    sweep = parse_sweep("max_num_batched_tokens=2048,4096, 8192")
    assert (sweep.flag, sweep.values) == ("max-num-batched-tokens", (2048, 4096, 8192))
    assert parse_sweep("--enable-prefix-caching=true,false").values == (True, False)


@pytest.mark.parametrize("text", ["max_num_seqs", "=1,2", "max_num_seqs="])
def test_a_malformed_sweep_says_how_to_write_it(text):
    with pytest.raises(ValueError, match=r"write FLAG=VALUE,VALUE,…"):
        parse_sweep(text)


def _spec():
    return validate_spec({
        "version": 1,
        "hosts": [{"name": "gpu1", "address": "10.0.0.5",
                   "gpus": {"devices": [{"index": 0, "uuid": "GPU-00000000-1111-2222-3333-000000000001",
                                         "model": "NVIDIA GeForce RTX 3090"}]}}],
        "instances": [{"name": "chat", "host": "gpu1", "model": "Qwen/Qwen3-1.7B", "gpus": [0],
                       "options": {"max-model-len": 4096}}],
    }, check_files=False)


def test_each_swept_value_is_a_validated_spec_before_any_host_is_touched():
    variants = swept_specs(_spec(), "chat", parse_sweep("max_num_seqs=8,64"))
    assert [(value, changed.instances[0].serve_options["max-num-seqs"]) for value, changed in variants] == [(8, 8), (64, 64)]


def test_a_sweep_over_an_unknown_flag_is_refused_with_the_flag_meant():
    with pytest.raises(SpecError, match=r"instances\[0\]\.options\.max-num-seq: .*did you mean .*max-num-seqs.*\(--sweep max-num-seq=8\)"):
        swept_specs(_spec(), "chat", parse_sweep("max_num_seq=8"))


def test_a_sweep_value_that_does_not_fit_in_memory_is_refused():
    with pytest.raises(ValueError, match=r"--sweep max-model-len=131072: gpu1 GPU 0: chat: max-model-len 131,072 is above"):
        swept_specs(_spec(), "chat", parse_sweep("max_model_len=4096,131072"))


def test_bench_names_the_instances_when_one_is_unknown(tmp_path):
    spec = tmp_path / "spec.yml"
    spec.write_text(json.dumps(_spec().model_dump(mode="json")))
    outcome = CliRunner().invoke(app, ["bench", "run", "chta", "--spec", str(spec)], env={"COLUMNS": "200"})
    assert outcome.exit_code == 2
    assert "no instance 'chta' in the spec — did you mean 'chat'? instances: chat" in outcome.output


def test_run_sets_measured_apart_join_into_one_comparison(tmp_path):
    joined = find_run_set("single-latency+conc-latency", RECORDED)
    assert joined.concurrencies == [1, 16, 64]
    rows = compare(find_run_set("single-defaults+conc-defaults", RECORDED), joined)
    assert {row.concurrency for row in rows} == {1, 16, 64}
    tpot = next(row for row in rows if row.concurrency == 1 and row.metric == "TPOT p50 ms")
    assert tpot.values == (load_run_set(RECORDED / "single-defaults").summary()[1]["p50_tpot_ms"],
                           load_run_set(RECORDED / "single-latency").summary()[1]["p50_tpot_ms"])


def test_the_bench_runs_here_for_a_loopback_host_and_over_ssh_otherwise():
    from provisioner.fleet.remote import HostShell

    remote = _spec().hosts[0]
    local = remote.model_copy(update={"address": "127.0.0.1"})
    assert HostShell.for_host(local).argv("true") == ["bash", "-c", "true"]
    forwarded = local.model_copy(update={"ssh": local.ssh.model_copy(update={"port": 52549})})  # e.g. a VM's port
    assert HostShell.for_host(forwarded).argv("true")[-3:] == ["127.0.0.1", "--", "true"]
    argv = HostShell.for_host(remote).argv("true")
    assert argv[0] == "ssh" and argv[-3:] == ["10.0.0.5", "--", "true"]
    assert "BatchMode yes" in argv
    sudo = remote.model_copy(update={"ssh": remote.ssh.model_copy(update={"user": "ops", "become": True})})
    assert HostShell.for_host(sudo).argv("cat /etc/x")[-1] == "sudo -n bash -c 'cat /etc/x'"
