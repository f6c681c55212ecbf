"""/dev/shm and nouveau at the next boot (plugins/module_utils/boot_config.py) from real files laid out as a
host's /."""

from __future__ import annotations

from pathlib import Path

import pytest

from provisioner.base.module_utils import boot_config

OURS = "tmpfs /dev/shm tmpfs defaults,nosuid,nodev,size=1G 0 0"
FSTAB = """\
# /etc/fstab: static file system information.
#
# <file system> <mount point>   <type>  <options>       <dump>  <pass>
UUID=0b8e2a47-5f3c-4d2e-9d4a-3c1f2e6b7a10 /               ext4    errors=remount-ro 0       1
UUID=4C1D-2B3A  /boot/efi       vfat    umask=0077      0       1
/swapfile none swap sw 0 0
"""
OUR_MODPROBE = """\
# Managed by vllm-provision (role nouveau); local changes are overwritten.
blacklist nouveau
# "blacklist" only stops loading by alias (hardware autoload); this stops `modprobe nouveau` and
# modules that depend on it, so `modprobe -n -v nouveau` answers "install /bin/false"
install nouveau /bin/false
options nouveau modeset=0
"""
OUR_GRUB = """\
# Managed by vllm-provision (role nouveau); local changes are overwritten.
GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX nouveau.modeset=0 rd.driver.blacklist=nouveau modprobe.blacklist=nouveau"
"""
DEBIAN_GRUB = """\
# If you change this file, run 'update-grub' afterwards to update
# /boot/grub/grub.cfg.
# For full documentation of the options in this file, see:
#   info -f grub -n 'Simple configuration'

GRUB_DEFAULT=0
GRUB_TIMEOUT=5
GRUB_DISTRIBUTOR=`lsb_release -i -s 2> /dev/null || echo Debian`
GRUB_CMDLINE_LINUX_DEFAULT="quiet"
GRUB_CMDLINE_LINUX=""
"""
FLAGS = ["nouveau.modeset=0", "rd.driver.blacklist=nouveau", "modprobe.blacklist=nouveau"]
OUR_MODPROBE_PATH = "/etc/modprobe.d/blacklist-nouveau.conf"
OUR_GRUB_PATH = "/etc/default/grub.d/60-vllm-provision-nouveau.cfg"


def host(tmp_path: Path, files: dict[str, str]) -> dict[str, str]:
    """Lays `files` out under tmp_path and reads them back as the module reads a host."""
    for path, text in files.items():
        on_disk = tmp_path / path.lstrip("/")
        on_disk.parent.mkdir(parents=True, exist_ok=True)
        on_disk.write_text(text)
    return boot_config.read_tree(str(tmp_path))


def converged(tmp_path: Path, **extra: str) -> dict[str, str]:
    files = {"/etc/fstab": FSTAB + OURS + "\n", OUR_MODPROBE_PATH: OUR_MODPROBE, OUR_GRUB_PATH: OUR_GRUB,
             "/etc/default/grub": DEBIAN_GRUB, "/etc/modules-load.d/modules.conf": "# /etc/modules\nloop\n"}
    return host(tmp_path, {**files, **{path.replace("__", "/"): text for path, text in extra.items()}})


def rows(files):
    return {row["check"]: (row["expected"], row["actual"], row["passed"])
            for row in boot_config.nouveau_findings(files, FLAGS)}


# ---------------------------------------------------------------- /dev/shm


def test_the_first_fstab_line_decides_the_size_at_boot(tmp_path):
    files = host(tmp_path, {"/etc/fstab": FSTAB + "tmpfs /dev/shm/ tmpfs size=128M 0 0\n" + OURS + "\n"})
    assert boot_config.shm_at_boot(files) == {"bytes": 128 << 20, "shown": f"{128 << 20} bytes",
                                               "source": "/etc/fstab line 7, size=128M"}
    files = host(tmp_path, {"/etc/fstab": FSTAB + OURS + "\ntmpfs /dev/shm tmpfs size=128M 0 0\n"})
    assert boot_config.shm_at_boot(files)["bytes"] == 1 << 30


def test_no_line_no_size_and_a_percentage(tmp_path):
    assert boot_config.shm_at_boot(host(tmp_path, {"/etc/fstab": FSTAB}))["source"] == "no /dev/shm line in /etc/fstab"
    files = host(tmp_path, {"/etc/fstab": FSTAB + "none /dev/shm tmpfs defaults,size=50% 0 0\n"})
    assert boot_config.shm_at_boot(files) == {"bytes": None, "shown": "size=50%",
                                               "source": "/etc/fstab line 7, size=50%"}
    assert boot_config.size_bytes("1000") == 4096 and boot_config.size_bytes("1g") == 1 << 30


def test_fstab_ends_with_exactly_our_line_where_the_first_was(tmp_path):
    before = FSTAB.replace("/swapfile", "tmpfs /dev/shm tmpfs size=128M 0 0\n/swapfile") + OURS + "\n" + OURS + "\n"
    after = boot_config.with_own_shm_line(before, OURS)
    assert after == FSTAB.replace("/swapfile", OURS + "\n/swapfile")
    assert boot_config.with_own_shm_line(after, OURS) == after
    assert boot_config.with_own_shm_line(FSTAB, OURS) == FSTAB + OURS + "\n"
    plan = boot_config.fstab_plan({"/etc/fstab": after}, OURS)
    assert plan == {"fstab": None, "removed": [], "overrides": [], "message": ""}
    assert boot_config.fstab_plan({"/etc/fstab": before}, OURS)["removed"] == [
        "line 6: tmpfs /dev/shm tmpfs size=128M 0 0", f"line 8: {OURS}", f"line 9: {OURS}"]
    assert boot_config.fstab_plan({"/etc/fstab": OURS + "\n" + OURS + "\n"}, OURS)["removed"] == [f"line 2: {OURS}"]


def test_a_file_it_cannot_read_is_never_taken_as_absent(tmp_path):
    host(tmp_path, {"/etc/modprobe.d/local.conf": "options nouveau modeset=1\n"})
    (tmp_path / "etc/modprobe.d/gone.conf").symlink_to("nowhere.conf")  # a dangling link: no file
    assert list(boot_config.read_tree(str(tmp_path))) == ["/etc/modprobe.d/local.conf"]
    (tmp_path / "etc/modprobe.d/loop.conf").symlink_to("loop.conf")  # unreadable, even by root
    with pytest.raises(OSError, match="Too many levels of symbolic links"):
        boot_config.read_tree(str(tmp_path))


def test_bytes_that_are_not_utf8_are_kept_for_the_rewrite(tmp_path):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/fstab").write_bytes(b"LABEL=caf\xe9 /data ext4 defaults 0 2\n")
    kept = boot_config.read_tree(str(tmp_path), errors="surrogateescape")["/etc/fstab"]
    after = boot_config.with_own_shm_line(kept, OURS)
    assert after.encode("utf-8", "surrogateescape") == (b"LABEL=caf\xe9 /data ext4 defaults 0 2\n"
                                                        + OURS.encode() + b"\n")


def test_a_dropin_setting_the_options_of_dev_shm_mount_is_named(tmp_path):
    dropin = "/etc/systemd/system/dev-shm.mount.d/size.conf"
    files = host(tmp_path, {"/etc/fstab": FSTAB + OURS + "\n", dropin: "[Mount]\nOptions=mode=1777,size=64M\n",
                            "/etc/systemd/system/dev-shm.mount.d/order.conf": "[Unit]\nAfter=local-fs-pre.target\n"})
    assert boot_config.shm_overrides(files) == [(dropin, "Options=mode=1777,size=64M")]
    plan = boot_config.fstab_plan(files, OURS)
    assert plan["fstab"] is None
    assert plan["message"].startswith(f"{dropin} sets Options=mode=1777,size=64M for dev-shm.mount")
    assert "not vllm-provision's file to change" in plan["message"]


def test_a_unit_file_of_its_own_is_named(tmp_path):
    files = host(tmp_path, {"/etc/fstab": FSTAB, "/etc/systemd/system/dev-shm.mount":
                            "[Mount]\nWhat=tmpfs\nWhere=/dev/shm\nType=tmpfs\n"})
    assert boot_config.shm_overrides(files) == [("/etc/systemd/system/dev-shm.mount", "a unit file of its own")]


# ---------------------------------------------------------------- nouveau


def test_a_converged_host_passes_every_row(tmp_path):
    assert rows(converged(tmp_path)) == {
        "nouveau modprobe.d: modeset": ("0", f"0 ({OUR_MODPROBE_PATH} line 6)", True),
        "nouveau modprobe.d: install": ("/bin/false", f"/bin/false ({OUR_MODPROBE_PATH} line 5)", True),
        "nouveau on the kernel command line GRUB builds": (" ".join(FLAGS), f"{' '.join(FLAGS)} ({OUR_GRUB_PATH})",
                                                           True),
        "nouveau in modules-load.d": ("none", "none", True),
    }


def test_a_later_modprobe_file_sets_modeset_1(tmp_path):
    files = converged(tmp_path, **{"/etc/modprobe.d/zz-nouveau.conf": "# local\noptions nouveau modeset=1\n"})
    assert rows(files)["nouveau modprobe.d: modeset"] == ("0", "1 (/etc/modprobe.d/zz-nouveau.conf line 2)", False)
    plan = boot_config.nouveau_plan(files, FLAGS, {OUR_MODPROBE_PATH, OUR_GRUB_PATH})
    assert plan["message"] == ("/etc/modprobe.d/zz-nouveau.conf decides 'nouveau modprobe.d: modeset' (1 "
                               "(/etc/modprobe.d/zz-nouveau.conf line 2), expected 0): it is not vllm-provision's file"
                               " to change; remove the line 'options nouveau modeset=1' and apply again")


def test_an_earlier_file_wins_the_install_line_and_etc_hides_lib(tmp_path):
    files = converged(tmp_path, **{"/etc/modprobe.d/a-nouveau.conf":
                                   "install nouveau /sbin/modprobe --ignore-install nouveau\n",
                                   "/lib/modprobe.d/blacklist-nouveau.conf": "options nouveau modeset=1\n"})
    assert rows(files)["nouveau modprobe.d: install"] == (
        "/bin/false", "/sbin/modprobe --ignore-install nouveau (/etc/modprobe.d/a-nouveau.conf line 1)", False)
    assert rows(files)["nouveau modprobe.d: modeset"][2]  # /lib's same-named file is hidden by ours


def test_grub_default_line_overrides_our_flag(tmp_path):
    files = converged(tmp_path, **{"/etc/default/grub": DEBIAN_GRUB.replace('"quiet"', '"quiet nouveau.modeset=1"')})
    assert rows(files)["nouveau on the kernel command line GRUB builds"] == (
        " ".join(FLAGS), "nouveau.modeset=1 last, from /etc/default/grub line 9 (GRUB_CMDLINE_LINUX_DEFAULT)", False)
    plan = boot_config.nouveau_plan(files, FLAGS, {OUR_MODPROBE_PATH, OUR_GRUB_PATH})
    assert "remove the line 'GRUB_CMDLINE_LINUX_DEFAULT=\"quiet nouveau.modeset=1\"'" in plan["message"]


def test_a_later_grub_dropin_appends_or_replaces(tmp_path):
    later = "/etc/default/grub.d/90-local.cfg"
    files = converged(tmp_path, **{later: "GRUB_CMDLINE_LINUX=\"${GRUB_CMDLINE_LINUX} nouveau.modeset=1\"\n"})
    assert rows(files)["nouveau on the kernel command line GRUB builds"][1] == (
        f"nouveau.modeset=1 last, from {later} line 1 (GRUB_CMDLINE_LINUX)")
    files = converged(tmp_path, **{later: "export GRUB_CMDLINE_LINUX='console=ttyS0'\n"})
    assert rows(files)["nouveau on the kernel command line GRUB builds"][1:] == (
        f"lacks {' '.join(FLAGS)}: {later} line 1 (GRUB_CMDLINE_LINUX) sets it without them", False)


def test_an_earlier_grub_dropin_is_kept_by_ours(tmp_path):
    console = 'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX console=ttyS0"\n'
    files = converged(tmp_path, **{"/etc/default/grub.d/10-console.cfg": console})
    assert rows(files)["nouveau on the kernel command line GRUB builds"][2]
    assert [word for word, _ in boot_config.grub_cmdline(files)] == ["console=ttyS0", *FLAGS, "quiet"]


def test_no_grub_at_all(tmp_path):
    files = host(tmp_path, {OUR_MODPROBE_PATH: OUR_MODPROBE})
    assert rows(files)["nouveau on the kernel command line GRUB builds"][2] is None


def test_modules_load_d_loading_nouveau(tmp_path):
    files = converged(tmp_path, **{"/etc/modules-load.d/gpu.conf": "# GPUs\nnouveau\n",
                                   "/usr/lib/modules-load.d/gpu.conf": "nouveau\n"})
    assert rows(files)["nouveau in modules-load.d"] == ("none", "/etc/modules-load.d/gpu.conf line 2: nouveau", False)
    assert "remove the line 'nouveau'" in boot_config.nouveau_plan(files, FLAGS, {OUR_MODPROBE_PATH})["message"]


def test_our_own_files_are_ours_to_rewrite(tmp_path):
    files = converged(tmp_path, **{OUR_MODPROBE_PATH: "options nouveau modeset=1\n"})
    assert not rows(files)["nouveau modprobe.d: modeset"][2]
    assert boot_config.nouveau_plan(files, FLAGS, {OUR_MODPROBE_PATH, OUR_GRUB_PATH})["foreign"] == []
