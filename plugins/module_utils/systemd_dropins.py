# SPDX-License-Identifier: Apache-2.0
# Part of vllm-provision (role vllm_service). Standard library only: it runs on the targets too.
"""Drop-ins of a systemd unit: where systemd reads them, what each one sets, and which of the
settings of a unit we write it changes.

Ansible ships this file to the targets with the module `unit_overrides` (which finds the drop-ins
on disk, as systemd will read them at the next daemon-reload); `provision audit` loads the same file
on the controller (provisioner.base.module_utils.load_module_utils) to judge the drop-ins that
`systemctl show -p DropInPaths` lists: one reading of "changes a managed setting" for both.

A managed setting is a key the unit we render sets (any section: `User`, `After`, `ExecStart`…),
one variable of its `Environment=` lines (`Environment CUDA_VISIBLE_DEVICES`), or `ExecStart`.
A drop-in changes it when it assigns that key (an empty assignment, `Environment=` or
`ExecStart=`, resets a list: that changes it too), sets or unsets (`UnsetEnvironment=`) one of
those variables.
"""

from __future__ import annotations

import os

# the system manager's unit search path, highest precedence first (systemd 252, `systemd-analyze unit-paths`)
UNIT_DIRS = (
    "/etc/systemd/system.control",
    "/run/systemd/system.control",
    "/run/systemd/transient",
    "/run/systemd/generator.early",
    "/etc/systemd/system",
    "/etc/systemd/system.attached",
    "/run/systemd/system",
    "/run/systemd/system.attached",
    "/run/systemd/generator",
    "/usr/local/lib/systemd/system",
    "/usr/lib/systemd/system",
    "/lib/systemd/system",
    "/run/systemd/generator.late",
)
# where a drop-in directory named after the unit itself belongs to whoever owns the unit (us):
# `systemctl edit` (/etc), `systemctl edit --runtime` (/run), `systemctl set-property` (system.control)
OWN_DIRS = ("/etc/systemd/system", "/run/systemd/system", "/etc/systemd/system.control", "/run/systemd/system.control")
# where `systemctl mask` puts its /dev/null link (--runtime: /run)
MASK_DIRS = ("/etc/systemd/system", "/run/systemd/system")
ENVIRONMENT = "Environment"


# --------------------------------------------------------------------------- unit file syntax


def unit_settings(text):
    """[(section, key, value)] of a unit file or drop-in, in file order: line continuations joined,
    comment lines (# or ;) skipped, whitespace around key and value stripped."""
    settings, section, pending = [], "", ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith(("#", ";"))):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = (pending + line).strip(), ""
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
        elif "=" in line:
            key, dummy, value = line.partition("=")
            settings.append((section, key.strip(), value.strip()))
    return settings


def words(text):
    """The words of a setting as systemd splits them (quotes and backslash escapes undone, `%%` → `%`);
    a line with an unbalanced quote gives no words (systemd ignores it)."""
    found, word, quote, index = [], None, "", 0
    text = text.replace("%%", "%")
    escapes = {"n": "\n", "t": "\t", "s": " ", "\\": "\\", '"': '"', "'": "'"}
    while index < len(text):
        char = text[index]
        if char == "\\" and index + 1 < len(text):
            word = (word or "") + escapes.get(text[index + 1], text[index + 1])
            index += 2
            continue
        if quote:
            if char == quote:
                quote = ""
            else:
                word += char
        elif char in "\"'":
            quote, word = char, word or ""
        elif char.isspace():
            if word is not None:
                found.append(word)
            word = None
        else:
            word = (word or "") + char
        index += 1
    if quote:
        return []
    if word is not None:
        found.append(word)
    return found


# --------------------------------------------------------------------------- what a unit manages, what a drop-in changes


def managed_settings(unit_text):
    """What the unit we render sets: {"keys": ["Section/Key", ...], "environment": [NAME, ...]} (sorted, JSON-able)."""
    keys, environment = set(), set()
    for section, key, value in unit_settings(unit_text):
        if key == ENVIRONMENT:
            environment.update(word.partition("=")[0] for word in words(value))
        else:
            keys.add("%s/%s" % (section, key))
    keys.add("Service/ExecStart")
    return {"keys": sorted(keys), "environment": sorted(environment)}


def dropin_changes(text, managed=None):
    """What a drop-in sets, in file order, without repeats: [{"setting", "verb", "managed"}] where
    setting is a key ("User", "ExecStart") or "Environment NAME", verb "sets", "resets" (an empty
    assignment), "replaces" (an empty assignment, then new values) or "unsets" (UnsetEnvironment=), and managed whether it changes a setting of `managed`
    (managed_settings()); managed=None: nothing is managed (a unit we did not write)."""
    keys = set((managed or {}).get("keys", ()))
    variables = set((managed or {}).get("environment", ()))
    changes, seen = [], set()

    def add(setting, verb, is_managed):
        if verb == "sets" and (setting, "resets") in seen:  # a list emptied, then given new items
            verb = "replaces"
            changes[:] = [change for change in changes if (change["setting"], change["verb"]) != (setting, "resets")]
        if (setting, verb) not in seen:
            seen.add((setting, verb))
            changes.append({"setting": setting, "verb": verb, "managed": bool(is_managed)})

    for section, key, value in unit_settings(text):
        if key in (ENVIRONMENT, "UnsetEnvironment"):
            if not value:
                add(key, "resets", key == ENVIRONMENT and variables)
            for word in words(value):
                name = word.partition("=")[0]
                add("%s %s" % (ENVIRONMENT, name), "unsets" if key == "UnsetEnvironment" else "sets", name in variables)
        else:
            add(key, "sets" if value else "resets", "%s/%s" % (section, key) in keys)
    return changes


def changes_managed(changes):
    return [change for change in changes if change["managed"]]


def describe(changes):
    """"sets Environment CUDA_VISIBLE_DEVICES, User; resets ExecStart" (verbs in a fixed order)."""
    parts = []
    for verb in ("sets", "replaces", "resets", "unsets"):
        settings = [change["setting"] for change in changes if change["verb"] == verb]
        if settings:
            parts.append("%s %s" % (verb, ", ".join(settings)))
    return "; ".join(parts) or "sets nothing"


def touches(changes, setting):
    """Whether the changes affect one setting ("User", "TimeoutStartSec", "Environment NAME")."""
    for change in changes:
        if change["setting"] == setting:
            return True
        if setting.startswith(ENVIRONMENT + " ") and change["setting"] == ENVIRONMENT and change["verb"] == "resets":
            return True
    return False


# --------------------------------------------------------------------------- where systemd reads them


def dropin_dir_names(unit):
    """The drop-in directory names systemd reads for `unit`, most specific first:
    vllm-chat.service.d, vllm-.service.d (one per dash prefix), service.d (every unit of the type)."""
    name, dummy, kind = unit.rpartition(".")
    names = [unit + ".d"]
    parts = name.split("-")
    for count in range(len(parts) - 1, 0, -1):
        names.append("-".join(parts[:count]) + "-." + kind + ".d")
    names.append(kind + ".d")
    return names


def find_dropins(unit, root="/"):
    """The drop-in files systemd applies to `unit`, in the order it applies them: every *.conf of
    every drop-in directory in the search path, sorted by file name; of two files with the same
    name the one in the directory of higher precedence (then: the more specific name) wins. A file
    linked to /dev/null is a masked drop-in: left out. Paths as on the host; `root`: where its tree is."""
    chosen, seen_dirs = {}, set()
    for base in UNIT_DIRS:
        for dir_name in dropin_dir_names(unit):
            directory = os.path.join(base, dir_name)
            local = under(root, directory)
            if not os.path.isdir(local) or os.path.realpath(local) in seen_dirs:
                continue
            seen_dirs.add(os.path.realpath(local))
            for file_name in sorted(os.listdir(local)):
                if file_name.endswith(".conf") and file_name not in chosen:
                    chosen[file_name] = os.path.join(directory, file_name)
    return [chosen[name] for name in sorted(chosen) if not is_null_link(under(root, chosen[name]))]


def find_masks(unit, root="/"):
    """The link that masks `unit`: the first file of that name in the search path, where it is a link to
    /dev/null in /etc/systemd/system or /run/systemd/system (where `systemctl mask` puts it). A runtime mask
    under our unit file in /etc (which comes first) masks nothing: not listed."""
    for base in UNIT_DIRS:
        path = os.path.join(base, unit)
        if os.path.lexists(under(root, path)):
            return [path] if is_null_link(under(root, path)) and base in MASK_DIRS else []
    return []


def under(root, path):
    return os.path.join(root, path.lstrip("/"))


def is_null_link(path):
    return os.path.islink(path) and os.readlink(path) == "/dev/null"


def is_own_dropin(unit, path):
    """Whether a drop-in is in the unit's own drop-in directory (/etc or /run, not a shared, prefix or vendor one)."""
    return os.path.dirname(path) in [os.path.join(base, unit + ".d") for base in OWN_DIRS]


def shared_reach(unit, path):
    """Which units a drop-in that is not the unit's own applies to, in words."""
    directory = os.path.basename(os.path.dirname(path))
    kind = unit.rpartition(".")[2]
    if directory == kind + ".d":
        return "every %s on the host" % kind
    if directory != unit + ".d":
        return "every %s whose name starts with %s" % (kind, directory[: -len("." + kind + ".d")])
    return "this unit, from a directory that is not ours (%s)" % os.path.dirname(os.path.dirname(path))
