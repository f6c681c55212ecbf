"""Builders for spec data: a valid spec by default, with the one thing a test changes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from provisioner.base.secrets import forget_declared_secrets
from provisioner.spec import SpecError, validate_spec

UUID0 = "GPU-00000000-0000-4000-8000-000000000000"
UUID1 = "GPU-11111111-1111-4111-8111-111111111111"


@pytest.fixture(autouse=True)
def _no_declared_secrets_between_tests():
    """A spec a test loads declares its secrets for the process (provisioner/base/secrets.py): the next test starts without."""
    yield
    forget_declared_secrets()


def host(name: str = "ws4070", address: str = "192.0.2.20", **fields) -> dict:
    return {
        "name": name,
        "address": address,
        "gpus": {"devices": [{"index": 0, "uuid": UUID0, "model": "NVIDIA GeForce RTX 4070"}]},
        **fields,
    }


def instance(name: str, port: int, share: float = 0.3, on: str = "ws4070", **fields) -> dict:
    return {
        "name": name,
        "host": on,
        "model": "Qwen/Qwen3-1.7B-FP8",
        "port": port,
        "gpus": [0],
        "gpu_memory_utilization": share,
        **fields,
    }


def spec_data(hosts: list[dict] | None = None, instances: list[dict] | None = None) -> dict:
    return {
        "version": 1,
        "hosts": [host()] if hosts is None else hosts,
        "instances": [instance("chat", 8000)] if instances is None else instances,
    }


def problems_of(data: dict, base_dir: Path | str = ".") -> list[str]:
    """The problems validation reports, one `path: message — fix` line each."""
    with pytest.raises(SpecError) as caught:
        validate_spec(data, base_dir=base_dir)
    return [str(problem) for problem in caught.value.problems]


def write_spec(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path
