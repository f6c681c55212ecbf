"""What the driver hosts of the lab need (role nvidia_driver), served on the lab's bridge:

- `debian_driver_repo()`: a flat apt repository of Debian bookworm's own driver packages (non-free,
  contrib: the lab's rootfs has main only) for the branches the tests install (470 and 535, the sets of
  the role's vars/packages.yml), the kernel headers and what they all need beyond the rootfs. Downloaded
  once on this machine from its own mirror with the non-free components added (a scratch apt state whose
  dpkg status is the rootfs's) and cached; `AptRepo` serves it. Its kernel headers are the mirror's newest
  (6.1.0-57-amd64 when this was written), which DKMS builds the module for.
- `nvidia_doubles_repo()`: a signed flat apt repository of TEST DOUBLE packages standing in for NVIDIA's
  CUDA repository (not reachable here), two branches (580 and 590): `nvidia-driver-cuda`, `nvidia-smi`,
  `libcuda1`, `libnvidia-ml1`, and real DKMS packages `nvidia-kernel-open-dkms` / `nvidia-kernel-dkms`
  whose "build" compiles a kernel object holding only a `.modinfo` section (version, vermagic of the kernel
  DKMS builds for): `modinfo` and `depmod` read it, nothing can load it. Signed with a throwaway key the
  role is given as the repository's key, so its `signed-by` source is exercised as for NVIDIA's.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import tempfile
import threading
import time
from functools import partial
from http.server import ThreadingHTTPServer
from pathlib import Path

import yaml

from provisioner.base.paths import role_dir
from tests.lab.containers import AptRepo, _QuietHandler, package_stanza
from tests.lab.hosts import HostKind, TestHost
from tests.lab.rootfs import PACKAGES, SUITE, apt_sources, cache_dir, cache_lock, ensure_rootfs

COMPONENTS = "main contrib non-free non-free-firmware"  # nvidia-persistenced is in contrib
HEADERS = "linux-headers-amd64"  # what the role installs on a host without a kernel image (a container)
DEBIAN_BRANCHES = ("470", "535")  # bookworm's own families the tests install: 470 -> 535


def package_sets(release: str = SUITE, source: str = "distribution") -> dict:
    """The role's package sets (roles/nvidia_driver/vars/packages.yml) of one release and source."""
    data = yaml.safe_load((role_dir("nvidia_driver") / "vars" / "packages.yml").read_text())
    return data["_nvidia_driver_package_sets"][release][source]


def debian_set(branch: str) -> list[str]:
    """The packages the role installs for a bookworm branch (proprietary modules), headers included."""
    chosen = package_sets()[branch]["proprietary"]
    return [*chosen["packages"], *chosen["companions"], HEADERS]


def debian_driver_repo() -> Path:
    """The cached flat repository (debs + Packages) of bookworm's driver sets for DEBIAN_BRANCHES."""
    wanted = [" ".join(debian_set(branch)) for branch in DEBIAN_BRANCHES]
    material = "\n".join([SUITE, COMPONENTS, *PACKAGES, *wanted, apt_sources()])
    repo = cache_dir() / f"driver-repo-{SUITE}-{hashlib.sha256(material.encode()).hexdigest()[:16]}"
    with cache_lock(repo.name):
        if not (repo / "Packages").exists():
            _build_debian_repo(repo)
    return repo


def _build_debian_repo(repo: Path) -> None:
    partial = repo.with_name(repo.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    status = ensure_rootfs()[0] / "var/lib/dpkg/status"
    with tempfile.TemporaryDirectory(prefix="vp-driver-apt-") as scratch:
        apt = _scratch_apt(Path(scratch), status, partial)
        _apt(apt, "update")
        for branch in DEBIAN_BRANCHES:  # one at a time: the families need not install side by side
            _apt(apt, "install", "--download-only", "--yes", "--no-install-recommends", *debian_set(branch))
    (partial / "Packages").write_text("\n".join(package_stanza(deb) for deb in sorted(partial.glob("*.deb"))))
    shutil.rmtree(repo, ignore_errors=True)
    partial.rename(repo)


def _scratch_apt(scratch: Path, status: Path, archives: Path) -> list[str]:
    """apt-get options for a scratch state: this machine's sources with every component, the rootfs as
    what is installed, downloads into `archives`."""
    for folder in ("sources.list.d", "preferences.d", "lists/partial", "cache"):
        (scratch / folder).mkdir(parents=True, exist_ok=True)
    sources = re.sub(r"(?m)^Components:.*$", f"Components: {COMPONENTS}", apt_sources())
    (scratch / "sources.list.d" / "debian.sources").write_text(sources)
    (archives / "partial").mkdir(exist_ok=True)
    settings = {
        "Dir::Etc::SourceList": "/dev/null",
        "Dir::Etc::SourceParts": scratch / "sources.list.d",
        "Dir::Etc::Preferences": "/dev/null",
        "Dir::Etc::PreferencesParts": scratch / "preferences.d",
        "Dir::State::Lists": scratch / "lists",
        "Dir::State::status": status,
        "Dir::State::extended_states": scratch / "extended_states",
        "Dir::Cache": scratch / "cache",
        "Dir::Cache::Archives": archives,
        "APT::Install-Recommends": "false",
        "Debug::NoLocking": "true",
    }
    return [option for name, value in settings.items() for option in ("-o", f"{name}={value}")]


def _apt(options: list[str], *arguments: str) -> None:
    result = subprocess.run(["apt-get", "-q", *options, *arguments], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"apt-get {' '.join(arguments)} failed:\n{(result.stderr or result.stdout)[-3000:]}")


class LoggedAptRepo(AptRepo):
    """An AptRepo that remembers the paths it was asked for: a test sees whether apt-get update ran."""

    def __init__(self, folder: Path, address: str) -> None:
        self.requests: list[str] = []
        handler = partial(_LoggingHandler, self.requests, directory=str(folder))
        self.server = ThreadingHTTPServer((address, 0), handler)
        self.url = f"http://{address}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()


class _LoggingHandler(_QuietHandler):
    def __init__(self, requests: list[str], *args, **kwargs) -> None:
        self.requests = requests
        super().__init__(*args, **kwargs)

    def do_GET(self) -> None:
        self.requests.append(self.path)
        super().do_GET()


class DriverHost(HostKind):
    """A default (bookworm) test host whose apt sources are the lab's Debian driver repository."""

    suite = SUITE

    def __init__(self, repo: AptRepo) -> None:
        self.repo = repo

    def prepare(self, host: TestHost) -> None:
        (host.root / "etc/apt/sources.list.d/vp-lab.list").write_text(self.repo.sources_line())



# --------------------------------------------------------------------------- TEST DOUBLE of NVIDIA's repository

DOUBLE_VERSIONS = {"580": "580.95.05-1", "590": "590.44.01-1"}  # two branches: an upgrade, a pin that holds
DOUBLES_RECIPE = 1  # bump when the doubles' contents change
DOUBLE_KEY = "TEST-DOUBLE-repository-key.asc"  # the throwaway key's public half, in the repository
DOUBLE_NOTE = "TEST DOUBLE of NVIDIA's {name} (vllm-provision lab): no driver, nothing runs on a GPU"

# what DKMS runs for the doubles' module: a kernel object holding only a .modinfo section, for the kernel
# DKMS builds for (gcc comes with the kernel headers' compiler)
DOUBLE_BUILD = r"""#!/bin/sh
# TEST DOUBLE of the NVIDIA module's build (vllm-provision lab): modinfo and depmod read the object; nothing loads it
set -e
printf '%s\n' \
  '__attribute__((section(".modinfo"), used)) static const char modinfo[] =' \
  '  "version=@VERSION@\0license=NVIDIA\0name=nvidia\0"' \
  '  "description=TEST DOUBLE of the NVIDIA kernel module (vllm-provision lab)\0"' \
  "  \"vermagic=$1 SMP preempt mod_unload modversions \\0\";" > nvidia-modinfo.c
gcc -c -o nvidia.ko nvidia-modinfo.c
"""
DOUBLE_DKMS_CONF = """PACKAGE_NAME="nvidia"
PACKAGE_VERSION="@VERSION@"
BUILT_MODULE_NAME[0]="nvidia"
DEST_MODULE_LOCATION[0]="/updates/dkms"
MAKE[0]="sh ./build.sh ${kernelver}"
CLEAN="rm -f nvidia.ko nvidia-modinfo.c"
AUTOINSTALL="yes"
"""
# the maintainer scripts of Debian's DKMS packages (dh_dkms), for the module nvidia
DOUBLE_POSTINST = """#!/bin/sh
set -e
if [ "$1" = configure ]; then
  /usr/lib/dkms/common.postinst nvidia @VERSION@ /usr/share/nvidia-dkms "" $2
fi
"""
DOUBLE_PRERM = """#!/bin/sh
set -e
case "$1" in
  remove|upgrade|deconfigure)
    if [ "$(dkms status -m nvidia -v @VERSION@)" ]; then dkms remove -m nvidia -v @VERSION@ --all; fi ;;
esac
"""


def nvidia_doubles_repo() -> Path:
    """The cached, signed flat repository of the TEST DOUBLE packages (DOUBLE_VERSIONS)."""
    material = "\n".join([str(DOUBLES_RECIPE), *sorted(DOUBLE_VERSIONS.values()), DOUBLE_BUILD, DOUBLE_DKMS_CONF,
                          DOUBLE_POSTINST, DOUBLE_PRERM])
    repo = cache_dir() / f"nvidia-doubles-repo-{hashlib.sha256(material.encode()).hexdigest()[:16]}"
    with cache_lock(repo.name):
        if not (repo / "InRelease").exists():
            _build_doubles_repo(repo)
    return repo


def doubles_key_fingerprint(repo: Path) -> str:
    """The fingerprint of the key that signed the doubles' repository."""
    return (repo / "fingerprint").read_text().strip()


def _doc(name: str) -> dict:
    return {f"usr/share/doc/{name}/README.TEST-DOUBLE": (0o644, DOUBLE_NOTE.format(name=name) + "\n")}


def double_packages(version: str) -> dict[str, dict]:
    """name -> {depends, conflicts, files: {path: (mode, text)}, scripts: {name: text}} of one version."""
    upstream = version.split("-")[0]
    smi = ("#!/bin/sh\necho 'TEST DOUBLE of nvidia-smi %s (vllm-provision lab): no driver loaded' >&2\nexit 9\n"
           % upstream)
    dkms_files = {f"usr/src/nvidia-{upstream}/dkms.conf": (0o644, DOUBLE_DKMS_CONF.replace("@VERSION@", upstream)),
                  f"usr/src/nvidia-{upstream}/build.sh": (0o755, DOUBLE_BUILD.replace("@VERSION@", upstream))}
    scripts = {"postinst": DOUBLE_POSTINST.replace("@VERSION@", upstream),
               "prerm": DOUBLE_PRERM.replace("@VERSION@", upstream)}
    return {
        "nvidia-driver-cuda": {"depends": f"nvidia-smi (= {version}), libcuda1 (= {version}), libnvidia-ml1 (= {version})",
                               "files": _doc("nvidia-driver-cuda")},
        "nvidia-smi": {"depends": f"libnvidia-ml1 (= {version})",
                       "files": {**_doc("nvidia-smi"), "usr/bin/nvidia-smi": (0o755, smi)}},
        "libcuda1": {"files": _doc("libcuda1")},
        "libnvidia-ml1": {"files": _doc("libnvidia-ml1")},
        "nvidia-kernel-open-dkms": {"depends": "dkms", "conflicts": "nvidia-kernel-dkms",
                                    "files": {**_doc("nvidia-kernel-open-dkms"), **dkms_files}, "scripts": scripts},
        "nvidia-kernel-dkms": {"depends": "dkms", "conflicts": "nvidia-kernel-open-dkms",
                               "files": {**_doc("nvidia-kernel-dkms"), **dkms_files}, "scripts": scripts},
    }


def _build_deb(folder: Path, name: str, version: str, package: dict) -> Path:
    tree = folder / f"{name}-{version}.tree"
    (tree / "DEBIAN").mkdir(parents=True)
    fields = {"Package": name, "Version": version, "Architecture": "amd64",
              "Maintainer": "vllm-provision lab <lab@invalid>", "Section": "NVIDIA", "Priority": "optional",
              "Depends": package.get("depends"), "Conflicts": package.get("conflicts"),
              "Description": DOUBLE_NOTE.format(name=name)}
    (tree / "DEBIAN/control").write_text("".join(f"{key}: {value}\n" for key, value in fields.items() if value))
    for script, text in package.get("scripts", {}).items():
        (tree / "DEBIAN" / script).write_text(text)
        (tree / "DEBIAN" / script).chmod(0o755)
    for path, (mode, text) in package["files"].items():
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        (tree / path).write_text(text)
        (tree / path).chmod(mode)
    deb = folder / f"{name}_{version}_amd64.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zxz", "-b", str(tree), str(deb)], check=True,
                   capture_output=True)
    shutil.rmtree(tree)
    return deb


def _build_doubles_repo(repo: Path) -> None:
    partial = repo.with_name(repo.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for version in DOUBLE_VERSIONS.values():
        for name, package in double_packages(version).items():
            _build_deb(partial, name, version, package)
    sign_flat_repo(partial, "TEST DOUBLE of NVIDIA's CUDA repository")
    shutil.rmtree(repo, ignore_errors=True)
    partial.rename(repo)


def sign_flat_repo(partial: Path, label: str) -> None:
    """The Packages index of the debs in `partial`, its Release signed (InRelease) with a throwaway key whose
    public half is DOUBLE_KEY and whose fingerprint is in the file `fingerprint`."""
    packages = "\n".join(package_stanza(deb) for deb in sorted(partial.glob("*.deb"))).encode()
    (partial / "Packages").write_bytes(packages)
    (partial / "Release").write_text(
        f"Origin: vllm-provision lab\nLabel: {label}\n"
        f"Date: {time.strftime('%a, %d %b %Y %H:%M:%S UTC', time.gmtime())}\n"
        f"SHA256:\n {hashlib.sha256(packages).hexdigest()} {len(packages)} Packages\n")
    with tempfile.TemporaryDirectory(prefix="vp-lab-gpg-") as home:
        gpg = ["gpg", "--homedir", home, "--batch", "--quiet", "--pinentry-mode", "loopback", "--passphrase", ""]
        subprocess.run([*gpg, "--quick-gen-key", "vllm-provision lab TEST DOUBLE repository key <lab@invalid>",
                        "rsa3072", "sign", "never"], check=True, capture_output=True)
        subprocess.run([*gpg, "--clearsign", "--output", str(partial / "InRelease"), str(partial / "Release")],
                       check=True, capture_output=True)
        subprocess.run([*gpg, "--armor", "--output", str(partial / DOUBLE_KEY), "--export"], check=True,
                       capture_output=True)
        listing = subprocess.run([*gpg, "--with-colons", "--list-keys"], check=True, capture_output=True,
                                 text=True).stdout
    fingerprint = next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))
    (partial / "fingerprint").write_text(fingerprint + "\n")
