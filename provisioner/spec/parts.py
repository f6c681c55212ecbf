"""The hosts and instances that passed pass 1, which the checks of pass 2 run on."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, TypeVar

from pydantic import BaseModel, ValidationError

from provisioner.spec.errors import Problem
from provisioner.spec.messages import path_of
from provisioner.spec.models import Gateway, Host, HostGroup, Instance, Monitoring, Spec

_M = TypeVar("_M", bound=BaseModel)


class SpecParts(NamedTuple):
    """The hosts and instances that passed pass 1 (None where one did not), in spec order."""

    hosts: list[Host | None]
    instances: list[Instance | None]
    host_names: list[str] | None  # names declared, also by hosts that failed pass 1; None: no list of hosts
    gateways: list[Gateway | None] = []
    groups: list[HostGroup | None] = []  # the entries of `groups:`
    listed_groups: list[str] | None = None  # the groups hosts list, also hosts that failed pass 1; None: unknown
    monitoring: Monitoring | None = None  # the spec's monitoring: section (None: none, or it failed pass 1)


def parts_of(spec: Spec) -> SpecParts:
    """A spec that passed pass 1, as parts."""
    return SpecParts(list(spec.hosts), list(spec.instances), [host.name for host in spec.hosts],
                     list(spec.gateways), list(spec.groups), [group for host in spec.hosts for group in host.groups],
                     spec.monitoring)


def salvage(data: dict, context: dict) -> SpecParts:
    """The hosts and instances of `data` that validate one by one (after the whole spec did not)."""
    def each(items: Any, model: type[_M]) -> list[_M | None]:
        if not isinstance(items, list):
            return []
        return [_validated_or_none(model, item, context) for item in items]

    raw_hosts = data.get("hosts")
    names = listed = None
    if isinstance(raw_hosts, list):
        names = [item["name"] for item in raw_hosts if isinstance(item, dict) and isinstance(item.get("name"), str)]
        listed = [group for item in raw_hosts if isinstance(item, dict) and isinstance(item.get("groups"), list)
                  for group in item["groups"] if isinstance(group, str)]
    return SpecParts(each(raw_hosts, Host), each(data.get("instances"), Instance), names,
                     each(data.get("gateways"), Gateway), each(data.get("groups"), HostGroup), listed,
                     _validated_or_none(Monitoring, data["monitoring"], context) if data.get("monitoring") else None)


def without_hosts(parts: SpecParts, indexes: set[int]) -> SpecParts:
    """The parts with the hosts at `indexes` taken out of pass 2 (as if they had failed pass 1)."""
    return parts._replace(hosts=[None if index in indexes else host for index, host in enumerate(parts.hosts)])


def _validated_or_none(model: type[_M], item: Any, context: dict) -> _M | None:
    try:
        return model.model_validate(item, context=context)
    except ValidationError:
        return None


def present(items: list[_M | None]) -> Iterator[tuple[int, _M]]:
    """(index, item) of the items that passed pass 1."""
    return ((index, item) for index, item in enumerate(items) if item is not None)


def keyed_problems(where: tuple, mapping: dict[str, Any], problem: Callable[[str, Any], str | None]) -> list[Problem]:
    """One Problem per key of `mapping` that `problem(key, value)` finds fault with."""
    return [
        Problem(path_of((*where, key)), message)
        for key, value in mapping.items()
        if (message := problem(key, value))
    ]
