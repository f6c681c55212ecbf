"""A host's GPU facts, typed: built from the plain data that NVML or nvidia-smi readings give.

`read_facts()` reads this machine (NVML, else nvidia-smi); `read_facts(recording=path)`
replays a recorded nvml.json; `facts_from_data(data)` types the data the Ansible module
`nvidia_gpu` returns (its `facts`), so the audit can use facts read on a target.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provisioner.gpu.nvml import LiveNvml, NvmlUnavailable, ReplayNvml, read_nvml_facts
from provisioner.gpu.smi import SmiError, read_cuda_version, read_smi_facts, subprocess_runner


@dataclass(frozen=True)
class Gpu:
    """One GPU. Values the driver does not report are None; watts, MiB, MHz, °C."""

    index: int
    uuid: str | None
    name: str | None
    pci_bus_id: str | None
    memory_total_mib: int | None
    memory_used_mib: int | None
    power_limit_w: float | None
    power_default_w: float | None
    power_min_w: float | None
    power_max_w: float | None
    power_enforced_w: float | None
    power_draw_w: float | None
    persistence_mode: bool | None
    pcie_gen_current: int | None
    pcie_gen_max: int | None
    pcie_width_current: int | None
    pcie_width_max: int | None
    clock_sm_mhz: int | None
    clock_memory_mhz: int | None
    clock_sm_max_mhz: int | None
    clock_memory_max_mhz: int | None
    performance_state: str | None
    throttle_reasons: tuple[str, ...] | None  # active clocks event reasons
    temperature_c: int | None

    @property
    def idle(self) -> bool:
        """NVML says nothing runs on it (clocks dropping to idle)."""
        return bool(self.throttle_reasons) and "gpu_idle" in self.throttle_reasons


@dataclass(frozen=True)
class GpuLink:
    """How two GPUs reach each other."""

    gpus: tuple[int, int]
    pcie_path: str | None  # PIX, PXB, PHB, NODE, SYS (nvidia-smi topo -m's names), INTERNAL
    nvlink: bool | None
    p2p_read: str | None  # ok, chipset_not_supported, gpu_not_supported, topology_not_supported, ...
    p2p_write: str | None

    @property
    def p2p(self) -> bool | None:
        """Whether each GPU can read and write the other's memory directly; None when unknown."""
        statuses = (self.p2p_read, self.p2p_write)
        if None in statuses:
            return True if self.nvlink else None
        return all(status == "ok" for status in statuses)


@dataclass(frozen=True)
class GpuFacts:
    """A host's GPUs and the links between them."""

    source: str  # nvml | nvidia-smi
    driver_version: str | None
    cuda_version: str | None
    gpus: tuple[Gpu, ...]
    links: tuple[GpuLink, ...]

    def gpu(self, index: int) -> Gpu | None:
        return next((gpu for gpu in self.gpus if gpu.index == index), None)

    def link(self, first: int, second: int) -> GpuLink | None:
        wanted = tuple(sorted((first, second)))
        return next((link for link in self.links if tuple(sorted(link.gpus)) == wanted), None)

    def as_data(self) -> dict[str, Any]:
        """The plain data again (as the module returns it), for JSON."""
        return dataclasses.asdict(self)


def facts_from_data(data: dict[str, Any]) -> GpuFacts:
    gpu_fields = {field.name for field in dataclasses.fields(Gpu)}
    return GpuFacts(
        source=data["source"],
        driver_version=data.get("driver_version"),
        cuda_version=data.get("cuda_version"),
        gpus=tuple(_gpu(gpu, gpu_fields) for gpu in data["gpus"]),
        links=tuple(
            GpuLink(gpus=tuple(link["gpus"]), pcie_path=link.get("pcie_path"), nvlink=link.get("nvlink"),
                    p2p_read=link.get("p2p_read"), p2p_write=link.get("p2p_write"))
            for link in data.get("links", [])
        ),
    )


def _gpu(data: dict[str, Any], fields: set[str]) -> Gpu:
    values = {name: data.get(name) for name in fields}
    if values["throttle_reasons"] is not None:
        values["throttle_reasons"] = tuple(values["throttle_reasons"])
    return Gpu(**values)


def smi_facts(run) -> dict[str, Any]:
    """The facts' data through nvidia-smi (`run(arguments) -> stdout`): its queries, and the CUDA version
    from `nvidia-smi -q`, which the queries do not tell."""
    data = read_smi_facts(run)
    return {**data, "cuda_version": data["cuda_version"] or read_cuda_version(run)}


def read_facts(recording: str | Path | None = None, nvidia_smi: str = "nvidia-smi") -> GpuFacts:
    """This machine's GPUs through NVML, else through nvidia-smi; or the answers of a recorded nvml.json.

    Raises NvmlUnavailable / SmiError (provisioner.gpu.smi) when neither can be read.
    """
    if recording is not None:
        return facts_from_data(read_nvml_facts(ReplayNvml.from_file(recording)))
    try:
        nvml = LiveNvml()
    except NvmlUnavailable as nvml_problem:
        try:
            return facts_from_data(smi_facts(subprocess_runner(nvidia_smi)))
        except SmiError as error:
            raise SmiError(f"{error}, and {nvml_problem}") from None
    try:
        return facts_from_data(read_nvml_facts(nvml))
    finally:
        nvml.close()
