"""`provision bench`: `bench run` load-tests a deployed instance (run sets, baselines, sweeps);
`bench compare` sets two stored run sets side by side."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from provisioner.cli.common import (
    INTERRUPTED,
    PROBLEMS_FOUND,
    USAGE_ERROR,
    SpecOption,
    complete_instances,
    complete_loads,
    exit_with,
    gate_or_exit,
)

DEFAULT_RESULTS = Path("bench-results")
app = typer.Typer(help="Load-test a deployed instance with vLLM's own `vllm bench serve`; compare run sets.",
                  no_args_is_help=True)

ResultsOption = Annotated[Path, typer.Option("--results", help="Folder of the run sets.")]


@app.command("run")
def bench_run(
    instance: Annotated[str, typer.Argument(help="The instance to load (a name from the spec).", autocompletion=complete_instances)],
    spec: SpecOption = None,
    load: Annotated[str, typer.Option("--load", autocompletion=complete_loads, help="Load profile: chat, single, long-prompt, batch or smoke (docs/bench.md lists their lengths and concurrencies).")] = "chat",
    repeats: Annotated[int, typer.Option("--repeats", min=1, help="Runs per concurrency; the median is kept.")] = 3,
    baseline: Annotated[str | None, typer.Option("--baseline", help="Store the run set under this name.")] = None,
    sweep: Annotated[str | None, typer.Option(
        "--sweep", help="FLAG=V1,V2,…: restart the instance with each value in turn, then restore it.")] = None,
    results: ResultsOption = DEFAULT_RESULTS,
    vllm: Annotated[str | None, typer.Option(
        "--vllm", help="The vllm executable on the host (default: the spec's <install_path>/venvs/<version>/bin/vllm).")] = None,
    floor: Annotated[bool, typer.Option(help="Measure the HBM bandwidth for the batch-1 TPOT floor.")] = True,
) -> None:
    """Load-test a deployed instance with vLLM's own `vllm bench serve`; keep the run set under --results."""
    from rich.markup import escape

    from provisioner.base.secrets import redact
    from provisioner.bench.loads import get_load
    from provisioner.bench.session import BenchError, run_set_name, tpot_floor
    from provisioner.bench.sweep import parse_sweep, swept_specs
    from provisioner.bench.target import bench_target
    from provisioner.cli.bench_view import (
        comparison_table,
        plot,
        run_set_with_progress,
        summary_table,
        sweep_with_progress,
    )
    from provisioner.cli.console import make_console, print_spec_problems
    from provisioner.fleet.remote import RemoteError
    from provisioner.spec import SpecError
    from provisioner.spec.wording import printable

    console = make_console()
    try:
        profile = get_load(load)
        parsed_sweep = parse_sweep(sweep) if sweep else None
        loaded = gate_or_exit(spec).spec
        target = bench_target(loaded, instance, vllm)
        if parsed_sweep:
            swept_specs(loaded, instance, parsed_sweep)  # every value valid before the host is touched
    except SpecError as error:
        print_spec_problems(console, error, "nothing was run on the host")
        exit_with(PROBLEMS_FOUND)
    except ValueError as error:
        console.print(f"[bold red]error:[/] {escape(printable(redact(str(error))))}")
        exit_with(USAGE_ERROR)
    name = baseline or run_set_name(target)
    if (results / name).exists():
        console.print(f"[bold red]error:[/] run set {escape(name)} exists in {results} — choose another --baseline "
                      "name or remove that folder")
        exit_with(USAGE_ERROR)
    try:
        floor_info = tpot_floor(target) if floor else {"note": "not measured (--no-floor)"}
        if parsed_sweep:
            run_sets = sweep_with_progress(console, loaded, target, parsed_sweep, profile, repeats, name,
                                           floor_info, vllm)
        else:
            run_sets = [run_set_with_progress(console, target, profile, repeats, name, {"floor": floor_info})]
    except SpecError as error:
        print_spec_problems(console, error, "nothing was changed on the host")
        exit_with(PROBLEMS_FOUND)
    except (BenchError, RemoteError, ValueError) as error:
        console.print(f"[bold red]error:[/] {escape(printable(redact(str(error))))}")
        exit_with(PROBLEMS_FOUND)
    except KeyboardInterrupt:
        console.print("[bold red]interrupted[/]; the instance's config is as it was before the bench")
        exit_with(INTERRUPTED)
    for run_set in run_sets:
        folder = run_set.save(results / run_set.name)
        console.print(summary_table(run_set))
        console.print(f"kept in {folder}")
    if len(run_sets) > 1:
        console.print(comparison_table(run_sets))
        plot(console, run_sets, results / f"{name}.png")


@app.command("compare")
def bench_compare(
    reference: Annotated[str, typer.Argument(metavar="A", help="The reference run set (a name or a folder; A+B joins two).")],
    other: Annotated[str, typer.Argument(metavar="B", help="The run set to compare with it.")],
    results: ResultsOption = DEFAULT_RESULTS,
) -> None:
    """Compare two stored run sets: TTFT/TPOT/ITL p50 and p99, tok/s, deltas, a PNG."""
    from rich.markup import escape

    from provisioner.bench.results import ResultError, find_run_set
    from provisioner.cli.bench_view import comparison_table, plot
    from provisioner.cli.console import make_console

    console = make_console()
    try:
        run_sets = [find_run_set(name, results) for name in (reference, other)]
    except ResultError as error:
        console.print(f"[bold red]error:[/] {escape(str(error))}")
        exit_with(USAGE_ERROR)
    console.print(comparison_table(run_sets))
    plot(console, run_sets, results / f"compare-{run_sets[0].name}-vs-{run_sets[1].name}.png")
