"""`provision audit` against real systemd test hosts: passes after apply, names each planted drift, exit codes.

The hosts are systemd-nspawn containers: the live sysctl, initramfs, kernel cmdline and reboot checks
are n/a there (never "passed").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from contextlib import contextmanager

import pytest

from provisioner.apply.hosts import apply_spec
from provisioner.audit.expectations import spec_targets
from provisioner.audit.runner import HostReport, audit_hosts, disconnect
from provisioner.fleet.remote import Connection, connection_options
from provisioner.spec import load_spec
from tests.lab.specs import (
    MODEL,
    fake_gpu_uuid,
    host_entry,
    install_standin,
    install_vllm_by_hand,
    instance_entry,
    write_spec,
)

PROVISION = [sys.executable, "-m", "provisioner.cli.main"]
CONTAINER_NOT_APPLICABLE = {
    "sysctl live: vm.swappiness", "sysctl live: vm.max_map_count", "nouveau blacklist in the initramfs",
    "kernel cmdline: nouveau flags", "reboot pending for nouveau", "modprobe refuses nouveau",
}
UNIT = "vllm-chat.service"
GPU_CHECKS = ("GPU count", "GPU 0 model", "GPU 0 uuid", "GPU 0 power limit", "GPU 0 persistence mode",
              "GPU 0 PCIe link width", "GPU 0 PCIe link generation", "GPU 0 throttle reasons")


def provision_audit(*args, json_file) -> tuple[subprocess.CompletedProcess, dict]:
    result = subprocess.run([*PROVISION, "audit", *map(str, args), "--json", str(json_file)],
                            capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "250"})
    return result, json.loads(json_file.read_text())


def applied_spec(hosts, path, **instance_extra):
    for host in hosts:
        install_standin(host)
    spec = load_spec(write_spec(path, [host_entry(h) for h in hosts],
                                [instance_entry(hosts[0], "chat", 8000, share=0.9, **instance_extra)]))
    result = apply_spec(spec)
    assert result.succeeded, result.problems
    return spec


def audit_one(spec) -> HostReport:
    (report,) = audit_hosts(spec_targets(spec)).values()
    return report


def not_passed(report: HostReport) -> dict[str, tuple[str, str]]:
    return {check.check: (check.expected, check.actual) for check in report.checks if check.status not in ("passed", "n/a")}


def lab_connection(host) -> Connection:
    return Connection(host.address, "root", 22, str(host.ssh_key), str(host.known_hosts))


@pytest.fixture
def audited_boot(lab):
    """boot(n) -> n fresh hosts, removed afterwards. Named au<n>, not t<n>: nspawn names each host's veth
    after it, so labs side by side on one machine must not share host names. The audit's SSH masters to
    them are closed first: a master left on a vanished container keeps its network namespace for minutes."""
    booted = []

    def _boot(count: int = 1):
        hosts = lab.boot_many([f"au{lab.boot_count + index}" for index in range(count)])
        booted.extend(hosts)
        return hosts

    yield _boot
    disconnect([lab_connection(host) for host in booted])
    for host in booted:
        lab.destroy(host)


@contextmanager
def chat_host(lab, folder, prefix: str, api_key: str, before_apply: Callable[[object], None] = lambda host: None):
    """One booted host (named PREFIX<n>) with the spec applied: the instance `chat` (port 8000, GPU 0 at 0.9,
    `api_key` from a file in `folder`); `before_apply(host)` runs first. Yields (host, spec); the audit's SSH
    master is closed and the host removed afterwards."""
    (host,) = lab.boot_many([f"{prefix}{lab.boot_count}"])
    try:
        key_file = folder / "chat.key"
        key_file.write_text(api_key + "\n")
        before_apply(host)
        yield host, applied_spec([host], folder / "spec.yml", api_key_file=str(key_file))
    finally:
        disconnect([lab_connection(host)])
        lab.destroy(host)


def failing_rows(spec) -> dict[str, tuple[str, str]]:
    """{check: (expected, actual)} of the spec's one host's rows that did not pass (n/a allowed); a host
    that could not be audited fails the test with its reason."""
    report = audit_one(spec)
    assert report.error is None, report.error
    return not_passed(report)


def main_pid(host) -> str:
    return host.ssh(f"systemctl show -p MainPID --value {UNIT}").stdout.strip()


@pytest.fixture(scope="module")
def applied(lab, tmp_path_factory):
    """One host with the spec applied (an instance with an API key); tests here only read it."""
    folder = tmp_path_factory.mktemp("applied")
    with chat_host(lab, folder, "au", "sk-audit-secret-42") as (host, spec):
        yield host, spec, folder


def test_audit_passes_right_after_apply(applied):
    host, spec, folder = applied
    result, report = provision_audit("spec", "--spec", spec.source_path, "--junit", folder / "audit.xml",
                                     json_file=folder / "audit.json")

    assert result.returncode == 0, result.stdout + result.stderr
    checks = report["hosts"][host.name]["checks"]
    statuses = {check["check"]: check["status"] for check in checks}
    assert len(checks) >= 40
    assert {name for name, status in statuses.items() if status == "n/a"} == CONTAINER_NOT_APPLICABLE
    assert set(statuses.values()) == {"passed", "n/a"}
    for name in (f"{UNIT}: User", f"{UNIT}: NoNewPrivileges", f"{UNIT}: ProtectSystem", f"{UNIT}: ExecStart",
                 f"{UNIT}: EnvironmentFile mode", f"{UNIT}: EnvironmentFile owner", f"{UNIT}: GET http://{host.address}:8000/v1/models",
                 f"{UNIT}: Environment CUDA_VISIBLE_DEVICES", f"{UNIT}: listening", "/dev/shm size", "sysctl at boot: vm.swappiness",
                 *GPU_CHECKS):
        assert statuses[name] == "passed", name
    gpu = {check["check"]: check["actual"] for check in checks if check["check"].startswith("GPU")}
    # read through the TEST DOUBLE nvidia-smi (the RTX 3090 fixture) after the role set it: max is 400 W
    assert gpu["GPU 0 power limit"] == "400 W" and gpu["GPU 0 persistence mode"] == "on"
    assert gpu["GPU 0 uuid"] == fake_gpu_uuid(host) and gpu["GPU count"] == "1"
    assert gpu["GPU 0 PCIe link generation"].startswith("gen 1 (idle")  # the fixture's idle card
    assert f"{host.name} ({host.address})" in result.stdout and "sk-audit-secret" not in result.stdout
    suite = ElementTree.parse(folder / "audit.xml").getroot().find("testsuite")
    assert (suite.get("name"), suite.get("tests"), suite.get("failures"), suite.get("skipped")) == (
        host.name, str(len(checks)), "0", str(len(CONTAINER_NOT_APPLICABLE)))


def test_a_group_named_audits_its_host_and_json_dash_is_all_of_stdout(applied, tmp_path):
    """`provision audit spec GROUP --json -` with the spec in $PROVISION_SPEC: stdout is the report alone
    (a program reads it), the tables are on stderr; a name of neither host nor group: exit 2."""
    host, spec, folder = applied
    entry = host_entry(host)
    entry["groups"] = ["rack_a"]
    instances = [instance_entry(host, "chat", 8000, share=0.9, api_key_file=str(folder / "chat.key"))]
    spec_file = write_spec(tmp_path / "grouped.yml", [entry], instances)
    environment = {**os.environ, "PROVISION_SPEC": str(spec_file)}

    result = subprocess.run([*PROVISION, "audit", "spec", "rack_a", "--json", "-"], capture_output=True, text=True,
                            timeout=300, env=environment, cwd=tmp_path)

    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert list(report["hosts"]) == [host.name] and report["hosts"][host.name]["status"] == "passed"
    assert f"{host.name} ({host.address})" in result.stderr
    unknown = subprocess.run([*PROVISION, "audit", "spec", "rack_b"], capture_output=True, text=True, timeout=60,
                             env=environment, cwd=tmp_path)
    assert unknown.returncode == 2 and unknown.stdout == ""
    assert f"no host or group 'rack_b' in {spec_file} — hosts: {host.name}; groups: rack_a" in unknown.stderr


def test_profile_mode_finds_our_unit_and_reports_its_settings(applied):
    host, spec, folder = applied
    result, report = provision_audit("host", f"ssh://root@{host.address}", "--key", host.ssh_key,
                                     "--known-hosts", host.known_hosts, "--profile", "recommended",
                                     json_file=folder / "profile.json")

    assert result.returncode == 0, result.stdout + result.stderr
    checks = {check["check"]: check for check in report["hosts"][host.address]["checks"]}
    assert checks["vLLM units"]["actual"] == UNIT
    assert checks["vLLM containers"]["actual"] == "none found (no docker or podman)"
    assert checks[f"{UNIT}: User"]["actual"] == "vllm"
    assert checks[f"{UNIT}: Environment CUDA_VISIBLE_DEVICES"]["actual"] == fake_gpu_uuid(host)
    assert checks[f"{UNIT}: Environment CUDA_DEVICE_ORDER"]["actual"] == "PCI_BUS_ID"
    assert checks[f"{UNIT}: ExecStart"]["actual"] == "/opt/vllm/venvs/0.25.0/bin/vllm serve --config /etc/vllm/chat.yaml"
    # where it listens and what it serves: read from that config file
    assert checks[f"{UNIT}: listening"]["actual"] == f"{host.address}:8000"
    assert checks[f"{UNIT}: GET http://{host.address}:8000/v1/models"]["actual"] == (
        f"{MODEL} (key: VLLM_API_KEY of pid {main_pid(host)})")  # no spec: the process's own key, and where from
    assert checks[f"{UNIT}: ready (one request served)"]["status"] == "passed"
    assert checks["sysctl at boot: vm.swappiness"]["status"] == "passed"
    assert checks["sysctl live: vm.swappiness"]["status"] == "n/a"
    assert checks["GPUs"]["actual"] == "GPU 0"
    assert checks["GPU 0 power limit"]["actual"] == "400 W (card: 100 W to 400 W, default 350 W)"  # reported
    assert checks["GPU 0 persistence mode"]["status"] == "passed"
    assert checks["GPU 0 uuid"]["actual"] == fake_gpu_uuid(host)  # reported: nothing to compare it with
    assert checks["GPU count"]["actual"] == "1"


def test_unreachable_host_exits_2_and_the_other_host_is_still_audited(applied, lab, tmp_path):
    host, spec, folder = applied
    ghost = host_entry(host)  # the applied spec, plus a host in our lab where nothing was booted
    ghost.update(name="ghost", address=str(lab.network.broadcast_address - 1))
    ghost["gpus"]["devices"][0]["uuid"] = "GPU-00000000-1111-2222-3333-999999999999"
    instances = [instance_entry(host, "chat", 8000, share=0.9, api_key_file=str(folder / "chat.key"))]
    spec_file = write_spec(tmp_path / "spec.yml", [host_entry(host), ghost], instances)

    result, report = provision_audit("spec", "--spec", spec_file, json_file=tmp_path / "audit.json")

    assert result.returncode == 2, result.stdout + result.stderr
    assert report["hosts"]["ghost"]["status"] == "could not run"
    assert "ghost" in result.stdout and "could not run" in result.stdout
    assert "port 22" in report["hosts"]["ghost"]["error"]  # ssh's own message: no route / timed out
    assert report["hosts"][host.name]["status"] == "passed"
    assert len(report["hosts"][host.name]["checks"]) >= 40


HAND_WRITTEN_UNIT = """\
[Unit]
Description=LLM server someone set up by hand

[Service]
ExecStart=/opt/vllm/venv/bin/vllm serve facebook/opt-125m --port 8000 --api-key sk-hand-written-7
Environment=CUDA_VISIBLE_DEVICES=0

[Install]
WantedBy=multi-user.target
"""


def test_profile_mode_on_a_server_we_did_not_build(audited_boot, tmp_path):
    (host,) = audited_boot(1)
    install_standin(host)
    install_vllm_by_hand(host)
    unit_file = tmp_path / "my-llm.service"
    unit_file.write_text(HAND_WRITTEN_UNIT)
    host.put(unit_file, "/etc/systemd/system/my-llm.service", mode="0644")
    host.ssh("systemctl daemon-reload && systemctl enable --now my-llm.service")
    host.ssh("for i in $(seq 100); do ss -Hltn | grep -q ':8000 ' && exit 0; sleep 0.1; done; exit 1")  # listening

    result, report = provision_audit("host", f"ssh://root@{host.address}", "--key", host.ssh_key,
                                     "--known-hosts", host.known_hosts, json_file=tmp_path / "profile.json")

    assert result.returncode == 1, result.stdout + result.stderr
    checks = {check["check"]: check for check in report["hosts"][host.address]["checks"]}
    assert checks["vLLM units"]["actual"] == "my-llm.service"
    failed = {name: check["actual"] for name, check in checks.items() if check["status"] == "failed"}
    assert failed["my-llm.service: User"] == "(unset)"  # runs as root
    assert failed["my-llm.service: Environment CUDA_DEVICE_ORDER"] == "(unset)"
    assert failed["my-llm.service: Environment CUDA_VISIBLE_DEVICES"] == "0"
    assert failed["my-llm.service: Restart"] == "no"
    assert failed["my-llm.service: NoNewPrivileges"] == "no"
    assert failed["GPU 0 persistence mode"] == "off"  # the TEST DOUBLE nvidia-smi's card, as it comes up
    assert checks["GPU 0 power limit"]["actual"] == "350 W (card: 100 W to 400 W, default 350 W)"
    assert "--api-key <redacted>" in failed["my-llm.service: ExecStart"]
    assert "sk-hand-written" not in result.stdout + json.dumps(report)
    # what it serves is reported, and answers (the API key is read from the process on the host)
    models = "my-llm.service: GET http://127.0.0.1:8000/v1/models"  # bound to every address: asked on the loopback
    assert checks[models]["status"] == "passed", checks[models]
    pid = host.ssh("systemctl show -p MainPID --value my-llm.service").stdout.strip()
    assert checks[models]["actual"] == f"facebook/opt-125m (key: the api-key option on the command line of pid {pid})"
    # the readiness probe finds the key on the command line too, and gets a completion served
    assert checks["my-llm.service: ready (one request served)"]["status"] == "passed", checks[
        "my-llm.service: ready (one request served)"]
    assert checks["my-llm.service: listening"]["actual"] == "0.0.0.0:8000"
    assert checks["my-llm.service: active"]["status"] == "passed"


def audit_with_pytest(host, spec, folder) -> subprocess.CompletedProcess:
    """The testinfra way: pytest over testinfra's --hosts with the audit's plugin, the lab's key and known_hosts
    in an ssh_config (no master left behind: one round trip reads the facts)."""
    config = folder / "pytest_ssh_config"
    config.write_text(f"Host {host.address}\n" + "".join(f"  {line}\n" for line in connection_options(lab_connection(host))))
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfs",
                           f"--hosts=ssh://root@{host.address}", f"--ssh-config={config}",
                           f"--ssh-identity-file={host.ssh_key}", "--ssh-extra-args=-o ControlMaster=no",
                           "-p", "provisioner.audit.pytest_plugin", "--spec", str(spec.source_path)],
                          capture_output=True, text=True, timeout=300, cwd=folder)


def test_the_testinfra_way_passes_on_the_applied_host_and_fails_naming_a_drifted_row(applied):
    """`pytest --hosts=ssh://root@HOST -p provisioner.audit.pytest_plugin --spec SPEC`: a test per row, n/a as
    skips; a planted drift (the env file's mode) fails its row's test with expected and actual, then is repaired."""
    host, spec, folder = applied
    rows = len(audit_one(spec).checks)

    clean = audit_with_pytest(host, spec, folder)

    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert f"{rows - len(CONTAINER_NOT_APPLICABLE)} passed, {len(CONTAINER_NOT_APPLICABLE)} skipped" in clean.stdout
    assert "sysctl live: vm.swappiness: n/a: a container" in clean.stdout
    env_file = spec_targets(spec)[0].expected["units"][0]["env_file"]
    assert env_file["mode"] == "0600"
    host.ssh(f"chmod 0640 {env_file['path']}")
    try:
        drifted = audit_with_pytest(host, spec, folder)
    finally:
        host.ssh(f"chmod 0600 {env_file['path']}")

    assert drifted.returncode == 1, drifted.stdout + drifted.stderr
    assert f"{UNIT}: EnvironmentFile mode: expected 0600, actual 0640" in drifted.stdout
    assert f"1 failed, {rows - len(CONTAINER_NOT_APPLICABLE) - 1} passed" in drifted.stdout
    assert "sk-audit-secret" not in clean.stdout + drifted.stdout
