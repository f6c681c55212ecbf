"""NVIDIA's container toolkit (role container_engine, phase toolkit) on one real systemd test host (bookworm,
systemd-nspawn, over SSH), run as `provision apply --tags container_engine_toolkit,container_engine_configure`
runs it, from the spec's `container_toolkit:` section; the engines themselves are test_containers.py's.

NVIDIA's repository is not reachable here: a signed local repository of TEST DOUBLE nvidia-container-toolkit-base
packages, 1.17.8-1 (no refresh units) and 1.18.0-1 (NVIDIA's own units and postinst), whose nvidia-ctk double writes
a CDI spec of the GPU the lab's TEST DOUBLE nvidia-smi lists (tests/lab/container_toolkit.py). The host's running
kernel has a modules.dep listing nvidia.ko, as after a driver's install; rewriting it (what depmod does when the
driver changes) must regenerate the spec through the refresh path unit: the role's own for 1.17.8, the toolkit's
for 1.18.0. The tests share the host's history and run in order.
"""

from __future__ import annotations

import json
import time

import pytest

from provisioner.apply.controls import Controls
from provisioner.apply.hosts import apply_spec
from provisioner.audit.expectations import spec_targets
from provisioner.audit.runner import audit_hosts
from provisioner.spec import load_spec
from tests.integration.conftest import disk_state
from tests.integration.test_nvidia_driver import changed, dpkg, notes
from tests.lab.container_toolkit import toolkit_doubles_repo
from tests.lab.nvidia_driver import DOUBLE_KEY, LoggedAptRepo, doubles_key_fingerprint
from tests.lab.specs import fake_gpu_uuid, host_entry, install_gpu_standin, instance_entry, write_spec

TAGS = ("container_engine_toolkit", "container_engine_configure")
SPEC = "/etc/cdi/nvidia.yaml"
LOG = "/var/log/nvidia-ctk-double.jsonl"
OWN_UNITS = ("/etc/systemd/system/vllm-provision-cdi-refresh.path",
             "/etc/systemd/system/vllm-provision-cdi-refresh.service")
DROPIN = "/etc/systemd/system/nvidia-cdi-refresh.service.d/vllm-provision.conf"
SOURCE = "/etc/apt/sources.list.d/vllm-provision-nvidia-container-toolkit.sources"


@pytest.fixture(scope="module")
def repo(lab):
    served = LoggedAptRepo(toolkit_doubles_repo(), lab.gateway)
    yield served
    served.close()


def calls(host) -> list[dict]:
    """Every `nvidia-ctk cdi generate` of the double: version, output, strategies, the unit that ran it."""
    return [json.loads(line) for line in host.ssh(f"cat {LOG} 2>/dev/null || true").stdout.splitlines()]


def depmod(host) -> None:
    """What depmod writes for the running kernel once a driver is installed: modules.dep listing nvidia.ko, and
    modules.dep.bin, each a new file renamed over the old one. (Both: systemd 252 does not fire a path unit on
    modules.dep while another of its PathChanged= files, modules.dep.bin, is missing.)"""
    host.ssh('d=/lib/modules/$(uname -r) && mkdir -p $d && for f in modules.dep modules.dep.bin; do '
             'printf "updates/dkms/nvidia.ko:\\n# %s\\n" "$(date +%s%N)" > $d/$f.new && mv $d/$f.new $d/$f; done')


def driver_changes(host, unit: str) -> list[dict]:
    """A driver change (depmod), then the calls of nvidia-ctk that followed, once the refresh `unit` ran (at
    most 30 s)."""
    before = len(calls(host))
    depmod(host)
    for _ in range(60):
        if len(calls(host)) > before:
            break
        time.sleep(0.5)
    else:
        pytest.fail(host.ssh(f"systemctl status --no-pager {unit}.path {unit}.service; journalctl --no-pager -n 30 "
                             f"-u {unit}.path -u {unit}.service", check=False).stdout)
    return calls(host)[before:]


def toolkit_rows(spec) -> dict[str, tuple[str, str, str]]:
    """The audit's rows of the toolkit (provisioner/audit/checks/container_toolkit.py): (status, expected, actual)."""
    (report,) = audit_hosts(spec_targets(load_spec(spec))).values()
    return {check.check: (check.status, check.expected, check.actual) for check in report.checks
            if check.check.startswith(("nvidia-container-toolkit-base", "CDI refresh "))}


def spec_devices(host, path: str = SPEC) -> list[str]:
    return [device["name"] for device in json.loads(host.ssh(f"cat {path}").stdout)["devices"]]


@pytest.fixture(scope="module")
def toolkit(lab, repo, tmp_path_factory):
    host = lab.boot(f"tk{lab.boot_count}")
    install_gpu_standin(host)
    depmod(host)
    folder = tmp_path_factory.mktemp("toolkit")
    variables = {"container_engine_nvidia_toolkit_repo_url": repo.url + "/",
                 "container_engine_nvidia_toolkit_repo_key_url": f"{repo.url}/{DOUBLE_KEY}",
                 "container_engine_nvidia_toolkit_repo_key_fingerprint": doubles_key_fingerprint(toolkit_doubles_repo())}

    def spec(version: str):
        return write_spec(folder / f"spec-{version}.yml", [{**host_entry(host), "container_toolkit": {"version": version}}],
                          [instance_entry(host, "pod", 8000, container={"engine": "podman"})])

    def apply(version: str, check: bool = False):
        events: list = []
        result = apply_spec(load_spec(spec(version)), check=check, diff=True, on_result=events.append,
                            controls=Controls(tags=TAGS, extra_vars=(json.dumps(variables),)))
        return result, events

    record = {"host": host, "apply": apply, "spec": spec, "disk before": disk_state(host)}
    started = time.monotonic()
    record["check 1.17.8"] = apply("1.17.8-1", check=True)
    record["disk after check"] = disk_state(host)
    record["apply 1.17.8"] = apply("1.17.8-1")
    record["seconds"] = time.monotonic() - started
    requests = len(repo.requests)
    record["again 1.17.8"] = apply("1.17.8-1")
    record["requests again"] = repo.requests[requests:]
    yield record
    lab.destroy(host)


def test_check_mode_writes_nothing_and_says_what_it_would(toolkit):
    result, events = toolkit["check 1.17.8"]
    assert result.succeeded, result.problems
    assert toolkit["disk after check"] == toolkit["disk before"], "check mode wrote to the host"
    assert {"Fetch the toolkit repository's key", "Write the toolkit repository's source", "Write the refresh units",
            "Say what would be installed (check mode)", "Say the CDI spec would be generated (check mode)"} <= set(
        changed(events)), changed(events)
    assert ("would install nvidia-container-toolkit-base 1.17.8-1 (not installed) and hold it; "
            "the CDI refresh: vllm-provision-cdi-refresh.path") in notes(events), notes(events)


def test_1_17_8_is_installed_held_and_generates_the_spec_with_the_gpu(toolkit, repo):
    result, events = toolkit["apply 1.17.8"]
    assert result.succeeded, result.problems
    host = toolkit["host"]
    check_changed = set(changed(toolkit["check 1.17.8"][1]))
    # what check mode said would change, changed (its "say" steps stand for the commands)
    assert {"Fetch the toolkit repository's key", "Write the toolkit repository's source", "Write the refresh units",
            "Install the toolkit at its version", "Hold the toolkit",
            "Generate the CDI spec of the GPUs"} <= set(changed(events))
    assert {task for task in check_changed if "(check mode)" not in task} <= set(changed(events))
    assert dpkg(host)["nvidia-container-toolkit-base"] == "held 1.17.8-1"
    assert host.ssh(f"cat {SOURCE}").stdout.splitlines()[2:] == [
        "Types: deb", f"URIs: {repo.url}/", "Suites: /",
        f"Signed-By: /etc/apt/keyrings/vllm-provision-nvidia-container-toolkit.asc "
        f"{doubles_key_fingerprint(toolkit_doubles_repo())}"]
    uuid = fake_gpu_uuid(host)
    assert spec_devices(host) == ["0", uuid]
    assert host.ssh("systemctl is-enabled vllm-provision-cdi-refresh.path vllm-provision-cdi-refresh.service "
                    "&& systemctl is-active vllm-provision-cdi-refresh.path").stdout.split() == ["enabled", "enabled", "active"]
    assert [(call["version"], call["output"], call["strategies"]) for call in calls(host)] == [
        ("1.17.8", SPEC, ["index", "uuid"])]
    assert toolkit_rows(toolkit["spec"]("1.17.8-1")) == {
        "nvidia-container-toolkit-base": ("passed", "1.17.8-1, held", "1.17.8-1, held"),
        "CDI refresh vllm-provision-cdi-refresh.path": ("passed", "enabled, active (waiting)", "enabled, active (waiting)")}


def test_a_second_run_changes_nothing_and_asks_apt_nothing(toolkit):
    result, events = toolkit["again 1.17.8"]
    assert result.succeeded, result.problems
    assert result.changed == 0, changed(events)
    assert not [path for path in toolkit["requests again"] if path.endswith(("Release", "Packages", ".deb"))]


def test_a_driver_change_regenerates_the_spec_through_the_roles_own_path_unit(toolkit):
    fired = driver_changes(toolkit["host"], "vllm-provision-cdi-refresh")
    # once per file depmod renamed, or once for both
    assert {(call["unit"], call["output"], tuple(call["strategies"])) for call in fired} == {
        ("vllm-provision-cdi-refresh.service", SPEC, ("index", "uuid"))}
    assert spec_devices(toolkit["host"]) == ["0", fake_gpu_uuid(toolkit["host"])]


def test_the_upgrade_to_1_18_0_switches_to_the_toolkits_own_refresh(toolkit):
    host, apply = toolkit["host"], toolkit["apply"]
    before = disk_state(host)
    check, events = apply("1.18.0-1", check=True)
    assert check.succeeded, check.problems
    assert disk_state(host) == before, "check mode wrote to the host"
    assert ("would install nvidia-container-toolkit-base 1.18.0-1 (now 1.17.8-1) and hold it; "
            "the CDI refresh: nvidia-cdi-refresh.path") in notes(events), notes(events)
    assert {"Stop the role's own refresh (the toolkit has its own)", "Remove the role's own refresh units, or the "
            "drop-in for the toolkit's", "Write the refresh units"} <= set(changed(events))

    generated = len(calls(host))
    result, events = apply("1.18.0-1")
    assert result.succeeded, result.problems
    assert dpkg(host)["nvidia-container-toolkit-base"] == "held 1.18.0-1"
    assert host.ssh(f"ls {' '.join(OWN_UNITS)} 2>/dev/null || true").stdout == ""
    assert "Environment=NVIDIA_CTK_CDI_OUTPUT_FILE_PATH=/etc/cdi/nvidia.yaml" in host.ssh(f"cat {DROPIN}").stdout
    assert host.ssh("systemctl is-enabled nvidia-cdi-refresh.path nvidia-cdi-refresh.service "
                    "&& systemctl is-active nvidia-cdi-refresh.path").stdout.split() == ["enabled", "enabled", "active"]
    # the package's postinst started the toolkit's refresh, which wrote the role's spec; then the role's generate
    assert [(call["version"], call["unit"], call["output"]) for call in calls(host)[generated:]][:1] == [
        ("1.18.0", "nvidia-cdi-refresh.service", SPEC)]
    assert host.ssh("ls /run/cdi 2>/dev/null || true").stdout == ""  # one spec: the toolkit's default is not there

    again, events = apply("1.18.0-1")
    assert again.succeeded and again.changed == 0, changed(events)


def test_after_the_upgrade_a_driver_change_fires_the_toolkits_unit_writing_the_same_spec(toolkit):
    host = toolkit["host"]
    fired = driver_changes(host, "nvidia-cdi-refresh")
    assert {(call["version"], call["unit"], call["output"], tuple(call["strategies"])) for call in fired} == {
        ("1.18.0", "nvidia-cdi-refresh.service", SPEC, ("index", "uuid"))}
    assert spec_devices(host) == ["0", fake_gpu_uuid(host)]
    assert host.ssh("ls /run/cdi 2>/dev/null || true").stdout == ""


def test_the_audit_sees_a_released_hold_and_apply_puts_it_back(toolkit):
    host, spec = toolkit["host"], toolkit["spec"]("1.18.0-1")
    assert toolkit_rows(spec) == {
        "nvidia-container-toolkit-base": ("passed", "1.18.0-1, held", "1.18.0-1, held"),
        "CDI refresh nvidia-cdi-refresh.path": ("passed", "enabled, active (waiting)", "enabled, active (waiting)")}
    host.ssh("apt-mark unhold nvidia-container-toolkit-base")
    assert toolkit_rows(spec)["nvidia-container-toolkit-base"] == ("failed", "1.18.0-1, held", "1.18.0-1, not held")
    result, events = toolkit["apply"]("1.18.0-1")
    assert result.succeeded and changed(events) == ["Hold the toolkit"], changed(events)
    assert toolkit_rows(spec)["nvidia-container-toolkit-base"][0] == "passed"
