"""The role's module_utils, loaded into the package: one copy of the code for both.

Ansible ships roles/nvidia_gpu/module_utils/*.py to the targets with the module
`nvidia_gpu`; the package imports the same files from the checkout (as `plan` reads
the roles' templates from it). They use the standard library alone.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from provisioner.paths import role_dir


def load_module_utils(name: str) -> ModuleType:
    """roles/nvidia_gpu/module_utils/<name>.py as the module provisioner.gpu.shared.<name>."""
    qualified = f"{__name__}.{name}"
    if qualified not in sys.modules:
        path = role_dir("nvidia_gpu") / "module_utils" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(qualified, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[qualified] = module
        spec.loader.exec_module(module)
    return sys.modules[qualified]


gpu_facts = load_module_utils("nvidia_gpu_facts")
gpu_settings = load_module_utils("nvidia_gpu_settings")
