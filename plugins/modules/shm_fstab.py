#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
# Part of vllm-provision (role shm). Runs on the target: standard library only.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: shm_fstab
short_description: Make /etc/fstab hold exactly one /dev/shm line, ours
description:
  - Writes O(line) as the only C(/etc/fstab) line for C(/dev/shm), where the first such line was (else at the
    end), and removes every other one. At boot C(systemd-remount-fs) remounts C(/dev/shm) with the options of
    the FIRST C(/dev/shm) line (mount(8) reads fstab front to back), so a second line before ours would decide
    the size after a reboot, and one after ours is a trap for the next edit.
  - Fails, changing nothing, when a C(dev-shm.mount) unit file or drop-in of C(/etc), C(/run), C(/usr/local/lib),
    C(/usr/lib) or C(/lib) sets the mount's C(Options=) (or C(/etc/systemd/system/dev-shm.mount) replaces the
    unit) - the message names each file; it is not the role's to change.
  - The rules are plugins/module_utils/boot_config.py's, which the audit shares.
version_added: "0.1.0"
author: vllm-provision contributors (@vllm-provision)
options:
  line:
    description: Our C(/etc/fstab) line for C(/dev/shm).
    type: str
    required: true
  root:
    description: The directory that stands for the host's C(/) (tests).
    type: path
    default: /
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Reports exactly what it would write (and the same refusal); writes nothing.
  diff_mode:
    support: full
    details: C(/etc/fstab) before and after.
  platform:
    support: full
    platforms: posix
"""

EXAMPLES = r"""
- name: Persist the size in /etc/fstab
  vllm_provision.gpu_host.shm_fstab:
    line: tmpfs /dev/shm tmpfs defaults,nosuid,nodev,size=16G 0 0
"""

RETURN = r"""
removed:
  description: The /dev/shm lines removed or replaced (line number and text), in check mode those it would.
  returned: always
  type: list
  elements: str
  sample: ["line 3: tmpfs /dev/shm tmpfs defaults,size=128M 0 0"]
overrides:
  description: Each dev-shm.mount unit file or drop-in that sets the mount's options, as [path, what it sets].
  returned: failed
  type: list
  elements: list
  sample: [["/etc/systemd/system/dev-shm.mount.d/size.conf", "Options=mode=1777,size=64M"]]
"""

import os
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vllm_provision.gpu_host.plugins.module_utils.boot_config import (
    FSTAB,
    fstab_plan,
    read_tree,
)


def shown(text):
    """Text read with its bytes kept (surrogateescape), as a diff shows it."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def write(path, text):
    """Replace the file at once with `text` (its bytes that are not UTF-8 as they were)."""
    handle, temporary = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".vllm-provision-")
    with os.fdopen(handle, "w", encoding="utf-8", errors="surrogateescape") as out:
        out.write(text)
    return temporary


def main():
    module = AnsibleModule(argument_spec=dict(line=dict(type="str", required=True),
                                              root=dict(type="path", default="/")),
                           supports_check_mode=True)
    line, root = module.params["line"], module.params["root"]
    files = read_tree(root, errors="surrogateescape")
    plan = fstab_plan(files, line)
    if plan["overrides"]:
        module.fail_json(msg=plan["message"], overrides=[list(found) for found in plan["overrides"]])
    if plan["fstab"] is None:
        module.exit_json(changed=False, removed=[])
    if not module.check_mode:
        target = os.path.join(root, FSTAB.lstrip("/"))
        module.atomic_move(write(target, plan["fstab"]), target)  # keeps fstab's mode, owner and SELinux context
    module.exit_json(changed=True, removed=[shown(found) for found in plan["removed"]],
                     diff={"before": shown(files.get(FSTAB, "")), "after": shown(plan["fstab"]),
                           "before_header": FSTAB, "after_header": FSTAB})


if __name__ == "__main__":
    main()
