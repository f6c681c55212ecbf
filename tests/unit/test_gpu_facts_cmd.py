"""`provision facts`: the table, --json, no driver; and its import path stays free of the spec (pydantic)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from provisioner.base.paths import CONTENT_ROOT
from provisioner.cli import facts_cmd
from provisioner.cli.main import app
from provisioner.gpu import facts as gpu_facts
from provisioner.gpu.facts import read_facts
from provisioner.gpu.smi import SmiError

H200X2 = Path(__file__).resolve().parents[1] / "fixtures" / "gpu" / "h200x2" / "nvml.json"


def test_json_is_the_facts():
    result = CliRunner().invoke(app, ["facts", "--json", "--from-recording", str(H200X2)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert {key: value for key, value in data.items() if key not in ("driver_branch", "vllm_builds")} == json.loads(
        json.dumps(read_facts(recording=H200X2).as_data()))
    assert data["driver_branch"] == 580 and {build["status"] for build in data["vllm_builds"]} == {"ok"}


def test_the_table_shows_the_gpus_and_their_link():
    result = CliRunner().invoke(app, ["facts", "--from-recording", str(H200X2)], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "NVIDIA driver 580.159.04, CUDA 13.0 — 2 GPUs (read through NVML)"
    row = next(line for line in lines if "default, min – max" in line)
    assert row.count("700 W, 200 W – 700 W") == 2
    assert any("0 ↔ 1" in line and "yes" in line and "PCIe path PHB, NVLink" in line for line in lines)


def test_without_a_driver_it_says_so(monkeypatch):
    def no_driver(**_):
        raise SmiError("nvidia-smi is not on the PATH, and NVML did not start: Driver Not Loaded")

    monkeypatch.setattr(gpu_facts, "read_facts", no_driver)  # facts imports it when it runs
    result = CliRunner().invoke(app, ["facts"])
    assert result.exit_code == 1
    assert "cannot read the GPUs: nvidia-smi is not on the PATH, and NVML did not start" in result.output


def test_facts_needs_no_spec_no_pydantic_no_yaml():
    """It runs on GPU hosts that have none of them (the H200 had no pydantic)."""
    code = ("import sys, provisioner.cli.facts_cmd, provisioner.gpu.checks; "
            "print(sorted(m for m in ('pydantic', 'yaml', 'jinja2', 'ansible', 'provisioner.spec') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=CONTENT_ROOT, check=True)
    assert done.stdout.strip() == "[]"


def test_with_json_a_missing_driver_is_a_json_error_on_stdout(monkeypatch):
    def no_driver(**_):
        raise SmiError("nvidia-smi is not on the PATH, and NVML did not start: Driver Not Loaded")

    monkeypatch.setattr(gpu_facts, "read_facts", no_driver)  # facts imports it when it runs
    result = CliRunner().invoke(app, ["facts", "--json"])
    assert result.exit_code == 1
    assert json.loads(result.stdout) == {
        "error": "cannot read the GPUs: nvidia-smi is not on the PATH, and NVML did not start: Driver Not Loaded",
        "fix": facts_cmd.NO_DRIVER_FIX,
    }
    assert result.stderr == ""


def test_with_json_no_driver_at_all_is_a_json_error_too(tmp_path):
    """This machine has no NVIDIA driver: NVML does not start, and the nvidia-smi given does not exist."""
    result = CliRunner().invoke(app, ["facts", "--json", "--nvidia-smi", str(tmp_path / "nvidia-smi")])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)  # not an exception's traceback
    error = json.loads(result.stdout)
    assert error["error"].startswith(f"cannot read the GPUs: {tmp_path / 'nvidia-smi'}")
    assert error["fix"] == facts_cmd.NO_DRIVER_FIX


@pytest.mark.parametrize("content", ["{not json", '{"calls": 3}', "[]"])
@pytest.mark.parametrize("json_output", [["--json"], []], ids=["json", "table"])
def test_a_recording_that_is_not_one_is_an_error_not_a_traceback(content, json_output, tmp_path):
    recording = tmp_path / "nvml.json"
    recording.write_text(content)
    result = CliRunner().invoke(app, ["facts", *json_output, "--from-recording", str(recording)])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.exception
    if json_output:
        error = json.loads(result.stdout)
        assert error["error"].startswith(f"{recording}: not a recording of NVML's answers")
        assert error["fix"] == facts_cmd.RECORDING_FIX
    else:
        assert result.stdout == "" and f"{recording}: not a recording of NVML's answers" in result.stderr


@pytest.mark.parametrize("json_output", [["--json"], []], ids=["json", "table"])
def test_a_recording_that_cannot_be_read_is_an_error_in_the_same_form(json_output, tmp_path):
    for missing in (tmp_path / "nope.json", tmp_path):  # no such file; a folder
        result = CliRunner().invoke(app, ["facts", *json_output, "--from-recording", str(missing)])
        assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.exception
        output = json.loads(result.stdout)["error"] if json_output else result.stderr
        assert f"{missing}: cannot read it (" in output
