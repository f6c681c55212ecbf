"""The Ansible module nvidia_gpu as Ansible runs it (ad hoc, on this machine), against the TEST DOUBLE nvidia-smi.

No GPU and no NVML here: the module falls back to nvidia-smi, which is the stand-in
(tests/doubles/nvidia_smi_standin.py) fed by the constructed 2× RTX 4090 fixture, with its
state, fixture and call log in a temporary folder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from provisioner.base.paths import COLLECTION, collections_dir
from tests.doubles import nvidia_smi_standin as standin

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "gpu" / "rtx4090x2"
U0, U1 = "GPU-0c1d2e3f-4a5b-4c6d-8e7f-9a0b1c2d3e4f", "GPU-f4e3d2c1-b0a9-4f8e-9d7c-6b5a4f3e2d1c"


class Machine:
    """This machine with the stand-in as its only nvidia-smi."""

    def __init__(self, root: Path):
        self.root = root
        bin_dir, fixture = root / "bin", root / "fixture"
        bin_dir.mkdir()
        shutil.copytree(FIXTURE, fixture)
        shutil.copy(standin.__file__, bin_dir / "nvidia-smi")
        (bin_dir / "nvidia-smi").chmod(0o755)
        self.log = root / "calls.jsonl"
        self.env = {
            **os.environ,
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "NVIDIA_SMI_STANDIN_FIXTURE": str(fixture),
            "NVIDIA_SMI_STANDIN_STATE": str(root / "state.json"),
            "NVIDIA_SMI_STANDIN_LOG": str(self.log),
            "ANSIBLE_COLLECTIONS_PATH": str(collections_dir(root / "collections")),
            "ANSIBLE_REMOTE_TMP": str(root / "ansible-tmp"),
            "ANSIBLE_LOCALHOST_WARNING": "false",
            "ANSIBLE_NOCOLOR": "1",
        }

    def module(self, args: dict, *options: str) -> dict:
        """Run the module once on localhost; its result (as Ansible's tree callback saves it), with `failed`."""
        ansible = Path(sys.executable).parent / "ansible"
        tree = self.root / "tree"
        shutil.rmtree(tree, ignore_errors=True)
        done = subprocess.run(
            [str(ansible), "localhost", "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}",
             "-t", str(tree), "-m", f"{COLLECTION}.nvidia_gpu", "-a", json.dumps(args), *options],
            env=self.env, capture_output=True, text=True, timeout=120,
        )
        return {**json.loads((tree / "localhost").read_text()), "failed": done.returncode != 0}

    def setters(self) -> list[list[str]]:
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        return [call["argv"] for call in standin.setter_calls([json.loads(line) for line in lines])]


@pytest.fixture
def machine(tmp_path) -> Machine:
    return Machine(tmp_path)


SEED3 = {"persistence_mode": True, "devices": [{"index": 0, "uuid": U0, "power_limit": 450},
                                               {"index": 1, "uuid": U1, "power_limit": "max"}]}


def test_check_mode_reports_what_would_change_and_sets_nothing(machine):
    result = machine.module(SEED3, "--check")

    assert result["changed"] is True and not result["failed"]
    assert result["backend"] == "nvidia-smi"
    assert result["msg"] == ("would change: GPU 0: persistence mode off → on; GPU 1: persistence mode off → on; "
                             "GPU 0: power limit 300 → 450 W; GPU 1: power limit 300 → 450 W")
    assert result["commands"] == []
    assert machine.setters() == []


def test_apply_sets_what_differs_then_changes_nothing(machine):
    first = machine.module(SEED3)

    assert first["changed"] is True and not first["failed"], first
    assert first["commands"] == [["nvidia-smi", "-i", U0, "-pm", "1"], ["nvidia-smi", "-i", U1, "-pm", "1"],
                                 ["nvidia-smi", "-i", U0, "-pl", "450"], ["nvidia-smi", "-i", U1, "-pl", "450"]]
    assert machine.setters() == [command[1:] for command in first["commands"]]
    assert [(gpu["power_limit_w"], gpu["persistence_mode"]) for gpu in first["facts"]["gpus"]] == [(450.0, True)] * 2
    assert first["targets"][1] == {"index": 1, "uuid": U1, "power_limit": "max", "power_limit_w": 450.0}

    second = machine.module(SEED3)
    assert second["changed"] is False and second["msg"] == "GPUs as wanted"
    assert len(machine.setters()) == 4


def test_a_target_out_of_range_fails_before_anything_is_set(machine):
    result = machine.module({"persistence_mode": True, "devices": [{"index": 0, "power_limit": "450"},
                                                                   {"index": 1, "power_limit": 600}]})

    assert result["failed"] is True and result["changed"] is False
    assert result["msg"] == (f"GPU 1 (NVIDIA GeForce RTX 4090, {U1}): power limit 600 W is outside the card's range "
                             "150–450 W — use a value from 150 to 450, 'max' or 'default'")
    assert result["targets"] == [{"index": 0, "uuid": U0, "power_limit": 450, "power_limit_w": 450.0}]  # "450": watts
    assert machine.setters() == []
