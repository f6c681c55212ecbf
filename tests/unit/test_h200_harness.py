"""The H200 harness (benchmarks/h200/run.py) runs exactly what the units render: it lays vLLM out at the path
their ExecStart names, for the spec's vLLM version, and starts each server with the unit's own ExecStart and
environment (issue 37: it once laid vLLM out at /opt/vllm/venv while the units ran /opt/vllm/venvs/<version>)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from benchmarks.h200 import rates, run
from provisioner.plan import build_plan
from provisioner.spec import load_spec
from provisioner.spec.models import VllmSettings

DEVICE = {"index": 0, "uuid": "GPU-00000000-1111-2222-3333-000000000001", "model": "NVIDIA H100 80GB HBM3"}
FIXTURES = Path(__file__).parents[1] / "fixtures/gpu"


def test_the_harness_runs_the_vllm_of_the_rendered_units_for_the_specs_version(tmp_path):
    spec = tmp_path / "spec.yml"
    data = run.harness_spec(DEVICE)
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    (plan,) = build_plan(load_spec(spec))
    settings = data["hosts"][0]["vllm"]
    expected = Path(VllmSettings(install_path=settings["install_path"], version=settings["version"]).venv) / "bin/vllm"
    assert run.units_vllm(plan.units) == expected == Path("/opt/vllm/venvs/0.25.0/bin/vllm")
    for unit in plan.units:  # the harness's ExecStart is the unit's, word for word
        assert shlex.split(run._service(unit.unit.content)["ExecStart"])[:3] == [str(expected), "serve", "--config"]
    source = Path(run.__file__).read_text(encoding="utf-8") + Path(run.__file__).with_name("decode_trace.py").read_text(
        encoding="utf-8")
    assert "/opt/vllm/venv/" not in source and "Path(\"/opt/vllm" not in source  # no path of its own


def test_the_harness_spec_names_the_card_the_run_is_on():
    """A lent H100's run must not be recorded as an H200's (the spec once said "NVIDIA H200" on any card)."""
    listing = (FIXTURES / "h200x2/nvidia-smi-L.txt").read_text(encoding="utf-8")
    device = run.gpu0(listing)
    assert device["model"] == "NVIDIA H200" and device["uuid"] in listing.splitlines()[0]
    assert run.harness_spec(DEVICE)["hosts"][0]["gpus"]["devices"] == [DEVICE]


def test_a_listing_without_gpu_0_stops_the_harness_saying_what_nvidia_smi_said():
    with pytest.raises(SystemExit, match=r"nvidia-smi -L lists no GPU 0 with a UUID; it said: No devices were found"):
        run.gpu0("No devices were found\n")


@pytest.mark.parametrize("only, parts", [("", ("capacity", "side")), ("capacity", ("capacity",)), ("side", ("side",))])
def test_rates_only_picks_the_campaigns_parts(only, parts):
    assert rates.campaign_parts(only) == parts


def test_a_rates_only_it_does_not_know_stops_it_before_a_server_starts():
    """A typo (RATES_ONLY=sides) would otherwise run the whole campaign on a session's last device minutes."""
    with pytest.raises(SystemExit, match=r"RATES_ONLY='sides': give capacity, side, or nothing for the whole campaign"):
        rates.campaign_parts("sides")
