"""What the gateway hosts of the lab need: Debian's haproxy and the packages it needs beyond the lab's
rootfs, downloaded once on this machine (`apt-get download`, its own bookworm sources) and cached as a
flat apt repository, which `AptRepo` (tests/lab/containers.py) serves on the lab's bridge: the role
gateway installs haproxy with apt-get from the host's sources, as on a server with a local mirror."""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

from tests.lab.containers import AptRepo, package_stanza
from tests.lab.hosts import HostKind, Lab, TestHost
from tests.lab.rootfs import PACKAGES, SUITE, cache_dir, cache_lock, ensure_rootfs
from tests.lab.specs import install_standin

GATEWAY_PACKAGES = ("haproxy",)  # what role gateway installs


def haproxy_repo() -> Path:
    """The cached flat repository (debs + Packages) of haproxy and what it needs beyond the rootfs."""
    return debian_repo("haproxy", GATEWAY_PACKAGES)


def debian_repo(name: str, packages: tuple[str, ...]) -> Path:
    """The cached flat repository (debs + Packages) of Debian's `packages` and what they need beyond the
    rootfs, `<name>-repo-<suite>-<key>` under the lab's cache."""
    key = hashlib.sha256("\n".join([SUITE, *PACKAGES, *packages]).encode()).hexdigest()[:16]
    repo = cache_dir() / f"{name}-repo-{SUITE}-{key}"
    with cache_lock(repo.name):
        if not (repo / "Packages").exists():
            _build_repo(repo, packages)
    return repo


def _needed(packages: tuple[str, ...]) -> list[str]:
    """The packages `packages` depend on (recursively, no recommends), less those the rootfs has."""
    depends = subprocess.run(
        ["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests", "--no-conflicts", "--no-breaks",
         "--no-replaces", "--no-enhances", "--no-pre-depends", *packages],
        capture_output=True, text=True, check=True).stdout
    wanted = {line.strip() for line in depends.splitlines() if line and not line.startswith((" ", "<"))}
    rootfs = ensure_rootfs()[0]
    installed = subprocess.run(["dpkg-query", f"--admindir={rootfs / 'var/lib/dpkg'}", "-W", "-f", "${Package}\n"],
                               capture_output=True, text=True, check=True).stdout.split()
    return sorted(wanted - set(installed))


def _build_repo(repo: Path, packages: tuple[str, ...]) -> None:
    partial = repo.with_name(repo.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    result = subprocess.run(["apt-get", "download", *_needed(packages)], cwd=partial, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"apt-get download failed: {result.stderr.strip()[-2000:]}")
    (partial / "Packages").write_text("\n".join(package_stanza(deb) for deb in sorted(partial.glob("*.deb"))))
    shutil.rmtree(repo, ignore_errors=True)
    partial.rename(repo)


class GatewayHost(HostKind):
    """A default (bookworm) test host whose apt sources are one of the lab's flat repositories (haproxy's,
    tests/lab/monitoring.py's)."""

    suite = SUITE

    def __init__(self, repo: AptRepo) -> None:
        self.repo = repo

    def prepare(self, host: TestHost) -> None:
        (host.root / "etc/apt/sources.list.d/vp-lab.list").write_text(self.repo.sources_line())


@contextlib.contextmanager
def repo_hosts(lab: Lab, repo: Path, prefix: str, count: int = 2) -> Iterator[list[TestHost]]:
    """`count` GatewayHosts named prefix<n> whose apt sources are `repo` (served on the lab's bridge meanwhile),
    each with the TEST DOUBLE nvidia-smi; destroyed at the end."""
    served = AptRepo(repo, lab.gateway)
    booted = lab.boot_many([f"{prefix}{lab.boot_count + index}" for index in range(count)], kind=GatewayHost(served))
    try:
        for host in booted:
            install_standin(host)
        yield booted
    finally:
        for host in booted:
            lab.destroy(host)
        served.close()
