"""What the toolkit hosts of the lab need (role container_engine, phase toolkit), served on the lab's bridge:

`toolkit_doubles_repo()`: a signed flat apt repository of TEST DOUBLE packages standing in for NVIDIA's
libnvidia-container repository (not reachable here): `nvidia-container-toolkit-base` at two versions, 1.17.8-1
(no refresh units, as the real 1.17.x) and 1.18.0-1 (NVIDIA's own nvidia-cdi-refresh.path/.service/.env and
postinst, verbatim from tests/fixtures/nvidia-container-toolkit/). Each has the TEST DOUBLE `nvidia-ctk`
(tests/doubles/nvidia_ctk_double.py), whose `cdi generate` writes a spec of the GPUs the lab's TEST DOUBLE
nvidia-smi lists. Signed with a throwaway key the role is given as the repository's key (tests/lab/nvidia_driver.py).
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from tests.lab.nvidia_driver import _build_deb, sign_flat_repo
from tests.lab.rootfs import cache_dir, cache_lock

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "nvidia-container-toolkit"
CTK_DOUBLE = Path(__file__).resolve().parent.parent / "doubles" / "nvidia_ctk_double.py"
PACKAGE = "nvidia-container-toolkit-base"
VERSIONS = ("1.17.8-1", "1.18.0-1")
NOTE = "TEST DOUBLE of NVIDIA's {name} (vllm-provision lab): nvidia-ctk writes a CDI spec of the stand-in GPUs"
UNITS = {"nvidia-cdi-refresh.path": "etc/systemd/system", "nvidia-cdi-refresh.service": "etc/systemd/system",
         "nvidia-cdi-refresh.env": "etc/nvidia-container-toolkit"}  # 1.18.0's nvidia-container-toolkit-base.install


def toolkit_package(version: str) -> dict:
    """The TEST DOUBLE nvidia-container-toolkit-base of one version, as tests/lab/nvidia_driver.py builds debs."""
    fixtures = FIXTURES / f"v{version.split('-')[0]}"
    files = {
        "usr/bin/nvidia-ctk": (0o755, CTK_DOUBLE.read_text().replace("@VERSION@", version.split("-")[0])),
        "usr/bin/nvidia-cdi-hook": (0o755, "#!/bin/sh\necho 'TEST DOUBLE of nvidia-cdi-hook: does nothing' >&2\n"),
        f"usr/share/doc/{PACKAGE}/README.TEST-DOUBLE": (0o644, NOTE.format(name=PACKAGE) + "\n"),
    }
    for name, folder in UNITS.items():
        if (fixtures / name).exists():
            files[f"{folder}/{name}"] = (0o644, (fixtures / name).read_text())
    return {"files": files, "scripts": {"postinst": (fixtures / f"{PACKAGE}.postinst").read_text()}}


def toolkit_doubles_repo() -> Path:
    """The cached, signed flat repository of the TEST DOUBLE toolkit packages (VERSIONS)."""
    packages = {version: toolkit_package(version) for version in VERSIONS}
    material = repr(sorted((version, sorted(package["files"].items()), sorted(package["scripts"].items()))
                           for version, package in packages.items()))
    repo = cache_dir() / f"toolkit-doubles-repo-{hashlib.sha256(material.encode()).hexdigest()[:16]}"
    with cache_lock(repo.name):
        if not (repo / "InRelease").exists():
            partial = repo.with_name(repo.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(parents=True)
            for version, package in packages.items():
                _build_deb(partial, PACKAGE, version, package)
            sign_flat_repo(partial, "TEST DOUBLE of NVIDIA's libnvidia-container repository")
            shutil.rmtree(repo, ignore_errors=True)
            partial.rename(repo)
    return repo
