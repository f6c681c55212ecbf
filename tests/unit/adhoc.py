"""A module of the collection as Ansible runs it on the controller: `ansible localhost -m NAME -a ARGS`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from provisioner.base.paths import COLLECTION, collections_dir


def run_module(work: Path, name: str, args: dict, *options: str) -> tuple[dict, subprocess.CompletedProcess]:
    """Run module `name` of the collection on localhost with `args` (`work` holds the collection link and
    Ansible's files): its result as Ansible wrote it (-t), and the run (its exit code and output)."""
    tree = work / "tree"
    (tree / "localhost").unlink(missing_ok=True)
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(collections_dir(work / "collections")),
           "ANSIBLE_REMOTE_TMP": str(work / "ansible-tmp"), "ANSIBLE_LOCALHOST_WARNING": "false",
           "ANSIBLE_NOCOLOR": "1"}
    done = subprocess.run(
        [str(Path(sys.executable).parent / "ansible"), "localhost", "-c", "local", "-e",
         f"ansible_python_interpreter={sys.executable}", "-t", str(tree), "-m", f"{COLLECTION}.{name}",
         "-a", json.dumps(args), *options],
        env=env, capture_output=True, text=True, timeout=120)
    return json.loads((tree / "localhost").read_text()), done
