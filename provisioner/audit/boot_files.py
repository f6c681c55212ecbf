"""The files that decide /dev/shm and nouveau at the next boot, read on the host in the audit's one round trip.

The concerns shm and nouveau both declare the command `boot_files`: python3 running the code the roles' modules
shm_fstab and nouveau_boot run (plugins/module_utils/boot_config.py's read_tree), answering {path: text} as JSON;
the rows then apply boot_config's rules to it on the controller.
"""

from __future__ import annotations

import shlex

from provisioner.audit.engine import Output, json_answer, not_installed
from provisioner.base.paths import module_utils_file

BOOT_READER = module_utils_file("boot_config")


def boot_files_command() -> dict[str, str]:
    """The command reading the files, by its name."""
    return {"boot_files": "python3 -c " + shlex.quote(
        BOOT_READER.read_text() + "\nimport json\nprint(json.dumps(read_tree('/')))\n")}


def read_boot_files(out: dict[str, Output]) -> dict[str, dict[str, str] | str | None]:
    """The facts `boot_files` ({path: text}; None where they could not be read) and `boot_files_problem` (why)."""
    answer = out["boot_files"]
    files, problem = json_answer(answer, dict)
    if problem:
        problem = not_installed(answer, "python3") or f"the boot files could not be read ({problem})"
    return {"boot_files": files, "boot_files_problem": problem}


def boot_files(facts, audit, check: str, expected) -> dict[str, str]:
    """The boot files the host has, for the row `check`; unknown where they could not be read."""
    if facts.boot_files is None:
        audit.unknown(check, expected, facts.boot_files_problem)
    return facts.boot_files
