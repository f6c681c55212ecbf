"""Builds the TEST DOUBLE vLLM wheel (tests/doubles/vllm_package) for one real vLLM version: the wheel
`vllm-<version>-py3-none-any.whl` with that version's committed flag catalog inside, in a wheelhouse
folder the role vllm_install installs from, as it would from a real one (`provision wheelhouse`).

Also a broken one (`fails_at_start`): a TEST DOUBLE of a vLLM that installs and parses its flags but
cannot start on the host, as an upgrade fails where the driver is too old for the new CUDA runtime.

A wheel is a zip with the package, its metadata and a RECORD (PEP 427); standard library only.
"""

from __future__ import annotations

import base64
import hashlib
import os
import zipfile
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent / "vllm_package" / "vllm"
CATALOGS = Path(__file__).resolve().parents[2] / "provisioner" / "vllm" / "catalogs"
SERVER = "vllm/entrypoints/cli/standin_server.py"
# vllm/_C.abi3.so, where real vLLM's kernels are: the stand-in maps it as vLLM maps its kernels
# (vllm/platforms/__init__.py), so that /proc/PID/maps names it; not an ELF object, nothing runs from it
KERNELS_PLACEHOLDER = b"TEST DOUBLE: the place of vLLM's kernels, only mapped by the stand-in (vllm-provision tests)\n"
BROKEN = "-broken"  # how a broken wheel's wheelhouse folder ends: standin-wheelhouse-<version>-<key>-broken


def build_standin_wheel(version: str, wheelhouse: Path, fails_at_start: str | None = None) -> Path:
    """Write the stand-in vllm==version wheel into `wheelhouse`; return its path.

    With `fails_at_start` (the error's line, e.g. `RuntimeError: CUDA driver version is insufficient
    for CUDA runtime version`), the TEST DOUBLE of a vLLM that cannot start: `vllm --version`, the flag
    parser and the config check work as in the good wheel, but `vllm serve` writes a traceback whose last
    line is that message to stderr and exits 1 without ever listening. Its file has the good wheel's name
    (pip reads name and version from it), so it lives in a wheelhouse of its own, whose folder name ends
    in BROKEN (and a good wheel's does not): a broken wheel never replaces a good one in the shared cache."""
    if (fails_at_start is not None) != wheelhouse.name.endswith(BROKEN):
        raise ValueError(f"{wheelhouse}: a wheelhouse whose name ends in {BROKEN!r} holds a broken wheel, "
                         "and only such a one does")
    if fails_at_start is not None and (not fails_at_start.strip() or "\n" in fails_at_start):
        raise ValueError("fails_at_start: one line, the error vLLM ends with")
    wheelhouse.mkdir(parents=True, exist_ok=True)
    dist_info = f"vllm-{version}.dist-info"
    files = {
        f"vllm/{path.relative_to(PACKAGE).as_posix()}": path.read_bytes()
        for path in sorted(PACKAGE.rglob("*.py"))
    }
    files["vllm/_C.abi3.so"] = KERNELS_PLACEHOLDER
    files["vllm/__init__.py"] = files["vllm/__init__.py"].replace(b'"0.0.0"', f'"{version}"'.encode())
    # a build's local label (0.25.0+cu129) names the same version's options
    files["vllm/catalog.json"] = (CATALOGS / f"vllm-{version.split('+')[0]}.json").read_bytes()
    summary = "TEST DOUBLE of vLLM for test hosts without a GPU (vllm-provision tests)"
    if fails_at_start is not None:
        unset = b"\nFAILS_AT_START = None "
        assert files[SERVER].count(unset) == 1, f"{SERVER} has no FAILS_AT_START to set"
        files[SERVER] = files[SERVER].replace(unset, f"\nFAILS_AT_START = {fails_at_start!r} ".encode())
        summary += f", that cannot start: {fails_at_start}"
    files[f"{dist_info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\nSummary: {summary}\n").encode()
    files[f"{dist_info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: vllm-provision tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files[f"{dist_info}/entry_points.txt"] = b"[console_scripts]\nvllm = vllm.entrypoints.cli.main:main\n"
    record = [f"{name},sha256={_digest(data)},{len(data)}" for name, data in files.items()]
    files[f"{dist_info}/RECORD"] = ("\n".join([*record, f"{dist_info}/RECORD,,"]) + "\n").encode()
    wheel = wheelhouse / f"vllm-{version}-py3-none-any.whl"
    partial = wheel.with_name(f".{wheel.name}.{os.getpid()}")  # labs running side by side: write, then rename
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0)), data)
    os.replace(partial, wheel)
    return wheel


def shared_folder(version: str, broken: bool = False) -> str:
    """The name of the shared cache's wheelhouse for this checkout's stand-in vllm==version (broken or not):
    `standin-wheelhouse-<version>-<key>[-broken]`, the key a digest of the stand-in's source and the
    version's catalog. Labs of several checkouts run side by side on one machine: each builds into the
    folder of its own source, so none installs a wheel another checkout wrote over its own (a lab of a
    checkout without /v1/chat/completions once replaced the wheel of one with it between build and install)."""
    digest = hashlib.sha256()
    catalog = CATALOGS / f"vllm-{version.split('+')[0]}.json"
    for name, path in [*((p.relative_to(PACKAGE).as_posix(), p) for p in sorted(PACKAGE.rglob("*.py"))),
                       (catalog.name, catalog)]:
        digest.update(name.encode() + b"\0" + path.read_bytes())
    digest.update(b"vllm/_C.abi3.so\0" + KERNELS_PLACEHOLDER)
    return f"standin-wheelhouse-{version}-{digest.hexdigest()[:12]}" + (BROKEN if broken else "")


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
