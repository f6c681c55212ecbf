"""Candidates, their outcomes against the SLO, the search, the Pareto front and the winner.

The search is Seed 2's method: measure the baseline (the instance as deployed), then one flag at a
time (the axes in order) measure each of its values on top of what was kept so far, and keep the
value that measurably helps: a candidate that meets the SLO where the current one does not; or, both
meeting it, more than `min_gain` more throughput; or, neither meeting it, a worst SLO term more than
`min_gain` closer to its limit. Deterministic given the measurements. A budget (seconds, candidates)
bounds it. The winner is chosen from every candidate measured: the highest throughput meeting the SLO.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from provisioner.bench.loads import Arrivals
from provisioner.bench.results import RunSet
from provisioner.tune.slo import Slo
from provisioner.tune.space import Axis

MIN_GAIN = 0.02  # what "measurably" means: bench compare's tolerance too


@dataclass(frozen=True)
class Candidate:
    """The flags changed from the deployed config (none: the baseline), in the order they were set."""

    changes: tuple[tuple[str, Any], ...] = ()

    @property
    def label(self) -> str:
        """baseline, or max-num-batched-tokens=4096,max-num-seqs=64 (a run set's folder name)."""
        return ",".join(f"{flag}={value_text(value)}" for flag, value in self.changes) or "baseline"

    def set(self, flag: str, value: Any) -> "Candidate":
        return Candidate(tuple((key, item) for key, item in self.changes if key != flag) + ((flag, value),))

    def as_dict(self) -> dict[str, Any]:
        return dict(self.changes)


def value_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "-".join(map(str, value))
    return str(value)


@dataclass
class Outcome:
    """A candidate's run set read against the SLO."""

    name: str
    changes: dict[str, Any]
    throughput: float  # output tok/s at the load's highest concurrency
    ratios: dict[str, float | None]  # per SLO term, the worst measured/limit over the concurrencies
    values: dict[str, float | None]  # per SLO term, the worst measured value (ms; goodput: the share)
    concurrency: int
    run_set: RunSet | None = None
    note: str = ""  # why it has no measurements (a capacity trial that lost requests)

    @property
    def meets(self) -> bool:
        return all(ratio is not None and ratio <= 1 for ratio in self.ratios.values())

    @property
    def worst(self) -> float:
        """The tightest term's measured/limit (1.0: at the limit); inf where a term was not reported."""
        return max((math.inf if ratio is None else ratio for ratio in self.ratios.values()), default=0.0)


def evaluate(run_set: RunSet, slo: Slo, name: str | None = None, changes: dict[str, Any] | None = None,
             at: Arrivals | None = None) -> Outcome:
    """The run set against the SLO: every concurrency it measured must meet it; or, `at` a request rate (a
    tune's --rate), the runs at that rate alone (a run set without them: every term unreported)."""
    summary = run_set.summary()
    judged = [run_set.rate_summary().get(at, {})] if at else [summary[c] for c in sorted(summary)]
    ratios: dict[str, float | None] = {}
    values: dict[str, float | None] = {}
    for measured in judged:
        for term, ratio in slo.ratios(measured).items():
            if ratio is None or ratios.get(term, 0.0) is None:
                ratios[term] = None
            else:
                ratios[term] = max(ratios.get(term, ratio), ratio)
        for bound in slo.bounds:
            value = measured.get(bound.key)
            values[bound.label] = None if value is None or values.get(bound.label, 0.0) is None \
                else max(values.get(bound.label, value), value)
        if slo.min_goodput is not None:
            good, total = measured.get("request_goodput"), measured.get("request_throughput")
            share = good / total if good is not None and total else None
            label = next(term for term in slo.ratios(measured) if term.startswith("goodput"))
            values[label] = None if share is None or values.get(label, 1.0) is None else min(values.get(label, share), share)
    top = max(summary) if summary else (at.max_concurrency if at else 0)
    throughput = (summary[top] if summary else judged[0] if judged else {}).get("output_throughput", 0.0)
    return Outcome(name or run_set.name, dict(changes or {}), throughput, ratios, values, top, run_set)


def better(new: Outcome, old: Outcome, min_gain: float = MIN_GAIN) -> bool:
    """Does `new` measurably help over `old` (module docstring)?"""
    if new.meets != old.meets:
        return new.meets
    if new.meets:
        return new.throughput > old.throughput * (1 + min_gain)
    return new.worst < old.worst * (1 - min_gain)


@dataclass(frozen=True)
class Choice:
    winner: Outcome | None  # the highest throughput meeting the SLO
    closest: Outcome | None  # none meets it: the one nearest to it (lowest worst term)
    note: str = ""


def choose(outcomes: list[Outcome], reference: Outcome | None = None, min_gain: float = MIN_GAIN) -> Choice:
    """The highest throughput meeting the SLO (ties: the first measured); none: the closest. With a
    reference (the baseline) that meets the SLO, a winner not measurably (min_gain) faster is no
    reason to change the config: the reference wins, and the note says so."""
    meeting = [outcome for outcome in outcomes if outcome.meets]
    if not meeting:
        return Choice(None, min(outcomes, key=lambda outcome: outcome.worst) if outcomes else None)
    best = max(meeting, key=lambda outcome: outcome.throughput)
    if reference is not None and reference.meets and best is not reference \
            and best.throughput <= reference.throughput * (1 + min_gain):
        return Choice(reference, None, f"{best.name} was {(best.throughput / reference.throughput - 1) * 100:+.1f} % "
                                       f"faster, within the {min_gain * 100:g} % noise: the deployed config stays")
    return Choice(best, None)


def pareto_front(outcomes: list[Outcome]) -> list[Outcome]:
    """Those no other outcome beats on both throughput (higher) and the tightest SLO term (lower),
    by their tightest term."""
    def dominated(one: Outcome) -> bool:
        return any(other.throughput >= one.throughput and other.worst <= one.worst
                   and (other.throughput > one.throughput or other.worst < one.worst) for other in outcomes)
    return sorted((outcome for outcome in outcomes if not dominated(outcome)), key=lambda outcome: outcome.worst)


class Skipped(Exception):
    """A candidate that cannot be measured (not recorded; refused by validation); the message says why."""


@dataclass
class Budget:
    seconds: float | None = None
    candidates: int | None = None
    clock: Callable[[], float] = time.monotonic


@dataclass
class SearchResult:
    outcomes: list[Outcome] = field(default_factory=list)  # in the order measured
    kept: Candidate = Candidate()
    notes: list[str] = field(default_factory=list)  # skipped candidates, where the budget stopped it
    min_gain: float = MIN_GAIN

    @property
    def choice(self) -> Choice:
        baseline = next((outcome for outcome in self.outcomes if outcome.name == "baseline"), None)
        return choose(self.outcomes, baseline, self.min_gain)


Measure = Callable[[Candidate], Outcome]


def search(axes: tuple[Axis, ...], measure: Measure, budget: Budget | None = None, min_gain: float = MIN_GAIN,
           deployed: dict[str, Any] | None = None) -> SearchResult:
    """Coordinate descent (module docstring). measure(candidate) → Outcome, or Skipped; deployed: the
    instance's options as deployed (a value it already has is not measured again)."""
    budget = budget or Budget()
    deployed = {key.replace("_", "-"): value for key, value in (deployed or {}).items()}
    result = SearchResult(min_gain=min_gain)
    start = budget.clock()
    durations: list[float] = []

    def run(candidate: Candidate) -> Outcome | None:
        """Measure one candidate (a skipped one counts toward neither budget)."""
        if budget.candidates is not None and len(durations) >= budget.candidates:
            raise _BudgetSpent(f"stopped at the budget of {budget.candidates} candidates")
        if budget.seconds is not None and durations:
            elapsed, each = budget.clock() - start, sum(durations) / len(durations)
            if elapsed + each > budget.seconds:
                raise _BudgetSpent(f"stopped at the time budget: {elapsed:.0f} s of {budget.seconds:.0f} s spent, "
                                   f"a candidate takes about {each:.0f} s")
        began = budget.clock()
        try:
            outcome = measure(candidate)
        except Skipped as why:
            result.notes.append(f"{candidate.label}: skipped — {why}")
            return None
        durations.append(budget.clock() - began)
        result.outcomes.append(outcome)
        return outcome

    try:
        current_candidate = Candidate()
        current = run(current_candidate)
        if current is None:
            result.notes.append("the baseline could not be measured: nothing to compare with")
            return result
        for axis in axes:
            best, best_candidate = current, current_candidate
            for value in axis.values:
                if deployed.get(axis.flag) == value and axis.flag not in current_candidate.as_dict():
                    continue  # the deployed config already has it: that is the current outcome
                candidate = current_candidate.set(axis.flag, value)
                outcome = run(candidate)
                if outcome is not None and better(outcome, best, min_gain):
                    best, best_candidate = outcome, candidate
            current, current_candidate = best, best_candidate
    except _BudgetSpent as spent:
        result.notes.append(str(spent))
    result.kept = current_candidate
    return result


class _BudgetSpent(Exception):
    pass
