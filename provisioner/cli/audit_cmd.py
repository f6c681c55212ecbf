"""`provision audit`: `audit spec` checks the spec's hosts against it; `audit host` checks a server we
did not build against a profile. Exit 0: every check passed (n/a allowed); 1: drift found; 2: the
audit could not run on a host."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from provisioner.cli.common import (
    STDOUT,
    USAGE_ERROR,
    HostsArgument,
    SpecOption,
    complete_profiles,
    exit_with,
    gate_or_exit,
    write_to,
)

if TYPE_CHECKING:
    from provisioner.audit.expectations import Target
    from provisioner.audit.runner import HostReport

app = typer.Typer(help="Audit what apply set: the spec's hosts against the spec, or a server of no spec of ours "
                       "against a profile.", no_args_is_help=True)

JunitOption = Annotated[str | None, typer.Option(
    "--junit", metavar="FILE|-", help="Also write a JUnit XML report here (-: to stdout, the tables to stderr).")]
JsonOption = Annotated[str | None, typer.Option(
    "--json", metavar="FILE|-", help="Also write a JSON report here (-: to stdout, the tables to stderr).")]
EveryCheckOption = Annotated[bool, typer.Option(
    "--all", help="Show every check (passed, n/a, reported values), not only the ones that failed.")]


@app.command("spec")
def audit_spec(
    hosts: HostsArgument = None,
    spec: SpecOption = None,
    junit: JunitOption = None,
    json_file: JsonOption = None,
    every_check: EveryCheckOption = False,
) -> None:
    """Audit what apply set on the spec's hosts: per host a summary and a table (check, expected, actual,
    status) of what failed (--all: of every check); the JUnit and JSON reports always hold every check.

    The spec: --spec FILE, else $PROVISION_SPEC, else ./provision.yml; HOST|GROUP: only those hosts.

    Exit 0: every check passed (n/a allowed); 1: drift found; 2: the audit could not run on a host.
    """
    check_report_destinations(json_file, junit)
    spec_path = found_spec(spec)
    targets = targets_of_spec(spec_path, hosts or [], json_file)
    report(run_with_progress(targets, None, spec_path), junit, json_file, every_check)


@app.command("host")
def audit_host(
    url: Annotated[str, typer.Argument(
        metavar="URL", help="ssh://user@address[:port] of a server with no spec of ours (user root and port 22 when "
        "left out).")],
    key: Annotated[Path | None, typer.Option("--key", help="SSH private key for the server.")] = None,
    known_hosts: Annotated[Path | None, typer.Option(
        "--known-hosts", help="known_hosts file to check the server's key against (strictly).")] = None,
    profile: Annotated[str, typer.Option(
        "--profile", autocompletion=complete_profiles, help="Recommended values to check against: recommended (docs/audit.md, \"Profile mode\").")] = "recommended",
    junit: JunitOption = None,
    json_file: JsonOption = None,
    every_check: EveryCheckOption = False,
) -> None:
    """Audit a server with no spec of ours against a --profile: per check expected, actual, status.

    Exit 0: every check passed (n/a allowed); 1: drift found; 2: the audit could not run.
    """
    from provisioner.audit.expectations import load_profile

    check_report_destinations(json_file, junit)
    try:
        targets, profile_values = [host_target(url, key, known_hosts)], load_profile(profile)
    except ValueError as error:
        fail(str(error))
    report(run_with_progress(targets, profile_values), junit, json_file, every_check)


def check_report_destinations(json_file: str | None, junit: str | None) -> None:
    if json_file == STDOUT and junit == STDOUT:
        fail("--json - and --junit - would both write to stdout — send one of them to a file")


def report(reports: dict[str, HostReport], junit: str | None, json_file: str | None, every_check: bool) -> None:
    """Per host its table (or why it could not be audited), the reports asked for; exit with the verdict."""
    from rich.markup import escape

    from provisioner.audit.report import host_table, json_text, junit_text, summary
    from provisioner.audit.runner import exit_code
    from provisioner.cli.console import make_console

    # the tables go to stderr when a report takes stdout
    console = make_console(stderr=STDOUT in (json_file, junit))
    for host_report in reports.values():
        if host_report.error is not None:
            console.print(f"[bold red]{escape(host_report.host)} ({escape(host_report.address)}): "
                          f"{escape(summary(host_report))}[/]")
        else:
            console.print(host_table(host_report, every_check))
    if junit:
        write_report(junit, junit_text(reports))
    if json_file:
        write_report(json_file, json_text(reports))
    raise typer.Exit(exit_code(reports))


def write_report(destination: str, text: str) -> None:
    """The report to stdout (`-`) or to the file; a file that cannot be written: exit 2."""
    try:
        write_to(destination, text)
    except typer.Exit:
        exit_with(USAGE_ERROR)  # 1 would read as "drift found"


def fail(message: str) -> None:
    """`audit: message` on stderr; exit 2 (the audit could not run)."""
    from provisioner.base.secrets import redact

    exit_with(USAGE_ERROR, f"audit: {redact(message)}")


def found_spec(option: Path | None) -> Path:
    """--spec, $PROVISION_SPEC or ./provision.yml; none: exit 2 naming them (and `audit host`)."""
    from provisioner.fleet.selection import SelectionError, find_spec

    try:
        return find_spec(option)
    except SelectionError as error:
        fail(f"{error}; or audit a server with no spec of ours with `provision audit host ssh://user@address`")


def targets_of_spec(spec: Path, names: list[str], json_file: str | None = None) -> list[Target]:
    """The targets of the hosts `names` stand for (host or group names, all; none: every host), once the spec
    passed the gate (a refusal: exit 2, as JSON too where the JSON report would go)."""
    from provisioner.audit.expectations import spec_targets

    gated = gate_or_exit(spec, names, json_to=json_file, invalid_code=USAGE_ERROR)  # 1 would read as "drift found"
    chosen = {host.name for host in gated.hosts}
    return [target for target in spec_targets(gated.spec) if target.name in chosen]


def host_target(url: str, key: Path | None, known_hosts: Path | None) -> Target:
    """`ssh://user@address[:port]` → a target (user root and port 22 when left out)."""
    from urllib.parse import urlsplit

    from provisioner.audit.expectations import Target
    from provisioner.fleet.remote import Connection

    parts = urlsplit(url if "://" in url else f"ssh://{url}")
    if parts.scheme != "ssh" or not parts.hostname:
        raise ValueError(f"audit host {url!r}: write ssh://user@address[:port]")
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
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

    from provisioner.audit.runner import audit_hosts
    from provisioner.cli.console import make_console

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
