"""The host roles on a real kernel: a qemu virtual machine booting Debian bookworm's own kernel through GRUB.

What containers cannot show is proven here: live sysctls, the nouveau blacklist inside the initramfs,
the kernel command line after a reboot through GRUB, `modprobe` refusing nouveau, the reboot-required
marker, /dev/shm from fstab after a boot, the vLLM unit (TEST DOUBLE server: no GPU here) started by
systemd at boot, and the audit's live checks, which are n/a in containers, passing.

The NVIDIA driver (role nvidia_driver): the image carries Debian's own 535 set, its module built by DKMS
natively when the image was built (tests/lab/vm.py; nothing is compiled under emulation). A second spec
for the same machine declares it (driver: source distribution, branch 535, reboot: true) and no GPU (the
machine has none; the main spec's GPU is the TEST DOUBLE nvidia-smi's, for the GPU role): its apply, the
role's tags alone, holds and pins the set and makes the managed reboot the nouveau role's marker asks for
(the one reboot of the module), waiting until SSH answers and the module of the installed version is
there for the running kernel with nouveau not loaded. After it `modprobe nvidia` fails only because there
is no GPU, and the audit's driver rows hold.

One machine serves the whole module (fixture `vm`, booted once): the tests run in file order, the
fixtures below apply once and reboot once, and each test checks one thing of that shared history.
Under software emulation every module Ansible runs on the machine costs 10-20 s, so only the first
apply runs the whole site playbook (the unit must be there for the boot and the audit); check mode,
the second apply and the repair run the kernel's roles alone (KERNEL_ROLES): what the other roles do
in check mode and on a second run is proven on the nspawn hosts (test_apply, test_dry_run).
"""

from __future__ import annotations

import time

import pytest

from provisioner.apply.controls import Controls
from provisioner.apply.events import TaskResult
from provisioner.apply.hosts import apply_spec
from provisioner.audit.expectations import spec_targets
from provisioner.audit.runner import disconnect
from provisioner.spec import load_spec
from tests.integration.test_audit import CONTAINER_NOT_APPLICABLE, audit_one, not_passed
from tests.lab.specs import host_entry, install_standin, instance_entry, write_spec
from tests.lab.vm import VM_TIMINGS

UNIT = "vllm-chat.service"
KERNEL_ROLES = Controls(tags=("sysctl", "nouveau", "shm"))
DRIVER_ROLE = Controls(tags=("nvidia_driver",))
DRIVER = {"source": "distribution", "branch": "535", "modules": "proprietary", "reboot": True}
DRIVER_VERSION = "535.309.01"  # bookworm-security's, in the lab's repository of Debian's driver packages
MODULE = "nvidia-current"  # Debian's name of the module
FLAGS = ("nouveau.modeset=0", "rd.driver.blacklist=nouveau", "modprobe.blacklist=nouveau")
SHM_BYTES = 1 << 30  # host_entry's shm_size: 1G
# planted before the first apply: a later sysctl.d file that would win at boot; apply must neutralise it
OVERRIDE = "/etc/sysctl.d/99-zz-override.conf"
# planted before the first apply too: two /dev/shm lines of 128M (the first one decides the size after a reboot);
# apply must leave our line alone in fstab, so that the reboot below brings /dev/shm up at SHM_BYTES
OTHER_SHM_LINE = "tmpfs /dev/shm tmpfs defaults,size=128M 0 0"
# what a run may write without changing the host: logs, journals, caches, Ansible's own temp files
VOLATILE = ("/run", "/var/log", "/var/lib/systemd", "/var/cache", "/var/tmp", "/tmp", "/root", "/var/lib/apt", "/var/lib/dpkg")
FILES_WRITTEN_SINCE_MARKER = (
    "find / -xdev \\( " + " -o ".join(f"-path {path}" for path in VOLATILE) + " \\) -prune -o "
    "-newer /run/vp-marker -print"
)


def timed(name: str, started: float) -> None:
    VM_TIMINGS[name] = time.monotonic() - started


def slowest(started: float, finished: list[tuple[float, str]], count: int = 4) -> str:
    """The tasks that took longest, from the times their results arrived (one host: one after another)."""
    took = [(at - before, label) for (at, label), before in zip(finished, [started, *(at for at, _ in finished)])]
    return "; ".join(f"{label} {seconds:.0f} s" for seconds, label in sorted(took, reverse=True)[:count])


def audit(spec):
    try:
        return audit_one(spec)
    finally:
        disconnect([target.connection for target in spec_targets(spec)])


@pytest.fixture(scope="module")
def spec(vm, tmp_path_factory):
    install_standin(vm)
    path = tmp_path_factory.mktemp("vm") / "spec.yml"
    return load_spec(write_spec(path, [host_entry(vm)], [instance_entry(vm, "chat", 8000, share=0.9)]))


@pytest.fixture(scope="module")
def driver_spec(vm, tmp_path_factory):
    """The same machine with its driver declared and no GPU (it has none)."""
    entry = {**host_entry(vm), "gpus": {}, "driver": DRIVER}
    return load_spec(write_spec(tmp_path_factory.mktemp("vm-driver") / "spec.yml", [entry], []))


@pytest.fixture(scope="module")
def history(vm, spec):
    """Check mode, apply, apply again, then the audit before the reboot: what each did, for the tests."""
    record = {"swappiness before": vm.ssh("cat /proc/sys/vm/swappiness").stdout.strip()}
    vm.ssh(f"printf 'vm.swappiness = 60\\n' > {OVERRIDE}")
    vm.ssh(f"sed -i '1i {OTHER_SHM_LINE}' /etc/fstab && echo '{OTHER_SHM_LINE}' >> /etc/fstab")
    vm.ssh("touch /run/vp-marker && sleep 1")
    started = time.monotonic()
    record["check"] = apply_spec(spec, check=True, controls=KERNEL_ROLES)
    timed("check mode", started)
    record["written by check mode"] = vm.ssh(FILES_WRITTEN_SINCE_MARKER).stdout.split()
    record["swappiness after check"] = vm.ssh("cat /proc/sys/vm/swappiness").stdout.strip()
    record["reboot marker after check"] = vm.ssh("test -e /run/reboot-required && echo present || echo absent").stdout.strip()
    started = time.monotonic()
    finished: list[tuple[float, str]] = []
    record["apply"] = apply_spec(spec, on_result=lambda result: finished.append((time.monotonic(), result.label)))
    timed("first apply", started)
    VM_TIMINGS["its slowest tasks"] = slowest(started, finished)
    started = time.monotonic()
    record["apply again"] = apply_spec(spec, controls=KERNEL_ROLES)
    timed("second apply", started)
    record["fstab /dev/shm lines"] = vm.ssh("awk '$2 == \"/dev/shm\"' /etc/fstab").stdout.splitlines()
    record["audit before reboot"] = audit(spec)
    return record


@pytest.fixture(scope="module")
def driver_history(vm, history, driver_spec):
    """Check mode, then the apply whose managed reboot is the module's reboot, then apply again."""
    record = {"boot id": vm.ssh("cat /proc/sys/kernel/random/boot_id").stdout}
    events: list[TaskResult] = []
    record["check"] = apply_spec(driver_spec, check=True, controls=DRIVER_ROLE, on_result=events.append)
    record["check events"], events = events, []
    record["boot id after check"] = vm.ssh("cat /proc/sys/kernel/random/boot_id").stdout
    started = time.monotonic()
    record["apply"] = apply_spec(driver_spec, controls=DRIVER_ROLE, on_result=events.append)
    timed("driver apply with the managed reboot", started)
    record["apply events"] = events
    vm.wait_for_ssh(timeout=600)  # systemd finished booting (the units the tests below read are up)
    record["apply again"] = apply_spec(driver_spec, controls=DRIVER_ROLE)
    return record


@pytest.fixture(scope="module")
def rebooted(vm, driver_history):
    return vm


# -- before the reboot ---------------------------------------------------------------------------


def test_check_mode_reports_changes_and_writes_nothing(history):
    assert history["check"].succeeded, history["check"].problems
    assert history["check"].changed > 0
    assert history["written by check mode"] == []
    assert history["reboot marker after check"] == "absent"
    assert history["swappiness after check"] == history["swappiness before"] != "1"


def test_converges_then_a_second_apply_changes_nothing(history):
    assert history["apply"].succeeded, history["apply"].problems
    assert history["fstab /dev/shm lines"] == ["tmpfs /dev/shm tmpfs defaults,nosuid,nodev,size=1G 0 0"]
    assert history["apply"].changed > 0
    assert history["apply again"].succeeded, history["apply again"].problems
    assert history["apply again"].changed == 0


def test_sysctls_are_live_in_the_kernel(vm, history):
    assert vm.ssh("sysctl -n vm.swappiness vm.max_map_count").stdout.split() == ["1", "262144"]


def test_the_initramfs_carries_the_blacklist(vm, history):
    listing = vm.ssh("lsinitramfs /boot/initrd.img-$(uname -r)").stdout.splitlines()
    assert "etc/modprobe.d/blacklist-nouveau.conf" in listing
    unpacked = vm.ssh("d=$(mktemp -d) && unmkinitramfs /boot/initrd.img-$(uname -r) $d && "
                      "cat $(find $d -path '*etc/modprobe.d/blacklist-nouveau.conf' | head -1)").stdout
    assert "blacklist nouveau" in unpacked.splitlines()


def test_grub_config_and_reboot_marker_wait_for_the_reboot(vm, history):
    grub_cfg = vm.ssh("grep -m1 'linux\\s*/boot/vmlinuz' /boot/grub/grub.cfg").stdout
    assert all(flag in grub_cfg.split() for flag in FLAGS), grub_cfg
    assert not any(flag in vm.ssh("cat /proc/cmdline").stdout.split() for flag in FLAGS)
    assert "vllm-provision:nouveau" in vm.ssh("cat /run/reboot-required.pkgs").stdout.split()


def test_audit_before_the_reboot_names_the_missing_kernel_flags(history):
    failed = not_passed(history["audit before reboot"])
    assert set(failed) == {"kernel cmdline: nouveau flags", "reboot pending for nouveau"}
    assert failed["kernel cmdline: nouveau flags"][1] == "none of them"
    assert failed["reboot pending for nouveau"] == ("no", "yes (vllm-provision:nouveau in /run/reboot-required.pkgs)")


# -- after the reboot ----------------------------------------------------------------------------


def test_the_kernel_booted_with_the_nouveau_flags(rebooted):
    cmdline = rebooted.ssh("cat /proc/cmdline").stdout.split()
    assert all(flag in cmdline for flag in FLAGS), cmdline


def test_modprobe_refuses_nouveau(rebooted):
    assert rebooted.ssh("modinfo -n nouveau").stdout.strip().endswith("nouveau.ko")  # the kernel ships it
    dry_run = rebooted.ssh("modprobe -n -v nouveau").stdout
    # kmod loads nouveau's dependencies, then runs the install line instead of loading nouveau.ko
    assert dry_run.splitlines()[-1].split()[:2] == ["install", "/bin/false"], dry_run
    assert "/nouveau.ko" not in dry_run
    assert "nouveau" not in rebooted.ssh("cut -d' ' -f1 /proc/modules").stdout.split()


def test_the_reboot_marker_is_cleared(rebooted):
    assert rebooted.ssh("test -e /run/reboot-required.pkgs; echo $?").stdout.strip() == "1"


def test_settings_survive_the_reboot(rebooted):
    # 1, not the 60 of the override planted before the first apply: apply commented its line out
    assert rebooted.ssh("sysctl -n vm.swappiness vm.max_map_count").stdout.split() == ["1", "262144"]
    assert rebooted.ssh(f"cat {OVERRIDE}").stdout.startswith("# vm.swappiness = 60  # disabled by vllm-provision: ")
    assert int(rebooted.ssh("findmnt -n -b -o SIZE /dev/shm").stdout) == SHM_BYTES
    assert rebooted.ssh(f"systemctl is-enabled {UNIT}; systemctl is-active {UNIT}").stdout.split() == ["enabled", "active"]


def test_after_the_reboot_the_audit_passes_with_its_live_checks(rebooted, spec):
    report = audit(spec)
    assert not_passed(report) == {}
    statuses = {check.check: check.status for check in report.checks}
    assert {statuses[name] for name in CONTAINER_NOT_APPLICABLE} == {"passed"}
    assert statuses[f"{UNIT}: ready (one request served)"] == "passed"


def test_the_driver_spec_check_mode_predicts_the_hold_pin_and_reboot_and_reboots_nothing(driver_history):
    check = driver_history["check"]
    assert check.succeeded, check.problems
    changed = {result.label for result in driver_history["check events"] if result.status == "changed"}
    applied = {result.label for result in driver_history["apply events"] if result.status == "changed"}
    assert changed == applied, (changed, applied)
    assert driver_history["boot id after check"] == driver_history["boot id"]


def test_the_role_reboots_the_machine_for_the_nouveau_marker_and_waits_for_the_driver(rebooted, driver_history):
    applied = driver_history["apply"]
    assert applied.succeeded, applied.problems
    labels = {result.label for result in driver_history["apply events"] if result.status == "changed"}
    assert "nvidia_driver : Reboot, then wait until SSH and the driver answer" in labels, labels
    assert rebooted.ssh("cat /proc/sys/kernel/random/boot_id").stdout != driver_history["boot id"]
    again = driver_history["apply again"]
    assert again.succeeded and again.changed == 0, again.problems


def test_the_module_is_installed_for_the_running_kernel_and_nouveau_is_not_loaded(rebooted):
    kernel = rebooted.ssh("uname -r").stdout.strip()
    assert rebooted.ssh(f"modinfo -k {kernel} -F version {MODULE}").stdout.strip() == DRIVER_VERSION
    assert rebooted.ssh("dkms status").stdout.strip() == f"{MODULE}/{DRIVER_VERSION}, {kernel}, x86_64: installed"
    assert "nouveau" not in rebooted.ssh("cut -d' ' -f1 /proc/modules").stdout.split()
    held = rebooted.ssh("apt-mark showhold").stdout.split()
    assert held == ["libcuda1", "libnvidia-cfg1", "nvidia-kernel-dkms", "nvidia-persistenced", "nvidia-smi"], held


def test_modprobe_nvidia_fails_only_because_there_is_no_gpu(rebooted):
    loaded = rebooted.ssh("modprobe nvidia", check=False)
    assert loaded.returncode != 0
    assert "No such device" in loaded.stderr, loaded.stderr  # the module loaded, and found no GPU to drive
    kernel_log = rebooted.ssh("dmesg | grep NVRM", check=False).stdout
    assert "NVRM" in kernel_log and "Unknown symbol" not in kernel_log, kernel_log


def test_the_audits_driver_rows_hold_after_the_managed_reboot(rebooted, driver_spec):
    report = audit(driver_spec)
    rows = {check.check: (check.status, check.actual) for check in report.checks if check.check.startswith("driver ")}
    packages = "nvidia-kernel-dkms, nvidia-smi, libcuda1, libnvidia-cfg1 at 535.*, held"
    assert rows == {
        "driver packages: distribution 535": ("passed", packages),
        f"driver module {MODULE}": ("passed", f"{DRIVER_VERSION} for every kernel with headers"),
        "driver loaded": ("n/a", "n/a: no GPU expected: nothing loads the module"),
    }


def test_live_drift_is_named_and_the_next_apply_repairs_only_that(rebooted, spec):
    """Also: after the reboot everything else is still in place (the apply changes nothing more)."""
    rebooted.ssh("sysctl -w vm.swappiness=60")
    assert not_passed(audit(spec)) == {"sysctl live: vm.swappiness": ("1", "60")}
    results: list[TaskResult] = []
    repaired = apply_spec(spec, controls=KERNEL_ROLES, on_result=results.append)
    assert repaired.succeeded, repaired.problems
    assert [result.label for result in results if result.status == "changed"] == [
        "sysctl : Set the kernel parameters that differ"
    ]
    assert rebooted.ssh("sysctl -n vm.swappiness").stdout.strip() == "1"
