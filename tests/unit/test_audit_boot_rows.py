"""The audit's /dev/shm and nouveau rows (provisioner/audit/checks/shm.py, nouveau.py): their commands run here with
bash as on a host, the answers read, and each row where a host lacks the tool it reads with: an error saying so,
never a pass and never a claim about the host."""

from __future__ import annotations

import os
import shutil
import subprocess
from types import SimpleNamespace

import pytest

from provisioner.audit.checks import nouveau
from provisioner.audit.engine import Output, not_installed
from provisioner.audit.registry import Case
from tests.unit.audit_rows import run_row

BASH = shutil.which("bash")  # found here, then run with the PATH a test gives it
H200_MODPROBE = Output("bash: line 9: modprobe: command not found\n", 127)  # as read on the H200 server


def row(check, item, **facts) -> tuple[str, str, str, str]:
    """(status, check, expected, actual) of one check on `item` with these facts."""
    status, shown = run_row(check, Case("h", {}, item), SimpleNamespace(**{"container": None, **facts}))
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
    assert actual == "cannot be checked: modprobe (kmod) is not installed"
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
        "error", f"cannot be checked: {path} could not be read: cat (coreutils) is not installed")
    assert row(nouveau.file_removed, str(path), **facts)[0] == "error"
    assert row(nouveau.file_removed, str(path), files={str(path): None}, file_problems={})[::3] == (
        "passed", "(absent)")


def test_modprobe_d_read_without_cat_is_no_claim_that_the_lines_are_missing():
    read = nouveau.read({"nouveau": {}}, {"modprobe": Output("", 127), "cmdline": Output("quiet\n", 0)})
    item = {"modprobe_lines": ["blacklist nouveau"]}
    assert row(nouveau.blacklisted_in_modprobe_config, item, **read)[::3] == (
        "error", "cannot be checked: the modprobe.d files could not be read: cat (coreutils) is not installed")
    found = nouveau.read({"nouveau": {}}, {"modprobe": Output("blacklist  nouveau\n", 1), "cmdline": Output("", 0)})
    assert row(nouveau.blacklisted_in_modprobe_config, item, **found)[::3] == ("passed", "blacklist nouveau")


def test_the_reboot_marker_and_the_cmdline_unreadable_are_errors():
    marker = {"reboot_marker": {"path": "/run/reboot-required.pkgs", "line": "vllm-provision:nouveau"}}
    assert row(nouveau.no_reboot_pending, marker, reboot_lines=set(),
               reboot_problem="cat (coreutils) is not installed")[::3] == (
        "error", "cannot be checked: /run/reboot-required.pkgs could not be read: cat (coreutils) is not installed")
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
     "cannot be checked: lsinitramfs (initramfs-tools) is not installed"),
    (Output("/boot/initrd.img-6.8.0-57-generic\ncpio: premature end of archive\n", 4), "error",
     "cannot be checked: lsinitramfs failed (exit 4: cpio: premature end of archive)"),
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

