"""The GPU fixtures say what they are: recorded on a real machine, or constructed with a source for each number."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gpu"
MACHINES = sorted(path.parent.name for path in FIXTURES.glob("*/nvml.json"))
SOURCED = ("memory_total_mib", "power_default_w", "power_min_w", "power_max_w", "pcie_gen_max", "pcie_width_max")


def construct_module():
    spec = importlib.util.spec_from_file_location("construct", FIXTURES / "construct.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_machines():
    assert MACHINES == ["h200x1", "h200x2", "rtx3090", "rtx4070", "rtx4090x2"]


@pytest.mark.parametrize("machine", MACHINES)
def test_every_fixture_is_marked_recorded_or_constructed(machine):
    about = json.loads((FIXTURES / machine / "fixture.json").read_text())
    recording = json.loads((FIXTURES / machine / "nvml.json").read_text())
    assert about["kind"] == recording["kind"] in ("recorded", "constructed")
    if about["kind"] == "constructed":
        for card, sources in about["sources"].items():
            assert [number for number in SOURCED if not sources.get(number)] == [], card


def test_the_constructed_files_are_what_construct_py_writes():
    construct = construct_module()
    for machine in construct.FIXTURES:
        for name, content in construct.fixture_files(machine).items():
            assert (FIXTURES / machine / name).read_text() == content, f"{machine}/{name}: run construct.py"
