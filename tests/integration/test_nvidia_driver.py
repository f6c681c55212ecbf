"""Role nvidia_driver on real systemd test hosts (bookworm, systemd-nspawn, over SSH), run as `provision apply
--tags nvidia_driver` runs it, its variables given as extra vars (tests/lab/nvidia_driver.py has the repositories):

- Debian's own packages (non-free and contrib, a flat repository of them on the lab bridge), real DKMS builds:
  check mode installs nothing; branch 470 is installed and DKMS builds `nvidia-tesla-470` for the kernel whose
  headers the role installed; a second run changes nothing and runs no `apt-get update`; branch 535 replaces it.
- NVIDIA's repository, as a signed local repository of TEST DOUBLE packages (the real one is not reachable
  here) whose DKMS module build is a stand-in: the role's key, source and pin; 580, held; unchanged; 590; the
  proprietary modules; a released hold; the minimum branch; reading only; the reboot phase under Mitogen.

One module-scoped host per path; the tests of a path share its history and run in order.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import yaml

from provisioner.apply.controls import Controls
from provisioner.apply.hosts import apply_spec
from provisioner.apply.playbook import run_playbook
from provisioner.audit.expectations import spec_targets
from provisioner.audit.runner import disconnect
from provisioner.fleet.inventory import write_inventory
from provisioner.spec import load_spec
from tests.integration.conftest import disk_state
from tests.integration.test_audit import audit_one
from tests.lab.hosts import LAB_NOTES
from tests.lab.nvidia_driver import (
    DOUBLE_KEY,
    DriverHost,
    LoggedAptRepo,
    debian_driver_repo,
    debian_set,
    doubles_key_fingerprint,
    nvidia_doubles_repo,
    package_sets,
)
from tests.lab.specs import host_entry

TAGS = ("nvidia_driver",)
PIN = "/etc/apt/preferences.d/vllm-provision-nvidia-driver.pref"
SOURCE = "/etc/apt/sources.list.d/vllm-provision-cuda.sources"
KEYRING = "/etc/apt/keyrings/vllm-provision-cuda.asc"
DEBIAN = {"nvidia_driver_manage": True, "nvidia_driver_source": "distribution", "nvidia_driver_modules": "proprietary"}


@pytest.fixture(scope="module")
def debian_repo(lab):
    repo = LoggedAptRepo(debian_driver_repo(), lab.gateway)
    yield repo
    repo.close()


@pytest.fixture(scope="module")
def doubles_repo(lab):
    repo = LoggedAptRepo(nvidia_doubles_repo(), lab.gateway)
    yield repo
    repo.close()


def boot(lab, repo, tmp_path_factory, prefix: str):
    host = lab.boot(f"{prefix}{lab.boot_count}", kind=DriverHost(repo))
    spec = tmp_path_factory.mktemp(prefix) / "spec.yml"
    spec.write_text(yaml.safe_dump({"version": 1, "hosts": [host_entry(host)], "instances": []}, sort_keys=False))
    return host, spec


def apply(spec: Path, variables: dict, check: bool = False, tags=TAGS):
    """One `provision apply --tags nvidia_driver -e <variables>` (with --diff): its result and task results."""
    events: list = []
    result = apply_spec(load_spec(spec), check=check, diff=True, on_result=events.append,
                        controls=Controls(tags=tags, extra_vars=(json.dumps(variables),)))
    return result, events


def notes(events) -> list[str]:
    return [note for event in events for note in event.notes]


def changed(events) -> list[str]:
    return [event.task for event in events if event.status == "changed"]


def dpkg(host) -> dict[str, str]:
    """Installed package -> version, and which are held (`h` for held)."""
    lines = host.ssh("dpkg-query -W -f '${db:Status-Abbrev} ${Package} ${Version}\\n'").stdout.splitlines()
    return {fields[1]: ("held " if fields[0].startswith("h") else "") + fields[2]
            for fields in (line.split() for line in lines) if fields[0][1] == "i"}


def headers_kernel(host) -> str:
    """The kernel of the headers the role installed: what linux-headers-amd64 depends on."""
    depends = host.ssh("dpkg-query -W -f '${Depends}' linux-headers-amd64").stdout
    return re.search(r"linux-headers-(\d\S*-amd64)", depends)[1]


def build_seconds(host, module: str, version: str) -> float:
    """How long DKMS's build took: its make.log (kept beside the built module) starts with the date the build
    began, and was last written when it ended."""
    log = host.ssh(f"ls /var/lib/dkms/{module}/{version}/*/*/log/make.log").stdout.split()[0]
    began = host.ssh(f"sed -n 2p {log}").stdout.strip()
    return float(host.ssh(f"echo $(( $(stat -c %Y {log}) - $(date -d '{began}' +%s) ))").stdout)


# --------------------------------------------------------------------------- Debian's own packages


@pytest.fixture(scope="module")
def debian(lab, debian_repo, tmp_path_factory):
    host, spec = boot(lab, debian_repo, tmp_path_factory, "drv")
    record = {"host": host, "spec": spec, "disk before": disk_state(host), "dpkg before": dpkg(host)}
    record["check 470"] = apply(spec, {**DEBIAN, "nvidia_driver_branch": "470"}, check=True)
    record["disk after check"], record["dpkg after check"] = disk_state(host), dpkg(host)
    started = time.monotonic()
    record["apply 470"] = apply(spec, {**DEBIAN, "nvidia_driver_branch": "470"})
    seconds = [time.monotonic() - started]
    record["dpkg 470"] = dpkg(host)
    record["kernel"] = headers_kernel(host)
    record["modinfo 470"] = host.ssh(f"modinfo -k {record['kernel']} -F version nvidia-tesla-470", check=False).stdout
    record["dkms 470"] = host.ssh("dkms status").stdout
    record["build 470"] = build_seconds(host, "nvidia-tesla-470", "470.256.02")
    requests = len(debian_repo.requests)
    record["again 470"] = apply(spec, {**DEBIAN, "nvidia_driver_branch": "470"})
    record["requests again"] = debian_repo.requests[requests:]
    record["check 535"] = apply(spec, {**DEBIAN, "nvidia_driver_branch": "535"}, check=True)
    record["dpkg after check 535"] = dpkg(host)
    started = time.monotonic()
    record["apply 535"] = apply(spec, {**DEBIAN, "nvidia_driver_branch": "535"})
    seconds.append(time.monotonic() - started)
    record["build 535"] = build_seconds(host, "nvidia-current", "535.309.01")
    LAB_NOTES.append(f"nvidia_driver: DKMS built nvidia-tesla-470 in {record['build 470']:.0f} s, nvidia-current "
                     f"535 in {record['build 535']:.0f} s; the applies took {seconds[0]:.0f} s and {seconds[1]:.0f} s")
    yield record
    lab.destroy(host)


def test_check_mode_installs_nothing_and_says_what_it_would(debian):
    result, events = debian["check 470"]
    assert result.succeeded, result.problems
    assert debian["dpkg after check"] == debian["dpkg before"]
    assert debian["disk after check"] == debian["disk before"], "check mode wrote to the host"
    assert "Install the driver branch" in changed(events)
    said = [note for note in notes(events) if note.startswith("would install")]
    assert said and "nvidia-tesla-470-kernel-dkms" in said[0] and "linux-headers-amd64" in said[0], notes(events)


def test_the_470_set_is_installed_held_and_dkms_builds_it_for_the_headers_kernel(debian):
    result, events = debian["apply 470"]
    assert result.succeeded, result.problems
    installed, kernel = debian["dpkg 470"], debian["kernel"]
    for name in package_sets()["470"]["proprietary"]["packages"] + ["nvidia-persistenced"]:
        assert installed[name].startswith("held "), (name, installed.get(name))
    assert installed["nvidia-tesla-470-kernel-dkms"] == "held 470.256.02-1~deb12u1"
    assert f"linux-headers-{kernel}" in installed and not installed["linux-headers-amd64"].startswith("held")
    assert debian["modinfo 470"].strip() == "470.256.02"
    assert debian["dkms 470"].strip() == f"nvidia-tesla-470/470.256.02, {kernel}, x86_64: installed"
    assert any(f"module nvidia-tesla-470 470.256.02 built for {kernel}" in note for note in notes(events))
    # a container: the module is not loaded here, no marker
    assert any("is a container and has no kernel of its own" in note for note in notes(events))
    assert debian["host"].ssh("test -e /run/reboot-required", check=False).returncode == 1


def test_a_second_run_changes_nothing_and_asks_apt_nothing(debian):
    result, events = debian["again 470"]
    assert result.succeeded, result.problems
    assert result.changed == 0, changed(events)
    assert debian["requests again"] == []  # no apt-get update: the host is at the branch


def test_check_mode_predicts_the_switch_to_535(debian):
    result, events = debian["check 535"]
    assert result.succeeded, result.problems
    assert debian["dpkg after check 535"] == debian["dpkg 470"]
    (said,) = [note for note in notes(events) if note.startswith("would install")]
    assert said.startswith("would install libcuda1 535.309.01-0+deb12u1, libnvidia-cfg1 535.309.01-0+deb12u1, "
                           "nvidia-kernel-dkms 535.309.01-0+deb12u1, nvidia-smi 535.309.01-0+deb12u1; would remove "
                           "libnvidia-tesla-470-cfg1, libnvidia-tesla-470-cuda1, nvidia-tesla-470-kernel-dkms, "
                           f"nvidia-tesla-470-smi; would build nvidia-current 535.309.01 for {debian['kernel']}"), said
    (diff,) = [entry for event in events if event.task == "Install the driver branch" for entry in event.diffs]
    assert "nvidia-tesla-470-kernel-dkms 470.256.02-1~deb12u1\n" in diff["before"]
    assert "nvidia-kernel-dkms 535.309.01-0+deb12u1\n" in diff["after"] and "tesla" not in diff["after"]


def test_branch_535_replaces_470(debian):
    result, events = debian["apply 535"]
    assert result.succeeded, result.problems
    host, kernel = debian["host"], debian["kernel"]
    installed = dpkg(host)
    assert [name for name in installed if "470" in name] == []  # the set and what it alone needed, purged
    assert {name: installed[name] for name in debian_set("535") if name != "linux-headers-amd64"} == {
        "nvidia-kernel-dkms": "held 535.309.01-0+deb12u1", "nvidia-smi": "held 535.309.01-0+deb12u1",
        "libcuda1": "held 535.309.01-0+deb12u1", "libnvidia-cfg1": "held 535.309.01-0+deb12u1",
        "nvidia-persistenced": "held 535.171.04-1~deb12u1"}
    assert host.ssh(f"modinfo -k {kernel} -F version nvidia-current").stdout.strip() == "535.309.01"
    assert host.ssh("dkms status").stdout.strip() == f"nvidia-current/535.309.01, {kernel}, x86_64: installed"
    assert host.ssh(f"cat {PIN}").stdout.splitlines()[-2] == "Pin: version 535.*"
    again, events = apply(debian["spec"], {**DEBIAN, "nvidia_driver_branch": "535"})
    assert again.succeeded and again.changed == 0, changed(events)


def driver_rows(spec) -> dict[str, tuple[str, str, str]]:
    """The audit's rows of role nvidia_driver on the spec's host: check -> (status, expected, actual)."""
    try:
        report = audit_one(spec)
    finally:  # no SSH master left on a host the module destroys
        disconnect([target.connection for target in spec_targets(spec)])
    return {check.check: (check.status, check.expected, check.actual) for check in report.checks
            if check.check.startswith("driver ")}


def test_the_audit_passes_then_names_a_released_hold_and_apply_puts_it_back(debian, tmp_path):
    """The spec now declares what the extra vars said (driver: source distribution, branch 535, proprietary):
    the audit's driver rows pass; a hold released by hand is the one failing row; apply repairs only that."""
    host = debian["host"]
    data = yaml.safe_load(debian["spec"].read_text())
    data["hosts"][0]["driver"] = {"source": "distribution", "branch": "535", "modules": "proprietary"}
    path = tmp_path / "spec.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    spec = load_spec(path)
    packages = "nvidia-kernel-dkms, nvidia-smi, libcuda1, libnvidia-cfg1 at 535.*, held"
    built = "535.309.01 for every kernel with headers"
    assert driver_rows(spec) == {
        "driver packages: distribution 535": ("passed", packages, packages),
        "driver module nvidia-current": ("passed", built, built),
        "driver loaded": ("n/a", "535.309.01", f"n/a: a container ({host_container(host)}) loads no kernel modules"),
    }
    host.ssh("apt-mark unhold nvidia-smi")
    assert {check: row for check, row in driver_rows(spec).items() if row[0] == "failed"} == {
        "driver packages: distribution 535": ("failed", packages, "nvidia-smi not held")}
    events: list = []
    result = apply_spec(spec, on_result=events.append, controls=Controls(tags=TAGS))
    assert result.succeeded and changed(events) == ["Install the driver branch"], changed(events)
    assert driver_rows(spec)["driver packages: distribution 535"][0] == "passed"


def host_container(host) -> str:
    return host.ssh("systemd-detect-virt --container", check=False).stdout.strip()


# --------------------------------------------------------------------------- NVIDIA's repository (TEST DOUBLES)


@pytest.fixture(scope="module")
def nvidia(lab, debian_repo, doubles_repo, tmp_path_factory):
    """A host whose apt has Debian's repository (headers, dkms); NVIDIA's is the role's to configure."""
    host, spec = boot(lab, debian_repo, tmp_path_factory, "nvd")
    variables = {"nvidia_driver_manage": True, "nvidia_driver_cuda_repo_url": doubles_repo.url + "/",
                 "nvidia_driver_cuda_repo_key_url": f"{doubles_repo.url}/{DOUBLE_KEY}",
                 "nvidia_driver_cuda_repo_key_fingerprint": doubles_key_fingerprint(nvidia_doubles_repo())}
    record = {"host": host, "spec": spec, "vars": variables, "disk before": disk_state(host)}
    record["check 580"] = apply(spec, variables, check=True)
    record["disk after check"] = disk_state(host)
    record["apply 580"] = apply(spec, variables)
    record["kernel"] = headers_kernel(host)
    requests = len(doubles_repo.requests), len(debian_repo.requests)
    record["again 580"] = apply(spec, variables)
    record["requests again"] = doubles_repo.requests[requests[0]:] + debian_repo.requests[requests[1]:]
    yield record
    lab.destroy(host)


def test_nvidia_check_mode_writes_nothing(nvidia):
    result, events = nvidia["check 580"]
    assert result.succeeded, result.problems
    assert nvidia["disk after check"] == nvidia["disk before"]
    assert {"Fetch the repository's key", "Write the repository's source", "Write the branch pin",
            "Install the driver branch"} <= set(changed(events))
    assert any(note.startswith("would install nvidia-driver-cuda, nvidia-kernel-open-dkms of branch 580") for note in
               notes(events)), notes(events)


def test_nvidia_580_from_the_signed_source_held_and_built_by_dkms(nvidia, doubles_repo):
    result, events = nvidia["apply 580"]
    assert result.succeeded, result.problems
    host, kernel = nvidia["host"], nvidia["kernel"]
    assert host.ssh(f"cat {SOURCE}").stdout.splitlines()[2:] == [
        "Types: deb", f"URIs: {doubles_repo.url}/", "Suites: /",
        f"Signed-By: {KEYRING} {doubles_key_fingerprint(nvidia_doubles_repo())}"]
    assert host.ssh(f"cat {KEYRING}").stdout == (nvidia_doubles_repo() / DOUBLE_KEY).read_text()
    assert host.ssh(f"cat {PIN}").stdout.splitlines()[-2] == "Pin: version 580.*"
    installed = dpkg(host)
    # 590 is there too: the pin keeps the set's dependencies on 580
    assert {name: installed[name] for name in ("nvidia-driver-cuda", "nvidia-kernel-open-dkms", "nvidia-smi",
                                               "libcuda1", "libnvidia-ml1")} == {
        "nvidia-driver-cuda": "held 580.95.05-1", "nvidia-kernel-open-dkms": "held 580.95.05-1",
        "nvidia-smi": "580.95.05-1", "libcuda1": "580.95.05-1", "libnvidia-ml1": "580.95.05-1"}
    assert host.ssh(f"modinfo -k {kernel} -F version nvidia").stdout.strip() == "580.95.05"
    assert host.ssh("dkms status").stdout.strip() == f"nvidia/580.95.05, {kernel}, x86_64: installed"
    again, events = nvidia["again 580"]
    assert again.succeeded and again.changed == 0, changed(events)
    # no apt-get update (the key's URL is asked whether it changed: get_url's If-Modified-Since)
    assert nvidia["requests again"] == [f"/{DOUBLE_KEY}"]


def test_nvidia_590_upgrades_then_proprietary_modules_replace_the_open_ones(nvidia):
    host, kernel = nvidia["host"], nvidia["kernel"]
    result, events = apply(nvidia["spec"], {**nvidia["vars"], "nvidia_driver_branch": "590"})
    assert result.succeeded, result.problems
    assert host.ssh(f"modinfo -k {kernel} -F version nvidia").stdout.strip() == "590.44.01"
    assert host.ssh("dkms status").stdout.strip() == f"nvidia/590.44.01, {kernel}, x86_64: installed"
    installed = dpkg(host)
    assert (installed["nvidia-driver-cuda"], installed["nvidia-smi"]) == ("held 590.44.01-1", "590.44.01-1")
    result, events = apply(nvidia["spec"], {**nvidia["vars"], "nvidia_driver_branch": "590",
                                            "nvidia_driver_modules": "proprietary"})
    assert result.succeeded, result.problems
    installed = dpkg(host)
    assert "nvidia-kernel-open-dkms" not in installed and installed["nvidia-kernel-dkms"] == "held 590.44.01-1"
    assert host.ssh(f"modinfo -k {kernel} -F version nvidia").stdout.strip() == "590.44.01"


def test_a_released_hold_is_put_back_and_nothing_else_changes(nvidia):
    host = nvidia["host"]
    host.ssh("apt-mark unhold nvidia-driver-cuda")
    variables = {**nvidia["vars"], "nvidia_driver_branch": "590", "nvidia_driver_modules": "proprietary"}
    result, events = apply(nvidia["spec"], variables)
    assert result.succeeded and changed(events) == ["Install the driver branch"], changed(events)
    assert "held nvidia-driver-cuda" in notes(events)
    assert host.ssh("apt-mark showhold").stdout.split() == ["nvidia-driver-cuda", "nvidia-kernel-dkms"]


def test_a_branch_below_the_minimum_is_refused_before_anything_changes(nvidia):
    before = disk_state(nvidia["host"])
    result, events = apply(nvidia["spec"], {**nvidia["vars"], "nvidia_driver_branch": "580",
                                            "nvidia_driver_minimum_branch": "590"})
    assert not result.succeeded
    (problem,) = result.problems
    assert problem.task == "Refuse a branch below what the host's vLLM needs"
    assert problem.message.startswith(f"{nvidia['host'].name}: driver 580 cannot run vLLM 0.25.0 (it needs driver "
                                      "≥ 590) — set driver.branch: \"590\" or later"), problem.message
    assert disk_state(nvidia["host"]) == before


def test_not_managed_the_role_only_reads(nvidia):
    before = disk_state(nvidia["host"])
    result, events = apply(nvidia["spec"], {**nvidia["vars"], "nvidia_driver_manage": False,
                                            "nvidia_driver_branch": "580"})
    assert result.succeeded and result.changed == 0, changed(events)
    assert any("nvidia_driver_manage is false" in note and "driver" in note for note in notes(events)), notes(events)
    assert disk_state(nvidia["host"]) == before


def test_the_reboot_phase_reboots_under_mitogens_strategy(nvidia, tmp_path):
    """The role's reboot tasks (ansible.builtin.reboot, then the driver read again), as apply runs a playbook
    (Mitogen's linear strategy): a container has no kernel to reboot for, so the reasons are given here."""
    host = nvidia["host"]
    boot_id = host.ssh("cat /proc/sys/kernel/random/boot_id").stdout
    sets = yaml.safe_load((Path(__file__).resolve().parents[2] / "roles/nvidia_driver/vars/packages.yml").read_text())
    variables = {"nvidia_driver_reboot": True, "nvidia_driver_reboot_timeout": 120, **sets,
                 "nvidia_driver_facts": {"in_container": False, "reboot_reasons": ["a reason given by the test"]},
                 "_nvidia_driver_test_command": "test -e /etc/hostname"}
    playbook = tmp_path / "reboot.yml"
    playbook.write_text(yaml.safe_dump([{"hosts": "vllm_hosts", "gather_facts": False, "tasks": [
        {"name": "The role's reboot phase", "ansible.builtin.include_role": {
            "name": "vllm_provision.gpu_host.nvidia_driver", "tasks_from": "reboot.yml"}, "vars": variables}]}]))
    write_inventory(load_spec(nvidia["spec"]), tmp_path / "inventory")
    events: list = []
    result = run_playbook(tmp_path / "inventory", playbook=playbook, on_result=events.append)
    assert result.succeeded, result.problems
    assert {"Mark the reboot as required", "Reboot, then wait until SSH and the driver answer"} <= set(changed(events))
    assert host.ssh("cat /proc/sys/kernel/random/boot_id").stdout != boot_id
    assert host.ssh("test -e /run/reboot-required", check=False).returncode == 1  # /run is new after a boot
