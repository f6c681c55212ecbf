"""The controls users expect, on real test hosts: `provision apply HOST|GROUP` with the spec found as
./provision.yml or $PROVISION_SPEC, --tags limiting what runs, -e reaching a role, -K answering a real
sudo, the user's own ansible.cfg, the run log and the JSON summary.

Two hosts for the whole module; every apply runs only the sysctl role (--tags sysctl), which is fast."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from provisioner.apply.controls import Controls
from provisioner.apply.hosts import apply_spec
from provisioner.spec import load_spec
from tests.lab.specs import host_entry, write_spec

PROVISION = [sys.executable, "-m", "provisioner.cli.main"]
SYSCTL_FILE = "/etc/sysctl.d/60-vllm-provision.conf"
BECOME_PASSWORD = "Vp-become-Pw-8c1f2e"  # the sudo password of the user `deploy` on the first host


def provision(*args: str, cwd: Path, env: dict[str, str] | None = None,
              stdin: str | None = None) -> subprocess.CompletedProcess:
    environment = {key: value for key, value in os.environ.items() if key not in ("PROVISION_SPEC",)}
    return subprocess.run([*PROVISION, *args], capture_output=True, text=True, timeout=300, cwd=cwd,
                          env={**environment, "COLUMNS": "200", **(env or {})}, input=stdin,
                          start_new_session=True)  # no controlling terminal: getpass reads stdin, as in CI


@pytest.fixture(scope="module")
def lab_hosts(lab, tmp_path_factory):
    """Two hosts: the first in groups rack_a and gpus, the second in gpus; a user `deploy` on the first
    with a sudo password; XDG_STATE_HOME of a folder of the module's own."""
    first, second = lab.boot_many([f"cc{lab.boot_count}", f"cc{lab.boot_count + 1}"])
    folder = tmp_path_factory.mktemp("controls")
    # sudo looks its own host name up: without this line it waits ~20 s on the lab's DNS (a real host has it)
    first.ssh(f"echo '127.0.1.1 {first.name}' >> /etc/hosts && useradd -m -s /bin/bash deploy && install -d -m 700 -o deploy -g deploy /home/deploy/.ssh && "
              "install -m 600 -o deploy -g deploy /root/.ssh/authorized_keys /home/deploy/.ssh/ && "
              f"echo 'deploy:{BECOME_PASSWORD}' | chpasswd && "
              "echo 'deploy ALL=(ALL:ALL) ALL' > /etc/sudoers.d/deploy && chmod 440 /etc/sudoers.d/deploy")
    hosts = [dict(host_entry(first), groups=["rack_a", "gpus"]), dict(host_entry(second), groups=["gpus"])]
    write_spec(folder / "provision.yml", hosts, [])
    yield first, second, folder
    for host in (first, second):
        lab.destroy(host)


def sysctl_file(host) -> str:
    return host.ssh(f"cat {SYSCTL_FILE} 2>/dev/null || true").stdout


def run_log_of(result: subprocess.CompletedProcess) -> Path:
    """The run log the last line of apply's output names."""
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("run log: "), result.stdout
    return Path(last.removeprefix("run log: "))


def test_apply_a_group_with_tags_extra_vars_and_the_users_ansible_cfg(lab_hosts, tmp_path):
    """`provision apply rack_a` in the spec's folder: ./provision.yml; only the first host, only the sysctl
    role; -e overrides what the role writes; the user's ansible.cfg (a log_path) is used, its
    host_key_checking = False is not."""
    first, second, folder = lab_hosts
    work = tmp_path / "work"
    work.mkdir()
    (work / "provision.yml").symlink_to(folder / "provision.yml")
    (work / "ansible.cfg").write_text("[defaults]\nforks = 3\nlog_path = ./ansible.log\nhost_key_checking = False\n"
                                      "[ssh_connection]\nhost_key_checking = False\n")
    state = tmp_path / "state"
    # every ssh Ansible starts (its own plugin or Mitogen's, which logs no command line) goes through this
    # wrapper first on PATH: it writes the options, then runs the real ssh
    wrapper, ssh_calls = tmp_path / "bin", tmp_path / "ssh-calls"
    wrapper.mkdir()
    (wrapper / "ssh").write_text(f'#!/bin/sh\necho "$*" >> {ssh_calls}\nexec /usr/bin/ssh "$@"\n')
    (wrapper / "ssh").chmod(0o755)
    result = provision("apply", "rack_a", "--tags", "sysctl", "-vvv",
                       "-e", '{"sysctl_settings": {"vm.swappiness": 7, "vm.max_map_count": 300000}}',
                       cwd=work, env={"XDG_STATE_HOME": str(state), "PATH": f"{wrapper}:{os.environ['PATH']}"})
    assert result.returncode == 0, result.stdout + result.stderr

    assert "vm.swappiness = 7" in sysctl_file(first) and "vm.max_map_count = 300000" in sysctl_file(first)  # -e won
    assert sysctl_file(second) == ""  # not in rack_a: not touched
    assert first.ssh("test -e /etc/modprobe.d/blacklist-nouveau.conf", check=False).returncode == 1  # only sysctl ran
    assert f"Using {work}/ansible.cfg as config file" in result.stdout  # Ansible's own words (-v)
    assert (work / "ansible.log").is_file() and "sysctl" in (work / "ansible.log").read_text()  # its log_path
    calls = ssh_calls.read_text().splitlines()
    assert calls and all(f'UserKnownHostsFile "{first.known_hosts}"' in call for call in calls), calls  # the spec's
    checking = {option.replace("=", " ") for call in calls for option in re.findall(r"StrictHostKeyChecking[ =]\w+", call)}
    assert checking == {"StrictHostKeyChecking yes"}, calls  # the user's host_key_checking = False did not undo it

    log = run_log_of(result)
    assert log.parent == state / "vllm-provision" / "runs" and log.name.endswith("Z-provision.log")
    text = log.read_text()
    assert f"changed {first.name} sysctl : " in " ".join(text.split())  # the console's lines
    assert re.search(rf"^│ {first.name}\s+│\s+\d+ │\s+1 │\s+0 │\s+0 │", text, re.M), text  # the summary table
    assert second.name not in text


def test_apply_json_with_the_spec_from_the_environment(lab_hosts, tmp_path):
    """$PROVISION_SPEC from another folder; two hosts named (one as a group): one --limit of both;
    --json: the summary on stdout, progress on stderr."""
    first, second, folder = lab_hosts
    result = provision("apply", "gpus", first.name, "--tags", "sysctl", "--json", cwd=tmp_path,
                       env={"PROVISION_SPEC": str(folder / "provision.yml"), "XDG_STATE_HOME": str(tmp_path)})
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads(result.stdout)
    assert sorted(summary) == ["ansible_output", "check", "hosts", "interrupted", "problems", "rc", "run_log", "spec",
                              "succeeded"]
    assert summary["succeeded"] is True and summary["check"] is False and summary["problems"] == []
    assert sorted(summary["hosts"]) == sorted([first.name, second.name])
    assert summary["hosts"][second.name]["changed"] >= 1 and summary["hosts"][second.name]["failed"] == 0
    assert Path(summary["run_log"]).is_file()
    assert "sysctl : " in result.stderr and result.stderr.strip().splitlines()[-1] == f"run log: {summary['run_log']}"
    assert "vm.swappiness = 1" in sysctl_file(second)


def test_ask_become_pass_answers_a_real_sudo_and_the_password_is_nowhere(lab_hosts, tmp_path):
    """-K as the user `deploy` (sudo asks a password): the run succeeds, and the password is in no
    output, no run log, no file of the run's private folder (its events, Ansible's output)."""
    first, _, folder = lab_hosts
    entry = dict(host_entry(first), groups=["rack_a"])
    entry["ssh"] = {**entry["ssh"], "user": "deploy", "become": True}
    spec = write_spec(tmp_path / "deploy.yml", [entry], [])
    first.ssh(f"rm -f {SYSCTL_FILE}")

    without = first.ssh("su - deploy -c 'sudo -n true'", check=False)
    assert without.returncode == 1 and "password is required" in without.stderr  # sudo wants the password

    result = provision("apply", "-K", "--spec", str(spec), "--tags", "sysctl", cwd=tmp_path,
                       env={"XDG_STATE_HOME": str(tmp_path)}, stdin=BECOME_PASSWORD + "\n")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "vm.swappiness = 1" in sysctl_file(first)
    assert first.ssh(f"stat -c %U {SYSCTL_FILE}").stdout.strip() == "root"  # written through sudo
    log = run_log_of(result)
    assert BECOME_PASSWORD not in result.stdout + result.stderr + log.read_text()

    # the library, with a look into the run's private folders while the run goes on
    seen: list[str] = []

    def look(_) -> None:
        # every run's folder, this one's among them; another run beside it (CI runs several) may remove its own
        # while it is read: os.walk skips a folder gone, and a file gone is skipped
        for folder in Path(tempfile.gettempdir()).glob("provision-run-*"):
            for parent, _, names in os.walk(folder):
                for path in (Path(parent) / name for name in names):
                    try:
                        if path.is_symlink() or not path.is_file():  # a socket: ssh's master
                            continue
                        content = path.read_bytes()
                    except FileNotFoundError:
                        continue
                    seen.append(str(path))
                    assert BECOME_PASSWORD.encode() not in content, path

    outcome = apply_spec(load_spec(spec), controls=Controls(tags=("sysctl",), become_password=BECOME_PASSWORD),
                         on_result=look)
    assert outcome.succeeded, outcome.problems
    assert any(path.endswith("/events.jsonl") for path in seen)  # the folder was there to look into
