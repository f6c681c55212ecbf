"""`provision apply --check --diff` is an honest dry run, on real systemd test hosts: it shows the diff of every
file the real run then writes (labelled with the file, an env file only as "content changes"), its "would
change" is the changed count of the real run that follows, and it exits non-zero where the real run stops.

One host for the module, its tests run in order: checked and applied fresh, then drifted (as the audit tests
drift it), checked and applied again, then given what a real run would stop on.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import yaml

from provisioner.apply.events import TaskResult
from provisioner.apply.hosts import apply_spec
from provisioner.apply.playbook import run_playbook
from provisioner.fleet.inventory import write_inventory
from provisioner.spec import load_spec
from tests.integration.conftest import disk_state
from tests.lab.specs import host_entry, install_standin, instance_entry, write_spec

PROVISION = [sys.executable, "-m", "provisioner.cli.main"]
UNIT_FILE = "/etc/systemd/system/vllm-chat.service"
ENV_FILE = "/etc/vllm/chat.env"
SYSCTL_FILE = "/etc/sysctl.d/60-vllm-provision.conf"
SECRET = "sk-dry-run-secret-77"
# written by the real run, but not by a file task of ours: pip's venv, useradd's databases, systemctl enable's links,
# and the run's own lock (taken and given back by every apply: the host's configuration is not in it)
NOT_A_FILE_TASK = re.compile(r"^(opt/vllm/venvs/[^/]+/|etc/(passwd|group|shadow|gshadow)-?$|etc/systemd/system/.*\.wants/"
                             r"|var/lib/vllm-provision/apply\.lock$)")


def check_diff(spec_file) -> subprocess.CompletedProcess:
    return subprocess.run([*PROVISION, "apply", "--spec", str(spec_file), "--check", "--diff"], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "COLUMNS": "250"})


def would_change(output: str, host: str) -> int:
    """The "would change" column of the summary table's row for the host."""
    (row,) = [line for line in output.splitlines() if re.match(rf"^│ {re.escape(host)}\s+│", line)]
    ok, changed, *_ = re.findall(r"\d+", row.split(host, 1)[1])
    return int(changed)


def checked_changes(output: str) -> list[str]:
    return re.findall(r"^\s+changed \S+\s+(.*)$", output, flags=re.MULTILINE)


def changed_lines(output: str, host: str) -> int:
    return len(re.findall(rf"^\s+changed {re.escape(host)}\s", output, flags=re.MULTILINE))


def shown_files(output: str) -> set[str]:
    """The destinations the dry run shows a change for: diffs, attribute and state changes (a link made), env
    files' "content changes"."""
    diffs = re.findall(r"^\+\+\+ (/\S+) \(after apply\)$", output, flags=re.MULTILINE)
    others = re.findall(r"^\s*(/\S+): (?:content changes|mode |owner |state \S+ -> link)", output, flags=re.MULTILINE)
    return {path.lstrip("/") for path in diffs + others}


def written_files(before: dict, after: dict) -> set[str]:
    return {path for path, state in after.items()
            if before.get(path) != state and not path.endswith("/") and not NOT_A_FILE_TASK.match(path)}


@pytest.fixture(scope="module")
def host_and_spec(lab, tmp_path_factory):
    (host,) = lab.boot_many([f"dr{lab.boot_count}"])
    folder = tmp_path_factory.mktemp("dry-run")
    key_file = folder / "chat.key"
    key_file.write_text(SECRET + "\n")
    install_standin(host)
    spec_file = write_spec(folder / "spec.yml", [host_entry(host)],
                           [instance_entry(host, "chat", 8000, share=0.9, api_key_file=str(key_file))])
    yield host, spec_file
    lab.destroy(host)


def dry_run_then_apply(host, spec_file):
    before = disk_state(host)
    checked = check_diff(spec_file)
    assert disk_state(host) == before, "check mode wrote to the host"
    applied = apply_spec(load_spec(spec_file))
    assert applied.succeeded, applied.problems
    return checked, applied, written_files(before, disk_state(host))


def test_fresh_host_dry_run_shows_every_file_and_counts_what_apply_changes(host_and_spec):
    host, spec_file = host_and_spec
    checked, applied, written = dry_run_then_apply(host, spec_file)
    output = checked.stdout

    assert checked.returncode == 0, output + checked.stderr  # vLLM is not there yet, but vllm_install installs it
    assert SECRET not in output + checked.stderr
    assert shown_files(output) == written, (shown_files(output) ^ written)
    assert f"+++ {UNIT_FILE} (after apply)" in output and "+++ /etc/vllm/chat.yaml (after apply)" in output
    assert f"{ENV_FILE}: content changes" in output
    assert "/root/.ansible/tmp" not in output  # no temp file stands for a destination
    assert would_change(output, host.name) == applied.stats[host.name].changed, (checked_changes(output), applied)
    assert changed_lines(output, host.name) == would_change(output, host.name)


def test_planted_drifts_are_shown_and_counted_as_apply_then_repairs_them(host_and_spec):
    host, spec_file = host_and_spec
    # the audit tests' drifts (tests/integration/test_audit.py): a unit file edit, an env file's mode,
    # a sysctl file edit, a stopped instance
    host.ssh(f"sed -i 's|^ExecStart=.*|& --enforce-eager|' {UNIT_FILE} && systemctl daemon-reload"
             f" && chmod 0644 {ENV_FILE}"
             f" && sed -i 's/^vm.swappiness = 1$/vm.swappiness = 60/' {SYSCTL_FILE}"
             " && systemctl stop vllm-chat.service")

    checked, applied, written = dry_run_then_apply(host, spec_file)
    output = checked.stdout

    assert checked.returncode == 0, output + checked.stderr
    assert re.search(rf"^-ExecStart=.* --enforce-eager$", output, flags=re.MULTILINE), output
    assert "-vm.swappiness = 60" in output and "+vm.swappiness = 1" in output
    assert f"{ENV_FILE}: content changes" in output and SECRET not in output
    assert shown_files(output) == written == {UNIT_FILE.lstrip("/"), ENV_FILE.lstrip("/"), SYSCTL_FILE.lstrip("/")}
    assert would_change(output, host.name) == applied.stats[host.name].changed, (checked_changes(output), applied)
    assert changed_lines(output, host.name) == would_change(output, host.name)
    assert host.ssh("systemctl is-active vllm-chat.service").stdout.strip() == "active"


def test_dry_run_stops_on_a_config_file_the_installed_vllm_rejects(host_and_spec, tmp_path):
    """Plain Ansible (no spec check in front): the real run's template validate refuses the file; check
    mode, where the template module validates nothing, runs the same parser."""
    host, spec_file = host_and_spec
    inventory = tmp_path / "inventory"
    write_inventory(load_spec(spec_file), inventory)
    host_vars = inventory / "host_vars" / f"{host.name}.yml"
    variables = yaml.safe_load(host_vars.read_text())
    variables["vllm_service_instances"][0]["options"]["disable-cuda-graph"] = True  # a flag vLLM does not have
    host_vars.write_text(yaml.safe_dump(variables))
    before = disk_state(host)
    results: list[TaskResult] = []

    checked = run_playbook(inventory, check=True, on_result=results.append)

    assert not checked.succeeded
    (failed,) = [result for result in results if result.status == "failed"]
    assert failed.task == "Check the changed config files with vLLM's parser (check mode)"
    assert "unrecognized arguments: --disable-cuda-graph" in failed.message
    assert disk_state(host) == before


def test_dry_run_exits_non_zero_where_the_real_run_stops(host_and_spec):
    host, spec_file = host_and_spec
    # vLLM's executable is gone but its package is still installed: vllm_install keeps it, vllm_service stops
    host.ssh("rm /opt/vllm/venvs/0.25.0/bin/vllm")

    checked = check_diff(spec_file)

    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert "vLLM is not installed at /opt/vllm/venvs/0.25.0/bin/vllm" in checked.stdout
    real = apply_spec(load_spec(spec_file))
    assert not real.succeeded and "vLLM is not installed at /opt/vllm/venvs/0.25.0/bin/vllm" in real.problems[0].message
