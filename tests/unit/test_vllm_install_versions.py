"""Role vllm_install's one round trip that reads which venvs a host has, run for real (its own shell
script, as the role's task passes it) on folder trees laid out as hosts have them; and what the role then
keeps and removes, from its own variables (rendered as Ansible renders them)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from provisioner.roles import render_string, role_tasks, role_vars

READ_TASK = "Read which venvs the units ran and the vLLM in this version's venv"


def rendered_role_vars(variables: dict) -> dict:
    """The role's vars/main.yml rendered one after another (each may use the ones before it)."""
    values = dict(variables)
    for name, template in role_vars("vllm_install").items():
        try:
            values[name] = render_string(str(template), values)
        except Exception:  # one that reads what a task registers: not needed here
            continue
    return values


def read_venvs(install_path: Path, version: str) -> dict[str, str]:
    """Run the role's read task's command on this machine, against `install_path`."""
    (task,) = [task for task in role_tasks("vllm_install") if task.get("name") == READ_TASK]
    values = rendered_role_vars({"vllm_install_path": str(install_path), "vllm_install_version": version})
    argv = [render_string(str(word), values) for word in task["ansible.builtin.command"]["argv"]]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def venv(path: Path, version: str | None) -> Path:
    """A venv whose python says `version` is installed (None: a python with no vLLM)."""
    (path / "bin").mkdir(parents=True)
    answer = f"print('version={version}')" if version else "raise SystemExit(1)"
    (path / "bin" / "python").write_text(f"#!/bin/sh\nexec python3 -c \"{answer}\"\n")
    (path / "bin" / "python").chmod(0o755)
    (path / "bin" / "vllm").write_text("#!/bin/sh\n")
    (path / "bin" / "vllm").chmod(0o755)
    return path


def test_a_fresh_host_has_nothing():
    assert read_venvs(Path("/nonexistent/vllm"), "0.25.0") == {"ran": "", "previous": "", "venvs": ""}


def test_a_host_of_an_earlier_release_ran_its_unversioned_venv(tmp_path):
    venv(tmp_path / "venv", "0.25.0")
    assert read_venvs(tmp_path, "0.25.0") == {"ran": f"{tmp_path}/venv", "previous": "",
                                              "unversioned": f"{tmp_path}/venv", "venvs": ""}


def test_an_upgrade_reads_the_running_the_previous_and_every_venv_as_written_never_resolved(tmp_path):
    for version in ("0.20.0", "0.25.0", "0.33.0"):
        venv(tmp_path / "venvs" / version, version)
    (tmp_path / "current").symlink_to(tmp_path / "venvs" / "0.25.0")
    (tmp_path / "previous").symlink_to(tmp_path / "venvs" / "0.20.0")
    linked = tmp_path / "linked"  # an install path reached through a link: the paths stay as written
    linked.symlink_to(tmp_path)
    read = read_venvs(linked, "0.33.0")
    assert read["ran"] == f"{tmp_path}/venvs/0.25.0" and read["previous"] == f"{tmp_path}/venvs/0.20.0"
    assert read["version"] == "0.33.0"
    assert read["venvs"].split() == [f"{linked}/venvs/{version}" for version in ("0.20.0", "0.25.0", "0.33.0")]


@pytest.mark.parametrize("current, previous, pinned, kept", [
    ("0.25.0", None, "0.25.0", ["0.25.0"]),  # nothing changes
    ("0.25.0", None, "0.33.0", ["0.33.0", "0.25.0"]),  # an upgrade: the one before becomes the previous
    ("0.33.0", "0.25.0", "0.33.0", ["0.33.0", "0.25.0"]),  # after it
    ("0.33.0", "0.25.0", "0.20.0", ["0.20.0", "0.33.0"]),  # the next switch: 0.25.0 goes
])
def test_a_run_that_got_ready_keeps_the_running_venv_and_the_previous_one(tmp_path, current, previous, pinned, kept):
    for version in {"0.20.0", "0.25.0", "0.33.0"}:
        venv(tmp_path / "venvs" / version, version)
    (tmp_path / "current").symlink_to(tmp_path / "venvs" / current)
    if previous:
        (tmp_path / "previous").symlink_to(tmp_path / "venvs" / previous)
    found = "\n".join(f"{key}={value}" for key, value in read_venvs(tmp_path, pinned).items())
    values = rendered_role_vars({"vllm_install_path": str(tmp_path), "vllm_install_version": pinned,
                                 "_vllm_install_found": {"stdout_lines": found.splitlines()}})
    for name in ("_vllm_install_read", "_vllm_install_last_ready", "_vllm_install_previous_before",
                 "_vllm_install_unversioned", "_vllm_install_venv_dirs", "_vllm_install_switched",
                 "_vllm_install_kept", "_vllm_install_unkept"):
        values[name] = evaluate(role_vars("vllm_install")[name], values)
    assert values["_vllm_install_kept"] == [str(tmp_path / "venvs" / version) for version in kept]
    assert sorted(values["_vllm_install_unkept"]) == sorted(
        str(tmp_path / "venvs" / version) for version in {"0.20.0", "0.25.0", "0.33.0"} - set(kept))


def evaluate(template: str, values: dict):
    """A role variable whose template is one expression, as Ansible 2.19 evaluates it: its native value."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    return Templar(loader=DataLoader(), variables=values).template(trust_as_template(template.strip()))
