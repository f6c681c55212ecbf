"""The collection vllm_provision.gpu_host (roles, playbooks, module, galaxy.yml, meta/runtime.yml) is
clean under `ansible-lint --profile production` (the settings are the repository's .ansible-lint), and
the module's documentation is what ansible-doc shows.

Both run the real tools from the test's venv, offline, with Ansible's and ansible-lint's caches in the
test's temporary folder: nothing is written in the checkout or the user's ~/.ansible.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from provisioner.base.paths import COLLECTION, collections_dir

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


@pytest.fixture
def ansible_env(tmp_path) -> dict[str, str]:
    """Our collection found by its name (as apply finds it); every cache in tmp_path."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("ANSIBLE_", "VIRTUAL_ENV"))}
    env.update(
        ANSIBLE_COLLECTIONS_PATH=str(collections_dir(tmp_path / "collections")),
        ANSIBLE_HOME=str(tmp_path / "ansible-home"),
        XDG_CACHE_HOME=str(tmp_path / "cache"),
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        NO_COLOR="1",
    )
    return env


def test_ansible_lint_production_profile_is_clean(ansible_env):
    caches_in_repo = [REPO / ".ansible", BIN.parent / ".ansible"]
    there_before = {path: path.exists() for path in caches_in_repo}
    lint = subprocess.run(
        [BIN / "ansible-lint", "--profile", "production", "--offline", "--nocolor", "-f", "pep8"],
        cwd=REPO, env=ansible_env, capture_output=True, text=True, timeout=300,
    )
    report = f"{lint.stdout}\n{lint.stderr}"
    assert lint.returncode == 0, f"ansible-lint found violations:\n{report}"
    assert "Profile 'production' was required, and it passed." in report, report
    for path, existed in there_before.items():
        assert path.exists() == existed, f"ansible-lint wrote a cache in {path}"


def test_the_module_documentation_renders(ansible_env):
    module = f"{COLLECTION}.nvidia_gpu"
    doc = subprocess.run(
        [BIN / "ansible-doc", "--type", "module", "--json", module],
        cwd=REPO, env=ansible_env, capture_output=True, text=True, timeout=120,
    )
    assert doc.returncode == 0, doc.stderr
    entry = json.loads(doc.stdout)[module]
    assert entry["doc"]["short_description"], entry["doc"]
    assert entry["doc"]["options"], entry["doc"]
    assert entry["examples"].strip(), entry
    assert entry["return"], entry
