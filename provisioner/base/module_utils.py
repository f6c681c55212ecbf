"""The collection's module_utils, loaded into the package: one copy of the code for the modules and the audit.

Ansible ships plugins/module_utils/*.py to the targets with the modules that import them (nvidia_gpu,
sysctl_precedence, unit_overrides, apt_packages, shm_fstab, nouveau_boot…); the package loads the same files (as
`plan` reads the roles' templates), on first use, not at import. They use the standard library alone.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from provisioner.base.paths import module_utils_file

SHARED = {"gpu_facts": "nvidia_gpu_facts", "gpu_settings": "nvidia_gpu_settings", "sysctl_files": "sysctl_files",
          "systemd_dropins": "systemd_dropins", "systemd_show": "systemd_show", "driver_state": "nvidia_driver_state",
          "haproxy_runtime": "haproxy_runtime", "apt_lock": "apt_lock",
          "apply_lock_run": "apply_lock_run", "value_rules": "value_rules", "boot_config": "boot_config"}


def load_module_utils(name: str) -> ModuleType:
    """plugins/module_utils/<name>.py as the module provisioner.base.module_utils.<name>."""
    qualified = f"{__name__}.{name}"
    if qualified not in sys.modules:
        spec = importlib.util.spec_from_file_location(qualified, module_utils_file(name))
        module = importlib.util.module_from_spec(spec)
        sys.modules[qualified] = module
        spec.loader.exec_module(module)
    return sys.modules[qualified]


def __getattr__(attribute: str) -> ModuleType:
    """`from provisioner.base.module_utils import gpu_facts` loads the file then (PEP 562)."""
    if attribute in SHARED:
        return load_module_utils(SHARED[attribute])
    raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")
