"""Which `vllm serve` flags change what the model generates (semantics.yml): performance flags change speed and
memory only; semantic flags change what a request gets back. Profiles hold performance flags only, `provision
tune` searches semantic flags only when told to, and `provision plan` names each semantic flag an instance runs
with."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

import yaml

from provisioner.vllm.flags import human_readable_int_or_auto

SEMANTICS_FILE = Path(__file__).with_name("semantics.yml")
Kind = Literal["performance", "semantic"]


@cache
def classified() -> dict[str, tuple[Kind, str]]:
    """flag (long name without --) → (its kind, what it changes)."""
    data = yaml.safe_load(SEMANTICS_FILE.read_text(encoding="utf-8"))
    return {flag: (kind, " ".join(str(why).split())) for kind in ("performance", "semantic")
            for flag, why in (data.get(kind) or {}).items()}


def flag_kind(flag: str) -> Kind | None:
    """performance, semantic, or None where the flag is not classified (either spelling: max_model_len too)."""
    found = classified().get(flag.replace("_", "-"))
    return found[0] if found else None


def why(flag: str) -> str:
    found = classified().get(flag.replace("_", "-"))
    return found[1] if found else "not classified as a flag of speed and memory only"


@dataclass(frozen=True)
class SemanticChange:
    instance: str
    flag: str
    value: Any
    why: str

    @property
    def text(self) -> str:
        return f"{self.instance}: {self.flag}={self.value} changes what the model generates — {self.why}"


def semantic_changes(instance: str, options: dict[str, Any], context: int | None = None) -> list[SemanticChange]:
    """Each semantic flag of an instance's `vllm serve` options. `context`: the model's own context length, where
    known: a max-model-len at or above it (or auto) changes nothing the model generates."""
    return [SemanticChange(instance, flag, value, why(flag)) for flag, value in options.items()
            if flag_kind(flag) == "semantic"
            and not (flag.replace("_", "-") == "max-model-len" and _whole_context(value, context))]


def _whole_context(value: Any, context: int | None) -> bool:
    try:
        length = human_readable_int_or_auto(str(value))
    except ValueError:
        return False
    return length == -1 or (context is not None and length >= context)
