"""Planner profiles (profiles.yml): named sets of `vllm serve` flags tuned for one goal, measured on
an H200 with `provision bench` (docs/bench.md, "Planner profiles")."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import yaml

PROFILES_FILE = Path(__file__).with_name("profiles.yml")


@cache
def planner_profiles() -> dict[str, dict[str, Any]]:
    return yaml.safe_load(PROFILES_FILE.read_text(encoding="utf-8"))


def profile_options(profile: str | None) -> dict[str, Any]:
    """The `vllm serve` flags of `profile` (none for None)."""
    return dict(planner_profiles()[profile].get("options") or {}) if profile else {}


def profile_env(profile: str | None) -> dict[str, str]:
    """The environment variables of `profile` (none for None)."""
    return dict(planner_profiles()[profile].get("env") or {}) if profile else {}
