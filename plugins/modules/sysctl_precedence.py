#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
# Part of vllm-provision (role sysctl). Runs on the target: standard library only.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sysctl_precedence
short_description: Neutralise the sysctl.d files that would override our kernel parameters at boot
description:
  - Reads every sysctl.d file as systemd-sysctl does at boot (C(/etc/sysctl.d), C(/run/sysctl.d),
    C(/usr/local/lib/sysctl.d), C(/usr/lib/sysctl.d), C(/lib/sysctl.d); a same-named file in an earlier
    directory hides the later ones; all files in file name order; the last assignment of a key wins) and
    finds each assignment read after O(file) that sets one of O(settings) to another value (or unsets it
    with a C(-KEY) line).
  - Neutralises each such line by commenting it out, with a marker naming O(file) and the key; every other
    line of the file is kept. A file under C(/etc) is edited in place (through a link such as Debian's
    C(99-sysctl.conf -> ../sysctl.conf), the target is edited and the link kept). A vendor file (C(/run),
    C(/usr/local/lib), C(/usr/lib), C(/lib)) is never edited - a same-named copy in C(/etc/sysctl.d), with the
    lines commented out, overrides it the way sysctl.d(5) describes.
  - With O(neutralise=false) it fails instead, naming each file and line and the fix.
  - A glob key (C(vm.*)) is never a conflict - systemd-sysctl does not let a glob override a key that has an
    explicit assignment.
version_added: "0.1.0"
author: vllm-provision contributors (@vllm-provision)
options:
  file:
    description: Our sysctl.d file (the role's C(sysctl_file)); the files read after it are the ones checked.
    type: path
    required: true
  settings:
    description: Our kernel parameters, key to value (the role's C(sysctl_settings)).
    type: dict
    required: true
  neutralise:
    description: Neutralise the overriding lines; false fails with the files, lines and the fix instead.
    type: bool
    default: true
  root:
    description: The directory that stands for the host's C(/) (tests); every path is read and written under it.
    type: path
    default: /
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Reports exactly what it would neutralise; writes nothing.
  diff_mode:
    support: full
    details: Each file written, before and after.
  platform:
    support: full
    platforms: posix
notes:
  - Writing needs root (C(become)).
"""

EXAMPLES = r"""
- name: Neutralise the files that override ours at boot
  vllm_provision.gpu_host.sysctl_precedence:
    file: /etc/sysctl.d/60-vllm-provision.conf
    settings: {vm.swappiness: 1, vm.max_map_count: 1048576}
  become: true
  register: precedence

- name: Only report them (the task fails, naming each file and line)
  vllm_provision.gpu_host.sysctl_precedence:
    file: /etc/sysctl.d/60-vllm-provision.conf
    settings: {vm.swappiness: 1}
    neutralise: false
"""

RETURN = r"""
neutralised:
  description: >-
    Each assignment neutralised (in check mode, that would be; with neutralise=false, that overrides ours) -
    the file systemd-sysctl reads (path), its line number and text, our key, the file written and how.
  returned: always
  type: list
  elements: dict
  sample:
    - {path: /etc/sysctl.d/99-zz-override.conf, number: 1, line: vm.swappiness = 60, key: vm.swappiness,
       written: /etc/sysctl.d/99-zz-override.conf, how: edited in place}
written:
  description: The files written (in check mode, that would be).
  returned: always
  type: list
  elements: str
  sample: [/etc/sysctl.d/99-zz-override.conf]
msg:
  description: One line per neutralised assignment, or that none overrides ours.
  returned: always
  type: str
"""

import os
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vllm_provision.gpu_host.plugins.module_utils.sysctl_files import (
    conf_files,
    conflicts,
    describe,
    neutralisations,
    read_tree,
)


def under(root, path):
    return os.path.join(root, path.lstrip("/"))


def write_file(root, path, text):
    """Replace `path` (under `root`) atomically, keeping an existing file's mode and owner (0644 root:
    root for a new one); a link at `path` is replaced by the file."""
    target = under(root, path)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    existing = os.lstat(target) if os.path.lexists(target) and not os.path.islink(target) else None
    handle, temporary = tempfile.mkstemp(dir=os.path.dirname(target), prefix=".vllm-provision-", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8", errors="surrogateescape", newline="") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, (existing.st_mode & 0o7777) if existing else 0o644)
        if os.geteuid() == 0:
            os.chown(temporary, existing.st_uid if existing else 0, existing.st_gid if existing else 0)
        os.replace(temporary, target)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def main():
    module = AnsibleModule(
        argument_spec=dict(
            file=dict(type="path", required=True),
            settings=dict(type="dict", required=True),
            neutralise=dict(type="bool", default=True),
            root=dict(type="path", default="/"),
        ),
        supports_check_mode=True,
    )
    managed, root = module.params["file"], module.params["root"]
    try:
        files = conf_files(read_tree(root))
    except OSError as error:
        module.fail_json(msg="Could not read the sysctl.d directories: %s" % error)
    found = conflicts(files, managed, module.params["settings"])
    plans = neutralisations(found, managed)
    neutralised = [
        dict(path=plan["source"], number=line["number"], line=line["line"], key=line["key"], written=plan["write"],
             how=plan["how"])
        for plan in plans for line in plan["lines"]
    ]
    lines = [line for plan in plans for line in describe(plan)]
    result = dict(changed=bool(plans), neutralised=neutralised, written=[plan["write"] for plan in plans])
    if not plans:
        module.exit_json(msg="no sysctl.d file overrides %s at boot" % managed, **result)
    if not module.params["neutralise"]:
        result["changed"] = False
        module.fail_json(
            msg="These lines override %s at boot (systemd-sysctl reads them after it): %s. Fix: comment them out or "
                "remove them (for a file under /usr/lib, /usr/local/lib or /run: copy it to /etc/sysctl.d under the "
                "same name and comment them out there), or set sysctl_neutralise_overrides: true."
                % (managed, "; ".join("%s:%d '%s'" % (item["path"], item["number"], item["line"].strip())
                                      for item in neutralised)),
            **result)
    if module._diff:
        result["diff"] = [dict(before=plan["before"] or "", after=plan["after"],
                               before_header=plan["write"] if plan["before"] is not None else "%s (absent)" % plan["write"],
                               after_header=plan["write"]) for plan in plans]
    if not module.check_mode:
        for plan in plans:
            try:
                write_file(root, plan["write"], plan["after"])
            except OSError as error:
                module.fail_json(msg="Could not write %s: %s" % (plan["write"], error), **result)
    verb = "would neutralise" if module.check_mode else "neutralised"
    module.exit_json(msg="%s: %s" % (verb, "; ".join(lines)), **result)


if __name__ == "__main__":
    main()
