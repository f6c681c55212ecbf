"""The Ansible module sysctl_precedence as Ansible runs it (ad hoc, on this machine), on a folder
standing for the host's / (its `root` option): check mode, diff, the writes, idempotence, refusal."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from provisioner.base.paths import COLLECTION, collections_dir

OURS = "/etc/sysctl.d/60-vllm-provision.conf"
OVERRIDE = "/etc/sysctl.d/99-zz-override.conf"
VENDOR = "/usr/lib/sysctl.d/99-vendor.conf"
MARK = f"  # disabled by vllm-provision: {OURS} sets"


class Host:
    def __init__(self, root: Path, work: Path):
        self.root, self.work = root, work
        self.env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(collections_dir(work / "collections")),
                    "ANSIBLE_REMOTE_TMP": str(work / "ansible-tmp"), "ANSIBLE_LOCALHOST_WARNING": "false",
                    "ANSIBLE_NOCOLOR": "1"}

    def write(self, path: str, text: str) -> None:
        file = self.root / path.lstrip("/")
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(text)

    def read(self, path: str) -> str:
        return (self.root / path.lstrip("/")).read_text()

    def state(self) -> dict[str, str]:
        return {str(path.relative_to(self.root)): ("-> " + os.readlink(path) if path.is_symlink() else path.read_text())
                for path in sorted(self.root.rglob("*")) if path.is_file() or path.is_symlink()}

    def module(self, settings: dict, *options: str, neutralise: bool = True) -> dict:
        tree = self.work / "tree"
        shutil.rmtree(tree, ignore_errors=True)
        args = {"file": OURS, "settings": settings, "neutralise": neutralise, "root": str(self.root)}
        done = subprocess.run(
            [str(Path(sys.executable).parent / "ansible"), "localhost", "-c", "local", "-e",
             f"ansible_python_interpreter={sys.executable}", "-t", str(tree), "-m", f"{COLLECTION}.sysctl_precedence",
             "-a", json.dumps(args), *options],
            env=self.env, capture_output=True, text=True, timeout=120)
        return {**json.loads((tree / "localhost").read_text()), "failed": done.returncode != 0, "stdout": done.stdout}


@pytest.fixture
def host(tmp_path) -> Host:
    (tmp_path / "root").mkdir()
    host = Host(tmp_path / "root", tmp_path)
    host.write(OURS, "vm.max_map_count = 1048576\nvm.swappiness = 1\n")
    host.write(OVERRIDE, "# someone's tuning\nkernel.pid_max = 4194304\nvm.swappiness = 60\n")
    host.write(VENDOR, "vm.max_map_count=65530\nnet.core.somaxconn = 4096\n")
    host.write("/etc/sysctl.conf", "#vm.swappiness = 10\nvm/swappiness = 30\n")
    os.symlink("../sysctl.conf", host.root / "etc/sysctl.d/99-sysctl.conf")
    return host


SETTINGS = {"vm.swappiness": 1, "vm.max_map_count": 1048576}


def test_check_mode_predicts_what_apply_neutralises_and_writes_nothing(host):
    before = host.state()
    predicted = host.module(SETTINGS, "--check", "--diff")

    assert predicted["changed"] is True and not predicted["failed"], predicted
    assert host.state() == before
    assert [(item["path"], item["number"], item["key"], item["written"]) for item in predicted["neutralised"]] == [
        ("/etc/sysctl.d/99-sysctl.conf", 2, "vm.swappiness", "/etc/sysctl.conf"),
        (VENDOR, 1, "vm.max_map_count", "/etc/sysctl.d/99-vendor.conf"),
        (OVERRIDE, 3, "vm.swappiness", OVERRIDE),
    ]
    assert predicted["msg"].startswith("would neutralise: /etc/sysctl.d/99-sysctl.conf:2 'vm/swappiness = 30'")
    # the diff as Ansible prints it (the tree callback does not keep it): each file written, before and after
    for header in ("--- before: /etc/sysctl.conf", "+++ after: /etc/sysctl.conf",
                   "--- before: /etc/sysctl.d/99-vendor.conf (absent)", f"+++ after: {OVERRIDE}",
                   f"+# vm.swappiness = 60{MARK} vm.swappiness"):
        assert header in predicted["stdout"], predicted["stdout"]

    applied = host.module(SETTINGS, "--diff")
    assert applied["changed"] is True and not applied["failed"], applied
    assert applied["neutralised"] == predicted["neutralised"]
    assert applied["stdout"].split("localhost |")[0] == predicted["stdout"].split("localhost |")[0]  # the same diff
    assert applied["msg"] == predicted["msg"].replace("would neutralise", "neutralised", 1)

    assert host.read(OVERRIDE) == ("# someone's tuning\nkernel.pid_max = 4194304\n"
                                   f"# vm.swappiness = 60{MARK} vm.swappiness\n")
    assert host.read("/etc/sysctl.conf") == f"#vm.swappiness = 10\n# vm/swappiness = 30{MARK} vm.swappiness\n"
    assert os.readlink(host.root / "etc/sysctl.d/99-sysctl.conf") == "../sysctl.conf"
    copy = host.read("/etc/sysctl.d/99-vendor.conf")
    assert copy.startswith(f"# A copy of {VENDOR} by vllm-provision")
    assert copy.endswith(f"# vm.max_map_count=65530{MARK} vm.max_map_count\nnet.core.somaxconn = 4096\n")
    assert host.read(VENDOR) == "vm.max_map_count=65530\nnet.core.somaxconn = 4096\n"
    assert oct((host.root / "etc/sysctl.d/99-vendor.conf").stat().st_mode & 0o777) == "0o644"

    again = host.module(SETTINGS, "--check")
    assert again["changed"] is False and again["neutralised"] == [] and not again["failed"], again
    assert host.module(SETTINGS)["changed"] is False


def test_neutralise_false_fails_naming_each_file_and_line_and_changes_nothing(host):
    before = host.state()
    refused = host.module({"vm.swappiness": 1}, neutralise=False)

    assert refused["failed"] and refused["changed"] is False
    assert f"{OVERRIDE}:3 'vm.swappiness = 60'" in refused["msg"]
    assert "/etc/sysctl.d/99-sysctl.conf:2 'vm/swappiness = 30'" in refused["msg"]
    assert "sysctl_neutralise_overrides: true" in refused["msg"]
    assert host.state() == before


def test_nothing_to_do_when_no_later_file_sets_another_value(host):
    host.write(OVERRIDE, "vm.swappiness = 1\n")
    (host.root / "etc/sysctl.d/99-sysctl.conf").unlink()
    result = host.module({"vm.swappiness": 1})
    assert result["changed"] is False and result["neutralised"] == [] and not result["failed"], result


def test_the_module_documentation_renders(host):
    module = f"{COLLECTION}.sysctl_precedence"
    doc = subprocess.run([str(Path(sys.executable).parent / "ansible-doc"), "--type", "module", "--json", module],
                         env=host.env, capture_output=True, text=True, timeout=120)
    assert doc.returncode == 0, doc.stderr
    entry = json.loads(doc.stdout)[module]
    assert entry["doc"]["attributes"]["check_mode"]["support"] == "full"
    assert entry["examples"].strip() and entry["return"]["neutralised"]
