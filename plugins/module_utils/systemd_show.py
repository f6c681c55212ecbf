# SPDX-License-Identifier: Apache-2.0
# Part of vllm-provision: `systemctl show` output, read by the module vllm_units on the target and by the audit
# (provisioner/audit/text.py). Standard library only.

from __future__ import annotations

import re


def show_blocks(text):
    """`systemctl show` output of one or more units (blank lines between units) -> one dict per unit, in order."""
    blocks = []
    for chunk in re.split(r"\n\s*\n", text.strip()):
        if chunk.strip():
            blocks.append(dict(line.split("=", 1) for line in chunk.splitlines() if "=" in line))
    return blocks


def shown_argv(exec_start):
    """The first command of `systemctl show`'s ExecStart= ({ path=... ; argv[]=... ; ... }), split into words."""
    match = re.search(r"argv\[\]=(.*?) ; ignore_errors=", exec_start)
    return match.group(1).split() if match else []
