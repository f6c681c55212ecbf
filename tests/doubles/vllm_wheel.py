"""Builds the TEST DOUBLE vLLM wheel (tests/doubles/vllm_package) for one real vLLM version: the wheel
`vllm-<version>-py3-none-any.whl` with that version's committed flag catalog inside, in a wheelhouse
folder the role vllm_install installs from, as it would from a real one (`provision wheelhouse`).

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


def build_standin_wheel(version: str, wheelhouse: Path) -> Path:
    """Write the stand-in vllm==version wheel into `wheelhouse`; return its path."""
    wheelhouse.mkdir(parents=True, exist_ok=True)
    dist_info = f"vllm-{version}.dist-info"
    files = {
        f"vllm/{path.relative_to(PACKAGE).as_posix()}": path.read_bytes()
        for path in sorted(PACKAGE.rglob("*.py"))
    }
    files["vllm/__init__.py"] = files["vllm/__init__.py"].replace(b'"0.0.0"', f'"{version}"'.encode())
    files["vllm/catalog.json"] = (CATALOGS / f"vllm-{version}.json").read_bytes()
    files[f"{dist_info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
        "Summary: TEST DOUBLE of vLLM for test hosts without a GPU (vllm-provision tests)\n").encode()
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


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
