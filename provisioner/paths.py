"""Where the repository's Ansible content lives, seen from the package.

The package is used from its checkout (editable install), so roles, playbooks and
templates are found next to it rather than inside the installed package.
"""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
ROLES_DIR = REPO_ROOT / "roles"
PLAYBOOKS_DIR = REPO_ROOT / "playbooks"
TEMPLATES_DIR = REPO_ROOT / "templates"
INVENTORY_DIR = REPO_ROOT / "inventory"
EXAMPLES_DIR = INVENTORY_DIR / "examples"
SPEC_EXAMPLE = TEMPLATES_DIR / "spec.example.yml"


def role_dir(name: str) -> Path:
    """roles/<name>, which must exist."""
    path = ROLES_DIR / name
    if not path.is_dir():
        raise FileNotFoundError(
            f"role '{name}' not found at {path} — vllm-provision runs from its checkout (pip install -e .)"
        )
    return path


def site_playbook() -> Path:
    """playbooks/site.yml: the playbook `apply` runs."""
    return PLAYBOOKS_DIR / "site.yml"


def ansible_cfg() -> Path:
    """The repository's ansible.cfg (roles_path, ssh settings)."""
    return REPO_ROOT / "ansible.cfg"
