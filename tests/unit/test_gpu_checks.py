"""The audit's GPU checks on real (H200) and constructed (seed 3) facts."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from provisioner.base.paths import EXAMPLES_DIR
from provisioner.fleet.inventory import host_vars
from provisioner.gpu.checks import Check, gpu_checks
from provisioner.gpu.facts import GpuFacts, read_facts
from provisioner.spec import load_spec

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gpu"


def seed3_expected() -> dict:
    spec = load_spec(EXAMPLES_DIR / "seed3-2x4090.yml")
    return host_vars(spec.hosts[0], spec.instances)  # what the roles get: the audit expects the same


def seed3_facts() -> GpuFacts:
    return read_facts(recording=FIXTURES / "rtx4090x2" / "nvml.json")


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {check.name: check for check in checks}


def with_gpu(facts: GpuFacts, index: int, **changes) -> GpuFacts:
    gpus = tuple(dataclasses.replace(gpu, **changes) if gpu.index == index else gpu for gpu in facts.gpus)
    return dataclasses.replace(facts, gpus=gpus)


def test_the_real_h200_passes_every_check():
    """The H200 run (tests/fixtures/gpu/h200-real-runs): its facts against what it should have."""
    run = json.loads((FIXTURES / "h200-real-runs" / "audit-checks.json").read_text())
    facts = read_facts(recording=FIXTURES / "h200x1" / "nvml.json")
    checks = gpu_checks(facts, run["expected"], loaded_modules=["nvidia", "nvidia_uvm"])
    assert [check for check in checks if not check.passed] == []
    assert [check.name for check in checks] == [
        "GPU count", "GPU 0 model", "GPU 0 uuid", "GPU 0 power limit", "GPU 0 persistence mode",
        "GPU 0 PCIe link width", "GPU 0 PCIe link generation", "GPU 0 throttle reasons", "nouveau not loaded"]
    assert by_name(checks)["GPU 0 power limit"] == Check("GPU 0 power limit", "default = 700 W ±1 W", "700 W", True)


def test_seed_3_before_the_fix_the_cap_and_persistence_fail():
    checks = by_name(gpu_checks(seed3_facts(), seed3_expected()))

    assert checks["GPU 1 power limit"] == Check("GPU 1 power limit", "450 W ±1 W", "300 W", False)
    assert checks["GPU 0 persistence mode"] == Check("GPU 0 persistence mode", "on", "off", False)
    assert checks["GPU count"].passed and checks["GPU 1 model"].passed and checks["GPU 1 uuid"].passed
    # idle consumer cards drop to PCIe gen 1: reported, not failed
    generation = checks["GPU 0 PCIe link generation"]
    assert generation.passed and generation.actual.startswith("gen 1 (idle:") and generation.expected == "gen 4"
    assert checks["GPU 0 PCIe link width"] == Check("GPU 0 PCIe link width", "x16", "x16", True)


def test_seed_3_after_the_fix_passes():
    fixed = seed3_facts()
    for index in (0, 1):
        fixed = with_gpu(fixed, index, power_limit_w=450.0, persistence_mode=True)
    assert [check for check in gpu_checks(fixed, seed3_expected()) if not check.passed] == []


def test_a_downtrained_link_fails():
    facts = with_gpu(seed3_facts(), 1, pcie_width_current=8)
    facts = with_gpu(facts, 0, pcie_gen_current=3, throttle_reasons=())
    checks = by_name(gpu_checks(facts, seed3_expected()))
    assert checks["GPU 1 PCIe link width"] == Check("GPU 1 PCIe link width", "x16", "x8 (downtrained from x16)", False)
    assert checks["GPU 0 PCIe link generation"] == Check(
        "GPU 0 PCIe link generation", "gen 4", "gen 3 under load (downtrained)", False)


def test_throttle_reasons_beyond_idle_fail_and_name_the_power_limit():
    facts = with_gpu(seed3_facts(), 0, throttle_reasons=("sw_power_cap", "hw_thermal_slowdown"))
    check = by_name(gpu_checks(facts, seed3_expected()))["GPU 0 throttle reasons"]
    assert (check.actual, check.passed) == ("sw_power_cap, hw_thermal_slowdown (power limit 300 W)", False)


def test_missing_gpus_wrong_models_and_nouveau():
    facts = dataclasses.replace(seed3_facts(), gpus=seed3_facts().gpus[:1])
    facts = with_gpu(facts, 0, name="NVIDIA GeForce RTX 3090")
    checks = by_name(gpu_checks(facts, seed3_expected(), loaded_modules=["nouveau", "drm"]))
    assert checks["GPU count"] == Check("GPU count", "2", "1", False)
    assert checks["GPU 0 model"] == Check("GPU 0 model", "NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 3090", False)
    assert checks["GPU 1 power limit"] == Check("GPU 1 power limit", "450", "(absent)", False)
    assert checks["nouveau not loaded"] == Check("nouveau not loaded", "not loaded", "loaded", False)
    assert "nouveau not loaded" not in by_name(gpu_checks(facts, seed3_expected()))  # modules unknown: not checked


def test_a_target_the_card_cannot_take_fails_with_the_reason():
    expected = seed3_expected()
    expected["nvidia_gpu_devices"][0]["power_limit"] = 600
    check = by_name(gpu_checks(seed3_facts(), expected))["GPU 0 power limit"]
    assert not check.passed and "outside the card's range 150–450 W" in check.actual
