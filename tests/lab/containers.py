"""What the container hosts of the lab need: their engines' Debian packages served on the lab's
bridge, and a locally built vLLM image holding the stand-in server (no registry is reachable here).

- `engine_repo()`: a flat apt repository of the packages the role container_engine installs (its own
  defaults) and everything they need, downloaded once by mmdebstrap from this machine's sources and
  cached; `AptRepo` serves it over HTTP on the lab's gateway, so the role installs the engines with
  apt-get from the host's sources, as on a server with a local mirror.
- `standin_image_archive()`: an image in `docker save` format (one layer: a Debian trixie rootfs with
  python3 and the TEST DOUBLE vllm, entrypoint `vllm serve`, as vllm/vllm-openai's), which
  `podman load` and `docker load` import. It is what the spec's `container.image_archive` names.
"""

from __future__ import annotations

import hashlib
import io
import json
import shlex
import shutil
import subprocess
import tarfile
import threading
import zipfile
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

from provisioner.base.paths import role_dir
from tests.doubles.vllm_wheel import build_standin_wheel, shared_folder
from tests.lab.hosts import HostKind, TestHost
from tests.lab.rootfs import PACKAGES, cache_dir, cache_lock, mmdebstrap

SUITE = "trixie"  # podman >= 4.4 (quadlets) and docker >= 25 (CDI devices); bookworm has 4.3.1 and 20.10
IMAGE_NAME = "localhost/vllm-standin"
IMAGE_RECIPE = 1  # bump when the image's build steps change
PYTHON_SITE = "usr/local/lib/python3.13/dist-packages"  # trixie's python3 reads it


def engine_packages() -> list[str]:
    """Every package the role container_engine installs for any engine (its defaults)."""
    defaults = yaml.safe_load((role_dir("container_engine") / "defaults" / "main.yml").read_text())
    return sorted({package for packages in defaults["container_engine_packages"].values() for package in packages})


def engine_repo() -> Path:
    """The cached flat repository (debs + Packages) of the engines' packages for the trixie hosts."""
    key = hashlib.sha256("\n".join([SUITE, *PACKAGES, *engine_packages()]).encode()).hexdigest()[:16]
    repo = cache_dir() / f"engine-repo-{SUITE}-{key}"
    with cache_lock(repo.name):
        if not (repo / "Packages").exists():
            _build_engine_repo(repo)
    return repo


def _build_engine_repo(repo: Path) -> None:
    tree = repo.with_name(repo.name + ".tree")
    shutil.rmtree(tree, ignore_errors=True)
    # keep what apt downloaded: the engines and all they depend on beyond the base system
    mmdebstrap(SUITE, tree, "--variant=minbase", "--skip=cleanup/apt/cache,download/empty",
               "--include=" + ",".join([*PACKAGES, *engine_packages()]))
    partial_repo = repo.with_name(repo.name + ".partial")
    shutil.rmtree(partial_repo, ignore_errors=True)
    partial_repo.mkdir(parents=True)
    for deb in sorted((tree / "var/cache/apt/archives").glob("*.deb")):
        shutil.copy2(deb, partial_repo / deb.name)
    shutil.rmtree(tree)
    (partial_repo / "Packages").write_text("\n".join(package_stanza(deb) for deb in sorted(partial_repo.glob("*.deb"))))
    shutil.rmtree(repo, ignore_errors=True)
    partial_repo.rename(repo)


def package_stanza(deb: Path) -> str:
    """The deb's control fields plus where it is and its checksum: one stanza of a Packages index."""
    control = subprocess.run(["dpkg-deb", "--field", str(deb)], capture_output=True, text=True, check=True).stdout
    data = deb.read_bytes()
    return (control.rstrip("\n") + f"\nFilename: ./{deb.name}\nSize: {len(data)}\n"
            f"SHA256: {hashlib.sha256(data).hexdigest()}\n")


class AptRepo:
    """Serves a flat apt repository over HTTP on one address of the lab's bridge (a thread of this process)."""

    def __init__(self, folder: Path, address: str) -> None:
        handler = partial(_QuietHandler, directory=str(folder))
        self.server = ThreadingHTTPServer((address, 0), handler)
        self.url = f"http://{address}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def sources_line(self) -> str:
        return f"deb [trusted=yes] {self.url} ./\n"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def standin_image_archive(version: str = "0.25.0") -> tuple[Path, str]:
    """(the cached `docker save` archive of the stand-in image, its name:tag)."""
    reference = f"{IMAGE_NAME}:{version}"
    wheel = build_standin_wheel(version, cache_dir() / shared_folder(version))
    key = hashlib.sha256(b"%d\n" % IMAGE_RECIPE + wheel.read_bytes()).hexdigest()[:16]
    archive = cache_dir() / f"standin-image-{version}-{key}.tar"
    with cache_lock(archive.name):
        if not archive.exists():
            _build_standin_image(archive, wheel, reference)
    return archive, reference


def _build_standin_image(archive: Path, wheel: Path, reference: str) -> None:
    rootfs = archive.with_name(archive.name + ".rootfs.tar")
    mmdebstrap(SUITE, rootfs, "--variant=essential", "--include=python3")
    layer = _with_standin(rootfs.read_bytes(), wheel)
    rootfs.unlink()
    partial_archive = archive.with_name(archive.name + ".partial")
    _write_docker_archive(partial_archive, layer, reference)
    partial_archive.rename(archive)


def _with_standin(rootfs_tar: bytes, wheel: Path) -> bytes:
    """The rootfs tar with the stand-in vllm package added (what pip would put there) and /usr/local/bin/vllm."""
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(rootfs_tar)) as source, tarfile.open(fileobj=out, mode="w") as layer:
        for member in source:
            layer.addfile(member, source.extractfile(member) if member.isfile() else None)
        with zipfile.ZipFile(wheel) as package:
            for name in package.namelist():
                _add_file(layer, f"./{PYTHON_SITE}/{name}", package.read(name), 0o644)
        _add_file(layer, "./usr/local/bin/vllm",
                  b"#!/usr/bin/python3\nimport sys\nfrom vllm.entrypoints.cli.main import main\nsys.exit(main())\n", 0o755)
    return out.getvalue()


def _add_file(layer: tarfile.TarFile, name: str, data: bytes, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    layer.addfile(info, io.BytesIO(data))


def _write_docker_archive(path: Path, layer: bytes, reference: str) -> None:
    """`docker save` format: the layer, the image config (entrypoint `vllm serve`), the manifest naming it."""
    layer_id = hashlib.sha256(layer).hexdigest()
    config = json.dumps({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": ["vllm", "serve"], "Cmd": [],
                   "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                   "Labels": {"org.opencontainers.image.description": "TEST DOUBLE of vllm/vllm-openai (stand-in server)"}},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_id}"]},
    }).encode()
    config_name = f"{hashlib.sha256(config).hexdigest()}.json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [reference], "Layers": [f"{layer_id}/layer.tar"]}]).encode()
    with tarfile.open(path, "w") as archive:
        _add_file(archive, f"{layer_id}/layer.tar", layer, 0o644)
        _add_file(archive, config_name, config, 0o644)
        _add_file(archive, "manifest.json", manifest, 0o644)


class ContainerHost(HostKind):
    """A trixie test host that can run Podman and Docker containers inside its systemd-nspawn container.

    This machine binds every cgroup controller to cgroup v1 (it boots without systemd), which nspawn
    mounts read-only: crun and runc cannot create containers there. So the host boots with the unified
    cgroup v2 hierarchy (SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1), which has no controllers here: the
    engines' default pids limit is switched off (containers.conf.d), the only limit they would set.
    nspawn's system call filter is widened by the keyring calls (crun's session keyring) and bpf (crun's
    device rules on cgroup v2). The engines' storage is a folder of this machine's disk bound into the
    host: overlayfs does not stack on the host's own overlay root. Apt reads only the lab's repository.
    """

    suite = SUITE

    def __init__(self, repo: AptRepo) -> None:
        self.repo = repo

    def prepare(self, host: TestHost) -> None:
        conf = host.root / "etc/containers/containers.conf.d/50-vp-lab.conf"
        conf.parent.mkdir(parents=True, exist_ok=True)
        conf.write_text("# vllm-provision lab: the nspawn host's cgroup v2 has no pids controller\n"
                        "[containers]\npids_limit = 0\n"
                        "# podman's default network, 10.88.0.0/16 with 10.88.0.1 on podman0, overlaps the lab's bridge\n"
                        "[network]\ndefault_subnet = \"10.250.0.0/16\"\n")
        (host.root / "etc/apt/sources.list.d/vp-lab.list").write_text(self.repo.sources_line())
        # trixie's sshd (OpenSSH 10) penalises an address whose connections end before they authenticate: each
        # apply's and audit's ssh-keyscan makes five, and by the third run sshd refused the bastion ("Connection
        # reset by peer"). The bastion is the lab's gateway, where the repository is served
        sshd = host.root / "etc/ssh/sshd_config.d/50-vp-lab.conf"
        sshd.parent.mkdir(parents=True, exist_ok=True)
        sshd.write_text(f"PerSourcePenaltyExemptList {self.repo.server.server_address[0]}\n")
        for store in ("containers", "docker"):
            (host.base / "storage" / store).mkdir(parents=True, exist_ok=True)

    def nspawn_options(self, host: TestHost) -> list[str]:
        return ["--system-call-filter=@keyring bpf",
                f"--bind={host.base / 'storage/containers'}:/var/lib/containers",
                f"--bind={host.base / 'storage/docker'}:/var/lib/docker"]

    def nspawn_environment(self) -> dict[str, str]:
        return {"SYSTEMD_NSPAWN_UNIFIED_HIERARCHY": "1"}


def write_cdi_standin(host: TestHost, uuids: list[str]) -> None:
    """TEST DOUBLE of `nvidia-ctk cdi generate --device-name-strategy=uuid` on a host without a GPU: a CDI
    spec declaring each GPU UUID as nvidia.com/gpu=<UUID>, whose edits set NVIDIA_VISIBLE_DEVICES (no device
    nodes: there are none). The engines resolve it with their real CDI code."""
    spec = {"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
            "devices": [{"name": uuid, "containerEdits": {"env": [f"NVIDIA_VISIBLE_DEVICES={uuid}"]}} for uuid in uuids],
            "containerEdits": {"env": ["VP_LAB_CDI_STANDIN=1"]}}
    host.ssh(f"mkdir -p /etc/cdi && printf '%s' {shlex.quote(yaml.safe_dump(spec))} > /etc/cdi/nvidia.yaml")
