"""Where the Ansible content and the example files live, seen from the package.

One source in the repository: the collection vllm_provision.gpu_host (top-level `galaxy.yml`, `meta/`,
`plugins/`, `roles/`, `playbooks/`) and the examples (`templates/`, `inventory/examples/`). A built
wheel carries them under `provisioner/_content/` (pyproject.toml's force-include); a checkout (an
editable install) has them beside the package. Only paths are computed here: nothing is read.
"""

from __future__ import annotations

import os
from pathlib import Path

COLLECTION = "vllm_provision.gpu_host"
PACKAGE_DIR = Path(__file__).resolve().parents[1]


def _content_root() -> Path:
    packaged = PACKAGE_DIR / "_content"
    return packaged if packaged.is_dir() else PACKAGE_DIR.parent


CONTENT_ROOT = _content_root()
ROLES_DIR = CONTENT_ROOT / "roles"
PLAYBOOKS_DIR = CONTENT_ROOT / "playbooks"
PLUGINS_DIR = CONTENT_ROOT / "plugins"
TEMPLATES_DIR = CONTENT_ROOT / "templates"
EXAMPLES_DIR = CONTENT_ROOT / "inventory" / "examples"
SPEC_EXAMPLE = TEMPLATES_DIR / "spec.example.yml"


class ContentMissing(FileNotFoundError):
    """A part of the installation is not where it belongs: the install is broken, not the user's input."""


def _existing(path: Path, what: str) -> Path:
    if not path.exists():
        raise ContentMissing(
            f"{what} not found at {path}: this installation of vllm-provision is incomplete — reinstall it "
            "(pipx install vllm-provision, or pip install -e . in a checkout)"
        )
    return path


def role_dir(name: str) -> Path:
    """The collection's role `name`."""
    return _existing(ROLES_DIR / name, f"role '{name}'")


def module_utils_file(name: str) -> Path:
    """plugins/module_utils/<name>.py: code the module `nvidia_gpu` and the package share."""
    return _existing(PLUGINS_DIR / "module_utils" / f"{name}.py", f"module_utils '{name}'")


def site_playbook() -> str:
    """The playbook `apply` runs, by its collection name."""
    return f"{COLLECTION}.site"


def collections_dir(parent: Path) -> Path:
    """Make `parent`/ansible_collections/vllm_provision/gpu_host point at the content and return
    `parent`, for ANSIBLE_COLLECTIONS_PATH: Ansible then finds the roles, the module and the playbook by
    their collection names, from a checkout as from a wheel."""
    namespace, name = COLLECTION.split(".")
    link = Path(parent) / "ansible_collections" / namespace / name
    link.parent.mkdir(parents=True, exist_ok=True)
    content = _existing(CONTENT_ROOT / "galaxy.yml", "the collection").parent
    if link.is_symlink() and os.readlink(link) != str(content):  # left by another checkout: point it here
        link.unlink()
    if not link.is_symlink():
        os.symlink(content, link)
    return Path(parent)
