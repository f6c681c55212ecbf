"""OPT-IN: the role vllm_install with the REAL vLLM wheels (no test double), offline, on a real test host.

It copies a real wheelhouse (about 4 GB) to the host and installs vLLM from it with pip's --no-index;
then the installed vLLM's own parser (roles/vllm_service/files/vllm-check-args.py, CPU platform: no
GPU needed) checks `vllm serve --config FILE` files like the role vllm_service renders. CI does not run
it; run it with a wheelhouse built for the hosts' Python (Debian bookworm: 3.11):

    provision wheelhouse --vllm-version 0.25.0 --out DIR
    VP_REAL_WHEELHOUSE=DIR pytest -s tests/integration/test_real_wheelhouse.py
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from provisioner.apply.events import TaskResult
from provisioner.apply.playbook import run_playbook
from provisioner.base.paths import ROLES_DIR
from provisioner.fleet.inventory import write_inventory
from provisioner.spec import load_spec
from tests.lab.specs import VLLM_INSTALL_PATH, host_entry, write_spec

VERSION = "0.25.0"
WHEELHOUSE = os.environ.get("VP_REAL_WHEELHOUSE", "")
CHECK_ARGS = ROLES_DIR / "vllm_service" / "files" / "vllm-check-args.py"
VENV_PYTHON = f"{VLLM_INSTALL_PATH}/venvs/{VERSION}/bin/python"


def _has_vllm_wheel(folder: str) -> bool:
    return bool(folder) and Path(folder).is_dir() and any(Path(folder).glob("vllm-*.whl"))


pytestmark = pytest.mark.skipif(
    not _has_vllm_wheel(WHEELHOUSE),
    reason=(
        "opt-in (copies ~4 GB to a test host): set VP_REAL_WHEELHOUSE to a folder holding a real vllm-*.whl "
        f"and its dependencies, built with `provision wheelhouse --vllm-version {VERSION} --out DIR`"
    ),
)

# What the role vllm_service renders (templates/vllm-instance.yaml.j2) for one instance.
CONFIG = """\
# Managed by vllm-provision (role vllm_service); local changes are overwritten.
model: "Qwen/Qwen2.5-7B-Instruct"
host: "127.0.0.1"
port: 8000
gpu-memory-utilization: 0.9
max-model-len: 4096
"""


def _check(host, name: str, text: str) -> tuple[int, str, float]:
    """Write a config file on the host and check `vllm serve --config` it: (exit code, output, seconds)."""
    path = f"/etc/vllm/{name}.yaml"
    host.ssh(f"mkdir -p /etc/vllm && cat > {path} <<'EOF'\n{text}EOF")
    started = time.monotonic()
    result = host.ssh(f"{VENV_PYTHON} /usr/local/lib/vllm-check-args.py serve --config {path}", check=False, timeout=600)
    seconds = time.monotonic() - started
    output = (result.stdout + result.stderr).strip()
    print(f"\n[check {name}] exit {result.returncode} in {seconds:.1f}s: {output.splitlines()[-1] if output else ''}")
    return result.returncode, output, seconds


def test_offline_install_of_the_real_vllm_and_its_parser(boot, tmp_path):
    (host,) = boot(1)
    entry = host_entry(host)
    entry["vllm"] = {**entry["vllm"], "version": VERSION, "wheelhouse": str(Path(WHEELHOUSE).resolve())}
    spec = load_spec(write_spec(tmp_path / "spec.yml", [entry], []))
    inventory = tmp_path / "inventory"
    write_inventory(spec, inventory)
    playbook = tmp_path / "install.yml"
    playbook.write_text(
        "- hosts: vllm_hosts\n  gather_facts: false\n"
        f"  vars:\n    vllm_install_version: \"{VERSION}\"\n    vllm_install_wheelhouse: \"{Path(WHEELHOUSE).resolve()}\"\n"
        f"  roles: [{ROLES_DIR / 'vllm_install'}]\n"
    )

    results: list[tuple[TaskResult, float]] = []  # each result with the seconds since the one before

    def timed(result: TaskResult) -> None:
        now = time.monotonic()
        results.append((result, now - timed.last))
        timed.last = now

    started = timed.last = time.monotonic()
    first = run_playbook(inventory, playbook=playbook, on_result=timed)
    first_seconds = time.monotonic() - started
    print(f"\n[install] first run: {first_seconds:.1f}s, succeeded={first.succeeded}, changed={first.changed}")
    for result, seconds in results:
        if result.status in ("changed", "failed", "unreachable"):
            print(f"  {seconds:6.1f}s {result.status:8} {result.task}" + (f": {result.message}" if result.message else ""))
    assert first.succeeded, [(p.label, p.message) for p in first.problems] or first.output_tail

    version = host.ssh(f"{VENV_PYTHON} -c \"import importlib.metadata as m; print(m.version('vllm'))\"").stdout.strip()
    assert version == VERSION
    assert host.ssh(f"test -e {VLLM_INSTALL_PATH}/wheelhouse-{VERSION}; echo $?").stdout.strip() == "1"
    venv_size = host.ssh(f"du -sh {VLLM_INSTALL_PATH}/venvs/{VERSION}").stdout.split()[0]
    print(f"[install] vllm {version} in {VLLM_INSTALL_PATH}/venvs/{VERSION}: {venv_size}")

    started = time.monotonic()
    second = run_playbook(inventory, playbook=playbook)
    second_seconds = time.monotonic() - started
    print(f"[install] second run: {second_seconds:.1f}s, succeeded={second.succeeded}, changed={second.changed}")
    assert second.succeeded and second.changed == 0

    host.put(CHECK_ARGS, "/usr/local/lib/vllm-check-args.py")
    code, output, _ = _check(host, "ok", CONFIG)
    assert code == 0, output
    assert f"ok: vllm {VERSION} accepts the arguments" in output

    code, output, _ = _check(host, "invented-flag", CONFIG + "disable-cuda-graph: true\n")
    assert code == 2, output
    assert "unrecognized arguments: --disable-cuda-graph" in output

    code, output, _ = _check(host, "bad-dtype", CONFIG + 'dtype: "bf16"\n')
    assert code == 2, output
    assert "invalid choice: 'bf16'" in output
