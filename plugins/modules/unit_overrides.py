#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
# Part of vllm-provision (role vllm_service). Runs on the target: standard library only.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: unit_overrides
short_description: Remove what overrides a systemd unit we own - its drop-ins that change our settings, its mask
description:
  - Finds every drop-in systemd applies to O(unit) (each C(*.conf) of C(UNIT.d/), of its dash-prefix
    directories such as C(vllm-.service.d/) and of C(service.d/), in every directory of the system
    manager's search path), as systemd will read them at the next daemon-reload, and what each one sets.
  - A drop-in changes a managed setting when it sets a key that O(content) (the unit as we write it) sets,
    in any section, one of its C(Environment=) variables (also through C(UnsetEnvironment=)) or
    C(ExecStart); an empty assignment (C(Environment=), C(ExecStart=)) resets a list and changes it too.
  - Such a drop-in in the unit's own directories (C(/etc/systemd/system/UNIT.d/),
    C(/run/systemd/system/UNIT.d/), and C(system.control/UNIT.d/) of C(systemctl set-property)) is removed
    (then its directory, when empty). One anywhere else (shared, prefix or vendor directories) also applies
    to other units, or belongs to a package, so it is never touched - the task fails, naming each such file and setting,
    before anything is removed.
  - Drop-ins that change only settings the unit does not set are left alone (and returned).
  - A mask (C(/etc/systemd/system/UNIT) or C(/run/systemd/system/UNIT) linked to C(/dev/null), the first file
    of that name in the search path) is removed. A runtime mask under the unit file in C(/etc) masks nothing and is left.
  - The caller runs C(systemctl daemon-reload) and restarts the unit when the task changed something.
version_added: "0.1.0"
author: vllm-provision contributors (@vllm-provision)
options:
  unit:
    description: The unit's name, e.g. C(vllm-chat.service).
    type: str
    required: true
  content:
    description: The unit file as it is written (rendered); its settings are the managed ones.
    type: str
    required: true
  root:
    description: The root of the tree the unit search path is under (an image's or a container's); C(/) is the host's own.
    type: path
    default: /
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Finds and judges everything, removes nothing; returns what it would remove.
  diff_mode:
    support: full
    details: Before - each file it removes with its content; after - none of them.
  platform:
    support: full
    platforms: posix
notes:
  - Needs root (C(become)) to remove files under C(/etc) and C(/run).
"""

EXAMPLES = r"""
- name: Remove the drop-ins that change what vllm-chat.service sets
  vllm_provision.gpu_host.unit_overrides:
    unit: vllm-chat.service
    content: "{{ lookup('ansible.builtin.template', 'vllm-instance.service.j2') }}"
  register: overrides
  notify: [daemon-reload, restart vllm-chat]

- name: Only check (stops on a shared drop-in that changes a managed setting; removes nothing)
  vllm_provision.gpu_host.unit_overrides:
    unit: vllm-chat.service
    content: "{{ lookup('ansible.builtin.template', 'vllm-instance.service.j2') }}"
  check_mode: true
"""

RETURN = r"""
dropins:
  description: Every drop-in systemd applies to the unit, in order, with what it sets and whether it changes a managed setting.
  returned: always
  type: list
  elements: dict
  sample:
    - path: /etc/systemd/system/vllm-chat.service.d/override.conf
      own: true
      changes: [{setting: Environment CUDA_VISIBLE_DEVICES, verb: sets, managed: true}]
      changes_managed: true
removed:
  description: The files, links and empty directories removed (in check mode, that would be), in order.
  returned: always
  type: list
  elements: str
  sample: [/etc/systemd/system/vllm-chat.service.d/override.conf, /etc/systemd/system/vllm-chat.service.d]
refused:
  description: The drop-ins outside the unit's own directories that change a managed setting (the task then fails).
  returned: failure
  type: list
  elements: dict
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vllm_provision.gpu_host.plugins.module_utils.systemd_dropins import (
    changes_managed,
    describe,
    dropin_changes,
    find_dropins,
    find_masks,
    is_own_dropin,
    managed_settings,
    shared_reach,
    under,
)


def read(path):
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read()


def survey(unit, content, root):
    """Every drop-in of the unit, judged; the mask links; what to remove and what to refuse."""
    managed = managed_settings(content)
    dropins = []
    for path in find_dropins(unit, root):
        changes = dropin_changes(read(under(root, path)), managed)
        dropins.append(dict(path=path, own=is_own_dropin(unit, path), changes=changes,
                            changes_managed=bool(changes_managed(changes))))
    masks = find_masks(unit, root)
    remove = [dropin["path"] for dropin in dropins if dropin["own"] and dropin["changes_managed"]]
    refused = [dropin for dropin in dropins if not dropin["own"] and dropin["changes_managed"]]
    return dropins, masks, remove, refused


def refusal(unit, refused):
    lines = [
        "%s %s, which vllm-provision sets in %s; it applies to %s, so it is not removed here: take those"
        " settings out of it (or remove the file), run systemctl daemon-reload and restart the units it applies to,"
        " put what %s needs in the spec, then apply again" % (
            dropin["path"], describe(changes_managed(dropin["changes"])), unit, shared_reach(unit, dropin["path"]), unit)
        for dropin in refused
    ]
    return "A drop-in outside %s.d changes what vllm-provision manages: %s" % (unit, "; ".join(lines))


def emptied_dirs(paths, root):
    """The drop-in directories that removing `paths` leaves empty."""
    found = []
    for directory in sorted({os.path.dirname(path) for path in paths}):
        left = [name for name in os.listdir(under(root, directory)) if os.path.join(directory, name) not in paths]
        if not left:
            found.append(directory)
    return found


def main():
    module = AnsibleModule(
        argument_spec=dict(unit=dict(type="str", required=True), content=dict(type="str", required=True),
                           root=dict(type="path", default="/")),
        supports_check_mode=True,
    )
    unit, root = module.params["unit"], module.params["root"]
    dropins, masks, remove, refused = survey(unit, module.params["content"], root)
    result = dict(changed=False, dropins=dropins, removed=[])
    if refused:
        module.fail_json(msg=refusal(unit, refused), refused=refused, **result)

    files = remove + masks
    directories = emptied_dirs(remove, root)
    removed = files + directories
    result.update(changed=bool(removed), removed=removed)
    if module._diff and removed:
        result["diff"] = dict(
            before="".join("# %s\n%s\n" % (path, "-> /dev/null" if path in masks else read(under(root, path))) for path in files),
            after="", before_header="%s: drop-ins and mask" % unit, after_header="%s: removed" % unit)
    if removed:
        result["msg"] = ("would remove: " if module.check_mode else "removed: ") + ", ".join(removed)
    if module.check_mode or not removed:
        module.exit_json(**result)
    try:
        for path in files:
            os.unlink(under(root, path))
        for directory in directories:
            os.rmdir(under(root, directory))
    except OSError as error:
        module.fail_json(msg="Removing %s failed: %s" % (error.filename, error.strerror), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
