"""`provision facts`: this machine's NVIDIA GPUs, read through NVML (or nvidia-smi).

Runs on the GPU host itself, with only typer, rich and nvidia-ml-py: no spec, no
pydantic on this path (`python3 -m provisioner.cli.facts_cmd` works from a checkout).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

from typing import TYPE_CHECKING

import typer

from provisioner.cli.common import PROBLEMS_FOUND

if TYPE_CHECKING:
    from rich.console import Console

    from provisioner.gpu.facts import Gpu, GpuFacts

NO_DRIVER_FIX = "install the NVIDIA driver and load it (`nvidia-smi -L` lists the GPUs once it is)"
RECORDING_FIX = "give an nvml.json as the repository's tests/fixtures/gpu/record_nvml.py records one"

# (row title, how to show it) for the table of GPUs
ROWS: list[tuple[str, Callable[[Gpu], object]]] = [
    ("model", lambda gpu: gpu.name),
    ("UUID", lambda gpu: gpu.uuid),
    ("PCI bus", lambda gpu: gpu.pci_bus_id),
    ("memory used / total", lambda gpu: f"{_value(gpu.memory_used_mib)} / {_value(gpu.memory_total_mib)} MiB"),
    ("power limit", lambda gpu: _watts(gpu.power_limit_w)),
    ("  default, min – max", lambda gpu: f"{_watts(gpu.power_default_w)}, "
                                         f"{_watts(gpu.power_min_w)} – {_watts(gpu.power_max_w)}"),
    ("  enforced", lambda gpu: _watts(gpu.power_enforced_w)),
    ("power draw", lambda gpu: _watts(gpu.power_draw_w)),
    ("persistence mode", lambda gpu: _on_off(gpu.persistence_mode)),
    ("PCIe link (now / max)", lambda gpu: f"gen {_value(gpu.pcie_gen_current)} x{_value(gpu.pcie_width_current)} / "
                                          f"gen {_value(gpu.pcie_gen_max)} x{_value(gpu.pcie_width_max)}"),
    ("SM clock (max)", lambda gpu: f"{_value(gpu.clock_sm_mhz)} ({_value(gpu.clock_sm_max_mhz)}) MHz"),
    ("memory clock (max)", lambda gpu: f"{_value(gpu.clock_memory_mhz)} ({_value(gpu.clock_memory_max_mhz)}) MHz"),
    ("performance state", lambda gpu: gpu.performance_state),
    ("throttle reasons", lambda gpu: "—" if gpu.throttle_reasons is None else ", ".join(gpu.throttle_reasons) or "none"),
    ("temperature", lambda gpu: f"{_value(gpu.temperature_c)} °C"),
]


app = typer.Typer()


@app.command()
def facts(
    json_output: Annotated[bool, typer.Option("--json", help="Print the facts as JSON.")] = False,
    recording: Annotated[Path | None, typer.Option(
        "--from-recording", help="Read a recording of NVML's answers (an nvml.json, as docs/gpus.md shows) instead of this machine.")] = None,
    nvidia_smi: Annotated[str, typer.Option(help="nvidia-smi to read with when NVML is not usable.")] = "nvidia-smi",
) -> None:
    """Show this machine's NVIDIA GPUs: power limits, persistence mode, PCIe links, clocks, throttle reasons, P2P."""
    from provisioner.cli.console import make_console
    from provisioner.gpu.facts import read_facts
    from provisioner.gpu.nvml import NvmlCallError, NvmlUnavailable
    from provisioner.gpu.smi import SmiError

    bad_recording = (ValueError, LookupError, TypeError, AttributeError, NvmlCallError)  # what one that is not raises
    try:
        gpu_facts = read_facts(recording=recording, nvidia_smi=nvidia_smi)
    except (NvmlUnavailable, SmiError) as error:
        fail(f"cannot read the GPUs: {error}", NO_DRIVER_FIX, json_output)
    except OSError as error:
        if recording is None:
            raise
        fail(f"{recording}: cannot read it ({error.strerror or error})", RECORDING_FIX, json_output)
    except bad_recording as error:
        if recording is None:
            raise
        fail(f"{recording}: not a recording of NVML's answers ({type(error).__name__}: {error})", RECORDING_FIX,
             json_output)
    if json_output:
        typer.echo(json.dumps(facts_data(gpu_facts), indent=2))
    else:
        show(gpu_facts, make_console())


def driver_branch(gpu_facts: GpuFacts) -> int | None:
    from provisioner.vllm.cuda_drivers import branch_of

    return branch_of(gpu_facts.driver_version) if gpu_facts.driver_version else None


def facts_data(gpu_facts: GpuFacts) -> dict:
    """The facts as JSON data, with the driver's branch and what it says to each supported vLLM build."""
    from provisioner.vllm.builds import verdicts

    branch = driver_branch(gpu_facts)
    return {**gpu_facts.as_data(), "driver_branch": branch,
            "vllm_builds": [verdict.as_data() for verdict in verdicts(branch)]}


def build_lines(gpu_facts: GpuFacts) -> list[str]:
    """One line per supported vLLM build: the driver it needs and whether this one runs it."""
    from provisioner.vllm.builds import verdicts

    lines = []
    for verdict in verdicts(driver_branch(gpu_facts)):
        build = verdict.build
        label = f"vLLM {build.version} (CUDA {build.cuda}{'' if build.verified else ', not verified'})"
        needs = "needs ?" if verdict.minimum is None else f"needs ≥ {verdict.minimum}"
        outcome = {"ok": "ok", "risky": f"ok, but {verdict.why}", "too old": f"too old: {verdict.why}",
                   "unknown": "unknown"}[verdict.status]
        lines.append(f"{label}: {needs} — {outcome}")
    return lines


def fail(error: str, fix: str, json_output: bool) -> None:
    """Exit 1 saying why and what to do: with --json as {"error", "fix"} on stdout (nothing else), else on stderr."""
    if json_output:
        typer.echo(json.dumps({"error": error, "fix": fix}, indent=2))
    else:
        typer.echo(f"{error} — {fix}", err=True)
    raise typer.Exit(PROBLEMS_FOUND)


def show(gpu_facts: GpuFacts, console: Console) -> None:
    from rich.table import Table

    from provisioner.gpu.topology import describe_link

    how = {"nvml": "NVML", "nvidia-smi": "nvidia-smi"}.get(gpu_facts.source, gpu_facts.source)
    console.print(
        f"NVIDIA driver {gpu_facts.driver_version or '?'}, CUDA {gpu_facts.cuda_version or '?'} — "
        f"{len(gpu_facts.gpus)} GPU{'s' if len(gpu_facts.gpus) != 1 else ''} (read through {how})"
    )
    for line in build_lines(gpu_facts):
        console.print(line, markup=False, highlight=False)
    if not gpu_facts.gpus:
        return
    table = Table(show_header=True, header_style="bold")
    table.add_column("")
    for gpu in gpu_facts.gpus:
        table.add_column(f"GPU {gpu.index}", overflow="fold")
    for title, shown in ROWS:
        table.add_row(title, *(str(shown(gpu) or "—") for gpu in gpu_facts.gpus))
    console.print(table)
    if gpu_facts.links:
        links = Table("GPUs", "P2P", "how", show_header=True, header_style="bold")
        for link in gpu_facts.links:
            p2p = {True: "yes", False: "no", None: "unknown"}[link.p2p]
            links.add_row(f"{link.gpus[0]} ↔ {link.gpus[1]}", p2p, describe_link(link))
        console.print(links)


def _value(value: object) -> str:
    return "?" if value is None else str(value)


def _watts(value: float | None) -> str:
    return "?" if value is None else f"{value:g} W"


def _on_off(value: bool | None) -> str:
    return "?" if value is None else ("on" if value else "off")


if __name__ == "__main__":
    typer.run(facts)
