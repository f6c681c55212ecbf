"""Shell completion of the names a command takes from the spec: hosts, groups (a host's `groups:`, `all`), instances;
and the audit's profiles and bench's loads.

Completion runs on every <Tab>: the spec is read as plain YAML (no validation, so a spec being edited still
completes), quickly, and nothing here ever raises: a spec that cannot be read completes nothing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from provisioner.fleet.selection import DEFAULT_SPEC, SPEC_ENV


def spec_data(option: str | Path | None) -> dict[str, Any]:
    """The spec a command would read (--spec, else $PROVISION_SPEC, else ./provision.yml) as plain YAML; {} where
    there is none or it cannot be read."""
    path = Path(option) if option else Path(os.environ[SPEC_ENV]) if os.environ.get(SPEC_ENV) else DEFAULT_SPEC
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def entries(data: dict[str, Any], section: str) -> list[dict[str, Any]]:
    listed = data.get(section)
    return [entry for entry in listed if isinstance(entry, dict)] if isinstance(listed, list) else []


def names(entries_of: list[dict[str, Any]]) -> list[str]:
    return [entry["name"] for entry in entries_of if isinstance(entry.get("name"), str)]


def target_names(option: str | Path | None) -> list[str]:
    """The hosts, then the groups (and `all`), in spec order, each once."""
    data = spec_data(option)
    hosts = entries(data, "hosts")
    groups = [group for host in hosts for group in (host.get("groups") or []) if isinstance(group, str)]
    return list(dict.fromkeys([*names(hosts), *groups, "all"])) if hosts else []


def instance_names(option: str | Path | None) -> list[str]:
    return names(entries(spec_data(option), "instances"))


def matching(candidates: list[str], incomplete: str) -> list[str]:
    return [candidate for candidate in candidates if candidate.startswith(incomplete)]
