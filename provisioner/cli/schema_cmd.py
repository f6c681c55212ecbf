"""`provision schema`: the JSON Schema of the spec, from the model this installation validates with."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from provisioner.cli.common import exit_on_write_error

app = typer.Typer()


@app.command()
def schema(
    output: Annotated[Path | None, typer.Option(
        "--output", "-o", help="Write it to this file (e.g. provision.schema.json) instead of stdout.")] = None,
) -> None:
    """Print the spec's JSON Schema (draft-07): editors validate the spec with it (docs/spec.md)."""
    from provisioner.base.files import write_file
    from provisioner.spec_docs import schema_text

    text = schema_text()
    if output is None:
        typer.echo(text, nl=False)
        return
    with exit_on_write_error(output):
        write_file(output, text.encode("utf-8"))
    typer.echo(f"wrote {output}")
