"""Shell completion of the names a command takes from the spec: hosts, groups (a host's `groups:`, `all`), instances;
and the audit's profiles and bench's loads.

Completion runs on every <Tab>: the spec is read as YAML with the spec's own bounded loader (aliases bounded, no
duplicate keys) but not validated, so a spec being edited still completes; only a regular file is read (a FIFO named
as the spec would block the shell); nothing here ever raises: a spec that cannot be read completes nothing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from provisioner.fleet.selection import DEFAULT_SPEC, SPEC_ENV
from provisioner.spec.errors import SpecError
from provisioner.spec.loading import decode_spec, parse_yaml


def spec_data(option: str | Path | None) -> dict[str, Any]:
    """The spec a command would read (--spec, else $PROVISION_SPEC, else ./provision.yml) as plain YAML; {} where
    there is none or it cannot be read."""
    path = Path(option) if option else Path(os.environ[SPEC_ENV]) if os.environ.get(SPEC_ENV) else DEFAULT_SPEC
    try:
        if not path.is_file():
            return {}
        data = parse_yaml(decode_spec(path.read_bytes(), str(path)), str(path))
    except (OSError, SpecError):
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
