"""The H200 harness (benchmarks/h200/run.py) runs exactly what the units render: it lays vLLM out at the path
their ExecStart names, for the spec's vLLM version, and starts each server with the unit's own ExecStart and
environment (issue 37: it once laid vLLM out at /opt/vllm/venv while the units ran /opt/vllm/venvs/<version>)."""

from __future__ import annotations

import shlex
from pathlib import Path

import yaml

from benchmarks.h200 import run
from provisioner.plan import build_plan
from provisioner.spec import load_spec
from provisioner.spec.models import VllmSettings

UUID = "GPU-00000000-1111-2222-3333-000000000001"


def test_the_harness_runs_the_vllm_of_the_rendered_units_for_the_specs_version(tmp_path):
    spec = tmp_path / "spec.yml"
    data = run.harness_spec(UUID)
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
