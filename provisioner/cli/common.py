"""Helpers shared by the CLI's commands, and the exit codes every command keeps to.

Light to import (typer and the standard library): `provision --help` reads every command's options
without loading the spec's models; the helpers import what they use when called.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

if TYPE_CHECKING:
    from provisioner.spec import Host, Spec

# the exit codes of every command (README): one meaning each
PROBLEMS_FOUND = 1  # the spec has problems, drift was found, a run failed
USAGE_ERROR = 2  # wrong arguments, or the command could not run at all
INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)
INTERNAL_ERROR = 70  # EX_SOFTWARE: a bug (main.run)

SpecOption = Annotated[Path | None, typer.Option(
    "--spec", "-s", metavar="FILE", show_default=False,
    help="The spec file (YAML). Default: $PROVISION_SPEC, else ./provision.yml.")]
HostsArgument = Annotated[list[str] | None, typer.Argument(
    metavar="HOST|GROUP", show_default=False,
    help="Host or group names of the spec, or all. Default: every host.")]


def exit_with(code: int, message: str | None = None) -> NoReturn:
    """Leave the command with `code` (one of the above), saying `message` on stderr first when given."""
    if message is not None:
        typer.echo(message, err=True)
    raise typer.Exit(code)


def find_spec_or_exit(option: Path | None) -> Path:
    """The spec a command reads (provisioner.selection.find_spec); none: one line and exit 2."""
    from provisioner.selection import SelectionError, find_spec

    try:
        return find_spec(option)
    except SelectionError as error:
        exit_with(USAGE_ERROR, str(error))


def load_found_spec(option: Path | None) -> Spec:
    """Find the spec (--spec, $PROVISION_SPEC, ./provision.yml) and load it, or exit (2: none, 1: invalid)."""
    return load_spec_or_exit(find_spec_or_exit(option))


def select_or_exit(spec: Spec, names: list[str] | None) -> list[Host]:
    """The hosts HOST arguments stand for (provisioner.selection.select_hosts); an unknown name: exit 2."""
    from provisioner.selection import SelectionError, select_hosts

    try:
        return select_hosts(spec, names or [])
    except SelectionError as error:
        exit_with(USAGE_ERROR, str(error))


def load_spec_or_exit(path: str | Path) -> Spec:
    """Load and validate the spec; on problems, print each as `path: message` to stderr (redacted: no secret the
    spec declares shows) and exit 1."""
    from provisioner.secrets import redact
    from provisioner.spec import SpecError, load_spec

    try:
        return load_spec(path)
    except SpecError as error:
        count = len(error.problems)
        typer.echo(f"{path}: {count} problem{'s' if count != 1 else ''}", err=True)
        for problem in error.problems:
            typer.echo(redact(str(problem)), err=True)
        exit_with(PROBLEMS_FOUND)


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
        exit_with(PROBLEMS_FOUND, f"{destination}: cannot write it: {reason} — nothing was written; choose a "
                                  "path you can write to")
