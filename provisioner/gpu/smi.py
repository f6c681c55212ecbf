"""nvidia-smi, for hosts without NVML in Python: its CSV queries and topology matrices read as facts.

`read_smi_facts(run)` asks `nvidia-smi --query-gpu=<QUERY_FIELDS> --format=csv` (and
`topo -m`, `topo -p2p r|w` when there are several GPUs) through `run(arguments) -> stdout`
and returns the same plain data as `provisioner.gpu.nvml.read_nvml_facts`.
`subprocess_runner(executable)` is such a `run` for this machine. The parsing code is the
role's module_utils (nvidia_gpu_facts.py), shared with the Ansible module.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable

from provisioner.base.module_utils import gpu_facts

SmiError = gpu_facts.SmiError
QUERY_FIELDS = gpu_facts.QUERY_FIELDS
query_arguments = gpu_facts.query_arguments
parse_query_csv = gpu_facts.parse_query_csv
parse_topology_matrix = gpu_facts.parse_topology_matrix
read_smi_facts = gpu_facts.read_smi_facts


# `nvidia-smi -q`'s header (and `nvidia-smi --version`'s last line), as an H200 printed it
# (tests/fixtures/gpu/h200-driver/): "CUDA Version                                           : 13.0" —
# the newest CUDA the driver supports, which no --query-gpu field tells
CUDA_VERSION_LINE = re.compile(r"^CUDA Version\s*:\s*([0-9]+\.[0-9]+)\s*$", re.M)
CUDA_ARGUMENTS = ["-q"]


def parse_cuda_version(text: str) -> str | None:
    """The `CUDA Version` of `nvidia-smi -q` ("13.0"); None when it says none."""
    match = CUDA_VERSION_LINE.search(text)
    return match.group(1) if match else None


def read_cuda_version(run: Callable[[list[str]], str]) -> str | None:
    """The newest CUDA the driver supports, through `nvidia-smi -q`; None when it cannot tell."""
    try:
        return parse_cuda_version(run(CUDA_ARGUMENTS))
    except SmiError:
        return None


def fact_commands() -> list[list[str]]:
    """Every nvidia-smi argument list read_smi_facts may run (to run them in one batch, e.g. over SSH)."""
    return [query_arguments(), ["topo", "-m"], ["topo", "-p2p", "r"], ["topo", "-p2p", "w"]]


def subprocess_runner(executable: str = "nvidia-smi") -> Callable[[list[str]], str]:
    """run(arguments) -> stdout of this machine's nvidia-smi; SmiError when it is missing or fails."""
    path = shutil.which(executable)

    def run(arguments: list[str]) -> str:
        if path is None:
            raise SmiError(f"{executable} is not on the PATH")
        done = subprocess.run([path, *arguments], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise SmiError(f"`{executable} {' '.join(arguments)}` exited {done.returncode}: "
                           f"{(done.stderr or done.stdout).strip()}")
        return done.stdout

    return run
