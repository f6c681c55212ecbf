"""`provision bench`: run sets against a deployed instance, baselines, sweeps and comparisons."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from provisioner.bench.compare import compare
from provisioner.bench.loads import Load, get_load
from provisioner.bench.plots import PlotsUnavailable, plot_run_sets
from provisioner.bench.results import ResultError, RunSet, find_run_set
from provisioner.bench.session import BenchError, run_bench, run_set_name, tpot_floor
from provisioner.bench.sweep import Sweep, parse_sweep, run_sweep
from provisioner.bench.target import BenchTarget, bench_target
from provisioner.cli.common import SpecOption, load_found_spec
from provisioner.cli.console import make_console
from provisioner.remote import RemoteError
from provisioner.secrets import redact
from provisioner.spec import SpecError

console = make_console()
DEFAULT_RESULTS = Path("bench-results")


def bench(
    instance: Annotated[str | None, typer.Argument(help="The instance to load (a name from the spec).")] = None,
    spec: SpecOption = None,
    load: Annotated[str, typer.Option("--load", help="Load profile: chat, single, long-prompt, batch or smoke (provisioner/bench/loads.yml).")] = "chat",
    repeats: Annotated[int, typer.Option("--repeats", min=1, help="Runs per concurrency; the median is kept.")] = 3,
    baseline: Annotated[str | None, typer.Option("--baseline", help="Store the run set under this name.")] = None,
    sweep: Annotated[str | None, typer.Option(
        "--sweep", help="FLAG=V1,V2,…: restart the instance with each value in turn, then restore it.")] = None,
    compare_sets: Annotated[tuple[str, str] | None, typer.Option(
        "--compare", help="Compare two stored run sets (names or folders; A+B joins two): A B.")] = None,
    results: Annotated[Path, typer.Option("--results", help="Folder of the run sets.")] = DEFAULT_RESULTS,
    vllm: Annotated[str | None, typer.Option(
        "--vllm", help="The vllm executable on the host (default: the spec's <install_path>/venv/bin/vllm).")] = None,
    floor: Annotated[bool, typer.Option(help="Measure the HBM bandwidth for the batch-1 TPOT floor.")] = True,
) -> None:
    """Load-test a deployed instance with vLLM's own `vllm bench serve`; compare run sets."""
    if compare_sets:
        _compare(compare_sets, results)
        return
    if instance is None:
        console.print("give INSTANCE to run a bench, or --compare A B to compare stored run sets")
        raise typer.Exit(2)
    try:
        profile = get_load(load)
        parsed_sweep = parse_sweep(sweep) if sweep else None
        loaded = load_found_spec(spec)
        target = bench_target(loaded, instance, vllm)
    except ValueError as error:
        console.print(f"[bold red]error:[/] {escape(redact(str(error)))}")
        raise typer.Exit(2) from None
    name = baseline or run_set_name(target)
    if (results / name).exists():
        console.print(f"[bold red]error:[/] run set {escape(name)} exists in {results} — choose another --baseline "
                      "name or remove that folder")
        raise typer.Exit(2)
    try:
        floor_info = tpot_floor(target) if floor else {"note": "not measured (--no-floor)"}
        if parsed_sweep:
            run_sets = _sweep(loaded, target, parsed_sweep, profile, repeats, name, floor_info, vllm)
        else:
            run_sets = [_run_set(target, profile, repeats, name, {"floor": floor_info})]
    except SpecError as error:
        for problem in error.problems:
            console.print(f"[bold red]{escape(problem.path)}:[/] {escape(redact(problem.message))}")
        console.print("nothing was changed on the host")
        raise typer.Exit(1) from None
    except (BenchError, RemoteError, ValueError) as error:
        console.print(f"[bold red]error:[/] {escape(redact(str(error)))}")
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        console.print("[bold red]interrupted[/]; the instance's config is as it was before the bench")
        raise typer.Exit(130) from None
    for run_set in run_sets:
        folder = run_set.save(results / run_set.name)
        console.print(summary_table(run_set))
        console.print(f"kept in {folder}")
    if len(run_sets) > 1:
        console.print(comparison_table(run_sets))
        _plot(run_sets, results / f"{name}.png")


def _run_set(target: BenchTarget, load: Load, repeats: int, name: str, meta: dict[str, Any]) -> RunSet:
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


def _sweep(spec, target: BenchTarget, sweep: Sweep, load: Load, repeats: int, name: str,
           floor_info: dict, vllm: str | None) -> list[RunSet]:
    def one(_: BenchTarget, value: Any) -> RunSet:
        label = "as-deployed" if value is None else f"{sweep.flag}={value}"
        return _run_set(target, load, repeats, f"{name}-{label}",
                        {"floor": floor_info, "sweep": {"flag": sweep.flag, "value": value}})

    def on_restart(value: Any) -> None:
        what = "restoring the original config" if value == "restore" else f"{sweep.flag}={value}"
        console.print(f"restarting {target.unit}: {escape(redact(what))} (returns once the server is ready)")

    return run_sweep(spec, target.name, sweep, one, vllm=vllm, on_restart=on_restart)


def _compare(names: tuple[str, str], results: Path) -> None:
    try:
        run_sets = [find_run_set(name, results) for name in names]
    except ResultError as error:
        console.print(f"[bold red]error:[/] {escape(str(error))}")
        raise typer.Exit(2) from None
    console.print(comparison_table(run_sets))
    _plot(run_sets, results / f"compare-{run_sets[0].name}-vs-{run_sets[1].name}.png")


def _plot(run_sets: list[RunSet], path: Path) -> None:
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
