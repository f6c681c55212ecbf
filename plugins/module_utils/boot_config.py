# SPDX-License-Identifier: Apache-2.0
# Part of vllm-provision (roles shm and nouveau). Standard library only: the modules shm_fstab and
# nouveau_boot run it on the target, the audit runs read_tree() on the host (python3 -c) and the rest on
# the controller.
"""What the next boot does with /dev/shm and nouveau, read from the files that decide it.

/dev/shm (role shm). systemd mounts /dev/shm itself (an API file system, mount-setup.c), then
systemd-remount-fs.service runs `mount -o remount /dev/shm` for every /etc/fstab line whose mount point is
an API file system (src/remount-fs/remount-fs.c, remount_by_fstab); mount(8) takes the options of the
FIRST fstab line for that mount point (libmount context.c: apply_table(..., MNT_ITER_FORWARD)). So with
two /dev/shm lines the first one's size= is the size after a reboot, whichever line is ours. A
dev-shm.mount unit file or drop-in setting Options= is what systemd uses whenever it (re)mounts the unit
(`systemctl reload dev-shm.mount`): a second source of the size, reported apart.

nouveau (role nouveau). kmod reads /etc/modprobe.d, /run/modprobe.d, /usr/local/lib/modprobe.d,
/lib/modprobe.d, /usr/lib/modprobe.d: *.conf files, a name in an earlier directory hides the same name in
later ones, all files in file name order; `blacklist M` lines add up, the FIRST `install M ...` line is
the one run, `options M ...` lines add up in order so the last value of a parameter wins, and the kernel
command line's `M.param=` (read from /proc/cmdline) comes after all files. GRUB builds the command line:
grub-mkconfig sources /etc/default/grub, then /etc/default/grub.d/*.cfg in glob order (Debian, Ubuntu),
and 10_linux writes `${GRUB_CMDLINE_LINUX} ${GRUB_CMDLINE_LINUX_DEFAULT}` after `ro`. systemd-modules-load
loads each module named in /etc/modules-load.d, /run/modules-load.d, /usr/local/lib/modules-load.d,
/usr/lib/modules-load.d, /lib/modules-load.d (*.conf, same hiding rule; Debian links /etc/modules in as
/etc/modules-load.d/modules.conf).

The shell of the GRUB files is read, not run: `NAME=value` and `export NAME=value` lines with single and
double quotes and $NAME / ${NAME} expansion, which is what these files hold; any other line is ignored.
"""

import glob
import os
import re

FSTAB = "/etc/fstab"
SHM = "/dev/shm"
SHM_UNIT = "dev-shm.mount"
UNIT_DIRS = ("/etc/systemd/system", "/run/systemd/system", "/usr/local/lib/systemd/system", "/usr/lib/systemd/system",
             "/lib/systemd/system")
MODPROBE_DIRS = ("/etc/modprobe.d", "/run/modprobe.d", "/usr/local/lib/modprobe.d", "/lib/modprobe.d",
                 "/usr/lib/modprobe.d")
MODULES_LOAD_DIRS = ("/etc/modules-load.d", "/run/modules-load.d", "/usr/local/lib/modules-load.d",
                     "/usr/lib/modules-load.d", "/lib/modules-load.d")
GRUB_DEFAULT = "/etc/default/grub"
GRUB_DIR = "/etc/default/grub.d"
GRUB_VARIABLES = ("GRUB_CMDLINE_LINUX", "GRUB_CMDLINE_LINUX_DEFAULT")
UNITS = {"K": 1, "M": 2, "G": 3, "T": 4, "P": 5, "E": 6}
ASSIGNMENT = re.compile(r"^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
EXPANSION = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


# ---------------------------------------------------------------- reading the host


def _patterns():
    yield FSTAB
    for directory in UNIT_DIRS:
        yield f"{directory}/{SHM_UNIT}"
        yield f"{directory}/{SHM_UNIT}.d/*.conf"
    for directory in MODPROBE_DIRS + MODULES_LOAD_DIRS:
        yield f"{directory}/*.conf"
    yield GRUB_DEFAULT
    yield f"{GRUB_DIR}/*.cfg"


def read_tree(root="/", errors="replace"):
    """{path: text} of every file that decides /dev/shm and nouveau at the next boot (a link is read
    through; one to /dev/null reads as empty, a dangling one is no file). `errors`: what becomes of bytes that
    are not UTF-8 (surrogateescape: kept, to be written back). A file it cannot read raises: never taken as absent."""
    found = {}
    for pattern in _patterns():
        on_disk = os.path.join(root, pattern.lstrip("/")) if root != "/" else pattern
        for path in sorted(glob.glob(on_disk)):
            if os.path.isdir(path):
                continue
            try:
                with open(path, encoding="utf-8", errors=errors) as handle:
                    text = handle.read()
            except FileNotFoundError:
                continue
            found[path if root == "/" else "/" + os.path.relpath(path, root)] = text
    return found


def in_directories(files, directories, suffix):
    """(path, text) of the files of `directories` ending in `suffix`, in file name order; a name in an
    earlier directory hides the same name in the later ones."""
    chosen = {}
    for directory in directories:
        for path, text in files.items():
            name = path[len(directory) + 1:]
            if path.startswith(directory + "/") and "/" not in name and name.endswith(suffix) \
                    and not name.startswith(".") and name not in chosen:
                chosen[name] = (path, text)
    return [chosen[name] for name in sorted(chosen)]


def numbered(text):
    """(line number, stripped line) of each line that is neither empty nor a comment."""
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            yield number, stripped


# ---------------------------------------------------------------- /dev/shm


def is_shm_line(line):
    """An /etc/fstab line that mounts /dev/shm (with or without a trailing slash)."""
    fields = line.split()
    return len(fields) > 1 and not fields[0].startswith("#") and fields[1].rstrip("/") == SHM


def shm_lines(fstab):
    """(number, line) of each /etc/fstab line for /dev/shm, in order: the first decides the size."""
    return [(number, line) for number, line in enumerate(fstab.splitlines(), 1) if is_shm_line(line)]


def option(options, name):
    """The last `name=value` of a comma-separated option list; None when absent."""
    value = None
    for word in options.split(","):
        key, dummy, found = word.partition("=")
        if key.strip() == name:
            value = found.strip()
    return value


def size_bytes(size, page_size=4096):
    """tmpfs's size= as bytes rounded up to whole pages (k/m/g/t/p/e: powers of 1024); None for a
    percentage of the RAM or a value tmpfs would refuse."""
    match = re.fullmatch(r"(\d+)([KkMmGgTtPpEe]?)", size or "")
    if not match:
        return None
    number = int(match.group(1)) * 1024 ** UNITS.get(match.group(2).upper(), 0)
    return -(-number // page_size) * page_size


def with_own_shm_line(fstab, line):
    """/etc/fstab holding exactly one /dev/shm line, `line`: where the first /dev/shm line was, else at the end."""
    kept, placed = [], False
    for current in fstab.splitlines():
        if not is_shm_line(current):
            kept.append(current)
        elif not placed:
            kept.append(line)
            placed = True
    if not placed:
        kept.append(line)
    return "\n".join(kept) + "\n"


def unit_settings(text, section, key):
    """The values of `key` in `section` of a unit file, in order (an empty assignment resets)."""
    values, current = [], None
    for dummy, line in numbered(text):
        if line.startswith(";"):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
        elif current == section and "=" in line:
            name, dummy, value = line.partition("=")
            if name.strip() == key:
                values = [] if not value.strip() else values + [value.strip()]
    return values


def shm_unit_files(files):
    """(path, text) of dev-shm.mount's unit file (the first directory's) and its drop-ins, as systemd loads them."""
    fragments = [f"{directory}/{SHM_UNIT}" for directory in UNIT_DIRS if f"{directory}/{SHM_UNIT}" in files]
    fragment = (fragments[0], files[fragments[0]]) if fragments else None
    dropins = in_directories(files, [f"{d}/{SHM_UNIT}.d" for d in UNIT_DIRS], ".conf")
    return ([fragment] if fragment else []) + dropins


def shm_overrides(files):
    """(path, what it sets) of each dev-shm.mount unit file or drop-in that changes the mount's options."""
    found = []
    for path, text in shm_unit_files(files):
        options = unit_settings(text, "Mount", "Options")
        if options:
            found.append((path, f"Options={options[-1]}"))
        elif path.endswith(f"/{SHM_UNIT}"):
            found.append((path, "a unit file of its own"))
    return found


def shm_at_boot(files, page_size=4096):
    """What /dev/shm's size will be after a reboot: {bytes (None: not a plain size), shown, source}."""
    lines = shm_lines(files.get(FSTAB, ""))
    if not lines:
        return {"bytes": None, "shown": "the kernel's default (half the RAM)", "source": f"no /dev/shm line in {FSTAB}"}
    number, line = lines[0]
    fields = line.split()
    size = option(fields[3] if len(fields) > 3 else "", "size")
    source = f"{FSTAB} line {number}"
    if size is None:
        return {"bytes": None, "shown": "the kernel's default (half the RAM)", "source": f"{source}, no size="}
    found = size_bytes(size, page_size)
    shown = f"{found} bytes" if found is not None else f"size={size}"
    return {"bytes": found, "shown": shown, "source": f"{source}, size={size}"}


def fstab_plan(files, line):
    """What the shm role does: {fstab: the new text or None (as it is), removed: the /dev/shm lines it removes or
    replaces ('line N: text'), overrides: [(path, what)], message}."""
    before = files.get(FSTAB, "")
    after = with_own_shm_line(before, line)
    removed = ["line %d: %s" % (number, text) for index, (number, text) in enumerate(shm_lines(before))
               if index > 0 or text != line]
    overrides = shm_overrides(files)
    message = "; ".join(
        f"{path} sets {what} for {SHM_UNIT}, the /dev/shm mount whose size vllm-provision sets in {FSTAB}: "
        f"it is not vllm-provision's file to change; remove it (then systemctl daemon-reload) and apply again"
        for path, what in overrides)
    return {"fstab": after if after != before else None, "removed": removed, "overrides": overrides,
            "message": message}


# ---------------------------------------------------------------- nouveau: modprobe.d, modules-load.d


def logical_lines(text):
    """(number, words) of each modprobe.d line, a trailing backslash joining the next one."""
    pending, start = "", 0
    for number, line in enumerate(text.splitlines(), 1):
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        words = (pending + line).split()
        pending = ""
        if words and not words[0].startswith("#"):
            yield start, words


def module_name(name):
    """kmod treats - and _ in module names alike."""
    return name.replace("-", "_")


def modprobe_state(files, module):
    """What modprobe.d says of `module`: {blacklist: [(path, n)], install: (command, path, n) or None,
    options: {param: (value, path, n)}} (the first install line; the last value of a parameter)."""
    state = {"blacklist": [], "install": None, "options": {}}
    for path, text in in_directories(files, MODPROBE_DIRS, ".conf"):
        for number, words in logical_lines(text):
            if len(words) < 2 or module_name(words[1]) != module_name(module):
                continue
            if words[0] == "blacklist":
                state["blacklist"].append((path, number))
            elif words[0] == "install" and state["install"] is None:
                state["install"] = (" ".join(words[2:]), path, number)
            elif words[0] == "options":
                for word in words[2:]:
                    name, dummy, value = word.partition("=")
                    state["options"][name] = (value, path, number)
    return state


def modules_loaded_at_boot(files, module):
    """(path, n) of each modules-load.d line that loads `module`."""
    return [(path, number) for path, text in in_directories(files, MODULES_LOAD_DIRS, ".conf")
            for number, line in numbered(text)
            if not line.startswith(";") and module_name(line.split()[0]) == module_name(module)]


# ---------------------------------------------------------------- nouveau: GRUB's kernel command line


def shell_value(raw, variables, origin):
    """A shell assignment's value as [(char, origin)]: quotes removed, $NAME expanded (keeping the origin of
    the text it expands to), unquoted text ends at a blank or ';' (a comment after the value starts at a blank)."""
    out, index, quote = [], 0, None
    while index < len(raw):
        char = raw[index]
        if quote is None and char in " \t;":
            break
        if char in "'\"" and quote in (None, char):
            quote = None if quote == char else char
            index += 1
            continue
        if char == "\\" and quote != "'" and index + 1 < len(raw):
            out.append((raw[index + 1], origin))
            index += 2
            continue
        match = EXPANSION.match(raw, index) if char == "$" and quote != "'" else None
        if match:
            out.extend(variables.get(match.group(1) or match.group(2), []))
            index = match.end()
            continue
        out.append((char, origin))
        index += 1
    return out


def grub_files(files):
    """(path, text) in the order grub-mkconfig sources them."""
    drop_ins = sorted(path for path in files if path.startswith(GRUB_DIR + "/") and path.endswith(".cfg")
                      and "/" not in path[len(GRUB_DIR) + 1:])
    return [(path, files[path]) for path in ([GRUB_DEFAULT] if GRUB_DEFAULT in files else []) + drop_ins]


def grub_variables(files):
    """The variables after grub-mkconfig sourced the GRUB files, each as [(char, origin)], and the origin of
    each one's last assignment; None when no GRUB file exists. An origin: 'PATH line N (VARIABLE)'."""
    sources = grub_files(files)
    if not sources:
        return None
    variables, assigned = {}, {}
    for path, text in sources:
        for number, line in numbered(text):
            match = ASSIGNMENT.match(line)
            if match:
                name = match.group(1)
                assigned[name] = f"{path} line {number} ({name})"
                variables[name] = shell_value(match.group(2), variables, assigned[name])
    return variables, assigned


def grub_cmdline(files):
    """The words GRUB puts on the kernel command line of a normal boot, each as (word, origin of the
    assignment that wrote it); None when no GRUB file exists."""
    read = grub_variables(files)
    if read is None:
        return None
    words = []
    for name in GRUB_VARIABLES:
        word, origin = "", None
        for char, where in read[0].get(name, []) + [(" ", None)]:
            if char.isspace():
                if word:
                    words.append((word, origin))
                word, origin = "", None
            else:
                word, origin = word + char, origin or where
    return words


def split_origin(origin):
    """'PATH line N (VARIABLE)' → (PATH, N)."""
    path, dummy, rest = origin.partition(" line ")
    return path, int(rest.split()[0])


# ---------------------------------------------------------------- nouveau: the rows


def finding(check, expected, actual, passed, path=None, line=None):
    """One row: its check, expected, actual and verdict; the file that decides and its line, when one does."""
    return {"check": check, "expected": expected, "actual": actual, "passed": passed, "path": path, "line": line}


def line_of(files, path, number):
    return files[path].splitlines()[number - 1].strip()


def nouveau_findings(files, flags, module="nouveau"):
    """The rows of nouveau's state at the next boot, given the role's kernel command line `flags`:
    modprobe.d's modeset and install line, the GRUB command line, modules-load.d."""
    state, rows = modprobe_state(files, module), []
    modeset = state["options"].get("modeset")
    if modeset is None:
        rows.append(finding(f"{module} modprobe.d: modeset", "0", "not set", False))
    else:
        value, path, number = modeset
        rows.append(finding(f"{module} modprobe.d: modeset", "0", f"{value} ({path} line {number})", value == "0",
                            path, line_of(files, path, number)))
    if state["install"] is None:
        rows.append(finding(f"{module} modprobe.d: install", "/bin/false", "none (modprobe loads it)", False))
    else:
        command, path, number = state["install"]
        rows.append(finding(f"{module} modprobe.d: install", "/bin/false", f"{command} ({path} line {number})",
                            command == "/bin/false", path, line_of(files, path, number)))
    rows.append(grub_finding(files, flags, module))
    loads = modules_loaded_at_boot(files, module)
    if loads:
        path, number = loads[0]
        shown = ", ".join(f"{where} line {at}: {module}" for where, at in loads)
        rows.append(finding(f"{module} in modules-load.d", "none", shown, False, path, line_of(files, path, number)))
    else:
        rows.append(finding(f"{module} in modules-load.d", "none", "none", True))
    return rows


def grub_finding(files, flags, module):
    check, expected = f"{module} on the kernel command line GRUB builds", " ".join(flags)
    words = grub_cmdline(files)
    if words is None:
        return finding(check, expected, f"no {GRUB_DEFAULT} and no {GRUB_DIR}/*.cfg", None)
    modeset = [(word, origin) for word, origin in words if word.startswith(f"{module}.modeset=")]
    wanted = [flag for flag in flags if flag.startswith(f"{module}.modeset=")]
    if wanted and modeset and modeset[-1][0] != wanted[-1]:
        word, origin = modeset[-1]
        path, number = split_origin(origin)
        return finding(check, expected, f"{word} last, from {origin}", False, path, line_of(files, path, number))
    missing = [flag for flag in flags if flag not in {word for word, dummy in words}]
    if missing:
        origin = grub_variables(files)[1].get(GRUB_VARIABLES[0])
        if origin is None:
            return finding(check, expected, f"lacks {' '.join(missing)}: nothing sets {GRUB_VARIABLES[0]}", False)
        path, number = split_origin(origin)
        return finding(check, expected, f"lacks {' '.join(missing)}: {origin} sets it without them", False,
                       path, line_of(files, path, number))
    origins = sorted({split_origin(origin)[0] for word, origin in words if word in flags})
    return finding(check, expected, f"{expected} ({', '.join(origins)})", True)


def nouveau_plan(files, flags, own, module="nouveau"):
    """What the nouveau role cannot repair: the failing rows decided by a file that is not one of `own`
    (the role's files, as it writes them), and the message naming each file and its line."""
    foreign = [row for row in nouveau_findings(files, flags, module)
               if row["passed"] is False and row["path"] is not None and row["path"] not in own]
    message = "; ".join(
        f"{row['path']} decides '{row['check']}' ({row['actual']}, expected {row['expected']}): it is not "
        f"vllm-provision's file to change; remove the line '{row['line']}' and apply again" for row in foreign)
    return {"foreign": foreign, "message": message}
