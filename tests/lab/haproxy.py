"""What the gateway hosts of the lab need: Debian's haproxy and the packages it needs beyond the lab's
rootfs, downloaded once on this machine (`apt-get download`, its own bookworm sources) and cached as a
flat apt repository, which `AptRepo` (tests/lab/containers.py) serves on the lab's bridge: the role
gateway installs haproxy with apt-get from the host's sources, as on a server with a local mirror."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

from tests.lab.containers import AptRepo, package_stanza
from tests.lab.hosts import HostKind, TestHost
from tests.lab.rootfs import PACKAGES, SUITE, cache_dir, cache_lock, ensure_rootfs

GATEWAY_PACKAGES = ("haproxy",)  # what role gateway installs


def haproxy_repo() -> Path:
    """The cached flat repository (debs + Packages) of haproxy and what it needs beyond the rootfs."""
    key = hashlib.sha256("\n".join([SUITE, *PACKAGES, *GATEWAY_PACKAGES]).encode()).hexdigest()[:16]
    repo = cache_dir() / f"haproxy-repo-{SUITE}-{key}"
    with cache_lock(repo.name):
        if not (repo / "Packages").exists():
            _build_repo(repo)
    return repo


def _needed() -> list[str]:
    """The packages haproxy depends on (recursively, no recommends), less those the rootfs has."""
    depends = subprocess.run(
        ["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests", "--no-conflicts", "--no-breaks",
         "--no-replaces", "--no-enhances", "--no-pre-depends", *GATEWAY_PACKAGES],
        capture_output=True, text=True, check=True).stdout
    wanted = {line.strip() for line in depends.splitlines() if line and not line.startswith((" ", "<"))}
    rootfs = ensure_rootfs()[0]
    installed = subprocess.run(["dpkg-query", f"--admindir={rootfs / 'var/lib/dpkg'}", "-W", "-f", "${Package}\n"],
                               capture_output=True, text=True, check=True).stdout.split()
    return sorted(wanted - set(installed))


def _build_repo(repo: Path) -> None:
    partial = repo.with_name(repo.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    result = subprocess.run(["apt-get", "download", *_needed()], cwd=partial, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"apt-get download failed: {result.stderr.strip()[-2000:]}")
    (partial / "Packages").write_text("\n".join(package_stanza(deb) for deb in sorted(partial.glob("*.deb"))))
    shutil.rmtree(repo, ignore_errors=True)
    partial.rename(repo)


class GatewayHost(HostKind):
    """A default (bookworm) test host whose apt sources are the lab's haproxy repository."""

    suite = SUITE

    def __init__(self, repo: AptRepo) -> None:
        self.repo = repo

    def prepare(self, host: TestHost) -> None:
        (host.root / "etc/apt/sources.list.d/vp-lab.list").write_text(self.repo.sources_line())
