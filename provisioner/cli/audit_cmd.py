"""`provision audit`: check hosts against the spec, or a server we did not build against a profile."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from provisioner.audit.expectations import Connection, Target, load_profile, spec_targets
from provisioner.audit.report import host_table, json_text, junit_text, summary
from provisioner.audit.runner import HostReport, audit_hosts, exit_code
from provisioner.cli.common import HostsArgument, SpecOption, exit_on_write_error, load_spec_or_exit, select_or_exit
from provisioner.cli.console import make_console
from provisioner.files import write_file
from provisioner.secrets import redact
from provisioner.selection import SelectionError, find_spec

COULD_NOT_RUN = 2
STDOUT = "-"


def audit(
    hosts: HostsArgument = None,
    spec: SpecOption = None,
    host: Annotated[str | None, typer.Option(
        "--host", help="ssh://user@address[:port] of a server with no spec of ours (profile mode).")] = None,
    key: Annotated[Path | None, typer.Option("--key", help="SSH private key for --host.")] = None,
    known_hosts: Annotated[Path | None, typer.Option(
        "--known-hosts", help="known_hosts file to check --host's key against (strictly).")] = None,
    profile: Annotated[str, typer.Option(
        "--profile", help="Recommended values to check --host against (provisioner/audit/profiles).")] = "recommended",
    junit: Annotated[str | None, typer.Option(
        "--junit", metavar="FILE|-", help="Also write a JUnit XML report here (-: to stdout, the tables to stderr).")] = None,
    json_file: Annotated[str | None, typer.Option(
        "--json", metavar="FILE|-", help="Also write a JSON report here (-: to stdout, the tables to stderr).")] = None,
    every_check: Annotated[bool, typer.Option(
        "--all", help="Show every check (passed, n/a, reported values), not only the ones that failed.")] = False,
) -> None:
    """Audit what apply set: per host a summary and a table (check, expected, actual, status) of
    what failed (--all: of every check); the JUnit and JSON reports always hold every check.

    The spec: --spec FILE, else $PROVISION_SPEC, else ./provision.yml; HOST|GROUP: only those hosts.
    --host audits a server with no spec of ours against a --profile instead.

    Exit 0: every check passed (n/a allowed); 1: drift found; 2: the audit could not run on a host.
    """
    if json_file == STDOUT and junit == STDOUT:
        fail("--json - and --junit - would both write to stdout — send one of them to a file")
    if host is not None:
        if spec is not None or hosts:
            fail("--host audits one server that has no spec of ours — leave out --spec and the HOST names, "
                 "or leave out --host to audit the spec's hosts")
        try:
            targets, profile_values = [host_target(host, key, known_hosts)], load_profile(profile)
        except ValueError as error:
            fail(str(error))
        spec_path = None
    else:
        spec_path = found_spec(spec)
        targets, profile_values = targets_of_spec(spec_path, hosts or []), None
    reports = run_with_progress(targets, profile_values, spec_path)
    # the tables go to stderr when a report takes stdout
    console = make_console(stderr=STDOUT in (json_file, junit))
    for report in reports.values():
        if report.error is not None:
            console.print(f"[bold red]{escape(report.host)} ({escape(report.address)}): {escape(summary(report))}[/]")
        else:
            console.print(host_table(report, every_check))
    if junit:
        write_report(junit, junit_text(reports))
    if json_file:
        write_report(json_file, json_text(reports))
    raise typer.Exit(exit_code(reports))


def write_report(destination: str, text: str) -> None:
    """The report to stdout (`-`) or to the file; a file that cannot be written: exit 2."""
    if destination == STDOUT:
        typer.echo(text, nl=False)
        return
    try:
        with exit_on_write_error(destination):
            write_file(Path(destination), text.encode("utf-8"))
    except typer.Exit:
        raise typer.Exit(COULD_NOT_RUN) from None


def fail(message: str) -> None:
    typer.echo(f"audit: {redact(message)}", err=True)
    raise typer.Exit(COULD_NOT_RUN)


def found_spec(option: Path | None) -> Path:
    """--spec, $PROVISION_SPEC or ./provision.yml; none: exit 2 naming them (and --host)."""
    try:
        return find_spec(option)
    except SelectionError as error:
        fail(f"{error}; or audit a server with no spec of ours with --host ssh://user@address")


def targets_of_spec(spec: Path, names: list[str]) -> list[Target]:
    """The targets of the hosts `names` stand for (host or group names, all; none: every host)."""
    try:
        loaded = load_spec_or_exit(spec)
    except typer.Exit:
        raise typer.Exit(COULD_NOT_RUN) from None  # 1 would read as "drift found"
    chosen = {chosen_host.name for chosen_host in select_or_exit(loaded, names)}  # unknown name: exit 2
    return [target for target in spec_targets(loaded) if target.name in chosen]


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
                  console=make_console(stderr=True), transient=True) as progress:
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
