"""The audit's GPU checks: a host's GPU facts against the nvidia_gpu_* variables it should have.

Plain functions, for the audit's checks to call: `gpu_checks(facts, expected, loaded_modules)`
returns one `Check(name, expected, actual, passed)` per check, in this order —

- GPU count (nvidia_gpu_expected_count);
- per listed device: model and UUID as listed; its power limit equal to its target (±1 W;
  'max'/'default' resolved on the card, with the same code the module sets them with);
- per GPU present: persistence mode as nvidia_gpu_persistence_mode; PCIe link at its maximum
  width and generation (a downtrained link fails; a lower generation on an idle GPU passes,
  as cards slow their link down at idle to save power); its active throttle reasons
  (anything beyond idle and clock settings fails: power cap, thermal, power brake, ...);
- nouveau not loaded, when nouveau_blacklist_enabled and the loaded modules are known.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from provisioner.base.module_utils import gpu_settings
from provisioner.gpu.facts import Gpu, GpuFacts
from provisioner.vllm.cuda_drivers import branch_of

# Active reasons that do not hold a working GPU back.
HARMLESS_THROTTLE_REASONS = frozenset({"gpu_idle", "applications_clocks_setting", "display_clock_setting"})
ABSENT = "(absent)"
REPORTED = "(reported)"  # the expected value of a value shown, not compared
UNKNOWN = "(not reported)"


class Check(NamedTuple):
    name: str
    expected: str
    actual: str
    passed: bool


def gpu_checks(
    facts: GpuFacts, expected: Mapping[str, Any], loaded_modules: Iterable[str] | None = None
) -> list[Check]:
    """Every GPU check of one host. `expected`: its nvidia_gpu_* (and nouveau_blacklist_enabled) variables."""
    checks = []
    count = expected.get("nvidia_gpu_expected_count")
    if count is not None:
        checks.append(Check("GPU count", str(count), str(len(facts.gpus)), len(facts.gpus) == count))
    for device in expected.get("nvidia_gpu_devices") or []:
        checks += device_checks(facts.gpu(device["index"]), device)
    persistence = expected.get("nvidia_gpu_persistence_mode")
    for gpu in facts.gpus:
        if persistence is not None:
            checks.append(persistence_check(gpu, persistence))
        checks += [pcie_width_check(gpu), pcie_generation_check(gpu), throttle_check(gpu)]
    if loaded_modules is not None and expected.get("nouveau_blacklist_enabled", True):
        loaded = "nouveau" in set(loaded_modules)
        checks.append(Check("nouveau not loaded", "not loaded", "loaded" if loaded else "not loaded", not loaded))
    return checks


def device_checks(gpu: Gpu | None, device: Mapping[str, Any]) -> list[Check]:
    """A listed device: model, UUID, power limit; each fails with actual '(absent)' when the GPU is not there."""
    return [model_check(gpu, device), uuid_check(gpu, device), power_limit_check(gpu, device)]


def model_check(gpu: Gpu | None, device: Mapping[str, Any]) -> Check:
    return _listed_check(gpu, device, "model", "name")


def uuid_check(gpu: Gpu | None, device: Mapping[str, Any]) -> Check:
    return _listed_check(gpu, device, "uuid", "uuid")


def _listed_check(gpu: Gpu | None, device: Mapping[str, Any], field: str, fact: str) -> Check:
    """The device's listed `field` against the GPU's `fact`; reported (not compared) when the device lists none."""
    actual = ABSENT if gpu is None else str(getattr(gpu, fact))
    if not device.get(field):
        return Check(f"GPU {device['index']} {field}", REPORTED, actual, gpu is not None)
    return Check(f"GPU {device['index']} {field}", device[field], actual, actual == device[field])


def power_limit_check(gpu: Gpu | None, device: Mapping[str, Any]) -> Check:
    target = device.get("power_limit", "default")  # the role's default
    if gpu is None:
        return Check(f"GPU {device['index']} power limit", str(target), ABSENT, False)
    return power_check(gpu, target)


def power_limit_report(gpu: Gpu) -> Check:
    """The power limit and the card's range, for a GPU with no target (passes: nothing to compare with)."""
    actual = f"{_watts(gpu.power_limit_w)} (card: {_watts(gpu.power_min_w)} to {_watts(gpu.power_max_w)}, " \
             f"default {_watts(gpu.power_default_w)})"
    return Check(f"GPU {gpu.index} power limit", REPORTED, actual, True)


def power_check(gpu: Gpu, target: Any) -> Check:
    name = f"GPU {gpu.index} power limit"
    watts, problem = gpu_settings.resolve_power_target(target, dataclasses.asdict(gpu))
    actual = _watts(gpu.power_limit_w)
    if problem:
        return Check(name, str(target), f"{actual} ({problem})", False)
    expected = f"{_watts(watts)} ±{gpu_settings.POWER_TOLERANCE_W:g} W"
    if target in gpu_settings.POWER_WORDS:
        expected = f"{target} = {expected}"
    return Check(name, expected, actual, gpu_settings.power_limit_matches(gpu.power_limit_w, watts))


def persistence_check(gpu: Gpu, wanted: bool) -> Check:
    actual = UNKNOWN if gpu.persistence_mode is None else _on_off(gpu.persistence_mode)
    return Check(f"GPU {gpu.index} persistence mode", _on_off(wanted), actual, gpu.persistence_mode == wanted)


def pcie_width_check(gpu: Gpu) -> Check:
    """x16 of x16 passes; x8 on a x16 link is a downtrained link (riser, slot, dirt)."""
    name = f"GPU {gpu.index} PCIe link width"
    if gpu.pcie_width_current is None or gpu.pcie_width_max is None:
        return Check(name, "its maximum", UNKNOWN, True)
    passed = gpu.pcie_width_current >= gpu.pcie_width_max
    actual = f"x{gpu.pcie_width_current}" + ("" if passed else f" (downtrained from x{gpu.pcie_width_max})")
    return Check(name, f"x{gpu.pcie_width_max}", actual, passed)


def pcie_generation_check(gpu: Gpu) -> Check:
    name = f"GPU {gpu.index} PCIe link generation"
    if gpu.pcie_gen_current is None or gpu.pcie_gen_max is None:
        return Check(name, "its maximum", UNKNOWN, True)
    expected = f"gen {gpu.pcie_gen_max}"
    if gpu.pcie_gen_current >= gpu.pcie_gen_max:
        return Check(name, expected, f"gen {gpu.pcie_gen_current}", True)
    if gpu.idle:
        return Check(name, expected, f"gen {gpu.pcie_gen_current} (idle: the link slows down to save power; "
                                     "check again under load)", True)
    return Check(name, expected, f"gen {gpu.pcie_gen_current} under load (downtrained)", False)


def throttle_check(gpu: Gpu) -> Check:
    name = f"GPU {gpu.index} throttle reasons"
    expected = "none beyond " + ", ".join(sorted(HARMLESS_THROTTLE_REASONS))
    if gpu.throttle_reasons is None:
        return Check(name, expected, UNKNOWN, True)
    holding_back = [reason for reason in gpu.throttle_reasons if reason not in HARMLESS_THROTTLE_REASONS]
    actual = ", ".join(gpu.throttle_reasons) or "none"
    if "sw_power_cap" in holding_back and gpu.power_limit_w is not None:
        actual += f" (power limit {_watts(gpu.power_limit_w)})"
    return Check(name, expected, actual, not holding_back)


def _watts(value: float | None) -> str:
    return UNKNOWN if value is None else f"{gpu_settings.watts_text(value)} W"


def _on_off(value: bool) -> str:
    return "on" if value else "off"


def driver_check(name: str, driver_version: str | None, minimum_branch: int) -> Check:
    """`driver ≥ what vLLM <version> (CUDA <x>) needs`: the driver's branch (nvidia-smi's driver_version)
    against the branch the host's vLLM build needs (provisioner/vllm/cuda_drivers.py)."""
    branch = branch_of(driver_version) if driver_version else None
    return Check(name, f"≥ {minimum_branch}", driver_version or UNKNOWN,
                 branch is not None and branch >= minimum_branch)
