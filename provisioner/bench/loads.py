"""Named load profiles (loads.yml): what one `provision bench` run set sends."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

LOADS_FILE = Path(__file__).with_name("loads.yml")


@dataclass(frozen=True)
class Load:
    name: str
    description: str
    input_len: int
    output_len: int
    concurrency: tuple[int, ...]
    prompts_per_client: int
    min_prompts: int

    def num_prompts(self, concurrency: int) -> int:
        return max(self.min_prompts, concurrency * self.prompts_per_client)


def load_profiles(path: Path = LOADS_FILE) -> dict[str, Load]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    return {name: Load(name=name, **{**fields, "concurrency": tuple(fields["concurrency"])})
            for name, fields in data.items()}


def get_load(name: str) -> Load:
    """The named profile; an unknown name raises ValueError listing the known ones."""
    profiles = load_profiles()
    if name not in profiles:
        raise ValueError(f"--load {name!r}: no load profile of that name — choose one of: {', '.join(profiles)}")
    return profiles[name]
