"""Capacity: the highest request rate one instance sustains within the SLO (issue 37, point 3).

vLLM's goodput view of a server: requests arrive at a rate (a Poisson process, or gamma arrivals), and the
SLO holds or not at that rate. The search starts at a rate, doubles it while the SLO holds (halves it while it
does not), then halves the gap between the highest rate that held and the lowest that did not until
they are within PRECISION of each other, or the trials run out. Deterministic given the measurements: a rate
measured once is not measured again. The answer is the highest rate measured to hold, never one in between.

Each trial is a run set of runs at that rate alone (RESULTS/NAME/capacity-q<RATE>/); the result is kept as
RESULTS/NAME/capacity.json and, with `tune --write`, in the instance's `capacity:` in the spec, which `provision
plan` reads to say how many replicas a gateway route's rate takes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from provisioner.bench.loads import Arrivals
from provisioner.tune.search import Outcome, Skipped

STEP = 2.0  # how far each trial moves while the SLO keeps holding (or failing)
PRECISION = 0.05  # the answer is within 5 % of the rate where the SLO stops holding
MAX_TRIALS = 12
CAPACITY_FILE = "capacity.json"
CAPACITY_TRIAL = "capacity-"  # a trial's run set: RESULTS/NAME/capacity-q<RATE>-b<B>


LOST = "every request completes"  # the term a trial misses where requests were lost (not an SLO term of the user's)


@dataclass(frozen=True)
class Trial:
    rate: float
    meets: bool
    worst: float | None  # the tightest SLO term's measured / limit (≤ 1: meets); None: not measured (requests lost)
    run_set: str  # its folder under RESULTS/NAME, or why it has none


def unsustained(name: str, changes: dict[str, Any], why: str) -> Outcome:
    """A trial whose requests did not all complete (the bench refused its result): the rate is not sustained."""
    return Outcome(name, dict(changes), 0.0, {LOST: None}, {LOST: None}, 0, note=why)


@dataclass
class Capacity:
    rate: float | None  # the highest rate measured to meet the SLO; None: not even the lowest tried
    slo: str
    arrivals: dict[str, float]  # burstiness, max_concurrency, seconds: the shape of every trial
    changes: dict[str, Any]  # the config measured (the tune's winner, as changes from the deployed one)
    trials: list[Trial] = field(default_factory=list)
    measured: str = ""  # when (UTC, ISO 8601)
    notes: list[str] = field(default_factory=list)

    @property
    def bracket(self) -> tuple[float | None, float | None]:
        """(the highest rate that held, the lowest that did not)."""
        held = [trial.rate for trial in self.trials if trial.meets]
        missed = [trial.rate for trial in self.trials if not trial.meets]
        return (max(held) if held else None, min(missed) if missed else None)

    def save(self, folder: Path) -> Path:
        path = folder / CAPACITY_FILE
        path.write_text(json.dumps(asdict(self), indent=1) + "\n", encoding="utf-8")
        return path


MeasureAt = Callable[[Arrivals], Outcome]  # the configured instance measured at these arrivals, or Skipped


def find_capacity(measure_at: MeasureAt, start: Arrivals, slo: str, changes: dict[str, Any] | None = None,
                  max_trials: int = MAX_TRIALS) -> Capacity:
    """The capacity search of the module docstring, from `start` (its rate; its shape for every trial)."""
    capacity = Capacity(None, slo, {"burstiness": start.burstiness, "max_concurrency": start.max_concurrency,
                                    "seconds": start.seconds}, dict(changes or {}),
                        measured=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    tried: dict[float, Trial] = {}

    def trial(rate: float) -> Trial | None:
        if len(tried) >= max_trials:
            return None
        arrivals = Arrivals(rate, start.burstiness, start.max_concurrency, start.seconds)
        try:
            outcome = measure_at(arrivals)
        except Skipped as why:
            capacity.notes.append(f"{arrivals.label}: not measured — {why}")
            return None
        tried[rate] = Trial(rate, outcome.meets, outcome.worst if math.isfinite(outcome.worst) else None, outcome.name)
        capacity.trials.append(tried[rate])
        if outcome.note:
            capacity.notes.append(f"{arrivals.label}: {outcome.note}")
        return tried[rate]

    first = trial(start.rate)
    if first is None:
        return capacity
    rate = first.rate
    while True:  # out from the start until the SLO changes its answer
        rate = round(rate * STEP if first.meets else rate / STEP, 3)
        step = None if rate in tried or rate <= 0 else trial(rate)
        if step is None or step.meets != first.meets:
            break
    while True:  # then between the two
        held, missed = capacity.bracket
        if held is None or missed is None or (missed - held) / held <= PRECISION:
            break
        middle = round((held + missed) / 2, 3)
        if middle in tried or trial(middle) is None:
            break
    capacity.rate, missed = capacity.bracket
    if capacity.rate is None:
        capacity.notes.append(f"the SLO was not met at any rate tried, down to {min(tried):g}/s")
    elif missed is None:
        capacity.notes.append(f"the SLO held at every rate tried, up to {max(tried):g}/s: the capacity is at least that")
    return capacity


def start_rate(outcome: Outcome) -> float | None:
    """Where the search starts without --rate: 80 % of the requests/s the candidate served at its highest
    concurrency (a burst keeps the server saturated: what it can serve at best, before any SLO)."""
    if outcome.run_set is None:
        return None
    top = outcome.run_set.summary().get(outcome.concurrency, {})
    served = top.get("request_throughput")
    return round(served * 0.8, 3) if served else None
