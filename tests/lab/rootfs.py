"""The test hosts' Debian bookworm root filesystem, built once with mmdebstrap.

The rootfs is built from this machine's own apt sources and cached as a
zstd tarball keyed on everything that goes into it (suite, package list,
sources); the extracted tree is kept next to it and serves as the read-only
lower layer of every test host's overlay.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

SUITE = "bookworm"
PACKAGES = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "python3",
    "python3-venv",  # what a GPU server has, or the role vllm_install installs from the host's apt sources
    "sudo",
    "iproute2",
    "kmod",
    "procps",
)
APT_SOURCES = Path("/etc/apt/sources.list.d/debian.sources")


def cache_dir() -> Path:
    """Where rootfs tarballs live: $VP_LAB_CACHE, else ~/.cache/vllm-provision/lab."""
    default = Path.home() / ".cache" / "vllm-provision" / "lab"
    return Path(os.environ.get("VP_LAB_CACHE", default))


def rootfs_key() -> str:
    """A short hash of what the rootfs is made of: change any input, get a new build."""
    material = "\n".join([SUITE, *PACKAGES, APT_SOURCES.read_text()])
    return hashlib.sha256(material.encode()).hexdigest()[:16]


def ensure_rootfs() -> tuple[Path, float, bool]:
    """Return (extracted rootfs dir, seconds spent, whether mmdebstrap ran)."""
    started = time.monotonic()
    base = cache_dir()
    base.mkdir(parents=True, exist_ok=True)
    key = rootfs_key()
    tarball = base / f"rootfs-{SUITE}-{key}.tar.zst"
    tree = base / f"rootfs-{SUITE}-{key}"
    built = False
    if not tarball.exists():
        _build_tarball(tarball)
        built = True
    if not (tree / ".complete").exists():
        _extract(tarball, tree)
    return tree, time.monotonic() - started, built


def _build_tarball(tarball: Path) -> None:
    partial = tarball.with_name(tarball.name + ".partial.tar.zst")
    partial.unlink(missing_ok=True)
    command = [
        "mmdebstrap",
        "--quiet",
        "--variant=minbase",
        "--include=" + ",".join(PACKAGES),
        SUITE,
        str(partial),
        str(APT_SOURCES),
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"mmdebstrap failed ({result.returncode}):\n{result.stderr[-4000:]}")
    partial.rename(tarball)


def _extract(tarball: Path, tree: Path) -> None:
    if tree.exists():
        shutil.rmtree(tree)
    tree.mkdir(parents=True)
    subprocess.run(
        ["tar", "--zstd", "-x", "-p", "--numeric-owner", "-f", str(tarball), "-C", str(tree)],
        check=True,
    )
    (tree / ".complete").write_text("ok\n")
