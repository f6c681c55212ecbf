"""How `provision bench` runs and shows its run sets: progress bars, the summary and comparison tables,
the plots. Imported when a bench command runs, not for `provision --help`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from provisioner.base.secrets import redact
from provisioner.bench.compare import compare
from provisioner.bench.loads import Load
from provisioner.bench.plots import PlotsUnavailable, plot_run_sets
from provisioner.bench.results import RunSet
from provisioner.bench.session import run_bench
from provisioner.bench.sweep import Sweep, run_sweep
from provisioner.bench.target import BenchTarget


def run_set_with_progress(console: Console, target: BenchTarget, load: Load, repeats: int, name: str,
                          meta: dict[str, Any]) -> RunSet:
    """One run set of `load` against the target, `repeats` runs per concurrency, with a progress bar."""
    total = len(load.concurrency) * repeats
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task(f"{name} ({load.name})", total=total)

        def on_run(event: str, concurrency: int, repeat: int, run) -> None:
            if event == "start":
                progress.update(task, description=f"{name}: concurrency {concurrency}, repeat {repeat}/{repeats}")
            else:
                progress.advance(task)

        return run_bench(target, load, repeats, name, on_run=on_run, meta=meta)


def sweep_with_progress(console: Console, spec, target: BenchTarget, sweep: Sweep, load: Load, repeats: int,
                        name: str, floor_info: dict, vllm: str | None) -> list[RunSet]:
    """A run set per value of the swept flag (and one as deployed), the instance restored after."""
    def one(_: BenchTarget, value: Any) -> RunSet:
        label = "as-deployed" if value is None else f"{sweep.flag}={value}"
        return run_set_with_progress(console, target, load, repeats, f"{name}-{label}",
                        {"floor": floor_info, "sweep": {"flag": sweep.flag, "value": value}})

    def on_restart(value: Any) -> None:
        what = "restoring the original config" if value == "restore" else f"{sweep.flag}={value}"
        console.print(f"restarting {target.unit}: {escape(redact(what))} (returns once the server is ready)")

    return run_sweep(spec, target.name, sweep, one, vllm=vllm, on_restart=on_restart)


def plot(console: Console, run_sets: list[RunSet], path: Path) -> None:
    """The run sets' plot at `path`, or why there is none (the extra `plot` not installed)."""
    floors = [run_set.meta.get("floor", {}).get("tpot_floor_ms") for run_set in run_sets]
    floor_ms = next((value for value in floors if value), None)
    try:
        plot_run_sets(run_sets, path, title=" vs ".join(run_set.name for run_set in run_sets), floor_ms=floor_ms)
    except PlotsUnavailable as missing:  # the extra `plot` is not installed: the tables above are the result
        console.print(escape(str(missing)))
        return
    console.print(f"plot: {path}")


def summary_table(run_set: RunSet) -> Table:
    floor_ms = run_set.meta.get("floor", {}).get("tpot_floor_ms")
    table = Table(title=f"{run_set.name}: medians of {run_set.meta.get('repeats', '?')} runs"
                        + (f" — batch-1 TPOT floor {floor_ms:.2f} ms" if floor_ms else ""))
    for column in ("concurrency", "TTFT p50/p99 ms", "TPOT p50/p99 ms", "ITL p50/p99 ms", "output tok/s",
                   "TPOT p50 / floor"):
        table.add_column(column, justify="right")
    for concurrency, values in run_set.summary().items():
        def pair(metric: str) -> str:
            return f"{values.get(f'p50_{metric}_ms', float('nan')):.2f} / {values.get(f'p99_{metric}_ms', float('nan')):.2f}"
        ratio = f"{values['p50_tpot_ms'] / floor_ms:.3f}×" if floor_ms and "p50_tpot_ms" in values else "—"
        table.add_row(str(concurrency), pair("ttft"), pair("tpot"), pair("itl"),
                      f"{values.get('output_throughput', float('nan')):.0f}", ratio)
    return table


def comparison_table(run_sets: list[RunSet]) -> Table:
    rows = compare(*run_sets)
    table = Table(title=f"{run_sets[0].name} (reference) vs " + ", ".join(run_set.name for run_set in run_sets[1:]))
    table.add_column("concurrency", justify="right")
    table.add_column("metric")
    for index, run_set in enumerate(run_sets):
        table.add_column(run_set.name, justify="right")
        if index:
            table.add_column("Δ", justify="right")
    style = {"better": "green", "worse": "red", "same": ""}
    for row in rows:
        cells = [str(row.concurrency), row.metric]
        for index, value in enumerate(row.values):
            cells.append("—" if value is None else f"{value:.2f}" if value < 1000 else f"{value:.0f}")
            if index:
                delta = row.delta(index)
                text = "—" if delta is None else f"{delta * 100:+.1f} %"
                colour = style[row.verdict(index)]
                cells.append(f"[{colour}]{text}[/]" if colour else text)
        table.add_row(*cells)
    return table
