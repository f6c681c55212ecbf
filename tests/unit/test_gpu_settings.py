"""Planning persistence mode and power limits from a host's facts: targets, ranges, what changes, in which order."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from provisioner.base.module_utils import gpu_settings as settings
from provisioner.gpu.nvml import ReplayNvml, read_nvml_facts

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gpu"
U0, U1 = "GPU-0c1d2e3f-4a5b-4c6d-8e7f-9a0b1c2d3e4f", "GPU-f4e3d2c1-b0a9-4f8e-9d7c-6b5a4f3e2d1c"


@pytest.fixture
def seed3() -> dict:
    """The constructed 2× RTX 4090: 150–450 W cards capped at 300 W, persistence off."""
    return read_nvml_facts(ReplayNvml.from_file(FIXTURES / "rtx4090x2" / "nvml.json"))


def devices(*limits, uuids=(U0, U1)):
    return [{"index": index, "uuid": uuid, "power_limit": limit} for index, (uuid, limit) in enumerate(zip(uuids, limits))]


@pytest.mark.parametrize("target, watts", [(450, 450.0), (150, 150.0), ("max", 450.0), ("default", 450.0)])
def test_targets_resolve_on_the_card(seed3, target, watts):
    assert settings.resolve_power_target(target, seed3["gpus"][0]) == (watts, None)


@pytest.mark.parametrize("target, problem", [
    (600, f"GPU 0 (NVIDIA GeForce RTX 4090, {U0}): power limit 600 W is outside the card's range 150–450 W "
          "— use a value from 150 to 450, 'max' or 'default'"),
    (100, "power limit 100 W is outside the card's range 150–450 W"),
    ("maximum", "'maximum' is not a power limit"),
    (True, "True is not a power limit"),
    (0, "0 is not a power limit"),
])
def test_targets_the_card_cannot_take_are_problems_that_name_the_gpu(seed3, target, problem):
    watts, message = settings.resolve_power_target(target, seed3["gpus"][0])
    assert watts is None and problem in message


def test_a_card_without_power_management_takes_only_default():
    gpu = {"index": 0, "name": "Tesla", "uuid": "GPU-x", "power_default_w": None, "power_min_w": None,
           "power_max_w": None}
    assert settings.resolve_power_target(450, gpu)[1] == (
        "GPU 0 (Tesla, GPU-x) does not report its power limit range (power management not supported), "
        "so power_limit 450 cannot be set — use 'default'")
    assert settings.resolve_power_target("default", gpu) == (None, None)
    facts = {"gpus": [dict(gpu, power_limit_w=None, persistence_mode=None)]}
    assert settings.plan_settings(facts, [{"index": 0, "power_limit": "default"}], persistence_mode=True) == {
        "changes": [], "targets": [], "problems": []}


def test_seed_3_plan_persistence_first_then_each_limit(seed3):
    plan = settings.plan_settings(seed3, devices(450, "max"), persistence_mode=True)

    assert plan["problems"] == []
    assert [(c["index"], c["setting"], c["before"], c["after"]) for c in plan["changes"]] == [
        (0, "persistence_mode", False, True), (1, "persistence_mode", False, True),
        (0, "power_limit_w", 300.0, 450.0), (1, "power_limit_w", 300.0, 450.0),
    ]
    assert plan["targets"] == [
        {"index": 0, "uuid": U0, "power_limit": 450, "power_limit_w": 450.0},
        {"index": 1, "uuid": U1, "power_limit": "max", "power_limit_w": 450.0},
    ]
    assert [settings.nvidia_smi_arguments(change) for change in plan["changes"]] == [
        ["-i", U0, "-pm", "1"], ["-i", U1, "-pm", "1"], ["-i", U0, "-pl", "450"], ["-i", U1, "-pl", "450"]]
    assert [settings.describe_change(change) for change in plan["changes"]][2] == "GPU 0: power limit 300 → 450 W"


def test_within_one_watt_is_the_target_and_persistence_none_is_left_alone(seed3):
    facts = copy.deepcopy(seed3)
    facts["gpus"][0]["power_limit_w"] = 449.2
    plan = settings.plan_settings(facts, devices(450, 300), persistence_mode=None)
    assert plan["changes"] == [] and plan["problems"] == []
    facts["gpus"][0]["power_limit_w"] = 448.9
    assert len(settings.plan_settings(facts, devices(450), persistence_mode=None)["changes"]) == 1


def test_a_missing_gpu_or_a_wrong_uuid_is_a_problem_and_nothing_is_planned_for_it(seed3):
    plan = settings.plan_settings(seed3, [{"index": 2, "power_limit": 450}] + devices(450, uuids=("GPU-other",)),
                                  persistence_mode=True)
    assert plan["problems"] == [
        "GPU 2 is listed but this host has no GPU 2 (GPUs present: 0, 1) — correct the index (nvidia-smi -L)",
        f"GPU 0 (NVIDIA GeForce RTX 4090, {U0}) is not the listed GPU-other — update the uuid of GPU 0 "
        "(nvidia-smi -L lists them)",
    ]
    assert plan["targets"] == []


def test_diff_text_before_and_after(seed3):
    plan = settings.plan_settings(seed3, devices(450), persistence_mode=True)
    before = settings.settings_text(seed3, plan["changes"], after=False)
    after = settings.settings_text(seed3, plan["changes"], after=True)
    assert before.splitlines()[:3] == [f"GPU 0 {U0} (NVIDIA GeForce RTX 4090)", "  persistence_mode: off",
                                       "  power_limit: 300 W"]
    assert after.splitlines()[:3] == [f"GPU 0 {U0} (NVIDIA GeForce RTX 4090)", "  persistence_mode: on",
                                      "  power_limit: 450 W"]
    assert after.splitlines()[5] == "  power_limit: 300 W"  # GPU 1 not listed: left as it is
