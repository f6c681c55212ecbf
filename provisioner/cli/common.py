"""Helpers shared by the CLI's commands."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from provisioner.spec import Spec, SpecError, load_spec

SpecArgument = Annotated[Path, typer.Argument(help="The spec file (YAML).")]
LimitOption = Annotated[str | None, typer.Option("--limit", help="Only this host (a host name of the spec).")]


def load_spec_or_exit(path: str | Path) -> Spec:
    """Load and validate the spec; on problems, print each as `path: message` to stderr and exit 1."""
    try:
        return load_spec(path)
    except SpecError as error:
        count = len(error.problems)
        typer.echo(f"{path}: {count} problem{'s' if count != 1 else ''}", err=True)
        for problem in error.problems:
            typer.echo(str(problem), err=True)
        raise typer.Exit(1) from None


def check_limit(spec: Spec, limit: str | None, spec_path: str | Path) -> None:
    """Exit 2 when `--limit` names no host of the spec."""
    host_names = [host.name for host in spec.hosts]
    if limit is not None and limit not in host_names:
        typer.echo(f"--limit: no host named {limit!r} in {spec_path}; hosts: {', '.join(host_names)}", err=True)
        raise typer.Exit(2)


@contextmanager
def exit_on_write_error(destination: str | Path) -> Iterator[None]:
    """An OSError while writing `destination` (nothing of it is left half-written, see provisioner.files)
    becomes one line on stderr and exit 1."""
    try:
        yield
    except OSError as error:
        reason = error.strerror or str(error)
        if error.filename and str(error.filename) != str(destination):
            reason += f" ({error.filename})"
        typer.echo(f"{destination}: cannot write it: {reason} — nothing was written; choose a path you can "
                   "write to", err=True)
        raise typer.Exit(1) from None
