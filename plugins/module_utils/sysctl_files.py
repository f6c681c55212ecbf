# SPDX-License-Identifier: Apache-2.0
# Part of vllm-provision (role sysctl). Standard library only: the module sysctl_precedence runs it on
# the target, the audit runs read_tree() on the host (python3 -c) and the rest on the controller.
"""systemd-sysctl's precedence: which file's assignment of a key wins at boot.

The rules, as sysctl.d(5) states them and systemd 252 (Debian bookworm) and 257 (trixie) implement
them (src/sysctl/sysctl.c, src/basic/conf-files.c), checked on a bookworm host with
`SYSTEMD_LOG_LEVEL=debug systemd-sysctl`:
- the directories, in this order: /etc/sysctl.d, /run/sysctl.d, /usr/local/lib/sysctl.d,
  /usr/lib/sysctl.d, /lib/sysctl.d; one that resolves to an earlier one (/lib -> usr/lib on a
  merged /usr) is the same directory and read once;
- their files ending in .conf, not hidden (a name starting with '.'), not directories; a file in an
  earlier directory hides every same-named file in the later ones ("Skipping overridden file"); a
  hiding file that is empty or a link to /dev/null masks the name;
- all the files sorted by file name (byte order), whatever their directory, and read in that order;
  the last assignment of a key wins (an assignment of the value the key already has keeps the
  earlier one: "Overwriting earlier assignment" only when the value differs);
- /etc/sysctl.conf is not read by systemd itself: Debian's procps links it in as
  /etc/sysctl.d/99-sysctl.conf -> ../sysctl.conf (a file like any other, read through the link);
- a line: whitespace-trimmed; empty or starting with '#' or ';': ignored; else `KEY = VALUE` split
  at the first '=', both trimmed; a leading '-' on the key ignores a failure to write it; a line
  '-KEY' without '=' is a "negative match": it leaves KEY unset (it replaces an earlier assignment
  and excludes KEY from globs); any other line without '=' is ignored; lines end at \\n, \\r, \\r\\n
  or \\0;
- keys are normalised: if the first separator is '.', dots and slashes are swapped (kernel.x/y.z is
  kernel/x.y/z); if it is '/', the key stands; then '//' collapse and a leading '/' goes;
- a key with a glob (*?[) sets every matching key that has no explicit assignment of its own
  ("Not setting ... (explicit setting exists)"): it never overrides an explicit key, so a glob is
  never a conflict with one of ours.
Not modelled: the system credential sysctl.extra (passed by a VM or container manager at boot,
not a file on the host) and the --prefix filtering of udev's per-interface runs.
"""

import os
import re

DIRECTORIES = ("/etc/sysctl.d", "/run/sysctl.d", "/usr/local/lib/sysctl.d", "/usr/lib/sysctl.d", "/lib/sysctl.d")
ADMIN_DIRECTORY = "/etc/sysctl.d"
DEV_NULL = "/dev/null"
MARKER = "disabled by vllm-provision"
COMMENTS = "#;"
WHITESPACE = " \t\n\r"
GLOB = re.compile(r"[*?\[]")
LINE_END = re.compile(r"(\r\n|\r|\n|\0)")
SWAP = str.maketrans("./", "/.")


# ---------------------------------------------------------------- reading the host


def _under(root, path):
    return os.path.join(root, path.lstrip("/")) if root != "/" else path


def _resolve(root, path, depth=0):
    """`path` (absolute, seen from `root`) with every symbolic link followed, seen from `root`."""
    parts, resolved = [part for part in path.split("/") if part], "/"
    for index, part in enumerate(parts):
        candidate = os.path.normpath(os.path.join(resolved, part))
        on_disk = _under(root, candidate)
        if os.path.islink(on_disk) and depth < 40:
            target = os.readlink(on_disk)
            joined = target if target.startswith("/") else os.path.join(resolved, target)
            rest = "/".join(parts[index + 1:])
            return _resolve(root, os.path.normpath(os.path.join(joined, rest) if rest else joined), depth + 1)
        resolved = candidate
    return resolved


def read_tree(root="/"):
    """The .conf entries of the sysctl.d directories, in directory order, then name order.

    Each: {"path", "link" (the link's own target, or None), "target" (where it resolves, or None),
    "text" (its content; "" for /dev/null; None where it cannot be read)}. Directories that resolve
    to an earlier one are skipped. Plain data (JSON) for the audit, which reads it through python3
    on the host; `root` lets the tests use a folder as the host's /.
    """
    entries, seen = [], set()
    for directory in DIRECTORIES:
        real = _resolve(root, directory)
        if real in seen or not os.path.isdir(_under(root, real)):
            continue
        seen.add(real)
        for name in sorted(os.listdir(_under(root, real))):
            if name.startswith(".") or not name.endswith(".conf"):
                continue
            path = directory + "/" + name
            on_disk = _under(root, path)
            if os.path.isdir(on_disk) and not os.path.islink(on_disk):
                continue
            link = os.readlink(on_disk) if os.path.islink(on_disk) else None
            target = _resolve(root, path) if link is not None else None
            entries.append({"path": path, "link": link, "target": target, "text": _read(root, target or path)})
    return entries


def _read(root, path):
    if path == DEV_NULL:
        return ""
    try:
        with open(_under(root, path), encoding="utf-8", errors="surrogateescape", newline="") as handle:
            return handle.read()
    except (OSError, UnicodeError):
        return None


# ---------------------------------------------------------------- systemd-sysctl's rules


def conf_files(entries):
    """The files systemd-sysctl reads, in its order: per name the first directory's, sorted by name."""
    chosen = {}
    for entry in entries:
        chosen.setdefault(os.path.basename(entry["path"]), entry)
    return [chosen[name] for name in sorted(chosen, key=lambda name: name.encode("utf-8", "surrogateescape"))]


def normalize(key):
    """sysctl_normalize(): the key as systemd-sysctl stores it (the path under /proc/sys)."""
    first = re.search(r"[./]", key)
    if first and first.group() == ".":
        key = key[:first.start()] + key[first.start():].translate(SWAP)
    parts = [part for part in key.split("/") if part and part != "."]  # path_simplify(), no leading '/'
    return "/".join(parts) if parts else key


def split_lines(text):
    """[(line, its end)] as systemd's read_line() ends lines (\\n, \\r, \\r\\n, \\0)."""
    pieces = LINE_END.split(text)
    lines = [(pieces[index], pieces[index + 1]) for index in range(0, len(pieces) - 1, 2)]
    if pieces[-1]:
        lines.append((pieces[-1], ""))
    return lines


def assignments(text):
    """Each assignment of a file: {"number" (1-based line), "line", "key" (normalised), "written" (the key
    as written, without '-'), "value" (trimmed; None for a '-KEY' negative match)}."""
    found = []
    for index, (line, _end) in enumerate(split_lines(text or "")):
        stripped = line.strip(WHITESPACE)
        if not stripped or stripped[0] in COMMENTS:
            continue
        key, equals, value = stripped.partition("=")
        if not equals and not key.startswith("-"):
            continue  # "Line is not an assignment, ignoring"
        key = key[1:] if key.startswith("-") else key
        key = key.strip(WHITESPACE)
        found.append({"number": index + 1, "line": line, "key": normalize(key), "written": key,
                      "value": value.strip(WHITESPACE) if equals else None})
    return found


def same_value(one, other):
    """Values as the kernel takes them: whitespace between words does not matter."""
    if one is None or other is None:
        return one is other
    return one.split() == other.split()


def effective(files):
    """{normalised key: {"value", "path", "number", "line"}}: what each key is set to at boot, and by
    which file and line (the entry's path: for a link, the link). Glob keys are included as written."""
    winners = {}
    for entry in files:
        for assignment in assignments(entry["text"]):
            existing = winners.get(assignment["key"])
            if existing is not None and existing["value"] == assignment["value"]:
                continue  # the same value: systemd keeps the earlier assignment
            winners[assignment["key"]] = dict(assignment, path=entry["path"], entry=entry)
    return winners


def shown_path(entry):
    """The file as a report names it: a link with where it leads (99-sysctl.conf -> /etc/sysctl.conf)."""
    return entry["path"] + (" -> " + entry["target"] if entry.get("target") else "")


def conflicts(files, managed_path, settings):
    """The assignments that override one of `settings` ({key: value}, ours in `managed_path`) at boot:
    in a file read after ours (a later name), the same key (normalised) with another value, or a
    '-KEY' negative match. A glob key is not one: it never overrides an explicit assignment. Each:
    {"key" (ours, as written in settings), "path", "number", "line", "value", "entry"}."""
    ours = os.path.basename(managed_path)
    wanted = {normalize(key): (key, str(value)) for key, value in settings.items()}
    found = []
    for entry in files:
        if os.path.basename(entry["path"]).encode("utf-8", "surrogateescape") <= ours.encode("utf-8", "surrogateescape"):
            continue
        for assignment in assignments(entry["text"]):
            if assignment["key"] in wanted and not GLOB.search(assignment["key"]):
                key, value = wanted[assignment["key"]]
                if not same_value(assignment["value"], value):
                    found.append(dict(assignment, key=key, path=entry["path"], entry=entry))
    return found


# ---------------------------------------------------------------- neutralising


def disabled_line(line, managed_path, key):
    """The line commented out, with the marker naming our file and the key."""
    return "# %s  # %s: %s sets %s" % (line, MARKER, managed_path, key)


def neutralisations(conflicting, managed_path):
    """How to neutralise each file with conflicting lines: [{"source" (the path systemd reads), "write"
    (the file to write), "how", "before", "after", "lines" ([{number, line, key}])}].

    A file under /etc is the administrator's: edited in place (a link's target when that is under
    /etc too, so the link stays; else the link is replaced by an edited copy). A vendor file (/run,
    /usr/local/lib, /usr/lib, /lib) is never edited: a same-named copy in /etc/sysctl.d, with the
    lines commented out, overrides it the systemd way. Every other line of the file is kept."""
    by_file = {}
    for conflict in conflicting:
        by_file.setdefault(conflict["path"], []).append(conflict)
    plans = []
    for path, items in by_file.items():
        entry = items[0]["entry"]
        numbers = {item["number"]: item["key"] for item in items}
        lines = split_lines(entry["text"])
        after = "".join((disabled_line(line, managed_path, numbers[index + 1]) if index + 1 in numbers else line) + end
                        for index, (line, end) in enumerate(lines))
        if path.startswith(ADMIN_DIRECTORY + "/"):
            if entry.get("target") and entry["target"].startswith("/etc/"):
                write, how = entry["target"], "edited %s in place (the link %s stays)" % (entry["target"], path)
            elif entry.get("target"):
                write, how = path, "replaced the link %s (to %s) with an edited copy" % (path, entry["target"])
            else:
                write, how = path, "edited in place"
            before = entry["text"]
        else:
            write = ADMIN_DIRECTORY + "/" + os.path.basename(path)
            header = "# A copy of %s by vllm-provision: this file overrides it (same name, /etc wins), with the\n" \
                     "# lines that override %s commented out.\n" % (path, managed_path)
            after = header + after + ("" if not lines or lines[-1][1] else "\n")
            before, how = None, "overridden by a same-named copy %s (the vendor file is not edited)" % write
        plans.append({"source": path, "write": write, "how": how, "before": before, "after": after,
                      "lines": [{"number": item["number"], "line": item["line"], "key": item["key"]} for item in items]})
    return plans


def describe(plan):
    """One line per neutralised assignment: FILE:LINE 'LINE' (KEY) — how."""
    return ["%s:%d '%s' (%s): %s" % (plan["source"], line["number"], line["line"].strip(WHITESPACE), line["key"], plan["how"])
            for line in plan["lines"]]
