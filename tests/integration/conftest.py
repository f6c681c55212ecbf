"""Fixtures for tests against real systemd-nspawn test hosts (see tests/lab)."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from provisioner.apply.hosts import apply_spec
from provisioner.audit.expectations import spec_targets
from provisioner.audit.runner import audit_hosts
from provisioner.spec import load_spec
from tests.lab.hosts import LAB_NOTES, Lab, TestHost
from tests.lab.vm import VM_TIMINGS, VirtualMachine, accelerator, ensure_image

# Paths that change on a host by merely running (logs, ansible's temp files, systemd state, what Debian's
# daily dpkg-db-backup.timer writes at midnight): everything else written to a host's disk shows up in its
# overlay's upper layer.
VOLATILE = ("var/log/", "var/lib/systemd/", "var/cache/", "tmp/", "var/tmp/", "root/.ansible/", "run/",
            "var/backups/")


def pytest_collection_modifyitems(items):
    for item in items:
        if "integration" in str(item.fspath):
            item.add_marker(pytest.mark.hosts)


@pytest.fixture(scope="session")
def lab():
    missing = [tool for tool in ("systemd-nspawn", "mmdebstrap", "ssh") if shutil.which(tool) is None]
    if os.geteuid() != 0 or missing:
        pytest.fail(
            f"the host tests need root and {', '.join(missing) or 'nothing more'}: "
            "run .ci/run (it installs them), or deselect with -m 'not hosts'"
        )
    with Lab() as created:
        LAB_NOTES.extend(f"removed a killed lab's {item}" for item in created.removed_stale)
        yield created




@pytest.fixture(scope="session")
def vm():
    """One qemu virtual machine booting Debian's own kernel (tests/lab/vm.py), shared by the session's
    real-kernel tests: booted once here, rebooted by them, powered off at the end."""
    missing = [tool for tool in ("qemu-system-x86_64", "qemu-img", "mmdebstrap", "sfdisk", "mkfs.ext4", "zstd")
               if shutil.which(tool) is None]
    if os.geteuid() != 0 or missing:
        pytest.fail(f"the VM tests need root and {', '.join(missing) or 'nothing more'}: run .ci/run (it installs them)")
    image = ensure_image()
    VM_TIMINGS[f"image ({'built' if image.built else 'cached'})"] = image.seconds
    workdir = Path(tempfile.mkdtemp(prefix="vp-vm-", dir="/var/tmp"))
    machine = VirtualMachine.start(image, workdir, accel=accelerator(image), name="kvm0")
    # qemu's software emulation (TCG) is ~10x slower than a real machine, and CI loads this one's two cores with
    # two other parts: the VM's sshd may take longer than Ansible's 10 s connect timeout to greet a new connection
    # (a real host's takes milliseconds); the user's own setting for a slow link, ANSIBLE_TIMEOUT, is given it
    timeout_before = os.environ.get("ANSIBLE_TIMEOUT")
    os.environ["ANSIBLE_TIMEOUT"] = "60"
    try:
        VM_TIMINGS["accelerator"] = machine.accel
        VM_TIMINGS["boot to SSH"] = machine.wait_for_ssh(timeout=600)
        yield machine
    finally:
        machine.stop()
        shutil.rmtree(workdir, ignore_errors=True)
        if timeout_before is None:
            os.environ.pop("ANSIBLE_TIMEOUT", None)
        else:
            os.environ["ANSIBLE_TIMEOUT"] = timeout_before


def pytest_terminal_summary(terminalreporter):
    for note in LAB_NOTES:
        terminalreporter.write_line("lab: " + note)
    if VM_TIMINGS:
        shown = (f"{name} {value:.1f} s" if isinstance(value, float) else f"{name} {value}"
                 for name, value in VM_TIMINGS.items())
        terminalreporter.write_line("virtual machine: " + ", ".join(shown))


@pytest.fixture
def boot(lab):
    """boot(n) -> n fresh hosts for this test, powered off and removed afterwards."""
    booted: list[TestHost] = []

    def _boot(count: int = 1) -> list[TestHost]:
        names = [f"t{lab.boot_count + i}" for i in range(count)]
        hosts = lab.boot_many(names)
        booted.extend(hosts)
        return hosts

    yield _boot
    for host in booted:
        lab.destroy(host)


def disk_state(host: TestHost) -> dict[str, str]:
    """What a host has written to its disk: path -> content hash (or link target, or 'dir'/'whiteout')."""
    upper = host.base / "upper"
    state = {}
    for path in sorted(upper.rglob("*")):
        relative = str(path.relative_to(upper)) + ("/" if path.is_dir() and not path.is_symlink() else "")
        if relative.startswith(VOLATILE):
            continue
        if path.is_symlink():
            state[relative] = "-> " + os.readlink(path)
        elif path.is_file():
            state[relative] = hashlib.sha256(path.read_bytes()).hexdigest()[:12] + f" {path.stat().st_mode:o}"
        elif path.is_dir():
            state[relative] = "dir"
        else:
            state[relative] = "special"  # overlay whiteout: a deleted file
    return state


def audit_failures(spec_path: Path) -> dict[str, dict[str, tuple[str, str]]]:
    """The spec's audit of its hosts: per host, each failed row's (expected, actual)."""
    reports = audit_hosts(spec_targets(load_spec(spec_path)))
    return {name: {check.check: (check.expected, check.actual) for check in report.checks if check.status == "failed"}
            for name, report in reports.items()}


def check_then_apply_twice(spec_path: Path, host: TestHost, command: str) -> dict:
    """Check mode on fresh hosts, then the first and second apply, each with its task results (`events`); `host`'s
    disk before and after check mode, and the exit status of `command` there after it (what it must not install)."""
    record: dict = {"disk before": disk_state(host)}
    events: dict[str, list] = {"check": [], "first": [], "second": []}
    record["check"] = apply_spec(load_spec(spec_path), check=True, on_result=events["check"].append)
    record["disk after check"] = disk_state(host)
    record["installed after check"] = host.ssh(command, check=False).returncode
    record["first"] = apply_spec(load_spec(spec_path), on_result=events["first"].append)
    record["second"] = apply_spec(load_spec(spec_path), on_result=events["second"].append)
    record["events"] = events
    return record
