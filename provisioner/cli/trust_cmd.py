"""`provision trust HOST…`: record the keys the hosts present, after you confirmed their fingerprints."""

from __future__ import annotations

from typing import Annotated

import typer

from provisioner.cli.common import PROBLEMS_FOUND, SpecOption, complete_targets, gate_or_exit

app = typer.Typer()


@app.command()
def trust(
    hosts: Annotated[list[str], typer.Argument(
        metavar="HOST|GROUP...", autocompletion=complete_targets, help="Host or group names of the spec, or all.")],
    spec: SpecOption = None,
    yes: Annotated[bool, typer.Option("--yes", help="Record the keys without asking.")] = False,
    replace: Annotated[bool, typer.Option(
        "--replace", help="Replace a different key recorded for the host (only after checking the new one).")] = False,
) -> None:
    """Scan the hosts' keys, show their fingerprints and, once confirmed, record them in each host's
    ssh.known_hosts file (~/.ssh/known_hosts when the spec names none)."""
    from provisioner.base.hostkeys import (
        CHANGED,
        TRUSTED,
        Endpoint,
        HostKeyError,
        check_hosts,
        record_keys,
        trust_command,
        trust_problem,
    )

    # keys are trusted whatever the hosts' GPUs and drivers: the spec's own checks, no preflight
    gated = gate_or_exit(spec, hosts, preflight=False)
    spec, chosen = gated.path, gated.hosts
    checks = check_hosts([Endpoint(host.name, host.address, host.ssh.port, host.ssh.known_hosts,
                                   trust_command(spec, host.name)) for host in chosen])
    failed = False
    for host in chosen:
        check = checks[host.name]
        if check.status == TRUSTED:
            typer.echo(f"{check.where}: already trusted — {check.matching[0].shown()}; nothing written")
            continue
        problem = trust_problem(check, replace)
        if problem:
            typer.echo(problem, err=True)
            failed = True
            continue
        typer.echo(f"{check.where} presents:")
        for key in check.presented:
            typer.echo(f"  {key.shown()}")
        if check.status == CHANGED:
            typer.echo("and replaces (this may be an attack — compare with the host's console first):")
            for entry in check.stale:
                typer.echo(f"  {entry.shown()}")
        if not yes and not typer.confirm(f"Record {'these keys' if len(check.presented) > 1 else 'this key'} "
                                         f"in {check.files[0]}?", default=False):
            typer.echo(f"{host.name}: nothing written")
            failed = True
            continue
        try:
            recorded = record_keys(check, replace)
        except HostKeyError as error:
            typer.echo(str(error), err=True)
            failed = True
            continue
        typer.echo(f"{host.name}: recorded {len(recorded.added)} key{'s' if len(recorded.added) != 1 else ''} "
                   f"in {recorded.file}" + (f", removed {len(recorded.removed)} old" if recorded.removed else ""))
    if failed:
        raise typer.Exit(PROBLEMS_FOUND)
