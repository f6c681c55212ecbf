"""Commands that work on the spec alone, without touching a host: init, inventory, plan."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from provisioner.cli.common import (
    PROBLEMS_FOUND,
    STDOUT,
    HostsArgument,
    SpecOption,
    exit_on_write_error,
    exit_with,
    gate_or_exit,
)
from provisioner.fleet.selection import DEFAULT_SPEC

if TYPE_CHECKING:
    from rich.console import Console

app = typer.Typer()


def _console() -> Console:
    # created per call, so it writes to whatever stdout is current (tests capture it)
    from provisioner.cli.console import make_console

    return make_console()


@app.command()
def init(
    path: Annotated[Path, typer.Argument(help="Where to write the example spec.")] = DEFAULT_SPEC,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing spec file.")] = False,
) -> None:
    """Write a commented example spec to start from, and its JSON Schema beside it, for editors.

    The spec's first line (a yaml-language-server modeline) points editors to provision.schema.json."""
    from provisioner.base.files import write_folder
    from provisioner.spec_docs import SCHEMA_FILE_NAME, example_with_modeline, schema_text, write_example_key

    if path.is_dir():
        exit_with(PROBLEMS_FOUND, f"{path} is a folder — name the spec file to write, e.g. {path / DEFAULT_SPEC}")
    if path.name == SCHEMA_FILE_NAME:
        exit_with(PROBLEMS_FOUND, f"{path}: init writes the spec's JSON Schema under that name — choose another "
                                  f"name for the spec, e.g. {path.with_name(DEFAULT_SPEC.name)}")
    if path.exists() and not force:
        exit_with(PROBLEMS_FOUND, f"{path} already exists; pass --force to overwrite it")
    schema_path = path.with_name(SCHEMA_FILE_NAME)
    with exit_on_write_error(path):
        write_folder(path.absolute().parent, {path.name: example_with_modeline(), SCHEMA_FILE_NAME: schema_text()})
        key = write_example_key(path.absolute().parent)
    found_as_is = path.absolute() == DEFAULT_SPEC.absolute() and not os.environ.get("PROVISION_SPEC")
    typer.echo(f"wrote {path} and {schema_path} (its JSON Schema, for editors; `provision schema -o {schema_path}` "
               "writes it again after an upgrade)")
    if key is not None:
        key = key.relative_to(Path.cwd()) if key.is_relative_to(Path.cwd()) else key
        typer.echo(f"wrote {key} (a new random API key for the example's instance, mode 0600: clients send it as "
                   "`Authorization: Bearer KEY`)")
    typer.echo(f"edit the spec, then run `provision plan{'' if found_as_is else f' --spec {path}'}`")


@app.command()
def inventory(
    output: Annotated[Path, typer.Option("--output", "-o", help="Inventory folder to write.")],
    spec: SpecOption = None,
) -> None:
    """Validate the spec and write its Ansible inventory (hosts.yml, group_vars/, host_vars/)."""
    from provisioner.fleet.inventory import write_inventory

    gated = gate_or_exit(spec)
    with exit_on_write_error(output):
        result = write_inventory(gated.spec, output)
    for path in result.written:
        typer.echo(f"wrote {path}")
    for path in result.removed:
        typer.echo(f"removed {path} (host no longer in the spec)")


@app.command()
def plan(
    hosts: HostsArgument = None,
    spec: SpecOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON (secrets redacted).")] = False,
) -> None:
    """Validate the spec and show what each host would get: GPU memory per instance, the driver its vLLM
    needs, sysctls, files, units, environment. Exit 1 when an instance would not fit its GPU or a driver
    the spec names is too old (vLLM would refuse to start)."""
    from rich.markup import escape

    from provisioner.cli.plan_view import plan_json, show_host_plan
    from provisioner.plan import build_plan
    from provisioner.validation.gate import preflight_refusals

    # the preflight's problems are shown after the plan, which explains them
    gated = gate_or_exit(spec, hosts, preflight=False, json_to=STDOUT if as_json else None)
    plans = build_plan(gated.spec, [host.name for host in gated.hosts])
    refusals = preflight_refusals(gated)
    if as_json:
        typer.echo(json.dumps(plan_json(gated.path, plans, refusals), indent=2))
        raise typer.Exit(PROBLEMS_FOUND if refusals else 0)
    console = _console()
    for host_plan in plans:
        show_host_plan(console, host_plan)
    for refusal in refusals:
        console.print(f"[bold red]{refusal.label}:[/] {escape(refusal.text)}")
    if refusals:
        raise typer.Exit(PROBLEMS_FOUND)
