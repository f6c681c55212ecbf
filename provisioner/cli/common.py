"""Helpers shared by the CLI's commands."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from provisioner.selection import SelectionError, find_spec, select_hosts
from provisioner.spec import Host, Spec, SpecError, load_spec

SpecOption = Annotated[Path | None, typer.Option(
    "--spec", "-s", metavar="FILE", show_default=False,
    help="The spec file (YAML). Default: $PROVISION_SPEC, else ./provision.yml.")]
HostsArgument = Annotated[list[str] | None, typer.Argument(
    metavar="HOST|GROUP", show_default=False,
    help="Host or group names of the spec, or all. Default: every host.")]
USAGE_ERROR = 2


def find_spec_or_exit(option: Path | None) -> Path:
    """The spec a command reads (provisioner.selection.find_spec); none: one line and exit 2."""
    try:
        return find_spec(option)
    except SelectionError as error:
        typer.echo(str(error), err=True)
        raise typer.Exit(USAGE_ERROR) from None


def load_found_spec(option: Path | None) -> Spec:
    """Find the spec (--spec, $PROVISION_SPEC, ./provision.yml) and load it, or exit (2: none, 1: invalid)."""
    return load_spec_or_exit(find_spec_or_exit(option))


def select_or_exit(spec: Spec, names: list[str] | None) -> list[Host]:
    """The hosts HOST arguments stand for (provisioner.selection.select_hosts); an unknown name: exit 2."""
    try:
        return select_hosts(spec, names or [])
    except SelectionError as error:
        typer.echo(str(error), err=True)
        raise typer.Exit(USAGE_ERROR) from None


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
