"""The host's NVIDIA GPUs (role nvidia_gpu): count, model, UUID, power limit, persistence mode, PCIe link, throttling.

The comparisons are provisioner/gpu/checks.py's (one Check each); here each becomes one audit row.
Spec mode checks the GPUs the spec lists; profile mode the GPUs nvidia-smi lists (their model, UUID
and power limit are reported, not compared: a server we did not build states no target).
"""

import shlex

from provisioner.audit.engine import Output
from provisioner.audit.registry import ABSENT, REPORTED, each
from provisioner.gpu import checks as gpu
from provisioner.gpu.facts import GpuFacts, facts_from_data
from provisioner.gpu.smi import SmiError, query_arguments, read_smi_facts


def commands(expected):
    if not (expected.get("gpu") or expected.get("driver")):
        return {}
    # the query alone: the checks need no topology (read_smi_facts leaves the links unknown); its
    # driver_version is the driver row's actual value too
    return {"gpu": shlex.join([gpu_reader(expected), *query_arguments()])}


def read(expected, out):
    """The GPUs (read where they are expected) or why they could not be read."""
    gpus, problem = parse_gpu(out["gpu"], gpu_reader(expected)) if "gpu" in out else (None, None)
    return {"gpu": gpus, "gpu_problem": problem}


def gpu_reader(expected) -> str:
    """The nvidia-smi the GPU and driver rows read with (the nvidia_gpu role's)."""
    return (expected.get("gpu") or expected["driver"])["nvidia_smi"]


def parse_gpu(out: Output, nvidia_smi: str) -> tuple[GpuFacts | None, str | None]:
    """The GPU facts of `nvidia-smi --query-gpu` (the module's own parser), or why there are none."""
    if out.rc != 0:
        lines = out.text.strip().splitlines()
        why = "not on the PATH" if out.rc == 127 else f"exited {out.rc}: {lines[-1] if lines else 'no output'}"
        return None, f"{nvidia_smi} {why}"

    def answer(arguments: list[str]) -> str:
        if arguments != query_arguments():
            raise SmiError("the audit reads no topology")
        return out.text

    try:
        return facts_from_data(read_smi_facts(answer)), None
    except SmiError as error:
        return None, f"{nvidia_smi}: {error}"

host_gpus = each(lambda expected: [expected["gpu"]] if expected.get("gpu") else [], ids=lambda _: "gpus")
devices = each(lambda expected: (expected.get("gpu") or {}).get("devices", []), ids=lambda device: f"gpu{device['index']}")


def record(audit, check: gpu.Check) -> None:
    audit.expect(check.name, check.expected, check.actual, passed=check.passed)


def gpu_of(facts, audit, check: str, expected: str, index: int):
    """The GPU at `index` in the host's facts; fails the check when the facts or the GPU are missing."""
    if facts.gpu is None:
        audit.expect(check, expected, f"(unreadable: {facts.gpu_problem})", passed=False)
    found = facts.gpu.gpu(index)
    if found is None:
        audit.expect(check, expected, ABSENT, passed=False)
    return found


@host_gpus
def gpu_count(case, facts, audit):
    """`GPU count` — the GPUs nvidia-smi lists against `nvidia_gpu_expected_count` (reported where it is null).

    Modes: spec, profile.
    """
    count = case.item["expected_count"]
    expected = REPORTED if count is None else str(count)
    if facts.gpu is None:
        audit.expect("GPU count", expected, f"(unreadable: {facts.gpu_problem})", passed=False)
    actual = len(facts.gpu.gpus)
    audit.expect("GPU count", expected, str(actual), passed=count in (None, actual))


@devices
def gpu_model(case, facts, audit):
    """`GPU N model` — the card's name as nvidia-smi reports it against the spec's `model` (reported where none is set).

    Modes: spec, profile.
    """
    listed_check(case, facts, audit, "model", gpu.model_check)


@devices
def gpu_uuid(case, facts, audit):
    """`GPU N uuid` — the card's UUID against the spec's `uuid` (reported where none is set).

    Modes: spec, profile.
    """
    listed_check(case, facts, audit, "uuid", gpu.uuid_check)


def listed_check(case, facts, audit, field: str, check_of) -> None:
    index = case.item["index"]
    found = gpu_of(facts, audit, f"GPU {index} {field}", case.item.get(field) or REPORTED, index)
    record(audit, check_of(found, case.item))


@devices
def gpu_power_limit(case, facts, audit):
    """`GPU N power limit` — the enforced limit against the target ±1 W (`max`/`default` resolved); profile: reported.

    Modes: spec, profile.
    """
    index = case.item["index"]
    if "power_limit" not in case.item:  # profile mode: no target to compare with
        found = gpu_of(facts, audit, f"GPU {index} power limit", REPORTED, index)
        return record(audit, gpu.power_limit_report(found))
    found = gpu_of(facts, audit, f"GPU {index} power limit", str(case.item["power_limit"]), index)
    record(audit, gpu.power_limit_check(found, case.item))


@devices
def gpu_persistence_mode(case, facts, audit):
    """`GPU N persistence mode` — on or off against `nvidia_gpu_persistence_mode`; n/a where that is null.

    Modes: spec, profile.
    """
    wanted = case.target["gpu"]["persistence_mode"]
    name = f"GPU {case.item['index']} persistence mode"
    if wanted is None:
        return audit.not_applicable(name, "(as it is)", "nvidia_gpu_persistence_mode is null: left as it is")
    record(audit, gpu.persistence_check(gpu_of(facts, audit, name, "on" if wanted else "off", case.item["index"]), wanted))


@devices
def gpu_pcie_link_width(case, facts, audit):
    """`GPU N PCIe link width` — the current link width against the card's maximum (narrower: a downtrained link).

    Modes: spec, profile.
    """
    found = gpu_of(facts, audit, f"GPU {case.item['index']} PCIe link width", "its maximum", case.item["index"])
    record(audit, gpu.pcie_width_check(found))


@devices
def gpu_pcie_link_generation(case, facts, audit):
    """`GPU N PCIe link generation` — the current generation against the maximum (an idle card's slower link passes).

    Modes: spec, profile.
    """
    found = gpu_of(facts, audit, f"GPU {case.item['index']} PCIe link generation", "its maximum", case.item["index"])
    record(audit, gpu.pcie_generation_check(found))


@devices
def gpu_throttle_reasons(case, facts, audit):
    """`GPU N throttle reasons` — the active throttle reasons: any beyond idle and clock settings fails.

    Modes: spec, profile.
    """
    found = gpu_of(facts, audit, f"GPU {case.item['index']} throttle reasons", "none holding it back", case.item["index"])
    record(audit, gpu.throttle_check(found))
