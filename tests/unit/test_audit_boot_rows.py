"""The audit's /dev/shm and nouveau rows (provisioner/audit/checks/shm.py, nouveau.py): their commands run here with
bash as on a host, the answers read, and each row where a host lacks the tool it reads with: an error saying so,
never a pass and never a claim about the host."""

from __future__ import annotations

import os
import shutil
import subprocess
from types import SimpleNamespace

import pytest

from provisioner.audit.boot_files import boot_files_command, read_boot_files
from provisioner.audit.checks import nouveau, shm
from provisioner.audit.engine import Output, not_installed, run_commands
from provisioner.audit.registry import Case
from tests.unit.audit_rows import run_row
from tests.unit.test_audit_suite import LocalShell
from tests.unit.test_boot_config import FLAGS, OURS, converged

GIB = 1 << 30
SHM_1G = {"size": "1G", "bytes": GIB, "exact": True}
MOUNTINFO = """\
22 1 252:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw,errors=remount-ro
24 22 0:5 / /dev rw,nosuid,relatime shared:2 - devtmpfs udev rw,size=65912340k,nr_inodes=16478085,mode=755
25 24 0:23 / /dev/shm rw,nosuid,nodev shared:3 - tmpfs tmpfs rw,size=134217728k,inode64
"""
BASH = shutil.which("bash")  # found here, then run with the PATH a test gives it
H200_MODPROBE = Output("bash: line 9: modprobe: command not found\n", 127)  # as read on the H200 server


def row(check, target_or_item, **facts) -> tuple[str, str, str, str]:
    """(status, check, expected, actual) of one check on these facts; `target_or_item` is the case's item, and its
    target as {"shm": item} too."""
    status, shown = run_row(check, Case("h", {"shm": target_or_item}, target_or_item),
                            SimpleNamespace(**{"container": None, "page_size": 4096, **facts}))
    return status, shown["check"], shown["expected"], shown["actual"]


def bash(command: str, **env: str) -> Output:
    done = subprocess.run([BASH, "-c", f"( {command}\n) 2>&1"], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=30)
    return Output(done.stdout, done.returncode)


# ---------------------------------------------------------------- nouveau: tools missing, files absent


def test_modprobe_missing_is_an_error_saying_so_never_a_claim_about_nouveau():
    status, check, expected, actual = row(nouveau.modprobe_refuses_module, "nouveau",
                                          modprobe_dry_runs={"nouveau": H200_MODPROBE})
    assert (status, check, expected) == ("error", "modprobe refuses nouveau", "install /bin/false (modprobe -n -v)")
    assert actual == "unknown: modprobe (kmod) is not installed"
    in_a_container = row(nouveau.modprobe_refuses_module, "nouveau", container="systemd-nspawn",
                         modprobe_dry_runs={"nouveau": H200_MODPROBE})
    assert in_a_container[0] == "n/a"


@pytest.mark.parametrize("out, missing", [
    (H200_MODPROBE, "modprobe (kmod) is not installed"),
    (Output("sh: 1: lsinitramfs: not found\n", 127), "lsinitramfs (initramfs-tools) is not installed"),
    (Output("", 127), "cat (coreutils) is not installed"),  # its message sent to /dev/null: the tool it runs
    (Output("install /bin/false\n", 0), None),
    (Output("modprobe: FATAL: Module nouveau not found\n", 1), None),
])
def test_a_missing_tool_is_named_from_the_shells_message(out, missing):
    assert not_installed(out, "cat") == missing


def test_a_file_row_tells_an_absent_file_from_one_it_could_not_read(tmp_path):
    path = tmp_path / "blacklist-nouveau.conf"
    command = nouveau.file_command(str(path))
    assert nouveau.file_text(bash(command)) == (None, None)
    path.write_text("blacklist nouveau\n")
    assert nouveau.file_text(bash(command)) == ("blacklist nouveau\n", None)
    assert nouveau.file_text(bash(command, PATH=str(tmp_path))) == (None, "cat (coreutils) is not installed")
    item = (str(path), "blacklist nouveau\n")
    facts = {"files": {str(path): None}, "file_problems": {str(path): "cat (coreutils) is not installed"}}
    assert row(nouveau.file, item, **facts)[::3] == (
        "error", f"unknown: {path} could not be read: cat (coreutils) is not installed")
    assert row(nouveau.file_removed, str(path), **facts)[0] == "error"
    assert row(nouveau.file_removed, str(path), files={str(path): None}, file_problems={})[::3] == (
        "passed", "(absent)")


def test_the_reboot_marker_and_the_cmdline_unreadable_are_errors():
    marker = {"reboot_marker": {"path": "/run/reboot-required.pkgs", "line": "vllm-provision:nouveau"}}
    assert row(nouveau.no_reboot_pending, marker, reboot_lines=set(),
               reboot_problem="cat (coreutils) is not installed")[::3] == (
        "error", "unknown: /run/reboot-required.pkgs could not be read: cat (coreutils) is not installed")
    assert row(nouveau.no_reboot_pending, marker, reboot_lines=set(), reboot_problem=None)[::3] == ("passed", "no")
    flags = {"cmdline_flags": ["nouveau.modeset=0"]}
    assert row(nouveau.kernel_cmdline, flags, cmdline=None, cmdline_problem="cat (coreutils) is not installed")[0] == (
        "error")


@pytest.mark.parametrize("initramfs, status, actual", [
    (Output("/boot/initrd.img-6.8.0-57-generic\netc/modprobe.d/blacklist-nouveau.conf\n", 0), "passed",
     "contains etc/modprobe.d/blacklist-nouveau.conf"),
    (Output("/boot/initrd.img-6.8.0-57-generic\n", 1), "failed",
     "/boot/initrd.img-6.8.0-57-generic lacks etc/modprobe.d/blacklist-nouveau.conf"),
    (Output("no initramfs at /boot/initrd.img-6.8.0-57-generic\n", 3), "n/a",
     "n/a: no initramfs at /boot/initrd.img-6.8.0-57-generic"),
    (Output("/boot/initrd.img-6.8.0-57-generic\nbash: line 4: lsinitramfs: command not found\n", 127), "error",
     "unknown: lsinitramfs (initramfs-tools) is not installed"),
    (Output("/boot/initrd.img-6.8.0-57-generic\ncpio: premature end of archive\n", 4), "error",
     "unknown: lsinitramfs failed (exit 4: cpio: premature end of archive)"),
])
def test_the_initramfs_row_claims_nothing_it_could_not_read(initramfs, status, actual):
    item = {"initramfs_file": "etc/modprobe.d/blacklist-nouveau.conf"}
    assert row(nouveau.in_initramfs, item, initramfs=initramfs)[::3] == (status, actual)


def test_the_initramfs_script_without_lsinitramfs_exits_127(tmp_path):
    (tmp_path / "uname").symlink_to("/bin/uname")
    script = nouveau.INITRAMFS_SCRIPT.format(path="etc/modprobe.d/blacklist-nouveau.conf")
    ran = bash(script.replace("/boot/initrd.img-", f"{tmp_path}/initrd.img-"), PATH=str(tmp_path))
    assert ran.rc == 3  # no image here
    (tmp_path / f"initrd.img-{os.uname().release}").write_text("")
    ran = bash(script.replace("/boot/initrd.img-", f"{tmp_path}/initrd.img-"), PATH=str(tmp_path))
    assert (ran.rc, not_installed(ran, "lsinitramfs")) == (127, "lsinitramfs (initramfs-tools) is not installed")


# ---------------------------------------------------------------- /dev/shm live: mountinfo and statfs, no findmnt


def test_the_live_size_is_the_mount_point_and_statfs_fragments_times_blocks():
    assert shm.live_size(Output(MOUNTINFO, 0), Output("4096 33554432\n", 0)) == {
        "shm_bytes": 128 * GIB, "shm_problem": None}
    unmounted = MOUNTINFO.replace(" /dev/shm ", " /run/shm ")  # statfs of /dev/shm would be the /dev under it
    assert shm.live_size(Output(unmounted, 0), Output("4096 16478085\n", 0)) == {"shm_bytes": None, "shm_problem": None}


def test_a_mount_point_with_escaped_characters_is_read_as_its_path():
    assert shm.is_mount_point("30 25 0:27 / /mnt/a\\040b rw - tmpfs tmpfs rw\n", "/mnt/a b")
    assert not shm.is_mount_point("30 25 0:27 / /dev/shm/sub rw - tmpfs tmpfs rw\n", "/dev/shm")


def test_the_live_size_read_here_is_the_kernels():
    found = shm.read({}, run_commands(LocalShell(), shm.commands({})))
    statfs = os.statvfs("/dev/shm")
    assert found["shm_problem"] is None and found["shm_bytes"] == statfs.f_frsize * statfs.f_blocks
    assert found["page_size"] == os.sysconf("SC_PAGE_SIZE")


@pytest.mark.parametrize("statfs, problem", [
    (Output("bash: line 12: stat: command not found\n", 127),
     "the size of /dev/shm could not be read: stat (coreutils) is not installed"),
    (Output("stat: cannot read file system information for '/dev/shm': Permission denied\n", 1),
     "the size of /dev/shm could not be read: stat failed (exit 1: stat: cannot read file system information for "
     "'/dev/shm': Permission denied)"),
    (Output("?\n", 0), "the size of /dev/shm could not be read: stat -f answered '?'"),
])
def test_a_live_size_that_cannot_be_read_is_an_error_row_naming_why(statfs, problem):
    facts = shm.live_size(Output(MOUNTINFO, 0), statfs)
    assert facts == {"shm_bytes": None, "shm_problem": problem}
    assert row(shm.size, SHM_1G, **facts) == (
        "error", "/dev/shm size", f"{GIB} bytes (1G)", f"unknown: {problem}")
    profile = {"size": "1G", "bytes": GIB, "exact": False}
    assert row(shm.size, profile, **facts)[0] == "error"


def test_the_size_row_on_a_mounted_and_an_unmounted_shm():
    assert row(shm.size, SHM_1G, shm_bytes=GIB, shm_problem=None)[::3] == ("passed", f"{GIB} bytes")
    assert row(shm.size, SHM_1G, shm_bytes=None, shm_problem=None)[::3] == ("failed", "not mounted")


def test_mountinfo_unreadable_is_no_claim_that_shm_is_unmounted():
    facts = shm.live_size(Output("bash: line 3: cat: command not found\n", 127), Output("4096 1\n", 0))
    assert facts["shm_problem"] == "/proc/self/mountinfo could not be read: cat (coreutils) is not installed"


# ---------------------------------------------------------------- the boot files, read by boot_config's own code

SPEC = {**SHM_1G, "fstab_line": OURS}  # spec mode: our fstab line too


def test_the_boot_files_are_read_here_by_the_modules_reader():
    found = read_boot_files(run_commands(LocalShell(), boot_files_command()))
    assert found["boot_files_problem"] is None
    assert ("/etc/fstab" in found["boot_files"]) is os.path.exists("/etc/fstab")


def test_without_python3_the_boot_rows_cannot_be_checked(tmp_path):
    out = {"boot_files": bash(boot_files_command()["boot_files"], PATH=str(tmp_path))}
    facts = read_boot_files(out)
    assert facts == {"boot_files": None, "boot_files_problem": "python3 is not installed"}
    for check in (shm.fstab_line, shm.size_at_boot, shm.mount_unit):
        status, _, _, actual = row(check, SPEC, **facts)
        assert (status, actual) == ("error", "unknown: python3 is not installed")
    item = {"cmdline_flags": FLAGS, "modprobe_lines": ["blacklist nouveau"]}
    for check in (nouveau.blacklisted_in_modprobe_config, nouveau.modeset_in_modprobe_config, nouveau.grub_cmdline,
                  nouveau.install_line_in_modprobe_config, nouveau.not_in_modules_load):
        assert row(check, item, **facts)[::3] == ("error", "unknown: python3 is not installed")


# ---------------------------------------------------------------- /dev/shm and nouveau at the next boot


def test_the_first_of_two_fstab_lines_fails_the_size_at_boot(tmp_path):
    files = converged(tmp_path, **{"/etc/fstab": "tmpfs /dev/shm tmpfs defaults,size=128M 0 0\n" + OURS + "\n"})
    facts = {"boot_files": files, "boot_files_problem": None}
    assert row(shm.size_at_boot, SPEC, **facts) == (
        "failed", "/dev/shm size at boot", f"{GIB} bytes (1G)", f"{128 << 20} bytes (/etc/fstab line 1, size=128M)")
    assert row(shm.fstab_line, SPEC, **facts)[::3] == (
        "failed", f"tmpfs /dev/shm tmpfs defaults,size=128M 0 0, {OURS}")
    assert row(shm.mount_unit, SPEC, **facts)[::3] == ("passed", "no file that sets dev-shm.mount's options")


def test_profile_mode_without_an_fstab_line_is_not_applicable_at_boot(tmp_path):
    facts = {"boot_files": converged(tmp_path, **{"/etc/fstab": "/swapfile none swap sw 0 0\n"}),
             "boot_files_problem": None}
    profile = {"size": "1G", "bytes": GIB, "exact": False}
    assert row(shm.size_at_boot, profile, **facts)[::3] == ("n/a", "n/a: no /dev/shm line in /etc/fstab")
    assert row(shm.size_at_boot, {**profile, "exact": True}, **facts)[0] == "failed"

def test_the_next_boot_rows_of_a_converged_host_pass(tmp_path):
    facts = {"boot_files": converged(tmp_path), "boot_files_problem": None}
    item = {"cmdline_flags": FLAGS, "modprobe_lines": ["blacklist nouveau", "install nouveau /bin/false"]}
    for check in (nouveau.blacklisted_in_modprobe_config, nouveau.modeset_in_modprobe_config, nouveau.grub_cmdline,
                  nouveau.install_line_in_modprobe_config, nouveau.not_in_modules_load):
        assert row(check, item, **facts)[0] == "passed", check.__name__
    without_grub = {path: text for path, text in facts["boot_files"].items() if "grub" not in path}
    no_grub = {"boot_files": without_grub, "boot_files_problem": None}
    assert row(nouveau.grub_cmdline, item, **no_grub)[::3] == (
        "n/a", "n/a: no /etc/default/grub and no /etc/default/grub.d/*.cfg")
