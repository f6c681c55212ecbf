"""Helpers shared by the CLI's commands, and the exit codes every command keeps to.

Light to import (typer and the standard library): `provision --help` reads every command's options
without loading the spec's models; the helpers import what they use when called.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn, TypeVar

import typer

if TYPE_CHECKING:
    from provisioner.validation.gate import Gated

# the exit codes of every command (README): one meaning each
PROBLEMS_FOUND = 1  # the spec has problems, drift was found, a run failed
USAGE_ERROR = 2  # wrong arguments, or the command could not run at all
INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)
INTERNAL_ERROR = 70  # EX_SOFTWARE: a bug (main.run)
STDOUT = "-"  # a report (or a JSON error) written to stdout
T = TypeVar("T")

SpecOption = Annotated[Path | None, typer.Option(
    "--spec", "-s", metavar="FILE", show_default=False,
    help="The spec file (YAML). Default: $PROVISION_SPEC, else ./provision.yml.")]


def complete_targets(ctx: typer.Context, incomplete: str) -> list[str]:
    """<Tab> on a HOST|GROUP argument: the spec's host and group names (the spec of --spec, if given before)."""
    from provisioner.fleet.completion import matching, target_names

    return matching(target_names(ctx.params.get("spec")), incomplete)


def complete_instances(ctx: typer.Context, incomplete: str) -> list[str]:
    """<Tab> on an INSTANCE argument: the spec's instance names."""
    from provisioner.fleet.completion import instance_names, matching

    return matching(instance_names(ctx.params.get("spec")), incomplete)


def complete_profiles(incomplete: str) -> list[str]:
    """<Tab> on `audit host --profile`: the audit's profiles."""
    from provisioner.audit.expectations import PROFILES_DIR

    return sorted(path.stem for path in PROFILES_DIR.glob("*.yml") if path.stem.startswith(incomplete))


def complete_loads(incomplete: str) -> list[str]:
    """<Tab> on `--load`: bench's load profiles."""
    from provisioner.bench.loads import load_profiles

    return [name for name in load_profiles() if name.startswith(incomplete)]


HostsArgument = Annotated[list[str] | None, typer.Argument(
    metavar="HOST|GROUP", show_default=False, autocompletion=complete_targets,
    help="Host or group names of the spec, or all. Default: every host.")]


def exit_with(code: int, message: str | None = None) -> NoReturn:
    """Leave the command with `code` (one of the above), saying `message` on stderr first when given (its
    control characters shown escaped)."""
    if message is not None:
        from provisioner.spec.wording import printable

        typer.echo(printable(message), err=True)
    raise typer.Exit(code)


NOTHING_DONE = "nothing was written and no host was touched"


def gate_or_exit(option: Path | None, names: list[str] | None = None, *, preflight: bool = True,
                 json_to: str | None = None, invalid_code: int = PROBLEMS_FOUND, nothing: str = NOTHING_DONE) -> Gated:
    """The spec through the one gate (provisioner.validation.gate: found, valid, the HOST names known; with `preflight`,
    every GPU's memory and the drivers the spec names on those hosts), or exit: 2 for a usage error (no spec, an
    unknown HOST), else `invalid_code`. The refusal goes to stderr as lines (the preflight's followed by
    `nothing`: what to fix), or with `json_to` as one JSON error object: to stdout (`-`, nothing else printed) or
    into that file."""
    from provisioner.validation.gate import read_spec

    gated = passed_or_exit(lambda: read_spec(option, names or []), json_to, invalid_code, nothing)
    if preflight:
        preflight_or_exit(gated, json_to=json_to, invalid_code=invalid_code, nothing=nothing)
    return gated


def preflight_or_exit(gated: Gated, *, json_to: str | None = None, invalid_code: int = PROBLEMS_FOUND,
                      nothing: str = NOTHING_DONE) -> None:
    """The gate's preflight on what passed `gate_or_exit(preflight=False)`; refused: as gate_or_exit says."""
    from provisioner.validation.gate import preflight_gate

    passed_or_exit(lambda: preflight_gate(gated), json_to, invalid_code, nothing)


def passed_or_exit(step: Callable[[], T], json_to: str | None, invalid_code: int, nothing: str) -> T:
    """`step()` of the gate; a GateRefused shown (see gate_or_exit) and exit."""
    from provisioner.validation.gate import REFUSED, USAGE, GateRefused

    try:
        return step()
    except GateRefused as refused:
        if json_to is not None:
            write_json_error(refused.as_json(), json_to)
        if json_to != STDOUT:
            lines = refused.lines
            if refused.kind == REFUSED:
                lines.append(refusal_note({refusal.label for refusal in refused.refusals}, nothing))
            typer.echo("\n".join(lines), err=True)
        exit_with(USAGE_ERROR if refused.kind == USAGE else invalid_code)


def refusal_note(kinds: set[str | None], nothing: str) -> str:
    """The line after the preflight's refusal (provisioner/validation/preflight.py): nothing done, and what to fix."""
    if "driver" in kinds:
        return f"{nothing}: fix the driver or the spec (`provision plan` shows what each host needs)"
    return f"{nothing}: fix the spec (`provision plan` shows each GPU's memory)"


def write_json_error(error: dict, destination: str) -> None:
    """A JSON error object to stdout (`-`) or into the file `destination` (where its report would go)."""
    import json

    write_to(destination, json.dumps(error, indent=2, ensure_ascii=False) + "\n")


def write_to(destination: str, text: str) -> None:
    """`text` to stdout (`-`) or into the file (provisioner.base.files: whole or not at all; cannot: exit 1)."""
    from provisioner.base.files import write_file

    if destination == STDOUT:
        typer.echo(text, nl=False)
        return
    with exit_on_write_error(destination):
        write_file(Path(destination), text.encode("utf-8"))


@contextmanager
def exit_on_write_error(destination: str | Path) -> Iterator[None]:
    """An OSError while writing `destination` (nothing of it is left half-written, see provisioner.base.files)
    becomes one line on stderr and exit 1."""
    try:
        yield
    except OSError as error:
        reason = error.strerror or str(error)
        if error.filename and str(error.filename) != str(destination):
            reason += f" ({error.filename})"
        exit_with(PROBLEMS_FOUND, f"{destination}: cannot write it: {reason} — nothing was written; choose a "
                                  "path you can write to")
