"""The gate before any host is touched: what `plan` reports and `apply_spec` refuses to run with.

Today that is memory: an instance that would not fit its GPU (vLLM checks memory when it starts and
refuses). Only the chosen hosts are planned, and only their memory: no files are rendered.
"""

from __future__ import annotations

from collections.abc import Iterable

from provisioner.memory_plan import GpuMemory, host_memory
from provisioner.spec import Host, Spec


class PreflightError(ValueError):
    """The chosen hosts would not run what the spec asks: `problems`, one line each."""

    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems))
        self.problems = problems


def memory_problems(host_name: str, memory: list[GpuMemory]) -> list[str]:
    """'HOST GPU 0: problem' for each problem of the host's memory plan."""
    return [f"{host_name} {gpu.label}: {problem}" for gpu in memory for problem in gpu.problems]


def preflight_problems(spec: Spec, hosts: Iterable[Host]) -> list[str]:
    """What would keep an instance on `hosts` (of `spec`) from starting, one line each; none: []."""
    return [problem for host in hosts
            for problem in memory_problems(host.name, host_memory(host, spec.instances_on(host.name)))]


def check_preflight(spec: Spec, hosts: Iterable[Host]) -> None:
    """Raise PreflightError when `preflight_problems` finds any."""
    problems = preflight_problems(spec, hosts)
    if problems:
        raise PreflightError(problems)
