"""Role vllm_install refuses, before installing, a driver it does not manage that is older than the vLLM build
needs (`vllm_install_minimum_driver`, which the inventory writes): the refusal provision's own gate makes before
any run, for playbooks run without provision. Run here by ansible-playbook on localhost, the role's preflight
tasks as the role runs them (the install itself needs a host: tests/integration/test_vllm_layer.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from provisioner.base.paths import collections_dir


def preflight(tmp_path: Path, **variables) -> subprocess.CompletedProcess:
    playbook = [{"hosts": "localhost", "gather_facts": False, "tasks": [{
        "ansible.builtin.include_role": {"name": "vllm_provision.gpu_host.vllm_install", "tasks_from": "preflight.yml"}}],
        "vars": {"ansible_python_interpreter": sys.executable, **variables}}]
    (tmp_path / "playbook.yml").write_text(json.dumps(playbook))
    return subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           str(tmp_path / "playbook.yml")], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(collections_dir(tmp_path / "c")),
                               "ANSIBLE_NOCOLOR": "1", "ANSIBLE_LOCALHOST_WARNING": "false"})


def test_a_driver_older_than_the_build_needs_is_refused_naming_the_fix(tmp_path):
    run = preflight(tmp_path, nvidia_driver_installed_version="535.309.01", vllm_install_minimum_driver="580")
    assert run.returncode == 2, run.stdout[-2000:]
    assert ("localhost: driver 535.309.01 is too old for vLLM 0.25.0, which needs driver ≥ 580 — install a driver of "
            "branch 580 or later, or let the run do it (nvidia_driver_manage: true, nvidia_driver_branch: \"580\")"
            ) in " ".join(run.stdout.split())


@pytest.mark.parametrize("variables", [
    {"nvidia_driver_installed_version": "580.95.05"},  # new enough
    {"nvidia_driver_installed_version": "590.44.01"},
    {"nvidia_driver_installed_version": None},  # no driver packages read: provision's gate reads nvidia-smi
    {"nvidia_driver_installed_version": ""},  # the same null, as set_fact templates it before ansible-core 2.19
    {"nvidia_driver_installed_version": "535.309.01", "nvidia_driver_manage": True},  # replaced by this run
], ids=["580", "590", "none read", "none read, before 2.19", "managed"])
def test_a_driver_that_will_run_it_or_that_this_run_replaces_passes(tmp_path, variables):
    run = preflight(tmp_path, vllm_install_minimum_driver="580", **variables)
    assert run.returncode == 0, run.stdout[-2000:]
    assert "ok=" in run.stdout and "failed=0" in run.stdout


def test_no_minimum_no_check(tmp_path):
    run = preflight(tmp_path, nvidia_driver_installed_version="470.256.02", vllm_install_minimum_driver=None)
    assert run.returncode == 0, run.stdout[-2000:]
