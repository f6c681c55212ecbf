"""Measuring candidates: live on the instance's host, or from run sets recorded before (offline).

Live: each candidate is a changed spec, validated like any spec and planned (`changed_spec`, the path
`bench --sweep` takes) before the host is touched, checked by the installed vLLM's parser on the host,
written over the instance's config file, the unit restarted; then `vllm bench serve` through the bench
session (repeats interleaved, a fresh seed per run, medians), its run set kept as
RESULTS/NAME/<candidate label>/. The deployed config is put back byte for byte afterwards
(`restored_config`, as `bench --sweep`), also on Ctrl-C, SIGTERM, SIGHUP or a failure.

vLLM 0.25 has `vllm bench sweep serve`, but it starts `vllm serve` itself: outside the instance's
systemd unit, its hardening and this validation and restore. So each candidate runs in the deployed
unit and is measured with `vllm bench serve`, whose result JSONs are the same either way.

Offline: RESULTS/NAME/<candidate label>/ as above (or recorded elsewhere with `provision bench run
--baseline <label>`, or by hand: runs/c<C>-r<R>.json being `vllm bench serve --save-result` files).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from provisioner.base.secrets import redact
from provisioner.bench.loads import Arrivals, Load
from provisioner.bench.results import ResultError, load_run_set
from provisioner.bench.session import BenchError, OnRun, run_bench
from provisioner.bench.sweep import changed_spec, restored_config
from provisioner.bench.target import BenchTarget, bench_target
from provisioner.spec import Spec, SpecError
from provisioner.tune.capacity import CAPACITY_TRIAL, MAX_TRIALS, Capacity, find_capacity, start_rate, unsustained
from provisioner.tune.search import Budget, Candidate, Outcome, SearchResult, Skipped, evaluate, search
from provisioner.tune.slo import Slo
from provisioner.tune.space import Axis, option_changes

OnEvent = Callable[[str, Candidate], None]  # ("restart" | "bench" | "restore" | "capacity", candidate; capacity: rate=…)


def parse_label(label: str) -> dict[str, Any]:
    """A candidate's folder name back to its changes (baseline, or names that are not labels: {})."""
    parts = [part.partition("=") for part in label.split(",")]
    if label == "baseline" or not all(equals and flag for flag, equals, _ in parts):
        return {}
    return {flag: yaml.safe_load(value) for flag, _, value in parts}


def candidate_run_sets(folder: Path) -> list[Path]:
    """The candidates' run sets recorded in `folder` (FOLDER/<candidate label>/), by name; not the capacity trials."""
    return [path.parent for path in sorted(folder.glob("*/runset.json"))
            if not path.parent.name.startswith(CAPACITY_TRIAL)]


def recorded_folder_problem(folder: Path) -> str | None:
    """Why `folder` is not one a replay reads (`tune --from-results`), or None."""
    where = "give the folder holding one run set per candidate (DIR/<candidate>/runset.json)"
    if not folder.is_dir():
        return f"{folder}: no such folder — {where}"
    if not candidate_run_sets(folder):
        below = sorted({str(path.parent.parent) for path in folder.glob("*/*/runset.json")})
        return (f"{folder}: no run set recorded there — {where}, a tune's RESULTS/NAME"
                + (f": {', '.join(below)}" if below else ""))
    return None


class RecordedResults:
    """measure() from run sets on disk: FOLDER/<candidate label>/ (runset.json, runs/*.json)."""

    def __init__(self, folder: Path, slo: Slo, at: Arrivals | None = None):
        self.folder, self.slo, self.at = folder, slo, at
        problem = recorded_folder_problem(folder)
        if problem:
            raise ResultError(problem)

    def __call__(self, candidate: Candidate) -> Outcome:
        folder = self.folder / candidate.label
        if not (folder / "runset.json").is_file():
            raise Skipped(f"not recorded (no {folder})")
        return evaluate(load_run_set(folder), self.slo, candidate.label, candidate.as_dict(), self.at)

    def all(self) -> list[Outcome]:
        """Every run set of the folder, by name."""
        return [evaluate(load_run_set(path), self.slo, path.name, parse_label(path.name), self.at)
                for path in candidate_run_sets(self.folder)]


def replay(folder: Path, slo: Slo, axes: tuple[Axis, ...], budget: Budget | None = None,
           deployed: dict[str, Any] | None = None, at: Arrivals | None = None) -> SearchResult:
    """The search over recorded run sets; run sets it did not visit join the outcomes after it (the
    winner is chosen from all of them), marked in the notes. `at`: the SLO judged at that request rate."""
    recorded = RecordedResults(folder, slo, at)
    result = search(axes, recorded, budget, deployed=deployed)
    visited = {outcome.name for outcome in result.outcomes}
    for outcome in recorded.all():
        if outcome.name not in visited:
            result.outcomes.append(outcome)
            result.notes.append(f"{outcome.name}: recorded, not on the search's path; compared all the same")
    return result


@dataclass
class TuneRun:
    result: SearchResult
    target: BenchTarget
    folder: Path  # RESULTS/NAME
    dropped: list[str]  # values refused before anything ran (memory), with why
    capacity: Capacity | None = None  # the winner's, where asked for and there is a winner


def capacity_start(winner: Outcome, shape: Arrivals) -> Arrivals | None:
    """The first trial of the capacity search: `shape`'s rate when given (rate > 0), else from the winner's
    burst (capacity.start_rate)."""
    rate = shape.rate if shape.rate > 0 else start_rate(winner)
    return None if rate is None else Arrivals(rate, shape.burstiness, shape.max_concurrency, shape.seconds)


def replay_capacity(folder: Path, slo: Slo, winner: Outcome, shape: Arrivals, max_trials: int = MAX_TRIALS
                    ) -> Capacity | None:
    """The capacity search over recorded trials (RESULTS/NAME/capacity-q<RATE>-b<B>/): a rate not recorded is
    not measured, and the search stops there."""
    start = capacity_start(winner, shape)
    if start is None:
        return None

    created: list[str] = []

    def recorded(arrivals: Arrivals) -> Outcome:
        trial = folder / f"{CAPACITY_TRIAL}{arrivals.key}"
        if not (trial / "runset.json").is_file():
            raise Skipped(f"not recorded (no {trial})")
        run_set = load_run_set(trial)
        if run_set.meta.get("created"):
            created.append(run_set.meta["created"])
        return evaluate(run_set, slo, trial.name, winner.changes, arrivals)

    found = find_capacity(recorded, start, slo.text, winner.changes, max_trials)
    # when the trials began, as the live search records it (its first trial's start), not when they were replayed
    found.measured = min(created, default="time not recorded")
    return found


def run_tune(spec: Spec, instance_name: str, slo: Slo, load: Load, axes: tuple[Axis, ...], repeats: int,
             folder: Path, budget: Budget | None = None, vllm: str | None = None,
             on_event: OnEvent | None = None, on_run: OnRun | None = None, at: Arrivals | None = None,
             capacity: Arrivals | None = None, capacity_trials: int = MAX_TRIALS) -> TuneRun:
    """The search, live on the instance (module docstring). Every flag value alone is validated first
    (a flag or value vLLM lacks: SpecError, nothing touched); a value whose plan does not fit the GPU is
    dropped with a note. `at`: each candidate is also measured at that request rate, where the SLO is judged.
    `capacity`: then the winner, deployed again, is measured at rates (that shape; its rate, or 0 for one from
    the winner's burst) up to the highest that meets the SLO (tune/capacity.py), kept as RESULTS/NAME/capacity.json."""
    target = bench_target(spec, instance_name, vllm)
    version = spec.host(target.instance.host).vllm.version
    kept_axes, dropped = [], []
    for axis in axes:
        values = []
        for value in axis.values:
            try:
                changed_spec(spec, instance_name, option_changes(version, {axis.flag: value}),
                             f"tune {axis.flag}={value}")
                values.append(value)
            except SpecError:
                raise
            except ValueError as error:  # the memory plan refuses it
                dropped.append(redact(str(error)))
        kept_axes.append(Axis(axis.flag, tuple(values), axis.changes_memory, axis.why))

    def restarting(what: Any) -> None:
        if on_event and what == "restore":
            on_event("restore", Candidate())

    def target_with(candidate: Candidate) -> BenchTarget:
        """The instance with the candidate's changes, validated and planned (SpecError, ValueError: refused)."""
        changed = changed_spec(spec, instance_name, option_changes(version, candidate.as_dict()), f"tune {candidate.label}")
        return bench_target(changed, instance_name, vllm)

    with restored_config(target, restarting) as config:
        def switch(candidate: Candidate, swept: BenchTarget) -> None:
            """The candidate's config (`swept`) on the instance, the unit restarted."""
            if on_event:
                on_event("restart", candidate)
            config.use(swept)

        def measure(candidate: Candidate) -> Outcome:
            if candidate.changes:
                try:
                    swept = target_with(candidate)
                except (SpecError, ValueError) as error:  # refused before the host is touched: skipped
                    raise Skipped(redact(str(error))) from None
                switch(candidate, swept)
            if on_event:
                on_event("bench", candidate)
            run_set = run_bench(target, load, repeats, candidate.label, on_run=on_run,
                                meta={"tune": {"changes": candidate.as_dict(), "slo": slo.text,
                                               "slo_at": at.label if at else None}},
                                goodput=tuple(slo.goodput_args()), arrivals=(at,) if at else ())
            run_set.save(folder / candidate.label)
            return evaluate(run_set, slo, candidate.label, candidate.as_dict(), at)

        result = search(tuple(kept_axes), measure, budget, deployed=target.instance.serve_options)
        winner = result.choice.winner
        found = None
        start = capacity_start(winner, capacity) if capacity and winner else None
        if start is not None:
            kept = Candidate(tuple(winner.changes.items()))  # the winner on the instance again
            if kept.changes:
                switch(kept, target_with(kept))
            else:
                config.restore()  # the baseline: the deployed config

            def measure_at(arrivals: Arrivals) -> Outcome:
                label = f"{CAPACITY_TRIAL}{arrivals.key}"
                if on_event:
                    on_event("capacity", Candidate((("rate", arrivals.label),)))
                try:
                    run_set = run_bench(target, load, repeats, label, on_run=on_run, concurrencies=(),
                                        meta={"tune": {"changes": winner.changes, "slo": slo.text,
                                                       "slo_at": arrivals.label}},
                                        goodput=tuple(slo.goodput_args()), arrivals=(arrivals,))
                except BenchError as error:  # requests lost at this rate: the instance does not sustain it
                    return unsustained(label, winner.changes, redact(str(error)))
                run_set.save(folder / label)
                return evaluate(run_set, slo, label, winner.changes, arrivals)

            found = find_capacity(measure_at, start, slo.text, winner.changes, capacity_trials)
            found.save(folder)
    return TuneRun(result, target, folder, dropped, found)
