"""`provision facts`: the table, --json, no driver; and its import path stays free of the spec (pydantic)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from provisioner.cli import facts_cmd
from provisioner.cli.main import app
from provisioner.gpu.facts import read_facts
from provisioner.gpu.smi import SmiError
from provisioner.paths import CONTENT_ROOT

H200X2 = Path(__file__).resolve().parents[1] / "fixtures" / "gpu" / "h200x2" / "nvml.json"


def test_json_is_the_facts():
    result = CliRunner().invoke(app, ["facts", "--json", "--from-recording", str(H200X2)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == json.loads(json.dumps(read_facts(recording=H200X2).as_data()))


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

    monkeypatch.setattr(facts_cmd, "read_facts", no_driver)
    result = CliRunner().invoke(app, ["facts"])
    assert result.exit_code == 1
    assert "cannot read the GPUs: nvidia-smi is not on the PATH, and NVML did not start" in result.output


def test_facts_needs_no_spec_no_pydantic_no_yaml():
    """It runs on GPU hosts that have none of them (the H200 had no pydantic)."""
    code = ("import sys, provisioner.cli.facts_cmd, provisioner.gpu.checks; "
            "print(sorted(m for m in ('pydantic', 'yaml', 'jinja2', 'ansible', 'provisioner.spec') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=CONTENT_ROOT, check=True)
    assert done.stdout.strip() == "[]"
