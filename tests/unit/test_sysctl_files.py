"""systemd-sysctl's precedence (plugins/module_utils/sysctl_files.py) on folders laid out like a host's /.

The expected answers are the ones systemd 252 gave on a bookworm lab host for the same files
(`SYSTEMD_LOG_LEVEL=debug systemd-sysctl`: "Skipping overridden file", "Overwriting earlier assignment",
"Not setting ... (explicit setting exists)").
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from provisioner.base.module_utils import sysctl_files

OURS = "/etc/sysctl.d/60-vllm-provision.conf"


class Root:
    """A folder standing for a host's /."""

    def __init__(self, path: Path):
        self.path = path

    def write(self, path: str, text: str) -> None:
        file = self.path / path.lstrip("/")
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(text)

    def link(self, path: str, target: str) -> None:
        file = self.path / path.lstrip("/")
        file.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, file)

    def files(self):
        return sysctl_files.conf_files(sysctl_files.read_tree(str(self.path)))

    def winner(self, key: str):
        won = sysctl_files.effective(self.files()).get(sysctl_files.normalize(key))
        return None if won is None else (won["value"], won["path"])


@pytest.fixture
def root(tmp_path) -> Root:
    return Root(tmp_path)


def test_files_are_read_in_file_name_order_whatever_their_directory(root):
    root.write("/usr/lib/sysctl.d/50-pid-max.conf", "vm.swappiness = 10\n")
    root.write(OURS, "vm.swappiness = 1\n")
    root.write("/usr/lib/sysctl.d/99-vendor.conf", "vm.swappiness = 30\n")
    root.write("/run/sysctl.d/70-runtime.conf", "vm.swappiness = 20\n")

    assert [entry["path"] for entry in root.files()] == [
        "/usr/lib/sysctl.d/50-pid-max.conf", OURS, "/run/sysctl.d/70-runtime.conf", "/usr/lib/sysctl.d/99-vendor.conf"]
    assert root.winner("vm.swappiness") == ("30", "/usr/lib/sysctl.d/99-vendor.conf")


def test_a_same_named_file_in_an_earlier_directory_hides_the_later_ones(root):
    root.write("/usr/lib/sysctl.d/99-zz.conf", "vm.swappiness = 60\n")
    root.write("/usr/local/lib/sysctl.d/99-zz.conf", "vm.swappiness = 9\n")
    root.write(OURS, "vm.swappiness = 1\n")
    assert root.winner("vm.swappiness") == ("9", "/usr/local/lib/sysctl.d/99-zz.conf")

    root.write("/etc/sysctl.d/99-zz.conf", "# nothing\n")
    assert [entry["path"] for entry in root.files()] == [OURS, "/etc/sysctl.d/99-zz.conf"]
    assert root.winner("vm.swappiness") == ("1", OURS)


def test_a_link_to_dev_null_or_an_empty_file_masks_the_name(root):
    root.write("/usr/lib/sysctl.d/99-zz.conf", "vm.swappiness = 60\n")
    root.write(OURS, "vm.swappiness = 1\n")
    root.link("/etc/sysctl.d/99-zz.conf", "/dev/null")
    assert root.winner("vm.swappiness") == ("1", OURS)

    os.unlink(root.path / "etc/sysctl.d/99-zz.conf")
    root.write("/run/sysctl.d/99-zz.conf", "")
    assert root.winner("vm.swappiness") == ("1", OURS)


def test_debians_99_sysctl_conf_reads_etc_sysctl_conf_through_its_link(root):
    root.write("/etc/sysctl.conf", "#kernel.domainname = example.com\nvm.swappiness = 60\n")
    root.link("/etc/sysctl.d/99-sysctl.conf", "../sysctl.conf")
    root.write(OURS, "vm.swappiness = 1\n")

    (entry,) = [entry for entry in root.files() if entry["path"].endswith("99-sysctl.conf")]
    assert (entry["link"], entry["target"]) == ("../sysctl.conf", "/etc/sysctl.conf")
    assert root.winner("vm.swappiness") == ("60", "/etc/sysctl.d/99-sysctl.conf")
    assert sysctl_files.shown_path(entry) == "/etc/sysctl.d/99-sysctl.conf -> /etc/sysctl.conf"


def test_etc_sysctl_conf_alone_is_not_read(root):
    root.write("/etc/sysctl.conf", "vm.swappiness = 60\n")
    root.write(OURS, "vm.swappiness = 1\n")
    assert root.winner("vm.swappiness") == ("1", OURS)


def test_lib_linked_to_usr_lib_is_read_once(root):
    root.write("/usr/lib/sysctl.d/99-vendor.conf", "vm.swappiness = 30\n")
    root.link("/lib", "usr/lib")
    assert [entry["path"] for entry in root.files()] == ["/usr/lib/sysctl.d/99-vendor.conf"]


def test_hidden_files_other_suffixes_and_directories_are_not_read(root):
    root.write(OURS, "vm.swappiness = 1\n")
    root.write("/etc/sysctl.d/.hidden.conf", "vm.swappiness = 11\n")
    root.write("/etc/sysctl.d/99-zz.conf.dpkg-old", "vm.swappiness = 12\n")
    root.write("/etc/sysctl.d/README.sysctl", "vm.swappiness = 13\n")
    (root.path / "etc/sysctl.d/99-dir.conf").mkdir()
    assert [entry["path"] for entry in root.files()] == [OURS]


def test_slash_keys_dash_prefix_and_comments(root):
    root.write(OURS, "vm.swappiness = 1\nnet.ipv4.conf.enp3s0/200.forwarding = 1\n")
    root.write("/etc/sysctl.d/70-a.conf", "# vm.swappiness = 2\n; vm.swappiness = 3\n  -vm/swappiness=4  \n")
    assert root.winner("vm.swappiness") == ("4", "/etc/sysctl.d/70-a.conf")
    root.write("/etc/sysctl.d/80-b.conf", "net/ipv4/conf/enp3s0.200/forwarding = 0\nnot an assignment\n")
    assert root.winner("net.ipv4.conf.enp3s0/200.forwarding") == ("0", "/etc/sysctl.d/80-b.conf")


def test_a_later_assignment_of_the_same_value_keeps_the_earlier_file_as_the_winner(root):
    root.write(OURS, "vm.swappiness = 1\n")
    root.write("/etc/sysctl.d/99-zz.conf", "vm.swappiness =   1\n")
    assert root.winner("vm.swappiness") == ("1", OURS)
    assert sysctl_files.conflicts(root.files(), OURS, {"vm.swappiness": 1}) == []


def test_conflicts_are_the_later_assignments_with_another_value_or_a_negative_match(root):
    root.write("/etc/sysctl.d/10-early.conf", "vm.swappiness = 50\n")
    root.write(OURS, "vm.swappiness = 1\nvm.max_map_count = 1048576\n")
    root.write("/etc/sysctl.d/70-glob.conf", "vm.* = 3\n")
    root.write("/etc/sysctl.d/80-unset.conf", "-vm.max_map_count\nkernel.pid_max = 4194304\n")
    root.write("/usr/lib/sysctl.d/99-zz.conf", "vm/swappiness = 60\nvm.swappiness = 1\n")

    found = sysctl_files.conflicts(root.files(), OURS, {"vm.swappiness": 1, "vm.max_map_count": "1048576"})
    assert [(item["path"], item["number"], item["key"], item["value"]) for item in found] == [
        ("/etc/sysctl.d/80-unset.conf", 1, "vm.max_map_count", None),
        ("/usr/lib/sysctl.d/99-zz.conf", 1, "vm.swappiness", "60"),
    ]


def test_neutralising_comments_out_only_the_conflicting_lines(root):
    root.write(OURS, "vm.swappiness = 1\n")
    root.write("/etc/sysctl.d/99-zz-override.conf", "kernel.pid_max = 4194304\r\nvm.swappiness = 60\r\n")
    files = root.files()
    (plan,) = sysctl_files.neutralisations(sysctl_files.conflicts(files, OURS, {"vm.swappiness": 1}), OURS)

    assert plan["write"] == "/etc/sysctl.d/99-zz-override.conf" and plan["how"] == "edited in place"
    assert plan["after"] == ("kernel.pid_max = 4194304\r\n# vm.swappiness = 60  # disabled by vllm-provision: "
                             f"{OURS} sets vm.swappiness\r\n")
    root.write(plan["write"], plan["after"])
    assert sysctl_files.conflicts(root.files(), OURS, {"vm.swappiness": 1}) == []
    assert root.winner("kernel.pid_max") == ("4194304", "/etc/sysctl.d/99-zz-override.conf")


def test_a_vendor_file_is_overridden_by_a_same_named_copy_in_etc(root):
    root.write(OURS, "vm.swappiness = 1\n")
    root.write("/usr/lib/sysctl.d/99-vendor.conf", "vm.swappiness = 60\nnet.core.somaxconn = 4096")
    (plan,) = sysctl_files.neutralisations(sysctl_files.conflicts(root.files(), OURS, {"vm.swappiness": "1"}), OURS)

    assert plan["write"] == "/etc/sysctl.d/99-vendor.conf" and plan["before"] is None
    root.write(plan["write"], plan["after"])
    assert root.winner("vm.swappiness") == ("1", OURS)
    assert root.winner("net.core.somaxconn") == ("4096", "/etc/sysctl.d/99-vendor.conf")
    assert (root.path / "usr/lib/sysctl.d/99-vendor.conf").read_text() == "vm.swappiness = 60\nnet.core.somaxconn = 4096"


def test_a_link_into_etc_has_its_target_edited(root):
    root.write("/etc/sysctl.conf", "vm.swappiness = 60\n")
    root.link("/etc/sysctl.d/99-sysctl.conf", "../sysctl.conf")
    root.write(OURS, "vm.swappiness = 1\n")
    (plan,) = sysctl_files.neutralisations(sysctl_files.conflicts(root.files(), OURS, {"vm.swappiness": 1}), OURS)
    assert (plan["source"], plan["write"]) == ("/etc/sysctl.d/99-sysctl.conf", "/etc/sysctl.conf")


# ---------------------------------------------------------------- the audit's reader (provisioner/audit/checks/sysctl.py)


def test_the_audit_reads_the_files_as_json_and_a_comment_cannot_pose_as_a_file(root):
    from provisioner.audit.checks.sysctl import parse_sysctl
    from provisioner.audit.engine import Output

    root.write(OURS, "vm.swappiness = 1\n")
    # `systemd-analyze cat-config` would print this comment as a header: a reader of headers would be fooled
    root.write("/etc/sysctl.d/99-zz-override.conf", f"# {OURS}\nvm.swappiness = 60\n")
    at_boot, problem = parse_sysctl(Output(json.dumps(sysctl_files.read_tree(str(root.path))), 0))
    assert problem is None
    assert at_boot["vm/swappiness"] == ("60", "/etc/sysctl.d/99-zz-override.conf")


def test_the_audits_host_command_runs_the_reader_on_this_machine():
    from provisioner.audit.engine import host_commands

    expected = {"sysctl": {"file": OURS, "settings": {}}, "nouveau": {"enabled": False}, "shm": {}, "units": []}
    done = subprocess.run(["bash", "-c", host_commands(expected)["sysctl"]], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    entries = json.loads(done.stdout)
    assert isinstance(entries, list) and all(entry["path"].endswith(".conf") for entry in entries)


def test_an_unreadable_answer_says_why():
    from provisioner.audit.checks.sysctl import parse_sysctl
    from provisioner.audit.engine import Output

    assert parse_sysctl(Output("bash: line 1: python3: command not found", 127)) == (
        None, "could not read the sysctl.d files (exit 127: bash: line 1: python3: command not found)")
