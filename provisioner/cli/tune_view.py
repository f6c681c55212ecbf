"""How `provision tune` shows its run: a line per candidate as it goes, the table, the Pareto plot, the
winner, --write's message. Imported when `provision tune` runs, not for `provision --help`."""

from __future__ import annotations

import math
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from provisioner.base.secrets import redact
from provisioner.bench.loads import Load
from provisioner.bench.plots import PlotsUnavailable
from provisioner.bench.target import BenchTarget
from provisioner.spec import Spec
from provisioner.tune.measure import run_tune
from provisioner.bench.loads import Arrivals
from provisioner.tune.plot import plot_pareto
from provisioner.tune.search import Budget, Candidate, Choice, Outcome, SearchResult, pareto_front
from provisioner.tune.slo import Slo
from provisioner.tune.space import Axis, option_changes, side_by_side_groups
from provisioner.tune.capacity import CAPACITY_FILE, MAX_TRIALS, Capacity
from provisioner.tune.write import write_instance_key, write_winner


def run_with_progress(console: Console, spec: Spec, target: BenchTarget, slo: Slo, load: Load,
                      axes: tuple[Axis, ...], repeats: int, folder: Path, budget: Budget,
                      vllm: str | None, at: Arrivals | None = None,
                      capacity: Arrivals | None = None, capacity_trials: int = MAX_TRIALS
                      ) -> tuple[SearchResult, Capacity | None]:
    count = [0]

    def on_event(event: str, candidate: Candidate) -> None:
        if event == "restart":
            console.print(f"  restarting {target.unit} with {escape(redact(candidate.label))} "
                          "(returns once the server is ready)")
        elif event == "bench":
            count[0] += 1
            console.print(f"candidate {count[0]}: {escape(redact(candidate.label))} — vllm bench serve, load "
                          f"{load.name}, {repeats} run(s) per concurrency" + (f" and at {at.label}" if at else ""))
        elif event == "capacity":
            console.print(f"capacity trial: {escape(candidate.as_dict()['rate'])} arrivals, {repeats} run(s)")
        else:
            console.print(f"restoring the deployed config of {target.unit}")

    run = run_tune(spec, target.name, slo, load, axes, repeats, folder, budget, vllm, on_event=on_event, at=at,
                   capacity=capacity, capacity_trials=capacity_trials)
    for why in run.dropped:
        console.print(f"left out: {escape(why)}")
    return run.result, run.capacity


def report_capacity(console: Console, found: Capacity | None, folder: Path) -> None:
    """The winner's capacity: the highest rate that met the SLO, each trial, where it is kept."""
    if found is None:
        console.print("capacity: not measured (no rate to start from: give --rate)")
        return
    trials = ", ".join(f"{trial.rate:g}/s {'meets' if trial.meets else 'misses'} "
                       f"({'requests lost' if trial.worst is None else f'{trial.worst * 100:.0f} %'})"
                       for trial in found.trials)
    shape = Arrivals(1, found.arrivals["burstiness"]).label.removeprefix("1/s ")
    if not found.trials:
        console.print("[bold red]capacity: no rate was measured[/]")
    elif found.rate is None:
        console.print(f"[bold red]capacity: the SLO {escape(found.slo)} was met at no rate tried[/] ({escape(trials)})")
    else:
        console.print(f"[bold green]capacity:[/] {found.rate:g} requests/s within {escape(found.slo)} ({shape} arrivals, "
                      f"at most {found.arrivals['max_concurrency']:g} in flight); trials: {escape(trials)}")
    for note in found.notes:
        console.print(f"note: {escape(note)}")
    console.print(f"kept in {folder / CAPACITY_FILE}")


def write_capacity_to(console: Console, spec_path: Path, target: BenchTarget, found: Capacity, folder: Path) -> None:
    entry = {"rate": found.rate, "slo": found.slo, "measured": f"{folder / CAPACITY_FILE}, {found.measured}"}
    write_instance_key(spec_path, target.name, "capacity", entry)
    console.print(f"wrote capacity {found.rate:g}/s into {spec_path} (instance {escape(target.name)}); "
                  "`provision plan` sizes gateway routes by it")


def judged_where(at: Arrivals | None) -> str:
    """Where the SLO is judged: every concurrency of the load, or at a request rate."""
    if at is None:
        return "every concurrency"
    return f"{at.label} arrivals, at most {at.max_concurrency} in flight"


def report(console: Console, result: SearchResult, slo: Slo, axes: tuple[Axis, ...], target: BenchTarget,
           folder: Path, at: Arrivals | None = None) -> Choice:
    """The table, the notes, which candidates could share a GPU, the plot, the winner; returns the choice."""
    choice = result.choice
    console.print(outcome_table(result.outcomes, slo, choice, at))
    for note in result.notes:
        console.print(f"note: {escape(redact(note))}")
    groups = side_by_side_groups([outcome.changes for outcome in result.outcomes], axes,
                                 target.instance.gpu_memory_utilization)
    shared = [group for group in groups if len(group) > 1]
    console.print("side by side on one GPU: " + ("; ".join(
        " + ".join(result.outcomes[index].name for index in group) for group in shared) if shared else
        "none of these candidates (each changes GPU memory, or one share leaves no room for a second)"))
    try:
        title = f"{target.name}: {slo.text} at {judged_where(at)}"
        console.print(f"Pareto plot: {plot_pareto(result.outcomes, folder / 'pareto.png', title=title)}")
    except PlotsUnavailable as missing:
        console.print(escape(str(missing)))
    if choice.winner is not None:
        console.print(f"[bold green]winner:[/] {escape(choice.winner.name)} — {choice.winner.throughput:.0f} output tok/s "
                      f"at concurrency {choice.winner.concurrency}, meets {escape(slo.text)}"
                      + (f" at {escape(at.label)}" if at else ""))
        if choice.note:
            console.print(escape(choice.note))
    elif choice.closest is not None:
        console.print(f"[bold red]no candidate meets {escape(slo.text)}[/]; the closest: {escape(choice.closest.name)} "
                      f"({describe_worst(choice.closest)}) — loosen the SLO or search other flags")
    else:
        console.print("[bold red]no candidate was measured[/]")
    return choice


def describe_worst(outcome: Outcome) -> str:
    term, ratio = max(outcome.ratios.items(), key=lambda item: math.inf if item[1] is None else item[1])
    return f"{term}: not reported" if ratio is None else f"{term}: {ratio * 100:.0f} % of its limit"


def outcome_table(outcomes: list[Outcome], slo: Slo, choice: Choice, at: Arrivals | None = None) -> Table:
    front = {id(outcome) for outcome in pareto_front(outcomes)}
    baseline = next((outcome for outcome in outcomes if outcome.name == "baseline"), None)
    table = Table(title=f"candidates against {slo.text} ({judged_where(at)}; tok/s at the highest concurrency)")
    for column in ("candidate", "output tok/s", "Δ baseline", *(term for term in outcomes[0].values if outcomes),
                   "meets", "Pareto"):
        table.add_column(column, justify="left" if column == "candidate" else "right")
    for outcome in outcomes:
        delta = "—" if baseline is None or not baseline.throughput else \
            f"{(outcome.throughput / baseline.throughput - 1) * 100:+.1f} %"
        values = ["—" if value is None else f"{value:.2f}" if value < 1000 else f"{value:.0f}"
                  for value in outcome.values.values()]
        name = f"[bold]{escape(outcome.name)}[/]" if outcome is choice.winner else escape(outcome.name)
        table.add_row(name, f"{outcome.throughput:.0f}", delta, *values, "yes" if outcome.meets else "no",
                      "*" if id(outcome) in front else "")
    return table


def write_winner_to(console: Console, spec_path: Path, target: BenchTarget, version: str, winner: Outcome,
                    folder: Path, load: Load, slo: Slo, at: Arrivals | None = None) -> None:
    if not winner.changes:
        console.print("nothing to write: the deployed config is the winner")
        return
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    comment = (f"{date}: run set {folder}/{winner.name}, load {load.name}, SLO {slo.text}"
               f"{f' at {at.label}' if at else ''}: "
               f"{winner.throughput:.0f} output tok/s at concurrency {winner.concurrency}")
    write_winner(spec_path, target.name, option_changes(version, winner.changes), comment)
    console.print(f"wrote {escape(winner.name)} into {spec_path} (instance {escape(target.name)}); "
                  "`provision apply` deploys it")
