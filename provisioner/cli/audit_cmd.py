"""`provision audit`: check hosts against the spec, or a server we did not build against a profile."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from provisioner.audit.expectations import Connection, Target, load_profile, spec_targets
from provisioner.audit.report import host_table, summary, write_json, write_junit
from provisioner.audit.runner import HostReport, audit_hosts, exit_code
from provisioner.cli.common import LimitOption, check_limit, load_spec_or_exit
from provisioner.secrets import redact

COULD_NOT_RUN = 2


def audit(
    spec: Annotated[Path | None, typer.Argument(help="The spec file (YAML). Leave out with --host.")] = None,
    limit: LimitOption = None,
    host: Annotated[str | None, typer.Option(
        "--host", help="ssh://user@address[:port] of a server with no spec of ours (profile mode).")] = None,
    key: Annotated[Path | None, typer.Option("--key", help="SSH private key for --host.")] = None,
    known_hosts: Annotated[Path | None, typer.Option(
        "--known-hosts", help="known_hosts file to check --host's key against (strictly).")] = None,
    profile: Annotated[str, typer.Option(
        "--profile", help="Recommended values to check --host against (provisioner/audit/profiles).")] = "recommended",
    junit: Annotated[Path | None, typer.Option("--junit", help="Also write a JUnit XML report here.")] = None,
    json_file: Annotated[Path | None, typer.Option("--json", help="Also write a JSON report here.")] = None,
    every_check: Annotated[bool, typer.Option(
        "--all", help="Show every check (passed, n/a, reported values), not only the ones that failed.")] = False,
) -> None:
    """Audit what apply set: per host a summary and a table (check, expected, actual, status) of
    what failed (--all: of every check); the JUnit and JSON reports always hold every check.

    Exit 0: every check passed (n/a allowed); 1: drift found; 2: the audit could not run on a host.
    """
    if (spec is None) == (host is None):
        fail("give a spec file, or --host ssh://user@address for a server with no spec of ours")
    if spec is not None:
        targets, profile_values = targets_of_spec(spec, limit), None
    else:
        try:
            targets, profile_values = [host_target(host, key, known_hosts)], load_profile(profile)
        except ValueError as error:
            fail(str(error))
    reports = run_with_progress(targets, profile_values, spec)
    console = Console(highlight=False, soft_wrap=False)
    for report in reports.values():
        if report.error is not None:
            console.print(f"[bold red]{escape(report.host)} ({escape(report.address)}): {escape(summary(report))}[/]")
        else:
            console.print(host_table(report, every_check))
    if junit:
        write_junit(reports, junit)
    if json_file:
        write_json(reports, json_file)
    raise typer.Exit(exit_code(reports))


def fail(message: str) -> None:
    typer.echo(f"audit: {redact(message)}", err=True)
    raise typer.Exit(COULD_NOT_RUN)


def targets_of_spec(spec: Path, limit: str | None) -> list[Target]:
    try:
        loaded = load_spec_or_exit(spec)
    except typer.Exit:
        raise typer.Exit(COULD_NOT_RUN) from None  # 1 would read as "drift found"
    check_limit(loaded, limit, spec)
    return spec_targets(loaded, limit)


def host_target(url: str, key: Path | None, known_hosts: Path | None) -> Target:
    """`ssh://user@address[:port]` → a target (user root and port 22 when left out)."""
    parts = urlsplit(url if "://" in url else f"ssh://{url}")
    if parts.scheme != "ssh" or not parts.hostname:
        raise ValueError(f"--host {url!r}: write ssh://user@address[:port]")
    connection = Connection(
        address=parts.hostname,
        user=parts.username or "root",
        port=parts.port or 22,
        key=str(key.expanduser().absolute()) if key else None,
        known_hosts=str(known_hosts.expanduser().absolute()) if known_hosts else None,
        sudo=(parts.username or "root") != "root",
    )
    return Target(parts.hostname, connection)


def run_with_progress(targets: list[Target], profile: dict | None, spec: Path | None = None) -> dict[str, HostReport]:
    """Audit the targets with one progress bar per host (on stderr; gone once done)."""
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as progress:
        tasks: dict[str, TaskID] = {target.name: progress.add_task(f"{target.name}: connecting", total=None)
                                    for target in targets}

        def on_progress(host: str, event: str, value) -> None:
            task = tasks[host]
            if event == "connected":
                progress.update(task, description=f"{host}: {'checking' if value is None else 'could not connect'}")
            elif event == "collected":
                progress.update(task, total=value)
            elif event == "check":
                progress.advance(task)
            elif event == "done":
                progress.update(task, description=f"{host}: done", completed=len(value.checks), total=len(value.checks))

        return audit_hosts(targets, on_progress=on_progress, profile=profile, spec_path=spec)
