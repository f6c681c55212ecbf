"""`vllm serve` flags checked against the catalog of the pinned vLLM version.

The catalogs (catalogs/vllm-<version>.json) are generated from vLLM's own parser by
`python -m provisioner.vllm.make_catalog` in a venv with that vLLM; a version without one is not
supported. `option_problems(version, options)` checks an instance's `options` (long flag names
without `--`, as the `vllm serve --config` file takes them) and says, per bad option, what is wrong
and the fix: an unknown flag with the flag meant ("did you mean"), a value outside the choices, a
value of the wrong type. A value is read as vLLM's parser reads the argument its config-file reader
makes of it (`str(value)`; `true`: the option alone): integers by int(), sizes by vLLM's own
human_readable_int rules, `auto` only where the option's type takes it; each catalog records what the
real parser made of a matrix of forms per option (`value_forms`), and the tests hold these readers to
it. The parser on the host (role vllm_service, vllm-check-args) checks the rendered file again with
the installed vLLM itself.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from provisioner.vllm.make_catalog import NO_VALUE  # the catalog's name for the option given alone

CATALOGS_DIR = Path(__file__).resolve().parent / "catalogs"

# Flags the write-ups our users copy from use, which no vLLM has, and what they meant.
INVENTED_FLAGS = {
    "disable-cuda-graph": "enforce-eager",  # an SGLang flag; vLLM's eager mode turns CUDA graphs off
    "cuda-graph-capture-size": "max-cudagraph-capture-size",
    "swap-space": "kv-offloading-size",  # CPU swap of the KV cache is gone; offloading replaced it
}
# Values they use that vLLM spells otherwise.
VALUE_SPELLINGS = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}


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
    type_name: str = ""  # the parser's type callable: int, human_readable_int_or_auto, optional_type._optional_type…

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
                    entry.get("nargs"), entry.get("negative"), entry.get("help") or "",
                    type_name=entry.get("type_name") or "")
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
    if item is True and option.nargs == "?":
        return None  # `key: true` passes the option alone: argparse gives it its const
    if isinstance(item, bool) and kind != "bool":
        return f"--{option.key} takes {_a(kind)}, not true/false"
    if kind in VALUE_READERS or isinstance(item, str):
        try:
            read_value(option, config_form(item))
        except ValueError as error:
            return f"'{item}' {error}".replace(" — takes ", f" — --{option.key} takes ", 1)
    if kind == "json" and isinstance(item, str):
        text = item.strip()
        if text.startswith(("{", "[")):
            try:
                json.loads(text)
            except ValueError as error:
                return f"--{option.key}: invalid JSON ({error}) — give a mapping, e.g. {{cudagraph_mode: NONE}}"
    return None


def config_form(value: Any) -> str:
    """The argument vLLM's config-file reader (FlexibleArgumentParser.load_config_file) makes of a
    value: `str(value)`, NO_VALUE for true (the option alone); a list's items one by one."""
    return NO_VALUE if value is True else str(value)


# The type callables of vLLM 0.25's parser, as the catalog names them, read the same way
# (vllm/utils/argparse_utils.py: human_readable_int, human_readable_int_or_auto; vllm/engine/arg_utils.py:
# optional_type). Each raises ValueError saying what is wrong and the fix ("— takes …": the option's
# name goes before "takes") for what vLLM's parser refuses. The
# catalog records what the real parser made of a matrix of forms (value_forms);
# tests/unit/test_spec_holes.py checks these agree with it on every option and form.
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_SUFFIXED = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")


def human_readable_int(text: str) -> int:
    """vLLM's human_readable_int: 4096, 25.6k (k m g t: ×1000ⁿ), 8G (K M G T: ×1024ⁿ, whole numbers only)."""
    text = text.strip()
    match = _SUFFIXED.fullmatch(text)
    if match:
        number, suffix = match.groups()
        if suffix in _DECIMAL:
            return int(float(number) * _DECIMAL[suffix])
        if "." in number:
            raise ValueError(f"has a decimal with a binary suffix ({suffix}: ×{_BINARY[suffix]:,}), which vLLM "
                             f"refuses — write {number}{suffix.lower()} (×{_DECIMAL[suffix.lower()]:,}) or a whole "
                             "number of a smaller unit")
        return int(number) * _BINARY[suffix]
    try:
        return int(text)
    except ValueError:
        raise ValueError("is not a size vLLM reads — takes an integer, or one with a suffix: k, m, g, t (×1000ⁿ, "
                         "decimals allowed: 25.6k) or K, M, G, T (×1024ⁿ, whole numbers: 8G)") from None


def human_readable_int_or_auto(text: str) -> int:
    """vLLM's human_readable_int_or_auto: as human_readable_int, or -1 / auto (any case): -1."""
    if text.strip() == "-1" or text.strip().lower() == "auto":
        return -1
    try:
        return human_readable_int(text)
    except ValueError as error:
        raise ValueError(f"{error}, or auto" if str(error).startswith("is not") else str(error)) from None


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError("is not an integer — takes one, e.g. 4096") from None


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError("is not a number — takes one, e.g. 0.5") from None


VALUE_READERS = {"int": _integer, "float": _number, "human_int": human_readable_int}
# An argument that starts with '-': vLLM's FlexibleArgumentParser.parse_args rewrites one holding a '.'
# as a dotted option (-x.y VALUE) and one starting with -O as --optimization-level; argparse (Python
# 3.11: the hosts' Debian bookworm, the catalogs' Python) reads the others as options unless they are
# '-' alone, a negative integer (this pattern) or hold a space.
_NEGATIVE_NUMBER = re.compile(r"^-\d+$")


def _read_as_a_value(text: str) -> bool:
    if not text.startswith("-"):
        return True
    if "." in text or text.startswith("-O"):
        return False
    return text == "-" or bool(_NEGATIVE_NUMBER.match(text)) or " " in text


def read_value(option: Option, text: str) -> Any:
    """What `--<option> <text>` sets, as vLLM's parser reads it; ValueError (with the fix) where it refuses."""
    if text == NO_VALUE:
        if option.nargs == "?":
            return True
        raise ValueError(f"is no value: --{option.key} needs one")
    if not _read_as_a_value(text):
        raise ValueError(f"starts with '-', so vLLM's parser takes it for an option and --{option.key} for a flag "
                         "without its value — write the value without the leading '-'")
    reader = human_readable_int_or_auto if option.type_name == "human_readable_int_or_auto" else \
        VALUE_READERS.get(option.kind, str)
    if option.type_name.startswith("optional_type") and text in ("", "None"):
        return None
    return reader(text)


def length(value: Any) -> int | None:
    """A token count as vLLM reads it (human_readable_int_or_auto): 4096, '32k' (×1000), '32K' (×1024),
    '1M', '1.5m'; None / 'auto' / -1: the default."""
    if value is None:
        return None
    number = human_readable_int_or_auto(str(value))
    return None if number == -1 else number


def _a(kind: str) -> str:
    return {"int": "an integer", "float": "a number", "human_int": "a length", "json": "a mapping (JSON)",
            "str": "a string"}.get(kind, "a value")
