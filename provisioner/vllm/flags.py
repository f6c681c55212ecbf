"""`vllm serve` flags checked against the catalog of the pinned vLLM version.

The catalogs (catalogs/vllm-<version>.json) are generated from vLLM's own parser by
`python -m provisioner.vllm.make_catalog` in a venv with that vLLM; a version without one is not
supported. `option_problems(version, options)` checks an instance's `options` (long flag names
without `--`, as the `vllm serve --config` file takes them) and says, per bad option, what is wrong
and the fix: an unknown flag with the flag meant ("did you mean"), a value outside the choices, a
value of the wrong type. The parser on the host (role vllm_service, vllm-check-args) checks the
rendered file again with the installed vLLM itself.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

CATALOGS_DIR = Path(__file__).resolve().parent / "catalogs"

# Flags the write-ups our users copy from use, which no vLLM has, and what they meant.
INVENTED_FLAGS = {
    "disable-cuda-graph": "enforce-eager",  # an SGLang flag; vLLM's eager mode turns CUDA graphs off
    "cuda-graph-capture-size": "max-cudagraph-capture-size",
    "swap-space": "kv-offloading-size",  # CPU swap of the KV cache is gone; offloading replaced it
}
# Values they use that vLLM spells otherwise.
VALUE_SPELLINGS = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}
HUMAN_INT = re.compile(r"^(\d+(?:\.\d+)?)([kKmM]?)$")


@dataclass(frozen=True)
class Option:
    key: str  # the long name without -- (the config file's key)
    names: tuple[str, ...]
    kind: str  # flag | bool_optional | int | float | str | json | human_int | bool | other
    choices: tuple[str, ...] | None
    nargs: Any
    negative: str | None  # --no-<key> of a BooleanOptionalAction
    help: str
    positive: str | None = None  # for such a negative (its own entry here): the key it turns off

    @property
    def takes_list(self) -> bool:
        return self.nargs in ("+", "*") or (isinstance(self.nargs, int) and self.nargs > 1)


@dataclass(frozen=True)
class Catalog:
    version: str
    options: dict[str, Option]

    def option(self, key: str) -> Option | None:
        """By long name (dashes or underscores), or by any of its names (`tp` → tensor-parallel-size)."""
        key = key.replace("_", "-")
        if key in self.options:
            return self.options[key]
        return None

    def by_alias(self, key: str) -> Option | None:
        """The option whose other name (a short alias such as -tp) `key` is."""
        wanted = {f"-{key}", f"--{key}", f"--{key.replace('_', '-')}"}
        return next((option for option in self.options.values()
                     if wanted & set(option.names[1:]) - {option.negative}), None)

    def negative_of(self, key: str) -> str | None:
        """The key that turns `key` off: `no-enable-prefix-caching` (0.25) or whatever the catalog has."""
        option = self.option(key)
        if option and option.negative:
            return option.negative.removeprefix("--")
        return None


def supported_versions() -> list[str]:
    return sorted(path.stem.removeprefix("vllm-") for path in CATALOGS_DIR.glob("vllm-*.json"))


@cache
def load_catalog(version: str) -> Catalog:
    """The `vllm serve` options of `version`; ValueError naming the supported versions when there is no catalog."""
    path = CATALOGS_DIR / f"vllm-{version}.json"
    if not path.is_file():
        raise ValueError(f"no flag catalog for vLLM {version} — use one of {', '.join(supported_versions())}, "
                         f"or generate one: python -m provisioner.vllm.make_catalog in a venv with vllm=={version}")
    serve = json.loads(path.read_text(encoding="utf-8"))["commands"]["serve"]
    options = {
        key: Option(key, tuple(entry["names"]), entry["kind"],
                    tuple(entry["choices"]) if entry.get("choices") else None,
                    entry.get("nargs"), entry.get("negative"), entry.get("help") or "")
        for key, entry in serve["options"].items()
    }
    negatives = {  # --no-enable-prefix-caching, --disable-prefix-caching: each a flag of its own in a config file
        name.removeprefix("--"): Option(name.removeprefix("--"), (name,), "flag", None, 0, None,
                                        f"turns --{key} off", positive=key)
        for key, entry in serve["options"].items()
        for name in entry.get("negatives") or [entry["negative"]] if name
    }
    return Catalog(version, {**negatives, **options})


def option_problems(version: str, options: dict[str, Any]) -> dict[str, str]:
    """{key: 'what is wrong — the fix'} for each option `version`'s `vllm serve` would reject."""
    catalog = load_catalog(version)
    problems = {}
    for key, value in options.items():
        option = catalog.option(key)
        message = unknown_flag(catalog, key) if option is None else value_problem(catalog, option, value)
        if message:
            problems[key] = message
    return problems


def unknown_flag(catalog: Catalog, key: str) -> str:
    normalized = key.replace("_", "-")
    alias = catalog.by_alias(key)
    if alias is not None:
        return f"'{key}' is a short alias, which a config file does not take — write '{alias.key}'"
    meant = INVENTED_FLAGS.get(normalized)
    if meant and catalog.option(meant):
        return f"vLLM {catalog.version} has no flag --{normalized} — did you mean '{meant}'? ({catalog.option(meant).help})"
    close = difflib.get_close_matches(normalized, catalog.options, n=3, cutoff=0.75)
    hint = f" — did you mean {' or '.join(repr(name) for name in close)}?" if close else \
        " — remove it (`vllm serve --help` lists the flags)"
    return f"vLLM {catalog.version} has no flag --{normalized}{hint}"


def value_problem(catalog: Catalog, option: Option, value: Any) -> str | None:
    if option.kind in ("flag", "bool_optional"):
        if value is True:
            return None
        if value is False:
            negative = option.positive or catalog.negative_of(option.key)
            fix = f"write `{negative}: true`" if negative else "remove it (it is off unless given)"
            return f"false is dropped by vLLM's config file reader, so the default stays — {fix}"
        return f"--{option.key} takes no value — write `{option.key}: true`, or remove it"
    values = value if isinstance(value, list) else [value]
    if isinstance(value, list) and not option.takes_list:
        return f"--{option.key} takes one value, not a list — give one"
    for item in values:
        message = item_problem(option, item)
        if message:
            return message
    return None


def item_problem(option: Option, item: Any) -> str | None:
    if option.choices is not None:
        text = str(item)
        if text in option.choices:
            return None
        meant = VALUE_SPELLINGS.get(text.lower())
        close = [meant] if meant in option.choices else difflib.get_close_matches(text, option.choices, n=2, cutoff=0.6)
        hint = f"did you mean {' or '.join(repr(name) for name in close)}? " if close else ""
        return f"'{text}' is not a choice of --{option.key} — {hint}choices: {', '.join(option.choices)}"
    kind = option.kind
    if isinstance(item, bool) and kind != "bool":
        return f"--{option.key} takes {_a(kind)}, not true/false"
    if kind == "int" and not (isinstance(item, int) or re.fullmatch(r"-?\d+", str(item))):
        return f"'{item}' is not an integer — --{option.key} takes one, e.g. 4096"
    if kind == "float" and not isinstance(item, (int, float)):
        try:
            float(str(item))
        except ValueError:
            return f"'{item}' is not a number — --{option.key} takes one, e.g. 0.5"
    if kind == "human_int":
        try:
            length(item)
        except ValueError:
            return f"'{item}' is not a length — --{option.key} takes an integer or 32k / 1M / auto"
    if kind == "json" and isinstance(item, str):
        text = item.strip()
        if text.startswith(("{", "[")):
            try:
                json.loads(text)
            except ValueError as error:
                return f"--{option.key}: invalid JSON ({error}) — give a mapping, e.g. {{cudagraph_mode: NONE}}"
    return None


def length(value: Any) -> int | None:
    """A token count as vLLM reads it: 4096, '32k' (×1000), '32K' (×1024), '1M'; None / 'auto' / -1: the default."""
    if value is None or str(value).lower() in ("auto", "-1"):
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    match = HUMAN_INT.match(str(value))
    if not match:
        raise ValueError(f"cannot read {value!r} as a number of tokens")
    number, unit = match.groups()
    return int(float(number) * {"": 1, "k": 1000, "K": 1024, "m": 10**6, "M": 2**20}[unit])


def _a(kind: str) -> str:
    return {"int": "an integer", "float": "a number", "human_int": "a length", "json": "a mapping (JSON)",
            "str": "a string"}.get(kind, "a value")
