#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
# Part of vllm-provision (role vllm_service). Runs on the target: standard library only.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_units
short_description: Read a host's vLLM instances in one call - the files role vllm_service wrote, each unit's state, what it runs
description:
  - Finds the files role vllm_service wrote (units C(/etc/systemd/system/vllm-NAME.service), quadlets
    C(QUADLET_DIR/vllm-NAME.container) and compose files C(CONFIG_DIR/NAME.compose.yaml) that carry its
    header; a masked unit, a link, is not one), each instance's env and config file, and the previous files
    kept for a rollback (C(CONFIG_DIR/previous/)).
  - Reads every listed instance's unit and every unit it wrote with one C(systemctl show) - C(ActiveState),
    C(SubState), C(LoadState), C(ExecStart) - and for each the C(vllm) its command runs, that venv's vLLM
    version (from its package metadata, without importing vLLM) and the C(--config) file it serves.
  - With O(wait), reads again every O(poll) seconds until each unit of O(units) has settled, up to O(timeout)
    seconds - a unit C(activating) (C(RestartSec=), then the readiness probe), C(deactivating), C(reloading) or
    C(refreshing) is waited for, unless its start already failed (sub-state C(auto-restart)) and it is not a
    node of a multi-node instance (O(nnodes) above 1, C(Restart=always)), which restarts whenever a
    peer did and is back once the group met again.
  - Changes nothing.
version_added: "0.1.0"
author: vllm-provision contributors (@vllm-provision)
options:
  instances:
    description: The names of the instances listed for the host (the role's C(vllm_service_instances)); the files of
      others are RV(stale).
    type: list
    elements: str
    default: []
  units:
    description: Of O(instances), those that run as a unit C(vllm-NAME.service) (a venv or Podman instance; a compose
      project, Docker, has none), in order - the units read, and waited for.
    type: list
    elements: str
    default: []
  nnodes:
    description: The nodes of the group of each multi-node instance (its option C(nnodes), above 1); others need no entry.
    type: dict
    default: {}
  config_dir:
    description: The role's C(vllm_service_config_dir).
    type: path
    default: /etc/vllm
  quadlet_dir:
    description: The role's C(vllm_service_quadlet_dir).
    type: path
    default: /etc/containers/systemd
  wait:
    description: Wait until each unit of O(units) has settled (above), up to O(timeout).
    type: bool
    default: false
  timeout:
    description: Seconds O(wait) waits at most; a unit unsettled then is returned as it is.
    type: int
    default: 1820
  poll:
    description: Seconds between two reads while waiting.
    type: float
    default: 5
  root:
    description: The root of the tree the files are under (an image's, a test's); C(/) is the host's own. C(systemctl) is the host's.
    type: path
    default: /
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Reads only; runs the same in check mode.
  diff_mode:
    support: none
  platform:
    support: full
    platforms: posix
notes:
  - Reads C(/etc/vllm/previous/), which is root's (0700).
"""

EXAMPLES = r"""
- name: Find what the role wrote and the units' states
  vllm_provision.gpu_host.vllm_units:
    instances: [chat, big, web]
    units: [chat, big]                   # web: a compose project
    nnodes: {big: 2}
  register: vllm_host

- name: Read the state of the units, once each has settled
  vllm_provision.gpu_host.vllm_units:
    units: [chat]
    wait: true
    timeout: 1820
  register: vllm_units
"""

RETURN = r"""
written:
  description: The units, quadlets and compose files that carry the role's header, sorted.
  returned: always
  type: list
  elements: str
  sample: [/etc/systemd/system/vllm-chat.service]
names:
  description: The instances whose unit, quadlet or compose file the role wrote, sorted.
  returned: always
  type: list
  elements: str
  sample: [chat]
files:
  description: Each file of the instances in O(instances) and RV(names) that is there - the written ones above (C(kind)
    unit, quadlet, compose file; a compose project's boot unit is a unit too), and C(CONFIG_DIR/NAME.env) (env file),
    C(CONFIG_DIR/NAME.yaml) (config file) - with its instance, sorted by path.
  returned: always
  type: list
  elements: dict
  sample: [{name: chat, path: /etc/vllm/chat.env, kind: env file}]
stale:
  description: Of RV(names), those not in O(instances) (their files go); RV(stale_compose) those of them with a compose file.
  returned: always
  type: list
  elements: str
stale_compose:
  description: Of RV(stale), the compose projects (taken down before their file goes).
  returned: always
  type: list
  elements: str
enabled:
  description: The instances whose unit is enabled at boot (a link in C(multi-user.target.wants/); a masked unit whose link stayed is too).
  returned: always
  type: list
  elements: str
active:
  description: The instances of O(units) whose unit is active (C(ActiveState=active)).
  returned: always
  type: list
  elements: str
outdated:
  description: The instances of O(units) whose unit runs (active or activating) a process started before its env file,
    config file, unit or quadlet last changed (by more than a second) - a run wrote them and stopped before it restarted
    the unit (interrupted, killed, the host lost). The role restarts them.
  returned: always
  type: list
  elements: str
not_ready:
  description: The instances of O(units) whose unit is not active, in order.
  returned: always
  type: list
  elements: str
previous:
  description: The instances' files as they last got ready, kept in C(CONFIG_DIR/previous/) for a rollback, sorted -
    each with its instance (C(name)), the file it is the previous version of (C(dest)) and what it is (C(kind) - env
    file, config file, unit, quadlet, compose file).
  returned: always
  type: list
  elements: dict
  sample: [{name: chat, path: /etc/vllm/previous/chat.yaml, dest: /etc/vllm/chat.yaml, kind: config file}]
units:
  description: Per instance of O(units), and per unit of RV(stale), what systemd says and what it runs.
  returned: always
  type: dict
  sample:
    chat:
      unit: vllm-chat.service
      state: active/running
      active_state: active
      sub_state: running
      load_state: loaded
      enabled: true
      argv: [/opt/vllm/venvs/0.25.0/bin/vllm, serve, --config, /etc/vllm/chat.yaml]
      bin: /opt/vllm/venvs/0.25.0/bin/vllm
      version: 0.25.0
      config: /etc/vllm/chat.yaml
settled:
  description: Whether every unit of O(units) had settled (without O(wait), at the one read).
  returned: always
  type: bool
waited:
  description: Seconds spent waiting.
  returned: always
  type: float
"""

import glob
import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vllm_provision.gpu_host.plugins.module_utils.systemd_show import show_blocks, shown_argv

HEADER = "# Managed by vllm-provision (role vllm_service)"
UNSETTLED = ("activating", "deactivating", "reloading", "refreshing")
PROPERTIES = "Id,LoadState,ActiveState,SubState,ExecStart,ExecMainStartTimestampMonotonic"
# a file written this long after its process started is newer than it (ssh and systemd take longer between the two)
OUTDATED_AFTER_S = 1.0


def under(root, path):
    return os.path.join(root, path.lstrip("/"))


def ours(path):
    """A regular file (not a link: a mask) whose lines carry the role's header."""
    if os.path.islink(path) or not os.path.isfile(path):
        return False
    with open(path, encoding="utf-8", errors="replace") as handle:
        return any(line.startswith(HEADER) for line in handle)


def written_files(root, config_dir, quadlet_dir):
    """{path as on the host: instance name} of the units, quadlets and compose files the role wrote."""
    patterns = {"/etc/systemd/system/vllm-*.service": ("vllm-", ".service"),
                quadlet_dir + "/vllm-*.container": ("vllm-", ".container"),
                config_dir + "/*.compose.yaml": ("", ".compose.yaml")}
    found = {}
    for pattern, (prefix, suffix) in patterns.items():
        for path in glob.glob(under(root, pattern)):
            if ours(path):
                shown = "/" + os.path.relpath(path, root) if root != "/" else path
                found[shown] = os.path.basename(path)[len(prefix):-len(suffix)]
    return found


def instance_files(root, config_dir, written, names):
    """[{name, path, kind}] of the written files and each instance's env and config file that is there."""
    kinds = {".service": "unit", ".container": "quadlet", ".compose.yaml": "compose file"}
    found = [{"name": name, "path": path, "kind": next(kind for suffix, kind in kinds.items() if path.endswith(suffix))}
             for path, name in written.items()]
    for name in names:
        for suffix, kind in ((".env", "env file"), (".yaml", "config file")):
            path = "%s/%s%s" % (config_dir, name, suffix)
            if os.path.isfile(under(root, path)):
                found.append({"name": name, "path": path, "kind": kind})
    return sorted(found, key=lambda entry: entry["path"])


def enabled_names(root):
    wants = under(root, "/etc/systemd/system/multi-user.target.wants")
    return sorted(os.path.basename(link)[len("vllm-"):-len(".service")]
                  for link in glob.glob(os.path.join(wants, "vllm-*.service")) if os.path.islink(link))


def kept_previous(root, config_dir, quadlet_dir):
    """[{name, path, dest, kind}] of the files in <config_dir>/previous/, named as the originals."""
    kinds = (("vllm-", ".service", "/etc/systemd/system", "unit"), ("vllm-", ".container", quadlet_dir, "quadlet"),
             ("", ".compose.yaml", config_dir, "compose file"), ("", ".env", config_dir, "env file"),
             ("", ".yaml", config_dir, "config file"))
    kept = []
    for path in sorted(glob.glob(os.path.join(under(root, config_dir + "/previous"), "*"))):
        base = os.path.basename(path)
        for prefix, suffix, folder, kind in kinds:
            if base.startswith(prefix) and base.endswith(suffix) and os.path.isfile(path):
                kept.append({"name": base[len(prefix):-len(suffix)], "path": config_dir + "/previous/" + base,
                             "dest": folder + "/" + base, "kind": kind})
                break
    return kept


def venv_version(root, binary):
    """The vLLM version in the venv of `binary` (<venv>/bin/vllm), from its package metadata; None elsewhere."""
    venv = os.path.dirname(os.path.dirname(binary))
    for metadata in sorted(glob.glob(under(root, venv + "/lib/python3*/site-packages/vllm-*.dist-info/METADATA"))):
        with open(metadata, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip()
    return None


def config_of(argv):
    for index, word in enumerate(argv):
        if word == "--config" and index + 1 < len(argv):
            return argv[index + 1]
        if word.startswith("--config="):
            return word.split("=", 1)[1]
    return None


def read_units(module, names):
    """{name: systemd's properties} for the units vllm-<name>.service, in one `systemctl show`."""
    if not names:
        return {}
    units = ["vllm-%s.service" % name for name in names]
    rc, out, err = module.run_command(["systemctl", "show", "--property", PROPERTIES, "--"] + units)
    if rc != 0:
        module.fail_json(msg="systemctl show failed: %s" % (err.strip() or out.strip()), rc=rc)
    blocks = {block.get("Id", ""): block for block in show_blocks(out)}
    return {name: blocks.get(unit, {}) for name, unit in zip(names, units)}


def describe(root, name, shown, enabled):
    argv = shown_argv(shown.get("ExecStart", ""))
    binary = argv[0] if argv and os.path.basename(argv[0]) == "vllm" else None
    active, sub = shown.get("ActiveState", "unknown"), shown.get("SubState", "unknown")
    return {"unit": "vllm-%s.service" % name, "state": "%s/%s" % (active, sub), "active_state": active,
            "sub_state": sub, "load_state": shown.get("LoadState", "unknown"), "enabled": name in enabled,
            "argv": argv, "bin": binary, "version": venv_version(root, binary) if binary else None,
            "config": config_of(argv)}


def newer_than_process(root, shown, paths):
    """Whether a file of `paths` last changed more than OUTDATED_AFTER_S after the unit's main process started.
    systemd gives that start on the monotonic clock (microseconds since boot); a file's change, on the wall clock."""
    started = int(shown.get("ExecMainStartTimestampMonotonic") or 0) / 1e6
    if not started or not paths:
        return False
    offset = time.time() - time.monotonic()  # wall clock minus monotonic clock, now
    changed = max(os.stat(under(root, path)).st_mtime for path in paths) - offset
    return changed > started + OUTDATED_AFTER_S


def settled(units, nnodes):
    """Every unit settled: none activating, ... but those whose start failed (auto-restart), unless a group's node."""
    for name, unit in units.items():
        if unit["active_state"] in UNSETTLED and not (unit["sub_state"] == "auto-restart" and nnodes.get(name, 1) < 2):
            return False
    return True


def main():
    module = AnsibleModule(
        argument_spec={
            "instances": {"type": "list", "elements": "str", "default": []},
            "units": {"type": "list", "elements": "str", "default": []},
            "nnodes": {"type": "dict", "default": {}},
            "config_dir": {"type": "path", "default": "/etc/vllm"},
            "quadlet_dir": {"type": "path", "default": "/etc/containers/systemd"},
            "wait": {"type": "bool", "default": False},
            "timeout": {"type": "int", "default": 1820},
            "poll": {"type": "float", "default": 5},
            "root": {"type": "path", "default": "/"},
        },
        supports_check_mode=True,
    )
    params = module.params
    root = params["root"]
    config_dir, quadlet_dir = params["config_dir"].rstrip("/"), params["quadlet_dir"].rstrip("/")
    listed, with_unit = params["instances"], params["units"]
    nnodes = {name: int(count) for name, count in params["nnodes"].items()}
    written = written_files(root, config_dir, quadlet_dir)
    names = sorted(set(written.values()))
    enabled = enabled_names(root)

    started, deadline = time.monotonic(), time.monotonic() + params["timeout"]
    while True:
        shown = read_units(module, with_unit)
        units = {name: describe(root, name, shown[name], enabled) for name in with_unit}
        ours_settled = settled(units, nnodes)
        if ours_settled or not params["wait"] or time.monotonic() >= deadline:
            break
        time.sleep(min(params["poll"], max(deadline - time.monotonic(), 0)))

    stale = [name for name in names if name not in listed]
    files = instance_files(root, config_dir, written, sorted(set(names) | set(listed)))
    started_from = {name: [entry["path"] for entry in files if entry["name"] == name and entry["kind"] != "compose file"]
                    for name in with_unit}
    outdated = [name for name in with_unit if units[name]["active_state"] in ("active", "activating")
                and newer_than_process(root, shown[name], started_from[name])]
    module.exit_json(
        changed=False,
        written=sorted(written),
        names=names,
        files=files,
        outdated=outdated,
        stale=stale,
        stale_compose=sorted({name for path, name in written.items() if path.endswith(".compose.yaml") and name in stale}),
        enabled=enabled,
        active=[name for name in with_unit if units[name]["active_state"] == "active"],
        not_ready=[name for name in with_unit if units[name]["active_state"] != "active"],
        previous=kept_previous(root, config_dir, quadlet_dir),
        units=units,
        settled=ours_settled,
        waited=round(time.monotonic() - started, 1),
    )


if __name__ == "__main__":
    main()
