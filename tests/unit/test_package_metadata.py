"""The package fits into other people's environments (issue 36, point 6): its metadata states compatible version
ranges, never one exact version (but the `vllm` extra's, the version the flag catalogs describe), and constraints.txt
is the exact lock CI installs with (`.ci/setup`), each pin inside its range and the version this venv runs."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
EXACT_ON_PURPOSE = {"vllm"}  # the extra naming the vLLM the catalogs describe, not a library the tool imports


def requirements() -> list[Requirement]:
    listed = PROJECT["project"]["dependencies"] + sum(PROJECT["project"]["optional-dependencies"].values(), [])
    return [Requirement(text) for text in listed if not text.startswith("vllm-provision")]


def lock() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[canonical(name)] = version.strip()
    return pins


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_dependency_is_a_range_not_one_version():
    exact = [str(req) for req in requirements() if canonical(req.name) not in EXACT_ON_PURPOSE
             and any(spec.operator in ("==", "===") for spec in req.specifier)]
    assert exact == []
    assert all(str(req.specifier) for req in requirements()), "a dependency with no bound at all"


def test_the_lock_pins_each_dependency_inside_its_range_at_the_version_installed_here():
    pins = lock()
    for req in requirements():
        if canonical(req.name) in EXACT_ON_PURPOSE:
            continue
        assert canonical(req.name) in pins, f"{req.name} not in constraints.txt"
        assert req.specifier.contains(pins[canonical(req.name)]), (req, pins[canonical(req.name)])
    for name, version in pins.items():
        if name == "hatchling":  # the build backend: pip's isolated build environment, not this venv
            continue
        assert metadata.version(name) == version, f"constraints.txt says {name}=={version}, this venv runs another"
    (backend,) = PROJECT["build-system"]["requires"]
    assert Requirement(backend).specifier.contains(pins["hatchling"])


def test_ci_installs_with_the_lock():
    assert "--constraint constraints.txt" in (ROOT / ".ci" / "setup").read_text()


def test_the_metadata_names_the_project_urls_galaxy_yml_names():
    galaxy = yaml.safe_load((ROOT / "galaxy.yml").read_text(encoding="utf-8"))
    urls = PROJECT["project"]["urls"]
    assert {"Homepage", "Documentation", "Source", "Issues", "Changelog"} <= set(urls)
    assert urls["Source"] == galaxy["repository"]
