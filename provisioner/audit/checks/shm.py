"""/dev/shm (role shm): its size live and, in spec mode, its line in /etc/fstab.

Spec mode expects exactly `shm_size` (rounded up to whole pages, as tmpfs does); profile mode at least
`shm_size_min`. The live size is read with what every Linux has: whether /dev/shm is a mount point
(/proc/self/mountinfo) and the size of the file system there (`stat -f`: fragment size × blocks, findmnt's
SIZE).
"""

import re

from provisioner.audit.engine import Output, command_problem, not_installed
from provisioner.audit.registry import ABSENT, check, each

SHM = "/dev/shm"
MOUNTINFO = "/proc/self/mountinfo"
OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")  # the kernel's escape of a blank, tab, newline or backslash in a path


def commands(expected):
    return {"fstab": "cat /etc/fstab", "mountinfo": f"cat {MOUNTINFO}", "shm_statfs": f"stat -f -c '%S %b' {SHM}",
            "page_size": "getconf PAGESIZE"}


def read(expected, out):
    problem = command_problem(out["page_size"], "getconf")
    if problem:
        raise RuntimeError(f"the page size could not be read: {problem}")
    return {"fstab": out["fstab"].text, "fstab_problem": not_installed(out["fstab"], "cat"), **live_size(out["mountinfo"], out["shm_statfs"]),
            "page_size": int(out["page_size"].text)}


def live_size(mountinfo: Output, statfs: Output) -> dict[str, int | str | None]:
    """The facts `shm_bytes` (None: nothing is mounted on /dev/shm) and `shm_problem` (why the size could not be
    read)."""
    problem = command_problem(mountinfo, "cat")
    if problem:
        return {"shm_bytes": None, "shm_problem": f"{MOUNTINFO} could not be read: {problem}"}
    if not is_mount_point(mountinfo.text, SHM):
        return {"shm_bytes": None, "shm_problem": None}
    problem = command_problem(statfs, "stat")
    fields = statfs.text.split()
    if problem is None and not (len(fields) == 2 and all(field.isdigit() for field in fields)):
        problem = f"stat -f answered {statfs.text.strip()!r}"
    if problem:
        return {"shm_bytes": None, "shm_problem": f"the size of {SHM} could not be read: {problem}"}
    fragment_size, blocks = map(int, fields)
    return {"shm_bytes": fragment_size * blocks, "shm_problem": None}


def is_mount_point(mountinfo: str, path: str) -> bool:
    """Whether /proc/self/mountinfo lists a mount on `path` (its fifth field, octal escapes undone)."""
    points = (line.split()[4] for line in mountinfo.splitlines() if len(line.split()) > 4)
    return path in {OCTAL_ESCAPE.sub(lambda escape: chr(int(escape[1], 8)), point) for point in points}


@check
def size(case, facts, audit):
    """`/dev/shm size` — the mounted size (page-rounded) against `shm_size` (spec) or at least `shm_size_min` (profile).

    Modes: spec, profile.
    """
    shm = case.target["shm"]
    if shm["size"] is None:
        audit.not_applicable("/dev/shm size", "(as it is)", "shm_size is null: /dev/shm is left as it is")
    pages = -(-shm["bytes"] // facts.page_size)
    wanted = pages * facts.page_size
    expected = f"{wanted} bytes ({shm['size']})" if shm["exact"] else f"at least {wanted} bytes ({shm['size']})"
    if facts.shm_problem:
        audit.cannot_check("/dev/shm size", expected, facts.shm_problem)
    actual = f"{facts.shm_bytes} bytes" if facts.shm_bytes is not None else "not mounted"
    passed = facts.shm_bytes == wanted if shm["exact"] else (facts.shm_bytes or 0) >= wanted
    audit.expect("/dev/shm size", expected, actual, passed=passed)


@each(lambda expected: [expected["shm"]] if expected["shm"].get("fstab_line") else [], ids=lambda _: "fstab")
def fstab_line(case, facts, audit):
    """`/dev/shm in /etc/fstab` — the /etc/fstab lines mounting /dev/shm against the one the shm role writes.

    Modes: spec.
    """
    if facts.fstab_problem:
        audit.cannot_check("/dev/shm in /etc/fstab", case.item["fstab_line"], facts.fstab_problem)
    pattern = re.compile(case.item["fstab_pattern"])
    lines = [line for line in facts.fstab.splitlines() if pattern.match(line)]
    audit.expect("/dev/shm in /etc/fstab", case.item["fstab_line"], lines or ABSENT)
