"""The one-round-trip reads of roles sysctl, nouveau and nvidia_gpu, run for real (each task's own shell
script, as the role passes it) on this machine, and what the roles' variables make of their output, as
Ansible 2.19 evaluates them. `systemd-detect-virt` and `systemctl` are replaced on PATH by scripts that
answer as the real ones do on a bare-metal host and in a container (TEST DOUBLES: this machine runs no
systemd; the lab tests run the real ones on systemd-nspawn hosts and the qemu VM)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from provisioner.validation.roles import render_string, role_tasks, role_vars


def evaluate(template: str, values: dict):
    """A role variable whose template is one expression, as Ansible 2.19 evaluates it: its native value."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    return Templar(loader=DataLoader(), variables=values).template(trust_as_template(str(template).strip()))


def task(role: str, name: str) -> dict:
    (found,) = [task for task in role_tasks(role) if task.get("name") == name]
    return found


def fake_command(folder: Path, name: str, script: str) -> None:
    folder.mkdir(exist_ok=True)
    (folder / name).write_text("#!/bin/sh\n" + script)
    (folder / name).chmod(0o755)


def run_read(role: str, name: str, values: dict, bin_dir: Path) -> dict:
    """The task's argv rendered as Ansible renders it, run here with `bin_dir` first on PATH; its
    stdout_lines as the task registers them."""
    step = task(role, name)
    values = {**values, **step.get("vars", {})}
    argv = step["ansible.builtin.command"]["argv"]
    argv = evaluate(argv, values) if isinstance(argv, str) else [render_string(str(word), values) for word in argv]
    done = subprocess.run([str(word) for word in argv], capture_output=True, text=True, check=True,
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    return {"stdout_lines": done.stdout.splitlines()}


@pytest.fixture
def bare_metal(tmp_path) -> Path:
    """systemd-detect-virt as on a host that is no container: `none`, exit 1."""
    fake_command(tmp_path / "bin", "systemd-detect-virt", "echo none; exit 1\n")
    return tmp_path / "bin"


@pytest.fixture
def container(tmp_path) -> Path:
    fake_command(tmp_path / "bin", "systemd-detect-virt", "echo systemd-nspawn\n")
    return tmp_path / "bin"


SYSCTL_READ = "Detect a container and read the live kernel parameters"


def sysctl_vars(read: dict, settings: dict) -> dict:
    values = {"sysctl_settings": settings, "_sysctl_read": read}
    for name in ("_sysctl_container", "_sysctl_in_container", "_sysctl_live"):
        values[name] = evaluate(role_vars("sysctl")[name], values)
    return values


def test_sysctl_reads_every_parameter_the_kernel_has_and_no_other(bare_metal):
    """A known key with dots, one given as a path, one the kernel lacks, one that is a folder."""
    settings = {"vm.swappiness": 1, "kernel/pid_max": 4194304, "vm.no_such_knob": 1, "net.ipv4": 1}
    read = run_read("sysctl", SYSCTL_READ, {"sysctl_settings": settings}, bare_metal)
    values = sysctl_vars(read, settings)
    assert values["_sysctl_in_container"] is False
    assert sorted(values["_sysctl_live"]) == ["kernel/pid_max", "vm.swappiness"]
    assert values["_sysctl_live"]["vm.swappiness"].split() == Path("/proc/sys/vm/swappiness").read_text().split()


def test_sysctl_joins_a_parameter_of_several_values_with_spaces(bare_metal):
    settings = {"kernel.printk": "4 4 1 7"}
    values = sysctl_vars(run_read("sysctl", SYSCTL_READ, {"sysctl_settings": settings}, bare_metal), settings)
    assert values["_sysctl_live"]["kernel.printk"].split() == Path("/proc/sys/kernel/printk").read_text().split()
    assert "\t" not in values["_sysctl_live"]["kernel.printk"]


def test_sysctl_in_a_container_reads_no_parameter(container):
    settings = {"vm.swappiness": 1}
    values = sysctl_vars(run_read("sysctl", SYSCTL_READ, {"sysctl_settings": settings}, container), settings)
    assert (values["_sysctl_in_container"], values["_sysctl_container"], values["_sysctl_live"]) == (
        True, "systemd-nspawn", {})


NOUVEAU_READ = "Detect a container, look for the initramfs and GRUB tools, read the kernel command line"


def nouveau_vars(read: dict) -> dict:
    values = {"_nouveau_read": read}
    for name in ("_nouveau_container", "_nouveau_in_container", "_nouveau_has_update_initramfs",
                 "_nouveau_has_update_grub", "_nouveau_running_flags"):
        values[name] = evaluate(role_vars("nouveau")[name], values)
    return values


@pytest.mark.parametrize("where", ["bare_metal", "container"])
def test_nouveau_reads_container_tools_and_the_kernel_command_line_each_on_its_line(where, request):
    values = nouveau_vars(run_read("nouveau", NOUVEAU_READ, {}, request.getfixturevalue(where)))
    assert values["_nouveau_in_container"] is (where == "container")
    assert values["_nouveau_has_update_initramfs"] is Path("/usr/sbin/update-initramfs").exists()
    assert values["_nouveau_has_update_grub"] is Path("/usr/sbin/update-grub").exists()
    assert values["_nouveau_running_flags"] == Path("/proc/cmdline").read_text().split()


GPU_UNITS_READ = "Read the state of nvidia-persistenced and of the boot unit"


@pytest.mark.parametrize("persistenced_state, boot_unit_state, persistenced, persistenced_up, boot_unit_up", [
    (("loaded", "enabled", "active"), ("loaded", "enabled", "active"), "loaded", True, True),
    (("masked", "masked", "inactive"), ("loaded", "disabled", "active"), "masked", False, False),
    (("not-found", "", "inactive"), ("not-found", "", "inactive"), "not-found", False, False),
])
def test_nvidia_gpu_reads_both_units_in_one_round_trip(tmp_path, persistenced_state, boot_unit_state, persistenced,
                                                         persistenced_up, boot_unit_up):
    """systemctl answering `show UNIT --property=LoadState --value`, `is-enabled UNIT` (nothing on stdout for
    a unit it does not know) and `is-active UNIT` as it does for each state."""
    states = {"nvidia-persistenced.service": persistenced_state, "nvidia-gpu-limits.service": boot_unit_state}
    cases = "".join(f'  {unit}) load={load} enabled={enabled} active={active} ;;\n'
                    for unit, (load, enabled, active) in states.items())
    fake_command(tmp_path / "bin", "systemctl", f'verb=$1 unit=$2\ncase "$unit" in\n{cases}esac\n'
                 'case "$verb" in show) echo "$load" ;; is-enabled) [ -n "$enabled" ] && echo "$enabled" ;; '
                 'is-active) echo "$active" ;; esac\nexit 0\n')
    read = run_read("nvidia_gpu", GPU_UNITS_READ, {}, tmp_path / "bin")
    values = {"_nvidia_gpu_units": read}
    for name in ("_nvidia_gpu_unit_states", "_nvidia_gpu_persistenced", "_nvidia_gpu_persistenced_up",
                 "_nvidia_gpu_boot_unit_up"):
        values[name] = evaluate(role_vars("nvidia_gpu")[name], values)
    assert (values["_nvidia_gpu_persistenced"], values["_nvidia_gpu_persistenced_up"],
            values["_nvidia_gpu_boot_unit_up"]) == (persistenced, persistenced_up, boot_unit_up)


SHM_READ = "Read the page size and the live size of /dev/shm"


def shm_read(tmp_path: Path, mountinfo: str = "/proc/self/mountinfo") -> dict:
    """The role's read run here with sh, getconf and stat alone on PATH (no findmnt), `mountinfo` read for the
    mounts; what the role's variables make of it for shm_size 1G."""
    for tool in ("sh", "getconf", "stat"):
        (tmp_path / "bin").mkdir(exist_ok=True)
        (tmp_path / "bin" / tool).symlink_to(shutil.which(tool))
    (script,) = [word for word in task("shm", SHM_READ)["ansible.builtin.command"]["argv"] if "\n" in word]
    done = subprocess.run(["sh", "-c", script.replace("/proc/self/mountinfo", mountinfo)], capture_output=True,
                          text=True, env={"PATH": str(tmp_path / "bin")})
    values = {"shm_size": "1G", "_shm_live": {"rc": done.returncode, "stdout_lines": done.stdout.splitlines()}}
    for name in ("_shm_size_bytes", "_shm_page_size", "_shm_live_size", "_shm_needs_mount", "_shm_needs_remount"):
        values[name] = evaluate(role_vars("shm")[name], values)
    return values


def test_shm_reads_the_live_size_as_statfs_gives_it_without_findmnt(tmp_path):
    values = shm_read(tmp_path)
    statfs = os.statvfs("/dev/shm")
    assert int(values["_shm_live_size"]) == statfs.f_frsize * statfs.f_blocks
    assert int(values["_shm_page_size"]) == os.sysconf("SC_PAGE_SIZE")
    assert values["_shm_needs_mount"] is False
    assert values["_shm_needs_remount"] is (statfs.f_frsize * statfs.f_blocks != 1 << 30)


def test_shm_not_mounted_needs_a_mount_and_no_remount(tmp_path):
    (tmp_path / "mountinfo").write_text("24 22 0:5 / /dev rw,nosuid - devtmpfs udev rw,mode=755\n")
    values = shm_read(tmp_path, str(tmp_path / "mountinfo"))
    assert (values["_shm_needs_mount"], values["_shm_needs_remount"], values["_shm_live_size"]) == (True, False, "")
