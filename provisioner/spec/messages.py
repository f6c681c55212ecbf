"""Pydantic's errors rephrased for people who edit YAML, the paths they name, and their order."""

from __future__ import annotations

import difflib
import re
from typing import Any, get_args, get_origin

from pydantic import BaseModel, ValidationError

from provisioner.spec.errors import Problem
from provisioner.spec.models import ENV_VALUE_TAGS, GpuPolicy, GpuSettings, Host, HostDefaults, HostGroup, Spec
from provisioner.spec.wording import show


def shape_problems(error: ValidationError) -> list[Problem]:
    """Pydantic's errors, rephrased for people who edit YAML."""
    return [Problem(path_of(tuple(part for part in detail["loc"] if part not in ENV_VALUE_TAGS)), _rephrase(detail))
            for detail in error.errors()]


def path_of(loc: tuple) -> str:
    """('instances', 2, 'options', 'max-model-len') → instances[2].options.max-model-len"""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z0-9_-]+", str(part)):
            path += f".{part}" if path else str(part)
        else:
            path += f"['{part}']"
    return path or "(spec)"


_TYPE_NAMES = {
    "string_type": "a string",
    "int_type": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "bool_type": "true or false",
    "list_type": "a list",
    "dict_type": "a mapping (key: value)",
    "model_type": "a mapping (key: value)",
    "model_attributes_type": "a mapping (key: value)",
}
_LIMITS = {
    "greater_than": ("gt", "must be greater than"),
    "greater_than_equal": ("ge", "must be at least"),
    "less_than": ("lt", "must be less than"),
    "less_than_equal": ("le", "must be at most"),
}


def _rephrase(detail: dict) -> str:
    kind, value, ctx = detail["type"], detail.get("input"), detail.get("ctx") or {}
    if kind == "extra_forbidden":
        return _unknown_key_message(detail["loc"])
    if kind == "missing":
        return "required — add it"
    if kind in _TYPE_NAMES:
        message = f"expected {_TYPE_NAMES[kind]}, got {show(value)}"
        if kind == "string_type" and isinstance(value, (int, float, bool)):
            message += " — put it in quotes"
        return message
    if kind in _LIMITS:
        key, words = _LIMITS[kind]
        return f"{words} {ctx[key]}, got {show(value)}"
    if kind == "too_short":
        return f"needs at least {ctx.get('min_length', 1)} entry, got none"
    if kind == "literal_error":
        return f"must be {ctx.get('expected')}, got {show(value)}"
    return str(detail["msg"])


def _unknown_key_message(loc: tuple) -> str:
    key = str(loc[-1])
    model = _model_at(loc[:-1])
    if model is None:
        return f"unknown key '{key}'"
    if key in _PER_HOST and key in _HOST_MODEL.get(model, BaseModel).model_fields:
        return _per_host_message(loc, key)
    allowed = list(model.model_fields)
    guess = difflib.get_close_matches(key, allowed, n=1)
    hint = f"did you mean '{guess[0]}'? " if guess else ""
    return f"unknown key '{key}' — {hint}allowed keys: {', '.join(allowed)}"


# The fields of a host that defaults and groups may not set, and why.
_PER_HOST = {
    "name": "each host has its own",
    "address": "each host has its own",
    "groups": "each host lists its own",
    "devices": "every GPU has its own UUID",
}
_HOST_MODEL = {HostDefaults: Host, HostGroup: Host, GpuPolicy: GpuSettings}  # what each shares values of


def _per_host_message(loc: tuple, key: str) -> str:
    """defaults.address, groups[1].gpus.devices: a host's own field set where hosts share values."""
    who = "defaults" if loc[0] == "defaults" else "a group"
    in_host = ".".join(str(part) for part in loc[2 if loc[0] == "groups" else 1:])
    return f"{who} cannot set {key} ({_PER_HOST[key]}) — set it on each host: hosts[].{in_host}"


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The model that validates the mapping at `loc` (list indexes skipped)."""
    model: type[BaseModel] | None = Spec
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(str(part)) if model else None
        if field is None:
            return None
        model = _model_in(field.annotation)
    return model


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds: itself, in a list, or the model of `Model | None`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) is list:
        return _model_in(get_args(annotation)[0])
    models = [model for arg in get_args(annotation) if (model := _model_in(arg))]
    return models[0] if len(models) == 1 else None


def spec_order(problem: Problem) -> tuple[int, int]:
    """Sort key: by section (version, hosts, instances) and entry; a stable sort keeps the rest in check order."""
    match = re.match(r"(\w+)(?:\[(\d+)\])?", problem.path)
    section, index = (match.group(1), int(match.group(2) or -1)) if match else ("", -1)
    sections = list(Spec.model_fields)
    return (sections.index(section) if section in sections else len(sections), index)


def gpu_label(host: Host, ref: int | str) -> str:
    """'GPU 0' for a device listed on the host (by index or UUID), 'GPU <uuid>' otherwise."""
    device = host.device(ref) if isinstance(ref, int) else host.device_by_uuid(ref)
    return f"GPU {device.index}" if device else f"GPU {ref}"
