"""`provision`: the command line. Each command (or group) lives in its own module, which owns its
`typer.Typer()`; this one composes them, in the order `provision --help` lists them."""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from provisioner.cli import (
    apply_cmd,
    audit_cmd,
    bench_cmd,
    facts_cmd,
    monitoring_cmd,
    schema_cmd,
    spec_cmds,
    trust_cmd,
    tune_cmd,
    wheelhouse_cmd,
)
from provisioner.cli.common import INTERNAL_ERROR, PROBLEMS_FOUND

DISTRIBUTION = "vllm-provision"

app = typer.Typer(
    name="provision",
    help="Turn a bare NVIDIA GPU server into a tuned, audited vLLM inference host.",
    no_args_is_help=True,
    add_completion=True,
)


def version_text() -> str:
    """'vllm-provision 0.1.0 (ansible-core 2.19.14, vLLM 0.25.0)': the installed ansible-core that runs the roles,
    and the vLLM version the package's `vllm` extra pins (the flag catalogs'), from the installed metadata."""
    import re
    from importlib import metadata

    try:
        version, requirements = metadata.version(DISTRIBUTION), metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        return f"{DISTRIBUTION} (not installed: `pip install .` in the checkout, or install the wheel)"
    shown = []
    try:
        shown.append(f"ansible-core {metadata.version('ansible-core')}")
    except metadata.PackageNotFoundError:
        shown.append("ansible-core not installed")
    for requirement in requirements:
        pinned = re.match(r"^vllm\s*==\s*([^;\s]+)", requirement, re.I)
        if pinned:
            shown.append(f"vLLM {pinned[1]}")
            break
    return f"{DISTRIBUTION} {version} ({', '.join(shown)})"


def show_version(value: bool) -> None:
    if value:
        typer.echo(version_text())
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[bool, typer.Option(
        "--version", callback=show_version, is_eager=True, help="Show the version (and the pinned ansible-core and vLLM) and exit.")] = False,
) -> None:
    """Turn a bare NVIDIA GPU server into a tuned, audited vLLM inference host."""

# no name: the module's commands join the root's; a name: a command group (`provision audit spec|host`)
app.add_typer(spec_cmds.app)  # init, inventory, plan
app.add_typer(schema_cmd.app)
app.add_typer(apply_cmd.app)
app.add_typer(facts_cmd.app)
app.add_typer(audit_cmd.app, name="audit")
app.add_typer(wheelhouse_cmd.app)
app.add_typer(bench_cmd.app, name="bench")
app.add_typer(tune_cmd.app)
app.add_typer(trust_cmd.app)
app.add_typer(monitoring_cmd.app, name="monitoring")


def run() -> None:
    """The `provision` script: the app, with no traceback ever reaching the user. A broken installation
    says so in one line; any other unexpected error is named as a bug, its traceback only on request."""
    from provisioner.base.paths import ContentMissing
    from provisioner.base.secrets import redact

    try:
        app()
    except ContentMissing as error:
        typer.echo(f"provision: {error}", err=True)
        sys.exit(PROBLEMS_FOUND)
    except Exception as error:  # noqa: BLE001 — the last line of defence, see the docstring
        if os.environ.get("PROVISION_DEBUG"):
            raise
        typer.echo(f"provision: internal error: {type(error).__name__}: {redact(str(error))} — this is a bug; "
                   "rerun with PROVISION_DEBUG=1 for the traceback and report it", err=True)
        sys.exit(INTERNAL_ERROR)


if __name__ == "__main__":
    run()
