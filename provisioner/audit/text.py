"""Text formats the audit reads on a host: `systemctl show` values, modprobe's dry run."""

from __future__ import annotations

import re
import shlex

from provisioner.base.module_utils import systemd_show
from provisioner.base.secrets import shown_command  # noqa: F401 (the checks and their tests read it here too)


def environment_words(value: str) -> dict[str, str]:
    """`systemctl show`'s Environment= (NAME=value words, quoted where needed) → {NAME: value}."""
    return dict(word.split("=", 1) for word in shlex.split(value) if "=" in word)


def shown_argv(exec_start: str) -> list[str]:
    """The first command of `systemctl show`'s ExecStart= ({ path=… ; argv[]=… ; … }), split into words (the code
    the role's module vllm_units reads units with: plugins/module_utils/systemd_show.py)."""
    return systemd_show.shown_argv(exec_start)


def show_blocks(text: str) -> list[dict[str, str]]:
    """`systemctl show` output of one or more units (blank lines between units) → one dict per unit."""
    return systemd_show.show_blocks(text)


def modprobe_dry_run(module: str, output: str) -> tuple[bool, str]:
    """`modprobe -n -v MODULE` → (refused, what it would do to MODULE itself). kmod prints the
    modules it would load first (`insmod …/dep.ko`), then the module's own action: `insmod
    …/MODULE.ko options` (loaded: not refused) or `install COMMAND options` (an install line ran
    instead, e.g. /bin/false: refused)."""
    lines = [" ".join(line.split()) for line in output.splitlines() if line.strip()]
    own = [line for line in lines if line.startswith("insmod ") and line.split()[1].endswith(f"/{module}.ko")]
    if own:
        return False, f"would load: {own[0]}"
    installs = [line for line in lines if line.startswith("install ")]
    if installs:
        return True, installs[-1]
    return False, lines[-1] if lines else "no output"
