"""`provision tune`: search the `vllm serve` flags that move latency and throughput for an instance,
each candidate validated like any spec and load-tested with `vllm bench serve`; the winner is the
highest throughput meeting the SLO (provisioner/tune)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, NoReturn

import typer

from provisioner.cli.common import (
    INTERRUPTED,
    PROBLEMS_FOUND,
    USAGE_ERROR,
    SpecOption,
    complete_instances,
    complete_loads,
    exit_on_write_error,
    exit_with,
    gate_or_exit,
)

app = typer.Typer()


@app.command("tune")
def tune(
    instance: Annotated[str, typer.Argument(help="The instance to tune (a name from the spec).", autocompletion=complete_instances)],
    slo: Annotated[str, typer.Option("--slo", help="The SLO, e.g. 'ttft_p99<=200ms,itl_p99<=30ms', or "
                                     "'goodput>=95%,ttft<=200ms,tpot<=50ms' (vLLM's goodput).")],
    spec: SpecOption = None,
    load: Annotated[str, typer.Option("--load", autocompletion=complete_loads, help="Load profile (docs/bench.md lists them).")] = "concurrent",
    space: Annotated[list[str] | None, typer.Option(
        "--space", metavar="FLAG=V1,V2", help="Search exactly these flags and values, in this order (repeat it); "
        "default: max-num-batched-tokens, max-num-seqs, performance-mode, async-scheduling, max-cudagraph-capture-size.")] = None,
    allow_semantic: Annotated[list[str] | None, typer.Option(
        "--allow-semantic", metavar="FLAG", help="Let --space search FLAG although it changes what the model "
        "generates (docs/tune.md); --write then puts it into the instance's own options.")] = None,
    rate: Annotated[float | None, typer.Option(
        "--rate", metavar="REQ/S", min=0.001, help="Also measure each candidate with requests arriving at this "
        "rate (Poisson unless --burstiness), and judge the SLO there: under real arrivals, not one burst.")] = None,
    burstiness: Annotated[float, typer.Option(
        "--burstiness", min=0.01, max=100, help="With --rate: the arrivals' gamma shape, vLLM's --burstiness "
        "(1: Poisson; below 1 burstier, above 1 more even).")] = 1.0,
    rate_seconds: Annotated[float, typer.Option(
        "--rate-seconds", min=1, help="With --rate: how long each run at the rate sends requests (rate × this "
        "many requests).")] = 30.0,
    capacity: Annotated[bool, typer.Option(
        "--capacity", help="Then find the highest request rate the winner sustains within the SLO (from --rate, "
        "else from its burst's requests/s); --write also puts it into the instance's capacity.")] = False,
    capacity_trials: Annotated[int, typer.Option(
        "--capacity-trials", min=2, max=100, help="With --capacity: measure at most this many rates.")] = 12,
    repeats: Annotated[int, typer.Option("--repeats", min=1, help="Runs per concurrency and candidate; the median is kept.")] = 3,
    budget_minutes: Annotated[float, typer.Option("--budget-minutes", min=0.1, help="Stop before a candidate would end past this.")] = 60,
    max_candidates: Annotated[int, typer.Option("--max-candidates", min=1, help="Measure at most this many candidates.")] = 20,
    results: Annotated[Path, typer.Option("--results", help="Folder of the run sets.")] = Path("bench-results"),
    name: Annotated[str | None, typer.Option("--name", help="Keep the candidates' run sets under RESULTS/NAME.")] = None,
    from_results: Annotated[Path | None, typer.Option(
        "--from-results", metavar="DIR", help="Measure nothing: replay the search over run sets recorded in DIR/<candidate>/.")] = None,
    write: Annotated[bool, typer.Option("--write", help="Put the winner into the spec as the instance's options.")] = False,
    vllm: Annotated[str | None, typer.Option("--vllm", help="The vllm executable on the host.")] = None,
) -> None:
    """Find the flags with the highest throughput that meets an SLO; the deployed config is restored after."""
    from rich.markup import escape

    from provisioner.base.secrets import redact
    from provisioner.bench.loads import MAX_IN_FLIGHT, Arrivals, get_load
    from provisioner.bench.results import ResultError
    from provisioner.bench.session import BenchError, run_set_name
    from provisioner.bench.sweep import parse_sweep
    from provisioner.bench.target import bench_target
    from provisioner.cli.console import make_console, print_spec_problems
    from provisioner.cli.tune_view import (
        report,
        report_capacity,
        run_with_progress,
        write_capacity_to,
        write_winner_to,
    )
    from provisioner.fleet.remote import RemoteError
    from provisioner.spec import SpecError
    from provisioner.spec.wording import printable
    from provisioner.tune.measure import recorded_folder_problem, replay, replay_capacity
    from provisioner.tune.search import Budget
    from provisioner.tune.slo import parse_slo
    from provisioner.tune.space import search_space

    console = make_console()

    def fail(code: int, message: str) -> NoReturn:
        console.print(f"[bold red]error:[/] {escape(printable(redact(message)))}")
        exit_with(code)

    try:  # every input checked before any host is touched
        parsed_slo = parse_slo(slo)
        profile = get_load(load)
        if rate is None and (burstiness != 1.0 or rate_seconds != 30.0):
            raise ValueError("--burstiness and --rate-seconds shape the arrivals of --rate — give --rate REQ/S too")
        at = Arrivals(rate, burstiness, MAX_IN_FLIGHT, rate_seconds) if rate is not None else None
        shape = Arrivals(rate or 0.0, burstiness, MAX_IN_FLIGHT, rate_seconds) if capacity else None
        overrides = {sweep.flag: sweep.values for sweep in (parse_sweep(text, "--space") for text in space or [])}
    except ValueError as error:
        fail(USAGE_ERROR, str(error))
    gated = gate_or_exit(spec)
    spec_path, loaded = gated.path, gated.spec
    try:
        target = bench_target(loaded, instance, vllm)
        version = loaded.host(target.instance.host).vllm.version
        axes = search_space(version, overrides, tuple(flag.replace("_", "-") for flag in allow_semantic or []))
    except ValueError as error:
        fail(USAGE_ERROR, str(error))
    budget = Budget(seconds=budget_minutes * 60, candidates=max_candidates)
    folder = from_results or results / (name or f"tune-{run_set_name(target)}")
    if from_results is None and folder.exists():
        fail(USAGE_ERROR, f"{folder} exists — choose another --name or remove that folder")
    if from_results is not None and (problem := recorded_folder_problem(from_results)):
        fail(USAGE_ERROR, f"--from-results {problem}")
    untouched = "nothing was measured" if from_results else "the instance's config is as it was before the tune"
    try:
        if from_results is not None:
            result = replay(from_results, parsed_slo, axes, budget, deployed=target.instance.serve_options, at=at)
            winner = result.choice.winner
            found = replay_capacity(from_results, parsed_slo, winner, shape, capacity_trials) if shape and winner else None
            if found is not None:
                found.save(from_results)
        else:
            result, found = run_with_progress(console, loaded, target, parsed_slo, profile, axes, repeats, folder,
                                              budget, vllm, at, shape, capacity_trials)
    except SpecError as error:
        print_spec_problems(console, error, "nothing was changed on the host")
        exit_with(PROBLEMS_FOUND)
    except (BenchError, RemoteError, ResultError, ValueError) as error:
        fail(PROBLEMS_FOUND, f"{error} ({untouched})")
    except KeyboardInterrupt:
        console.print("[bold red]interrupted[/]; the instance's config is as it was before the tune")
        exit_with(INTERRUPTED)
    choice = report(console, result, parsed_slo, axes, target, folder, at)
    if choice.winner is None:
        exit_with(PROBLEMS_FOUND)
    if capacity:
        report_capacity(console, found, folder)
    if write:
        with exit_on_write_error(spec_path):
            try:
                write_winner_to(console, spec_path, target, version, choice.winner, folder, profile, parsed_slo, at)
                if found is not None and found.rate is not None:
                    write_capacity_to(console, spec_path, target, found, folder)
            except (SpecError, ValueError) as error:
                fail(PROBLEMS_FOUND, f"--write: the spec was left as it was: {error}")
    if capacity and (found is None or found.rate is None):
        exit_with(PROBLEMS_FOUND)  # asked for a capacity and found none: not a success
