#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
# Part of vllm-provision (role nouveau). Runs on the target: standard library only.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nouveau_boot
short_description: Stop where a file that is not ours turns nouveau back on at the next boot
description:
  - Reads what decides nouveau at the next boot as modprobe, GRUB and systemd-modules-load do
    (plugins/module_utils/boot_config.py, shared with the audit) - every modprobe.d file (C(options nouveau
    modeset=), the first C(install nouveau) line), the kernel command line grub-mkconfig builds from
    C(/etc/default/grub) and C(/etc/default/grub.d/*.cfg), every modules-load.d file - with the role's own files
    as the role writes them (O(own)).
  - Fails, naming each file and the line to remove, where a file that is not one of O(own) decides against
    the blacklist; changes nothing itself.
version_added: "0.1.0"
author: vllm-provision contributors (@vllm-provision)
options:
  flags:
    description: The role's kernel command line flags (C(nouveau_kernel_cmdline_flags)).
    type: list
    elements: str
    required: true
  own:
    description: The role's files, path to the content it writes there.
    type: dict
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
    details: The same reads and the same refusal as a real run; it never writes.
  diff_mode:
    support: none
  platform:
    support: full
    platforms: posix
"""

EXAMPLES = r"""
- name: Check no other file turns nouveau back on at boot
  vllm_provision.gpu_host.nouveau_boot:
    flags: [nouveau.modeset=0]
    own: {/etc/modprobe.d/blacklist-nouveau.conf: "blacklist nouveau\n"}
"""

RETURN = r"""
rows:
  description: The state at the next boot, one row per check (check, expected, actual, passed, path, line).
  returned: always
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vllm_provision.gpu_host.plugins.module_utils.boot_config import (
    nouveau_findings,
    nouveau_plan,
    read_tree,
)


def main():
    module = AnsibleModule(argument_spec=dict(flags=dict(type="list", elements="str", required=True),
                                              own=dict(type="dict", required=True),
                                              root=dict(type="path", default="/")),
                           supports_check_mode=True)
    files = {**read_tree(module.params["root"]), **module.params["own"]}
    plan = nouveau_plan(files, module.params["flags"], set(module.params["own"]))
    rows = nouveau_findings(files, module.params["flags"])
    if plan["foreign"]:
        module.fail_json(msg=plan["message"], rows=rows)
    module.exit_json(changed=False, rows=rows)


if __name__ == "__main__":
    main()
