#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
# Part of vllm-provision (roles gateway, prometheus, node_exporter, container_engine, vllm_install). Runs on the
# target: standard library only (apt-get, not python3-apt, which minimal servers lack).

from __future__ import annotations

DOCUMENTATION = r"""
---
module: apt_packages
short_description: Install Debian packages with apt-get, waiting a bounded time for apt's locks
description:
  - Reads which of O(packages) the host lacks (C(dpkg-query); a C(NAME=VERSION) lacks unless installed at exactly
    that version); where none, does nothing - no C(apt-get update), no transaction.
  - Otherwise updates apt's lists (C(apt-get update), with O(update_cache)) and installs the packages it lacks
    (C(apt-get install --yes), C(--no-install-recommends) unless O(install_recommends)), with
    C(DEBIAN_FRONTEND=noninteractive).
  - Another process holding apt's locks (unattended-upgrades, apt-daily, an operator's apt) is waited for, at most
    O(lock_timeout) seconds for the whole task - C(apt-get install) waits for the dpkg locks itself
    (C(-o DPkg::Lock::Timeout), given the time left); C(apt-get update), which never waits for the lists' lock, and
    a download apt refuses for the archives' lock are tried again every 2 s. Past the bound the task fails with one
    sentence - the package manager is busy, apt's line naming the process that holds the lock, how long it waited.
version_added: "0.1.0"
author: vllm-provision contributors (@vllm-provision)
options:
  packages:
    description: The packages, each C(NAME) or C(NAME=VERSION) (Debian's version, epoch included).
    type: list
    elements: str
    required: true
  update_cache:
    description: Run C(apt-get update) before installing (only when a package is lacking).
    type: bool
    default: true
  install_recommends:
    description: Install the packages' recommends too.
    type: bool
    default: false
  allow_downgrades:
    description: Let C(NAME=VERSION) go to a version older than the installed one (C(--allow-downgrades)).
    type: bool
    default: false
  allow_change_held_packages:
    description: Let the transaction change a package held with C(apt-mark hold) (C(--allow-change-held-packages)).
    type: bool
    default: false
  lock_timeout:
    description: How many seconds the task waits for apt's locks, its commands together, before it fails.
    type: int
    default: 300
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Reads which packages the host lacks and says it would install them; runs no apt command.
  diff_mode:
    support: none
  platform:
    support: full
    platforms: debian
notes:
  - Needs root (C(become)).
  - The bound covers the locks, not the transaction - a download or an install that takes long is not cut short.
"""

EXAMPLES = r"""
- name: Install haproxy where it is missing, waiting up to 5 minutes for apt's locks
  vllm_provision.gpu_host.apt_packages:
    packages: [haproxy]
  become: true

- name: NVIDIA's container toolkit at one version, over a hold
  vllm_provision.gpu_host.apt_packages:
    packages: [nvidia-container-toolkit-base=1.17.8-1]
    allow_downgrades: true
    allow_change_held_packages: true
    lock_timeout: 600
  become: true
"""

RETURN = r"""
installed:
  description: The packages installed (in check mode, that would be), as given in O(packages).
  returned: always
  type: list
  elements: str
  sample: [haproxy]
found:
  description: What the host had of O(packages) before the task - C({name - version}), null where not installed.
  returned: always
  type: dict
  sample: {haproxy: null}
waited:
  description: Seconds the task waited for apt's locks.
  returned: always
  type: int
held_by:
  description: apt's (or dpkg's) last line naming the process that held a lock the task waited for; null where none.
  returned: always
  type: str
  sample: Could not get lock /var/lib/apt/lists/lock. It is held by process 1234 (unattended-upgr)
commands:
  description: The apt commands run, as the last try ran them (none in check mode, nor where nothing lacked).
  returned: always
  type: list
  elements: list
msg:
  description: What was done, in one line.
  returned: always
  type: str
"""

import re

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vllm_provision.gpu_host.plugins.module_utils.apt_lock import (
    ENVIRONMENT,
    LOCK_TIMEOUT_S,
    Busy,
    LockWait,
    waited_note,
)

# Debian's package names (an architecture allowed), versions: never an option apt-get would read
PACKAGE = re.compile(r"^(?P<name>[a-z0-9][a-z0-9+.-]*)(?::[a-z0-9-]+)?(?:=(?P<version>[A-Za-z0-9.+~:-]+))?$")
TAIL_LINES = 12


def parse_packages(packages):
    """[(entry, name, version or None)] of O(packages) (name: without an architecture); ValueError naming the
    entries that are not packages."""
    parsed, wrong = [], []
    for entry in packages:
        match = PACKAGE.match(entry)
        if match:
            parsed.append((entry, match.group("name"), match.group("version")))
        else:
            wrong.append(entry)
    if wrong:
        raise ValueError("not a package (NAME or NAME=VERSION, Debian's names and versions): %s"
                         % ", ".join(repr(entry) for entry in wrong))
    return parsed


def parse_dpkg_query(text):
    """{name: version} of the installed packages in `dpkg-query --show` output of the format FORMAT (a package
    removed with its configuration left, or never installed, is absent)."""
    found = {}
    for line in text.splitlines():
        fields = line.split("\t")
        if len(fields) == 3 and fields[2][1:2] == "i":  # the status's second letter: i, installed
            found[fields[0]] = fields[1]
    return found


FORMAT = "${Package}\t${Version}\t${db:Status-Abbrev}\n"


def lacking(parsed, installed):
    """The entries the host lacks: not installed, or (NAME=VERSION) at another version."""
    return [entry for entry, name, version in parsed
            if installed.get(name) is None or (version is not None and installed[name] != version)]


def install_argv(params, entries):
    argv = ["apt-get", "install", "--yes"]
    argv += [] if params["install_recommends"] else ["--no-install-recommends"]
    argv += ["--allow-downgrades"] if params["allow_downgrades"] else []
    argv += ["--allow-change-held-packages"] if params["allow_change_held_packages"] else []
    return argv + list(entries)


def tail(text, lines=TAIL_LINES):
    return " | ".join(line for line in (text or "").strip().splitlines()[-lines:] if line.strip())


def main():
    module = AnsibleModule(
        argument_spec=dict(
            packages=dict(type="list", elements="str", required=True),
            update_cache=dict(type="bool", default=True),
            install_recommends=dict(type="bool", default=False),
            allow_downgrades=dict(type="bool", default=False),
            allow_change_held_packages=dict(type="bool", default=False),
            lock_timeout=dict(type="int", default=LOCK_TIMEOUT_S),
        ),
        supports_check_mode=True,
    )
    params = module.params
    commands = []
    result = dict(changed=False, installed=[], found={}, waited=0, held_by=None, commands=commands)
    try:
        parsed = parse_packages(params["packages"])
    except ValueError as error:
        module.fail_json(msg=str(error), **result)
    if params["lock_timeout"] < 0:
        module.fail_json(msg="lock_timeout must be 0 or more seconds, got %d" % params["lock_timeout"], **result)
    names = sorted({name for dummy, name, dummy in parsed})
    rc, out, err = module.run_command(["dpkg-query", "--show", "--showformat=" + FORMAT] + names,
                                      environ_update=ENVIRONMENT)
    if rc not in (0, 1):  # 1: a package dpkg knows nothing of
        module.fail_json(msg="`dpkg-query --show` exited %d: %s" % (rc, tail(err or out)), **result)
    installed = parse_dpkg_query(out)
    result["found"] = found = {name: installed.get(name) for name in names}
    missing = lacking(parsed, found)
    if not missing:
        module.exit_json(msg="installed already: %s" % ", ".join(params["packages"]), **result)
    result.update(changed=True, installed=missing)
    said = ", ".join("%s (now %s)" % (entry, found[name]) if found[name] else entry
                     for entry, name, dummy in parsed if entry in missing)
    if module.check_mode:
        module.exit_json(msg="would install %s" % said, **result)

    tried = []  # the current command's last try

    def run(argv):
        tried[:] = [argv]
        return module.run_command(argv, environ_update=ENVIRONMENT)

    locks = LockWait(run, timeout=params["lock_timeout"])
    steps = ([(["apt-get", "update", "-q"], False)] if params["update_cache"] else []) \
        + [(install_argv(params, missing), True)]
    for argv, apt_waits in steps:
        try:
            rc, out, err = locks.run(argv, apt_waits=apt_waits)
        except Busy as busy:
            commands.extend(tried)
            result.update(changed=False, installed=[], waited=round(locks.waited), held_by=locks.held_by)
            module.fail_json(msg=str(busy), **result)
        if rc != 0:
            commands.extend(tried)
            result.update(changed=argv[1] == "install", installed=[], waited=round(locks.waited),
                          held_by=locks.held_by)
            module.fail_json(msg="`%s` exited %d: %s" % (" ".join(argv), rc, tail(err or out)), stdout=out,
                             stderr=err, **result)
        commands.extend(tried)
    result.update(waited=round(locks.waited), held_by=locks.held_by)
    module.exit_json(msg="installed %s%s" % (said, waited_note(locks)), **result)


if __name__ == "__main__":
    main()
