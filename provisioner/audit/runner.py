"""Run the audit suite against hosts: one SSH master per host, all hosts in parallel, one report per host.

1. An ssh_config with one block per host (ControlMaster, ControlPersist): connecting opens the
   host's master connection, which every later command reuses (and a second audit within
   CONTROL_PERSIST finds it open: a warm audit). All hosts are connected in parallel; a host
   that cannot be reached is reported as "could not run" with ssh's own message.
2. Profile mode: discovery on each reachable host, turned into its expectations.
3. One pytest run of the suite (provisioner/audit/suite) over the reachable hosts: it reads each
   host's facts in one SSH round trip, in the background a few hosts at a time, and compares them
   with the expectations host by host. Each finished check is passed to `on_progress`.
   (One pytest process for all hosts, not one per host: on a 2-core machine, eight pytest start-ups
   alone took 5 s.)
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provisioner.audit.expectations import Target, profile_expectations, profile_variables
from provisioner.audit.text import PROGRESS_PREFIX
from provisioner.base.hostkeys import check_host, trust_command
from provisioner.base.unreachable import CONNECT_TIMEOUT_S, LOST, explain
from provisioner.fleet.remote import Connection, connection_options

SUITE_DIR = Path(__file__).resolve().parent / "suite"
CONTROL_PERSIST = "120s"
SUITE_TIMEOUT_S = 600
UNUSED_PYTEST_PLUGINS = ("cacheprovider", "logging", "warnings", "faulthandler", "unraisableexception", "threadexception")

# threads here start ssh at the same time: see the same switch in suite/conftest.py
subprocess._USE_VFORK = False

ProgressCallback = Callable[[str, str, Any], None]  # (host, event, value): connected, collected, check, done


@dataclass
class CheckResult:
    host: str
    check: str
    expected: str
    actual: str
    status: str  # passed | failed | n/a | error | skipped
    message: str = ""
    id: str = ""
    seconds: float = 0.0  # the check's setup and call (a host's first check also waits for its facts)


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

        def prepare(target: Target) -> None:
            started = time.monotonic()
            connection = target.connection
            host_key = check_host(target.name, connection.address, connection.port, connection.known_hosts,
                                  trust_command(spec_path, target.name))
            reports[target.name].error = host_key.reason() or connect(target.name, config)
            if reports[target.name].error is None and profile is not None:
                reports[target.name].error = discover_into(target, config, profile)
            reports[target.name].connect_seconds = round(time.monotonic() - started, 3)
            notify(target.name, "connected", reports[target.name].error)

        with ThreadPoolExecutor(max_workers=max(1, len(targets))) as pool:
            list(pool.map(prepare, targets))
        reachable = [target for target in targets if reports[target.name].error is None]
        if reachable:
            for result in run_suite(reachable, config, Path(workdir), notify, reports):
                reports[result.host].checks.append(result)
        for report in reports.values():
            say_lost(report)
    for report in reports.values():
        notify(report.host, "done", report)
    return reports


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


# --------------------------------------------------------------------------- the suite


def run_suite(
    targets: list[Target], config: Path, workdir: Path, notify: ProgressCallback, reports: dict[str, HostReport]
) -> list[CheckResult]:
    """One pytest run of the suite over `targets`; a host whose checks did not come back gets an error."""
    targets_file, results_file, output_file = workdir / "targets.json", workdir / "results.json", workdir / "pytest.out"
    targets_file.write_text(json.dumps({"hosts": {
        target.name: {"ssh": {"alias": target.name, "config": str(config), "sudo": target.connection.sudo},
                      "expected": target.expected}
        for target in targets
    }}))
    command = [
        sys.executable, "-m", "pytest", str(SUITE_DIR), "-c", str(SUITE_DIR / "pytest.ini"), "--rootdir", str(SUITE_DIR),
        "-p", "provisioner.audit.plugin", "-q", "--no-header", "--audit-targets", str(targets_file),
        "--audit-results", str(results_file),
        # what a check needs none of, and costs about a third of pytest's time per check
        "--assert=plain", "--capture=no", "--tb=line", *(f"-pno:{plugin}" for plugin in UNUSED_PYTEST_PLUGINS),
    ]
    # only our plugin: no other installed pytest plugin joins (or slows) the audit
    environment = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    with output_file.open("w") as output:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL,
                                   stdout=output, stderr=subprocess.PIPE, text=True, env=environment)
        other_lines = follow_progress(process, notify)
        process.wait(timeout=SUITE_TIMEOUT_S)
    results = json.loads(results_file.read_text()) if results_file.exists() else []
    returned = {result["host"] for result in results}
    for target in targets:
        if target.name not in returned:
            tail = (output_file.read_text() + "".join(other_lines)).strip()[-1500:]
            reports[target.name].error = f"the audit suite did not run (pytest exited {process.returncode}): {tail}"
    return [CheckResult(**result) for result in results]


def follow_progress(process: subprocess.Popen, notify: ProgressCallback) -> list[str]:
    """Pass the plugin's progress lines on as they come; return pytest's other stderr lines."""
    other = []
    for line in process.stderr:
        if not line.startswith(PROGRESS_PREFIX):
            other.append(line)
            continue
        event = json.loads(line.removeprefix(PROGRESS_PREFIX))
        for host, count in event.get("collected", {}).items():
            notify(host, "collected", count)
        if "check" in event:
            notify(event["check"]["host"], "check", CheckResult(**event["check"]))
    return other
