"""Commands that work on the spec alone, without touching a host: init, inventory, plan."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from provisioner.cli.console import make_console
from provisioner.cli.common import (
    HostsArgument,
    SpecOption,
    exit_on_write_error,
    find_spec_or_exit,
    load_found_spec,
    load_spec_or_exit,
    select_or_exit,
)
from provisioner.files import write_folder
from provisioner.inventory import write_inventory
from provisioner.plan import HostPlan, PlannedFile, build_plan
from provisioner.secrets import redact, redact_data, redact_environment
from provisioner.selection import DEFAULT_SPEC
from provisioner.spec_docs import SCHEMA_FILE_NAME, example_with_modeline, schema_text
from provisioner.vllm.memory import TABLE_COLUMNS


def _console() -> Console:
    # created per call, so it writes to whatever stdout is current (tests capture it)
    return make_console()


def init(
    path: Annotated[Path, typer.Argument(help="Where to write the example spec.")] = DEFAULT_SPEC,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing spec file.")] = False,
) -> None:
    """Write a commented example spec to start from, and its JSON Schema beside it, for editors.

    The spec's first line (a yaml-language-server modeline) points editors to provision.schema.json."""
    if path.is_dir():
        typer.echo(f"{path} is a folder — name the spec file to write, e.g. {path / DEFAULT_SPEC}", err=True)
        raise typer.Exit(1)
    if path.name == SCHEMA_FILE_NAME:
        typer.echo(f"{path}: init writes the spec's JSON Schema under that name — choose another name for the "
                   f"spec, e.g. {path.with_name(DEFAULT_SPEC.name)}", err=True)
        raise typer.Exit(1)
    if path.exists() and not force:
        typer.echo(f"{path} already exists; pass --force to overwrite it", err=True)
        raise typer.Exit(1)
    schema_path = path.with_name(SCHEMA_FILE_NAME)
    with exit_on_write_error(path):
        write_folder(path.absolute().parent, {path.name: example_with_modeline(), SCHEMA_FILE_NAME: schema_text()})
    found_as_is = path.absolute() == DEFAULT_SPEC.absolute() and not os.environ.get("PROVISION_SPEC")
    typer.echo(f"wrote {path} and {schema_path} (its JSON Schema, for editors; `provision schema -o {schema_path}` "
               "writes it again after an upgrade)")
    typer.echo(f"edit the spec, then run `provision plan{'' if found_as_is else f' --spec {path}'}`")


def inventory(
    output: Annotated[Path, typer.Option("--output", "-o", help="Inventory folder to write.")],
    spec: SpecOption = None,
) -> None:
    """Validate the spec and write its Ansible inventory (hosts.yml, group_vars/, host_vars/)."""
    loaded = load_found_spec(spec)
    with exit_on_write_error(output):
        result = write_inventory(loaded, output)
    for path in result.written:
        typer.echo(f"wrote {path}")
    for path in result.removed:
        typer.echo(f"removed {path} (host no longer in the spec)")


def plan(
    hosts: HostsArgument = None,
    spec: SpecOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON (secrets redacted).")] = False,
) -> None:
    """Validate the spec and show what each host would get: GPU memory per instance, sysctls, files,
    units, environment. Exit 1 when an instance would not fit its GPU (vLLM would refuse to start)."""
    spec = find_spec_or_exit(spec)
    loaded = load_spec_or_exit(spec)
    chosen = {host.name for host in select_or_exit(loaded, hosts)}
    plans = [host_plan for host_plan in build_plan(loaded) if host_plan.host in chosen]
    problems = [problem for host_plan in plans for problem in host_plan.memory_problems]
    if as_json:
        typer.echo(json.dumps(plan_json(spec, plans), indent=2))
        raise typer.Exit(1 if problems else 0)
    console = _console()
    for host_plan in plans:
        show_host_plan(console, host_plan)
    for problem in problems:
        console.print(f"[bold red]memory:[/] {escape(problem)}")
    if problems:
        raise typer.Exit(1)


def plan_json(spec: Path, plans: list[HostPlan]) -> dict:
    """The plan as JSON-able data, secrets redacted: keys are the plan's field names (provisioner/plan.py)."""
    return {
        "spec": str(spec),
        "hosts": [redact_data({**asdict(host_plan), "memory_problems": host_plan.memory_problems})
                  for host_plan in plans],
        "problems": [redact(problem) for host_plan in plans for problem in host_plan.memory_problems],
    }


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
