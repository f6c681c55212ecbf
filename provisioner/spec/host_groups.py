"""Defaults and groups: the values hosts share, resolved into each host before the hosts are validated.

A host takes `defaults:`, then each group it lists in its `groups:` that has an entry under `groups:` (in
the order it lists them), then its own values: field by field, and a mapping (a section such as
`settings`, or `settings.sysctls`) key by key. Resolution works on the parsed data, so every host is
validated, and reaches the inventory, plan and audit, as if it had written each value itself.

`origins` remembers where each value a host takes was written, so that a problem with it is reported
there, once, not on every host that takes it (`relocated`). A host that would take values from an entry
that is itself invalid (or whose name two entries share) is left unresolved: its problems are the
entry's, reported at the entry.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from pydantic import BaseModel, ValidationError

from provisioner.spec.errors import Problem
from provisioner.spec.messages import path_of
from provisioner.spec.models import HostDefaults, HostGroup

# Checks of a taken value against the host's own values: they stay on the host, naming where the value is from.
CHECKED_AGAINST_THE_HOST = ("gpus.expected_count", "driver.modules")

Layer = tuple[tuple, dict]  # (where it is written, e.g. ("groups", 1); the values)


class Resolution(NamedTuple):
    """The spec's hosts with what each takes from defaults and groups."""

    hosts: Any  # data["hosts"], each host merged with the values it takes
    origins: dict[int, dict[str, str | None]]  # host index → {path in the host: where written; None: its own}
    unresolved: set[int]  # hosts that list an invalid entry (or take invalid defaults): not merged


def resolve_hosts(data: dict, context: dict) -> Resolution:
    """Each host of `data` merged with the defaults and the groups it lists."""
    raw_hosts = data.get("hosts")
    if not isinstance(raw_hosts, list):
        return Resolution(raw_hosts, {}, set())
    sources = _Sources(data, context)
    hosts, origins, unresolved = [], {}, set()
    for index, raw in enumerate(raw_hosts):
        layers = sources.layers_of(raw) if isinstance(raw, dict) else []
        if not layers:
            hosts.append(raw)
            if layers is None:
                unresolved.add(index)
            continue
        taken: dict[tuple, tuple | None] = {}
        merged: dict = {}
        for written_at, values in [*layers, (None, raw)]:
            merged = _overlay(merged, values, written_at, (), taken)
        hosts.append(merged)
        origins[index] = {path_of(at): written_at and path_of(written_at) for at, written_at in taken.items()}
    return Resolution(hosts, origins, unresolved)


class _Sources:
    """The defaults and the group entries of the spec, and whether each passed pass 1."""

    def __init__(self, data: dict, context: dict):
        self.defaults = data.get("defaults")
        self.defaults_valid = self.defaults is None or _passes(HostDefaults, self.defaults, context)
        groups = data.get("groups")
        self.groups_readable = groups is None or isinstance(groups, list)
        self.entries: dict[str, Layer | None] = {}  # group name → its layer; None: invalid or named twice
        for index, entry in enumerate(groups if isinstance(groups, list) else []):
            name = entry.get("name") if isinstance(entry, dict) else None
            if isinstance(name, str):
                valid = name not in self.entries and _passes(HostGroup, entry, context)
                self.entries[name] = (("groups", index), _without_name(entry)) if valid else None

    def layers_of(self, host: dict) -> list[Layer] | None:
        """What the host takes, in order; None when any of it is invalid."""
        listed = host.get("groups")
        names = [name for name in listed if isinstance(name, str)] if isinstance(listed, list) else []
        if not self.defaults_valid or (names and not self.groups_readable):
            return None
        layers = [(("defaults",), self.defaults)] if isinstance(self.defaults, dict) else []
        for name in names:
            if name in self.entries and self.entries[name] is None:
                return None
            if name in self.entries:
                layers.append(self.entries[name])
        return layers


def _passes(model: type[BaseModel], data: Any, context: dict) -> bool:
    try:
        model.model_validate(data, context=context)
    except ValidationError:
        return False
    return True


def _without_name(entry: dict) -> dict:
    return {key: value for key, value in entry.items() if key != "name"}


def _overlay(base: dict, values: dict, written_at: tuple | None, at: tuple, taken: dict) -> dict:
    """`values` over `base` key by key, mappings merged into mappings; `taken` records where each value
    set here was written (None: the host's own)."""
    merged = dict(base)
    for key, value in values.items():
        here, source = (*at, key), written_at and (*written_at, key)
        if value is None and written_at is not None and not at:
            continue  # `ssh: null` in defaults or a group: sets nothing
        if isinstance(value, dict):
            below = merged.get(key)
            merged[key] = _overlay(below if isinstance(below, dict) else {}, value, source, here, taken)
        else:
            merged[key] = value
            taken[here] = source
    return merged


# --------------------------------------------------------------------------- problems where they were written

_IN_A_HOST = re.compile(r"^hosts\[(\d+)\]\.(.*)$")


def relocated(problems: list[Problem], origins: dict[int, dict[str, str | None]]) -> list[Problem]:
    """Each problem with a value a host took from defaults or a group, reported where that value is
    written, once (40 hosts taking one bad value make one problem)."""
    result: list[Problem] = []
    reported: set[Problem] = set()
    for problem in problems:
        moved = _moved(problem, origins)
        if moved is problem or moved not in reported:
            result.append(moved)
        reported.add(moved)
    return result


def _moved(problem: Problem, origins: dict[int, dict[str, str | None]]) -> Problem:
    """The problem where the value it is about is written (as it is: a host's own value)."""
    match = _IN_A_HOST.match(problem.path)
    if not match:
        return problem
    field, taken = match[2], origins.get(int(match[1]), {})
    written = _longest_prefix(field, taken)
    if written is None or taken[written] is None:
        return problem
    source = taken[written] + field[len(written):]
    if field in CHECKED_AGAINST_THE_HOST:
        return Problem(problem.path, f"{problem.message} (the host takes it from {source})")
    return Problem(source, problem.message)


def _longest_prefix(field: str, taken: dict[str, str | None]) -> str | None:
    """The longest path in `taken` that is `field` or a field above it."""
    above = [path for path in taken if field == path or field.startswith((path + ".", path + "["))]
    return max(above, key=len, default=None)
