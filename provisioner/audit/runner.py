"""Audit hosts: one SSH master per host, all hosts in parallel (threads), one report per host.

Per host: an ssh_config block with ControlMaster and ControlPersist, so that connecting opens the host's
master connection, which the fact read reuses (and a second audit within CONTROL_PERSIST finds it open: a
warm audit); a host that cannot be reached is reported as "could not run" with ssh's own message. Profile
mode: discovery, turned into the host's expectations. Then the host's facts in one round trip and every
registered check on them, in this process (provisioner/audit/engine.py); each finished check is passed
to `on_progress`.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provisioner.audit.engine import CheckResult, audit_facts, described, host_cases, read_facts
from provisioner.audit.expectations import Target, profile_expectations, profile_variables
from provisioner.base.hostkeys import check_host, trust_command
from provisioner.base.unreachable import CONNECT_TIMEOUT_S, LOST, explain
from provisioner.fleet.remote import Connection, connection_options

CONTROL_PERSIST = "120s"

ProgressCallback = Callable[[str, str, Any], None]  # (host, event, value): connected, collected, check, done

__all__ = ["CheckResult", "HostReport", "audit_hosts", "disconnect", "exit_code"]


@dataclass
class HostReport:
    host: str
    address: str
    checks: list[CheckResult] = field(default_factory=list)
    error: str | None = None  # set when the audit could not run on this host
    connect_seconds: float | None = None  # host key check, ssh master, discovery (profile mode)

    @property
    def check_seconds(self) -> float:
        return sum(check.seconds for check in self.checks)

    def count(self, status: str) -> int:
        return sum(check.status == status for check in self.checks)

    @property
    def status(self) -> str:
        if self.error is not None or self.count("error"):
            return "could not run"
        return "drift" if self.count("failed") else "passed"


def exit_code(reports: dict[str, HostReport]) -> int:
    """0: every check passed (n/a allowed); 1: drift found; 2: a host or a check could not run."""
    statuses = {report.status for report in reports.values()}
    if "could not run" in statuses:
        return 2
    return 1 if "drift" in statuses else 0


def audit_hosts(
    targets: list[Target],
    on_progress: ProgressCallback | None = None,
    profile: dict[str, Any] | None = None,
    spec_path: str | Path | None = None,
) -> dict[str, HostReport]:
    """Audit every target (expectations given, or from `profile` after discovery); one report per host.

    A host whose key is unknown or changed "could not run", with the fingerprints and the fix
    (`provision trust` when there is a spec) and nothing sent to it; the others are audited."""
    notify = on_progress or (lambda host, event, value: None)
    reports = {target.name: HostReport(target.name, target.connection.address) for target in targets}
    with tempfile.TemporaryDirectory(prefix="provision-audit-") as workdir:
        config = Path(workdir) / "ssh_config"
        config.write_text("".join(ssh_config_block(target.name, target.connection) for target in targets))

        def audit(target: Target) -> None:
            report = reports[target.name]
            started = time.monotonic()
            connection = target.connection
            host_key = check_host(target.name, connection.address, connection.port, connection.known_hosts,
                                  trust_command(spec_path, target.name))
            report.error = host_key.reason() or connect(target.name, config)
            if report.error is None and profile is not None:
                report.error = discover_into(target, config, profile)
            report.connect_seconds = round(time.monotonic() - started, 3)
            notify(target.name, "connected", report.error)
            if report.error is None:
                try:
                    check_host_facts(target, config, report, notify)
                except Exception as error:  # no traceback to the user: the host could not be audited, and why
                    report.error, report.checks = f"the audit failed: {described(error)}", []
            notify(target.name, "done", report)

        with ThreadPoolExecutor(max_workers=max(1, len(targets))) as pool:
            list(pool.map(audit, targets))
    return reports


def check_host_facts(target: Target, config: Path, report: HostReport, notify: ProgressCallback) -> None:
    """Read the host's facts in one round trip over its master and run every check on them."""
    cases = host_cases(target.name, target.expected)
    notify(target.name, "collected", len(cases))
    host = testinfra_host(target.name, config, target.connection.sudo)
    for result in audit_facts(target.name, target.expected, lambda: read_facts(host, target.expected), cases):
        report.checks.append(result)
        notify(target.name, "check", result)
    say_lost(report)


def say_lost(report: HostReport) -> None:
    """A host lost after it connected could not be audited: one reason, not one error row per check."""
    if report.checks and all(check.status == "error" for check in report.checks) \
            and report.checks[0].message.startswith(LOST):
        report.error, report.checks = report.checks[0].message, []


# --------------------------------------------------------------------------- ssh


def control_dir() -> Path:
    path = Path(tempfile.gettempdir()) / f"provision-audit-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def ssh_config_block(alias: str, connection: Connection) -> str:
    lines = [*connection_options(connection), "ControlMaster auto", f'ControlPath "{control_path(connection)}"',
             f"ControlPersist {CONTROL_PERSIST}"]
    return f"Host {alias}\n" + "".join(f"  {line}\n" for line in lines)


def control_path(connection: Connection) -> Path:
    """The master's socket, named after all the connection's options: a changed key or known_hosts
    file (or another host at the same address) never reuses an old connection."""
    return control_dir() / hashlib.sha256("\n".join(connection_options(connection)).encode()).hexdigest()[:20]


def disconnect(connections: list[Connection]) -> None:
    """Close the master connections to these hosts now, not CONTROL_PERSIST after the last audit
    (before a host goes away: a master left on a vanished host keeps a half-open connection)."""
    for connection in connections:
        subprocess.run(["ssh", "-o", f"ControlPath={control_path(connection)}", "-O", "exit", connection.address],
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=10)


def connect(alias: str, config: Path) -> str | None:
    """Open (or find open) the host's master connection; None, or why the host cannot be reached."""
    try:
        result = subprocess.run(["ssh", "-F", str(config), alias, "true"], stdin=subprocess.DEVNULL,
                                capture_output=True, text=True, timeout=CONNECT_TIMEOUT_S + 25)
    except subprocess.TimeoutExpired:
        return f"ssh to {alias} did not answer within {CONNECT_TIMEOUT_S + 25} s"
    if result.returncode != 0:
        return explain(result.stderr.strip()) or f"ssh exited {result.returncode}"
    return None


def testinfra_host(alias: str, config: Path, sudo: bool):
    """A testinfra host over the ssh_config's master (testinfra adds no ControlPersist of its own)."""
    import testinfra

    return testinfra.get_host(f"ssh://{alias}", ssh_config=str(config), controlpersist=0, sudo=sudo)


def discover_into(target: Target, config: Path, profile: dict[str, Any]) -> str | None:
    from provisioner.audit.discovery import discover

    try:
        nvidia_smi = profile_variables(profile)["nvidia_gpu_nvidia_smi"]
        discovered = discover(testinfra_host(target.name, config, target.connection.sudo), nvidia_smi)
    except Exception as error:  # the host answered ssh but not discovery: it could not be audited
        return f"discovery failed: {error}"
    target.expected = profile_expectations(profile, discovered)
    return None
