"""Role vllm_install's one round trip that reads which venvs (and folders of compile caches) a host has, run
for real (its own shell script, as the role's task passes it) on folder trees laid out as hosts have them;
and what the role then keeps and removes, from its own variables (rendered as Ansible renders them)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from provisioner.validation.roles import (
    UNIT_TEMPLATE,
    render_role_file,
    render_string,
    role_defaults,
    role_tasks,
    role_vars,
)

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


def read_venvs(install_path: Path, version: str, cache_path: Path | None = None) -> dict[str, str]:
    """Run the role's read task's command on this machine, against `install_path` (and `cache_path`, the
    units' compile caches; none: a folder that is not there)."""
    (task,) = [task for task in role_tasks("vllm_install") if task.get("name") == READ_TASK]
    values = rendered_role_vars({"vllm_install_path": str(install_path), "vllm_install_version": version,
                                 "vllm_install_cache_path": str(cache_path or install_path / "no-caches")})
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
    assert read_venvs(Path("/nonexistent/vllm"), "0.25.0") == {"ran": "", "previous": "", "venvs": "", "caches": ""}


def test_a_host_of_an_earlier_release_ran_its_unversioned_venv(tmp_path):
    venv(tmp_path / "venv", "0.25.0")
    assert read_venvs(tmp_path, "0.25.0") == {"ran": f"{tmp_path}/venv", "previous": "",
                                              "unversioned": f"{tmp_path}/venv", "venvs": "", "caches": ""}


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
    """...and their folders of compile caches (<cache_path>/<the venv's folder name>): every other one goes,
    also that of a version whose venv went before (0.10.0); a file there is not a version's folder, and a
    folder named as no venv of the role (`local`: a unit run from elsewhere) is left be."""
    caches = tmp_path / "home" / "cache"
    for version in {"0.20.0", "0.25.0", "0.33.0"}:
        venv(tmp_path / "venvs" / version, version)
    for version in {"0.10.0", "0.20.0", "0.25.0", "0.33.0"}:
        (caches / version / "inductor").mkdir(parents=True)
    (caches / "notes.txt").write_text("not a version's folder\n")
    (caches / "local" / "triton").mkdir(parents=True)
    (tmp_path / "current").symlink_to(tmp_path / "venvs" / current)
    if previous:
        (tmp_path / "previous").symlink_to(tmp_path / "venvs" / previous)
    read = read_venvs(tmp_path, pinned, caches)
    assert read["caches"].split() == [f"{caches}/{name}" for name in ("0.10.0", "0.20.0", "0.25.0", "0.33.0", "local")]
    found = "\n".join(f"{key}={value}" for key, value in read.items())
    values = rendered_role_vars({"vllm_install_path": str(tmp_path), "vllm_install_version": pinned,
                                 "vllm_install_cache_path": str(caches),
                                 "_vllm_install_found": {"stdout_lines": found.splitlines()}})
    for name in ("_vllm_install_read", "_vllm_install_last_ready", "_vllm_install_previous_before",
                 "_vllm_install_unversioned", "_vllm_install_venv_dirs", "_vllm_install_cache_dirs",
                 "_vllm_install_switched", "_vllm_install_kept", "_vllm_install_unkept", "_vllm_install_unkept_caches"):
        values[name] = evaluate(role_vars("vllm_install")[name], values)
    assert values["_vllm_install_kept"] == [str(tmp_path / "venvs" / version) for version in kept]
    assert sorted(values["_vllm_install_unkept"]) == sorted(
        str(tmp_path / "venvs" / version) for version in {"0.20.0", "0.25.0", "0.33.0"} - set(kept))
    assert sorted(values["_vllm_install_unkept_caches"]) == sorted(
        str(caches / version) for version in {"0.10.0", "0.20.0", "0.25.0", "0.33.0"} - set(kept))


def test_the_caches_of_the_unversioned_venv_are_kept_while_it_is_the_previous_one(tmp_path):
    """A host of an earlier release: its unversioned venv (<path>/venv) is the previous version after the
    first upgrade, its caches folder `venv` with it; the next upgrade removes both."""
    caches = tmp_path / "cache"
    venv(tmp_path / "venv", "0.25.0")
    for name in ("venv", "0.33.0"):
        (caches / name).mkdir(parents=True)

    def unkept(pinned: str) -> tuple[list, list]:
        read = read_venvs(tmp_path, pinned, caches)
        values = rendered_role_vars({"vllm_install_path": str(tmp_path), "vllm_install_version": pinned,
                                     "vllm_install_cache_path": str(caches),
                                     "_vllm_install_found": {"stdout_lines": [f"{k}={v}" for k, v in read.items()]}})
        for name in ("_vllm_install_read", "_vllm_install_last_ready", "_vllm_install_previous_before",
                     "_vllm_install_unversioned", "_vllm_install_venv_dirs", "_vllm_install_cache_dirs",
                     "_vllm_install_switched", "_vllm_install_kept", "_vllm_install_unkept",
                     "_vllm_install_unkept_caches"):
            values[name] = evaluate(role_vars("vllm_install")[name], values)
        return values["_vllm_install_unkept"], values["_vllm_install_unkept_caches"]

    assert unkept("0.33.0") == ([], [])  # the first upgrade: 0.33.0 runs, the unversioned venv is the previous
    venv(tmp_path / "venvs" / "0.33.0", "0.33.0")
    (tmp_path / "current").symlink_to(tmp_path / "venvs" / "0.33.0")
    (tmp_path / "previous").symlink_to(tmp_path / "venv")
    assert unkept("0.33.0") == ([], [])
    assert unkept("0.34.0") == ([str(tmp_path / "venv")], [str(caches / "venv")])  # the next one


def test_a_discarded_version_takes_its_own_caches_with_it():
    values = rendered_role_vars({"vllm_install_path": "/opt/vllm", "vllm_install_version": "0.33.0+cu129",
                                 "vllm_install_cache_path": "/var/lib/vllm/cache"})
    assert values["_vllm_install_cache"] == "/var/lib/vllm/cache/0.33.0+cu129"


def test_the_caches_vllm_install_removes_are_where_the_units_keep_them():
    """The folder is vllm_service's (its home): vllm_install's default names the folder of that role's
    default home, and a unit running <path>/venvs/<version>/bin/vllm keeps its caches in <that>/<version>."""
    defaults = role_defaults()
    assert defaults["vllm_install_cache_path"] == defaults["vllm_service_home"] + "/cache"
    entry = {"name": "chat", "model": "m", "host": "127.0.0.1", "port": 8000, "gpu_uuids": ["GPU-0"],
             "gpu_memory_utilization": 0.5}
    for version in ("0.25.0", "0.33.0+cu129"):
        variables = {**defaults, "vllm_service_bin": f"{defaults['vllm_install_path']}/venvs/{version}/bin/vllm",
                     "vllm_service_instance": entry, "vllm_service_instance_index": 0, "vllm_service_instances": [entry]}
        unit = render_role_file("vllm_service", UNIT_TEMPLATE, variables).content
        cached = {line.split("=", 2)[1]: line.split("=", 2)[2] for line in unit.splitlines()
                  if line.startswith("Environment=") and line.split("=", 2)[1].endswith(("CACHE_ROOT", "CACHE_DIR"))}
        assert cached == {name: f"{defaults['vllm_install_cache_path']}/{version}/{folder}" for name, folder in
                          (("VLLM_CACHE_ROOT", "vllm"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
                           ("TRITON_CACHE_DIR", "triton"))}


def evaluate(template: str, values: dict):
    """A role variable whose template is one expression, as Ansible 2.19 evaluates it: its native value."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    return Templar(loader=DataLoader(), variables=values).template(trust_as_template(template.strip()))
