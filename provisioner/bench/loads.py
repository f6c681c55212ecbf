"""Named load profiles (loads.yml): what one `provision bench` run set sends; and arrivals at a request rate
(Poisson, or gamma for bursts), which a tune measures beside the load's fixed concurrencies."""

from __future__ import annotations

import math
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


# requests in flight at most, at a rate: vLLM's bench client holds a request back (a semaphore) once this many
# are in flight and starts its clock only when it sends it, so a low cap would hide the queue an overloaded
# server builds; this one keeps the queue in the server, where TTFT counts it
MAX_IN_FLIGHT = 1024


@dataclass(frozen=True)
class Arrivals:
    """Requests arriving at `rate` per second, the gaps between them drawn from a gamma distribution (vLLM's
    `bench serve --request-rate R --burstiness B`: B = 1 is a Poisson process, B < 1 burstier, B > 1 more even),
    at most `max_concurrency` in flight, for about `seconds` (the run sends rate × seconds requests)."""

    rate: float
    burstiness: float = 1.0
    max_concurrency: int = MAX_IN_FLIGHT
    seconds: float = 30.0

    def num_prompts(self, minimum: int) -> int:
        return max(minimum, math.ceil(self.rate * self.seconds))

    @property
    def label(self) -> str:
        """36/s Poisson, or 36/s gamma 0.5."""
        shape = "Poisson" if self.burstiness == 1 else f"gamma {self.burstiness:g}"
        return f"{self.rate:g}/s {shape}"

    @property
    def key(self) -> str:
        """The runs' file names and a summary's key: q36-b1."""
        return f"q{self.rate:g}-b{self.burstiness:g}"


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
