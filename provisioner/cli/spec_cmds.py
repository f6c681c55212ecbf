"""Commands that work on the spec alone, without touching a host: init, inventory, plan."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from provisioner.cli.common import LimitOption, SpecArgument, check_limit, exit_on_write_error, load_spec_or_exit
from provisioner.files import write_file
from provisioner.inventory import write_inventory
from provisioner.paths import SPEC_EXAMPLE
from provisioner.plan import HostPlan, PlannedFile, build_plan
from provisioner.secrets import redact, redact_environment
from provisioner.vllm.memory import TABLE_COLUMNS


def _console() -> Console:
    # created per call, so it writes to whatever stdout is current (tests capture it)
    return Console(highlight=False, soft_wrap=True)


def init(
    path: Annotated[Path, typer.Argument(help="Where to write the example spec.")] = Path("spec.yml"),
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
) -> None:
    """Write a commented example spec to start from."""
    if path.exists() and not force:
        typer.echo(f"{path} already exists; pass --force to overwrite it", err=True)
        raise typer.Exit(1)
    with exit_on_write_error(path):
        write_file(path, SPEC_EXAMPLE.read_bytes())
    typer.echo(f"wrote {path}: edit it, then run `provision plan {path}`")


def inventory(
    spec: SpecArgument,
    output: Annotated[Path, typer.Option("--output", "-o", help="Inventory folder to write.")],
) -> None:
    """Validate the spec and write its Ansible inventory (hosts.yml, group_vars/, host_vars/)."""
    loaded = load_spec_or_exit(spec)
    with exit_on_write_error(output):
        result = write_inventory(loaded, output)
    for path in result.written:
        typer.echo(f"wrote {path}")
    for path in result.removed:
        typer.echo(f"removed {path} (host no longer in the spec)")


def plan(spec: SpecArgument, limit: LimitOption = None) -> None:
    """Validate the spec and show what each host would get: GPU memory per instance, sysctls, files,
    units, environment. Exit 1 when an instance would not fit its GPU (vLLM would refuse to start)."""
    loaded = load_spec_or_exit(spec)
    check_limit(loaded, limit, spec)
    console = _console()
    plans = [host_plan for host_plan in build_plan(loaded) if limit is None or host_plan.host == limit]
    for host_plan in plans:
        show_host_plan(console, host_plan)
    problems = [problem for host_plan in plans for problem in host_plan.memory_problems]
    for problem in problems:
        console.print(f"[bold red]memory:[/] {escape(problem)}")
    if problems:
        raise typer.Exit(1)


def show_host_plan(console: Console, plan: HostPlan) -> None:
    console.rule(f"[bold]{plan.host}[/] ({plan.address})")
    for warning in plan.warnings:
        console.print(f"[yellow]warning:[/] {escape(redact(warning))}")

    show_memory(console, plan)
    sysctls = Table("kernel parameter", "value", title="sysctls")
    for key, value in sorted(plan.sysctls.items()):
        sysctls.add_row(Text(key), Text(str(value)))
    console.print(sysctls)

    console.print(f"[bold]/etc/fstab:[/] {escape(plan.fstab_line or '(unchanged: shm_size is null)')}")
    for path in plan.removed_files:
        console.print(f"[bold]remove:[/] {escape(path)}")

    for file in [plan.sysctl_file, *plan.nouveau_files]:
        show_file(console, file)
    for unit in plan.units:
        show_file(console, unit.unit)
        show_file(console, unit.env_file)
        show_file(console, unit.config_file)
        environment = Table("variable", "value", title=f"environment of vllm-{unit.instance}")
        for key, value in redact_environment(unit.environment).items():
            environment.add_row(Text(key), Text(value))
        console.print(environment)


def show_memory(console: Console, plan: HostPlan) -> None:
    """Per GPU: each instance's share, weights, overhead, KV cache and the full-length sequences it holds."""
    for gpu in plan.memory:
        if gpu.plan is None:
            console.print(f"[yellow]memory:[/] {escape(gpu.note or '')}")
            continue
        title = (f"memory of {gpu.label}: shares {gpu.plan.shares:.2f} of {gpu.plan.usable_fraction:g} usable, "
                 f"{gpu.plan.spare / 2**30:.2f} GiB spare once all started")
        table = Table(*TABLE_COLUMNS, title=title)
        for row in gpu.plan.table_rows():
            table.add_row(*(Text(cell) for cell in row))
        console.print(table)


def show_file(console: Console, file: PlannedFile) -> None:
    console.print(f"[bold cyan]{escape(file.path)}[/] (mode {file.mode or 'unchanged'}, role {file.role})")
    console.print(redact(file.content), markup=False, highlight=False)
