"""/dev/shm (role shm): its size live and after a reboot, and, in spec mode, its line in /etc/fstab.

Spec mode expects exactly `shm_size` (rounded up to whole pages, as tmpfs does); profile mode at least
`shm_size_min`. The live size is read with what every Linux has: whether /dev/shm is a mount point
(/proc/self/mountinfo) and the size of the file system there (`stat -f`: fragment size × blocks, findmnt's
SIZE). After a reboot: the files that decide it, by the rules of plugins/module_utils/boot_config.py, which the
role's module shares.
"""

import re

from provisioner.audit.boot_files import boot_files, boot_files_command, read_boot_files
from provisioner.audit.engine import Output, command_problem
from provisioner.audit.registry import ABSENT, check, each
from provisioner.base.module_utils import boot_config

MOUNTINFO = "/proc/self/mountinfo"
OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")  # the kernel's escape of a blank, tab, newline or backslash in a path


def commands(expected):
    return {**boot_files_command(), "mountinfo": f"cat {MOUNTINFO}",
            "shm_statfs": f"stat -f -c '%S %b' {boot_config.SHM}", "page_size": "getconf PAGESIZE"}


def read(expected, out):
    problem = command_problem(out["page_size"], "getconf")
    if problem:
        raise RuntimeError(f"the page size could not be read: {problem}")
    return {**read_boot_files(out), **live_size(out["mountinfo"], out["shm_statfs"]),
            "page_size": int(out["page_size"].text)}


def live_size(mountinfo: Output, statfs: Output) -> dict[str, int | str | None]:
    """The facts `shm_bytes` (None: nothing is mounted on /dev/shm) and `shm_problem` (why the size could not be
    read)."""
    problem = command_problem(mountinfo, "cat")
    if problem:
        return {"shm_bytes": None, "shm_problem": f"{MOUNTINFO} could not be read: {problem}"}
    if not is_mount_point(mountinfo.text, boot_config.SHM):
        return {"shm_bytes": None, "shm_problem": None}
    problem = command_problem(statfs, "stat")
    fields = statfs.text.split()
    if problem is None and not (len(fields) == 2 and all(field.isdigit() for field in fields)):
        problem = f"stat -f answered {statfs.text.strip()!r}"
    if problem:
        return {"shm_bytes": None, "shm_problem": f"the size of {boot_config.SHM} could not be read: {problem}"}
    fragment_size, blocks = map(int, fields)
    return {"shm_bytes": fragment_size * blocks, "shm_problem": None}


def is_mount_point(mountinfo: str, path: str) -> bool:
    """Whether /proc/self/mountinfo lists a mount on `path` (its fifth field, octal escapes undone)."""
    points = (line.split()[4] for line in mountinfo.splitlines() if len(line.split()) > 4)
    return path in {OCTAL_ESCAPE.sub(lambda escape: chr(int(escape[1], 8)), point) for point in points}


def wanted_bytes(shm, facts) -> int:
    """`shm_size` in bytes, rounded up to whole pages as tmpfs does."""
    return -(-shm["bytes"] // facts.page_size) * facts.page_size


@check
def size(case, facts, audit):
    """`/dev/shm size` — the mounted size (page-rounded) against `shm_size` (spec) or at least `shm_size_min` (profile).

    Modes: spec, profile.
    """
    shm = case.target["shm"]
    if shm["size"] is None:
        audit.not_applicable("/dev/shm size", "(as it is)", "shm_size is null: /dev/shm is left as it is")
    wanted = wanted_bytes(shm, facts)
    expected = f"{wanted} bytes ({shm['size']})" if shm["exact"] else f"at least {wanted} bytes ({shm['size']})"
    if facts.shm_problem:
        audit.unknown("/dev/shm size", expected, facts.shm_problem)
    actual = f"{facts.shm_bytes} bytes" if facts.shm_bytes is not None else "not mounted"
    passed = facts.shm_bytes == wanted if shm["exact"] else (facts.shm_bytes or 0) >= wanted
    audit.expect("/dev/shm size", expected, actual, passed=passed)


@each(lambda expected: [expected["shm"]] if expected["shm"].get("fstab_line") else [], ids=lambda _: "fstab")
def fstab_line(case, facts, audit):
    """`/dev/shm in /etc/fstab` — the /etc/fstab lines mounting /dev/shm against the one the shm role writes.

    Modes: spec.
    """
    check, expected = "/dev/shm in /etc/fstab", case.item["fstab_line"]
    fstab = boot_files(facts, audit, check, expected).get(boot_config.FSTAB, "")
    lines = [line for _, line in boot_config.shm_lines(fstab)]
    audit.expect(check, expected, lines or ABSENT)


@check
def size_at_boot(case, facts, audit):
    """`/dev/shm size at boot` — the size after a reboot: the FIRST /etc/fstab line for /dev/shm (systemd-remount-fs, mount(8)).

    Spec mode: exactly `shm_size`; profile mode: at least `shm_size_min`, n/a without a /dev/shm line.
    The rules: plugins/module_utils/boot_config.py (the shm role's module shares them).

    Modes: spec, profile.
    """
    shm, check = case.target["shm"], "/dev/shm size at boot"
    if shm["size"] is None:
        audit.not_applicable(check, "(as it is)", "shm_size is null: /dev/shm is left as it is")
    wanted = wanted_bytes(shm, facts)
    expected = f"{wanted} bytes ({shm['size']})" if shm["exact"] else f"at least {wanted} bytes ({shm['size']})"
    files = boot_files(facts, audit, check, expected)
    boot = boot_config.shm_at_boot(files, facts.page_size)
    if not shm["exact"] and not boot_config.shm_lines(files.get(boot_config.FSTAB, "")):
        audit.not_applicable(check, expected, boot["source"])
    passed = boot["bytes"] == wanted if shm["exact"] else (boot["bytes"] or 0) >= wanted
    audit.expect(check, expected, f"{boot['shown']} ({boot['source']})", passed=passed)


@check
def mount_unit(case, facts, audit):
    """`/dev/shm mount unit` — no dev-shm.mount unit file or drop-in sets the mount's options (the size is /etc/fstab's).

    Modes: spec, profile.
    """
    check, expected = "/dev/shm mount unit", "no file that sets dev-shm.mount's options"
    if case.target["shm"]["size"] is None:
        audit.not_applicable(check, expected, "shm_size is null: /dev/shm is left as it is")
    found = boot_config.shm_overrides(boot_files(facts, audit, check, expected))
    audit.expect(check, expected, "; ".join(f"{path} sets {what}" for path, what in found) or expected)
