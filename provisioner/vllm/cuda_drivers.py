"""Which NVIDIA driver a CUDA build needs: the one table, by CUDA major version, with its sources.

A vLLM wheel is built for one CUDA version (its catalog's `builds`, provisioner/vllm/builds.py). Since
CUDA 11 an application built with any toolkit of a major release runs on every driver from that
family's minimum up (minor-version compatibility), and on every newer driver (backward compatibility).
Below the minimum the CUDA runtime refuses ("The NVIDIA driver on your system is too old").

Drivers are compared by branch, the number before the first dot (580.159.04 → 580): the minimums are
branch floors. Standard library only: `provision facts` runs this on the GPU host.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MINOR_VERSION_COMPATIBILITY = ("NVIDIA, CUDA Compatibility, Minor Version Compatibility, Table 1 (CUDA Toolkit 11.x, "
                               "12.x and 13.x driver version ranges): "
                               "https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html")
PTX_JIT = ("vllm-project/vllm#31700 (\"the provided PTX was compiled with an unsupported toolchain\" on a CUDA 12.9 "
           "build and an older driver), vllm-project/vllm#28305 (vLLM's troubleshooting guide for it); CUDA 12.9's "
           "own driver is branch 575")


@dataclass(frozen=True)
class DriverRule:
    """What a build of CUDA `major`.x asks of the driver."""

    major: int
    minimum_branch: int  # below: the CUDA runtime refuses to start
    sources: tuple[str, ...]
    advised_branch: int | None = None  # below (and at least the minimum): runs, with a known risk
    risk: str = ""  # what can go wrong between the minimum and the advised branch (under minor-version compatibility)

    @property
    def minimum(self) -> str:
        return str(self.minimum_branch)


RULES = {
    13: DriverRule(13, 580, (MINOR_VERSION_COMPATIBILITY,)),
    12: DriverRule(
        12, 525, (MINOR_VERSION_COMPATIBILITY, PTX_JIT), advised_branch=575,
        risk="kernels JIT-compiled from PTX can fail (\"the provided PTX was compiled with an unsupported "
             "toolchain\", vllm#31700)"),
}

VERSION_RE = re.compile(r"^(\d+)\.\d+(\.\d+)?$")


def rule_for(cuda: str) -> DriverRule | None:
    """The rule for a CUDA version such as "13.0"; None for a major the table has no row for."""
    major = cuda.split(".", 1)[0]
    return RULES.get(int(major)) if major.isdigit() else None


def branch_of(driver: str) -> int | None:
    """580.159.04 → 580; a branch alone ("580") → 580; None when `driver` is neither."""
    driver = driver.strip()
    if driver.isdigit():
        return int(driver)
    match = VERSION_RE.match(driver)
    return int(match.group(1)) if match else None


def is_driver_version(text: str) -> bool:
    """A driver version as nvidia-smi and the module print it: 580.159.04, 550.120."""
    return VERSION_RE.match(text.strip()) is not None
