"""The test hosts' Debian root filesystem, built once with mmdebstrap.

The rootfs is built from this machine's own apt sources and cached as a
zstd tarball keyed on everything that goes into it (suite, package list,
sources); the extracted tree is kept next to it and serves as the read-only
lower layer of every test host's overlay.

Two suites: bookworm (this machine's own, every host by default) and trixie for the container hosts
(tests/lab/containers.py): Podman quadlets need podman >= 4.4 and Docker's CDI devices docker >= 25,
which bookworm does not have (4.3.1 and 20.10). Its sources are this machine's with the suite renamed.
"""

from __future__ import annotations

import contextlib
import fcntl
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


@contextlib.contextmanager
def cache_lock(name: str):
    """Held while one cached piece (`name`) is checked and built: labs side by side (CI runs two) build
    each piece once, and never read one half-built."""
    base = cache_dir()
    base.mkdir(parents=True, exist_ok=True)
    with open(base / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def apt_sources(suite: str = SUITE) -> str:
    """This machine's apt sources (deb822), for `suite` instead of its own."""
    return APT_SOURCES.read_text().replace(SUITE, suite)


def rootfs_key(suite: str = SUITE) -> str:
    """A short hash of what the rootfs is made of: change any input, get a new build."""
    material = "\n".join([suite, *PACKAGES, apt_sources(suite)])
    return hashlib.sha256(material.encode()).hexdigest()[:16]


def ensure_rootfs(suite: str = SUITE) -> tuple[Path, float, bool]:
    """Return (extracted rootfs dir, seconds spent, whether mmdebstrap ran)."""
    started = time.monotonic()
    base = cache_dir()
    base.mkdir(parents=True, exist_ok=True)
    key = rootfs_key(suite)
    tarball = base / f"rootfs-{suite}-{key}.tar.zst"
    tree = base / f"rootfs-{suite}-{key}"
    built = False
    with cache_lock(f"rootfs-{suite}"):
        if not tarball.exists():
            _build_tarball(tarball, suite)
            built = True
        if not (tree / ".complete").exists():
            _extract(tarball, tree)
    return tree, time.monotonic() - started, built


def mmdebstrap(suite: str, target: Path, *options: str) -> None:
    """mmdebstrap SUITE TARGET from this machine's sources (renamed to the suite); raise with its stderr."""
    sources = target.with_name(target.name + ".sources")
    sources.write_text(apt_sources(suite))
    try:
        result = subprocess.run(["mmdebstrap", "--quiet", *options, suite, str(target), str(sources)],
                                capture_output=True, text=True)
    finally:
        sources.unlink(missing_ok=True)
    if result.returncode != 0:
        raise RuntimeError(f"mmdebstrap failed ({result.returncode}):\n{result.stderr[-4000:]}")


def _build_tarball(tarball: Path, suite: str) -> None:
    partial = tarball.with_name(tarball.name + ".partial.tar.zst")
    partial.unlink(missing_ok=True)
    mmdebstrap(suite, partial, "--variant=minbase", "--include=" + ",".join(PACKAGES))
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
