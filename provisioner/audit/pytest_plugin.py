"""The audit's checks as pytest tests, the testinfra way: one test per row, per host of testinfra's --hosts.

    pytest -p provisioner.audit.pytest_plugin --hosts=ssh://root@HOST --spec SPEC
    pytest -p provisioner.audit.pytest_plugin --hosts=ssh://root@HOST --profile recommended

The connection is testinfra's (its --hosts, --ssh-config, --ssh-identity-file, --sudo…). Spec mode: a host's
expectations are those of the spec's host with that address (or name); profile mode: the profile applied to
what discovery finds on it. Each host's facts are read once, in one round trip, by its first test. A drift
fails its test with the row (`ROW: expected E, actual A`); n/a is a skip; a check that could not run, an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import testinfra

from provisioner.audit.engine import CheckResult, Facts, host_cases, read_facts, run_case
from provisioner.audit.registry import Case, Check


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("vllm-provision audit")
    group.addoption("--spec", help="audit the --hosts against this spec (their expectations: its host of that address)")
    group.addoption("--profile", help="audit the --hosts against a profile of recommended values (e.g. recommended)")


def pytest_configure(config: pytest.Config) -> None:
    if not (config.getoption("spec") or config.getoption("profile")):
        return
    if config.getoption("spec") and config.getoption("profile"):
        raise pytest.UsageError("--spec and --profile: give one")
    # this module's test_audit is what runs: collected from here, whatever folder pytest was started in
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        config.args[:] = []
    config.args.append(__file__)
    config.pluginmanager.register(AuditRows(), "vllm-provision-audit-rows")


@dataclass
class AuditedHost:
    """A host of --hosts: its testinfra host, its name in the rows, its expectations; its facts once read."""

    host: Any  # testinfra.host.Host
    name: str
    expected: dict[str, Any]
    _facts: Facts | None = field(default=None, repr=False)

    def facts(self) -> Facts:
        if self._facts is None:
            self._facts = read_facts(self.host, self.expected)
        return self._facts


@dataclass
class Row:
    """One check on one item of one host: a test."""

    audited: AuditedHost
    check: Check
    case: Case
    id: str

    def run(self) -> CheckResult:
        return run_case(self.check, self.case, self.id, self.audited.facts())


def connected_hosts(config: pytest.Config) -> list[Any]:
    """The hosts of --hosts, connected as testinfra's own plugin connects them."""
    option = config.option
    if not option.hosts:
        raise pytest.UsageError("the audit needs --hosts (ssh://user@address, comma-separated)")
    return testinfra.get_hosts(option.hosts.split(","), connection=option.connection, ssh_config=option.ssh_config,
                               ssh_identity_file=option.ssh_identity_file, ssh_extra_args=option.ssh_extra_args,
                               sudo=option.sudo, sudo_user=option.sudo_user, ansible_inventory=option.ansible_inventory,
                               force_ansible=option.force_ansible)


def audited_hosts(config: pytest.Config) -> list[AuditedHost]:
    hosts = connected_hosts(config)
    if config.getoption("spec"):
        return [spec_host(host, config.getoption("spec")) for host in hosts]
    return [profile_host(host, config.getoption("profile")) for host in hosts]


def spec_host(host: Any, spec_path: str) -> AuditedHost:
    from provisioner.audit.expectations import spec_targets
    from provisioner.spec import load_spec

    address = host.backend.get_hostname()
    targets = spec_targets(load_spec(Path(spec_path)))
    for target in targets:
        if address in (target.connection.address, target.name):
            return AuditedHost(host, target.name, target.expected)
    raise pytest.UsageError(f"--hosts {address}: no host of {spec_path} has that address or name "
                            f"(its hosts: {', '.join(f'{target.name} {target.connection.address}' for target in targets)})")


def profile_host(host: Any, profile_name: str) -> AuditedHost:
    from provisioner.audit.discovery import discover
    from provisioner.audit.expectations import load_profile, profile_expectations, profile_variables

    profile = load_profile(profile_name)
    discovered = discover(host, profile_variables(profile)["nvidia_gpu_nvidia_smi"])
    return AuditedHost(host, host.backend.get_hostname(), profile_expectations(profile, discovered))


class AuditRows:
    """Parametrizes test_audit with every row of every host (a plugin object: the module is also collected,
    and pytest would call a module-level pytest_generate_tests a second time)."""

    @staticmethod
    def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
        if "audit_row" not in metafunc.fixturenames:
            return
        rows = [Row(audited, found, case, test_id) for audited in audited_hosts(metafunc.config)
                for found, case, test_id in host_cases(audited.name, audited.expected)]
        metafunc.parametrize("audit_row", rows, ids=[row.id.replace("::", ".") for row in rows])


class CheckError(Exception):
    """A check that could not run on the host (its facts unreadable, the host lost, a bug)."""


def test_audit(audit_row: Row) -> None:
    result = audit_row.run()
    if result.status == "failed":
        pytest.fail(f"{result.check}: expected {result.expected}, actual {result.actual}", pytrace=False)
    if result.status == "n/a":
        pytest.skip(f"{result.check}: n/a: {result.message}")
    if result.status == "error":
        raise CheckError(f"{result.check}: {result.message}")
