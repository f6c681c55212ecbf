"""The Ansible modules shm_fstab and nouveau_boot as Ansible runs them (ad hoc, on this machine), on a folder
standing for the host's / (their `root` option): check mode, diff, the write, idempotence, the refusals."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from provisioner.base.paths import COLLECTION, collections_dir
from tests.unit.test_boot_config import FLAGS, FSTAB, OUR_GRUB, OUR_GRUB_PATH, OUR_MODPROBE, OUR_MODPROBE_PATH, OURS

OTHER = "tmpfs /dev/shm tmpfs defaults,size=128M 0 0"
DROPIN = "/etc/systemd/system/dev-shm.mount.d/size.conf"


class Host:
    def __init__(self, root: Path, work: Path):
        self.root, self.work = root, work
        self.env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(collections_dir(work / "collections")),
                    "ANSIBLE_REMOTE_TMP": str(work / "ansible-tmp"), "ANSIBLE_LOCALHOST_WARNING": "false",
                    "ANSIBLE_NOCOLOR": "1"}

    def write(self, path: str, text: str | bytes) -> None:
        file = self.root / path.lstrip("/")
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_bytes(text if isinstance(text, bytes) else text.encode())

    def read(self, path: str) -> bytes:
        return (self.root / path.lstrip("/")).read_bytes()

    def state(self) -> dict[str, bytes]:
        return {str(path.relative_to(self.root)): path.read_bytes() for path in sorted(self.root.rglob("*"))
                if path.is_file()}

    def module(self, name: str, args: dict, *options: str) -> dict:
        tree = self.work / "tree"
        shutil.rmtree(tree, ignore_errors=True)
        done = subprocess.run(
            [str(Path(sys.executable).parent / "ansible"), "localhost", "-c", "local", "-e",
             f"ansible_python_interpreter={sys.executable}", "-t", str(tree), "-m", f"{COLLECTION}.{name}",
             "-a", json.dumps({**args, "root": str(self.root)}), *options],
            env=self.env, capture_output=True, text=True, timeout=120)
        return {**json.loads((tree / "localhost").read_text()), "failed": done.returncode != 0, "stdout": done.stdout}


@pytest.fixture
def host(tmp_path) -> Host:
    (tmp_path / "root").mkdir()
    return Host(tmp_path / "root", tmp_path)


def test_shm_fstab_keeps_our_line_alone_where_the_first_was(host):
    # a label that is not UTF-8 (latin-1): its bytes come back as they were
    before = (FSTAB.replace("/swapfile", OTHER + "\n/swapfile") + OURS + "\n" + OTHER + "\n").encode()
    host.write("/etc/fstab", before + b"LABEL=caf\xe9 /data ext4 defaults 0 2\n")
    unchanged = host.state()
    predicted = host.module("shm_fstab", {"line": OURS}, "--check", "--diff")
    assert predicted["changed"] is True and not predicted["failed"], predicted
    assert host.state() == unchanged
    assert predicted["removed"] == [f"line 6: {OTHER}", f"line 8: {OURS}", f"line 9: {OTHER}"]
    assert f"-{OTHER}\n+{OURS}\n" in predicted["stdout"] and "--- before: /etc/fstab" in predicted["stdout"]

    applied = host.module("shm_fstab", {"line": OURS}, "--diff")
    assert applied["changed"] is True and applied["removed"] == predicted["removed"], applied
    assert host.read("/etc/fstab") == (FSTAB.replace("/swapfile", OURS + "\n/swapfile").encode()
                                       + b"LABEL=caf\xe9 /data ext4 defaults 0 2\n")
    again = host.module("shm_fstab", {"line": OURS})
    assert again["changed"] is False and again["removed"] == [], again


def test_shm_fstab_appends_our_line_to_an_fstab_without_one(host):
    host.write("/etc/fstab", FSTAB)
    assert host.module("shm_fstab", {"line": OURS})["changed"] is True
    assert host.read("/etc/fstab") == (FSTAB + OURS + "\n").encode()


def test_shm_fstab_stops_at_a_dev_shm_mount_dropin_naming_it_and_changes_nothing(host):
    host.write("/etc/fstab", FSTAB + OTHER + "\n")
    host.write(DROPIN, "[Mount]\nOptions=mode=1777,size=64M\n")
    unchanged = host.state()
    for options in (("--check",), ()):
        refused = host.module("shm_fstab", {"line": OURS}, *options)
        assert refused["failed"] and refused["changed"] is False, refused
        assert refused["msg"].startswith(f"{DROPIN} sets Options=mode=1777,size=64M for dev-shm.mount")
        assert refused["overrides"] == [[DROPIN, "Options=mode=1777,size=64M"]]
    assert host.state() == unchanged


def nouveau_args(modprobe: str = OUR_MODPROBE) -> dict:
    return {"flags": FLAGS, "own": {OUR_MODPROBE_PATH: modprobe, OUR_GRUB_PATH: OUR_GRUB}}


def test_nouveau_boot_counts_our_files_as_the_role_writes_them(host):
    host.write(OUR_MODPROBE_PATH, "options nouveau modeset=1\n")  # ours, edited: the role's template rewrites it
    host.write("/etc/default/grub", 'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n')
    passed = host.module("nouveau_boot", nouveau_args(), "--check")
    assert not passed["failed"] and passed["changed"] is False, passed
    assert all(row["passed"] for row in passed["rows"]), passed["rows"]


@pytest.mark.parametrize("path, text, line", [
    ("/etc/modprobe.d/zz-nouveau-kms.conf", "options nouveau modeset=1\n", "options nouveau modeset=1"),
    ("/usr/lib/modules-load.d/gpu.conf", "nouveau\n", "nouveau"),
])
def test_nouveau_boot_stops_at_a_foreign_file_naming_it_and_its_line(host, path, text, line):
    host.write(path, text)
    unchanged = host.state()
    refused = host.module("nouveau_boot", nouveau_args(), "--check")
    assert refused["failed"], refused
    assert refused["msg"].startswith(f"{path} decides '") and f"remove the line '{line}'" in refused["msg"]
    assert host.state() == unchanged


def test_the_modules_documentation_renders(host):
    modules = [f"{COLLECTION}.shm_fstab", f"{COLLECTION}.nouveau_boot"]
    doc = subprocess.run([str(Path(sys.executable).parent / "ansible-doc"), "--type", "module", "--json", *modules],
                         env=host.env, capture_output=True, text=True, timeout=120)
    assert doc.returncode == 0, doc.stderr
    entries = json.loads(doc.stdout)
    for module in modules:
        assert entries[module]["doc"]["attributes"]["check_mode"]["support"] == "full", module
        assert entries[module]["examples"].strip() and entries[module]["return"], module
    assert entries[modules[0]]["doc"]["attributes"]["diff_mode"]["support"] == "full"
