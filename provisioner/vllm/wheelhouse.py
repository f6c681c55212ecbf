"""A wheelhouse: every wheel a pinned vLLM needs, downloaded once on the bastion for hosts without
(fast) internet. The role vllm_install copies it to each host and installs from it alone (--no-index).

Wheels are downloaded for the hosts' Python (`python_version`, e.g. "3.11" on Debian 12) and for
glibc-based x86_64 Linux (every manylinux tag up to glibc 2.35), binary only: pip on a host without
an index cannot build a source distribution.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

# every glibc a Debian 12 / Ubuntu 22.04 host satisfies (2.5 … 2.35), and the legacy names of 2.5/2.12/2.17
MANYLINUX_TAGS = ("manylinux1_x86_64", "manylinux2010_x86_64", "manylinux2014_x86_64",
                  *(f"manylinux_2_{minor}_x86_64" for minor in range(5, 36)))


@dataclass(frozen=True)
class Wheelhouse:
    folder: Path
    wheels: tuple[Path, ...]

    @property
    def size_bytes(self) -> int:
        return sum(wheel.stat().st_size for wheel in self.wheels)


def download_command(version: str, folder: Path, python_version: str, extra: tuple[str, ...] = ()) -> list[str]:
    """The `pip download` that fills `folder` with vllm==version and its dependencies for that Python."""
    abi = "cp" + python_version.replace(".", "")
    platforms = [argument for tag in MANYLINUX_TAGS for argument in ("--platform", tag)]
    return [
        sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-input",
        "--only-binary=:all:", "--python-version", python_version, "--implementation", "cp",
        "--abi", abi, "--abi", "abi3", "--abi", "none", *platforms,
        "--dest", str(folder), f"vllm=={version}", *extra,
    ]


def build_wheelhouse(version: str, folder: Path, python_version: str, extra: tuple[str, ...] = ()) -> Wheelhouse:
    """Download into `folder` (kept: a second run downloads only what is missing); raise
    RuntimeError with pip's last lines when pip fails."""
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(download_command(version, folder, python_version, extra), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise RuntimeError(f"pip download exited {done.returncode}:\n{tail}")
    return Wheelhouse(folder, tuple(sorted(folder.glob("*.whl"))))
