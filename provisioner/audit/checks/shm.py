"""/dev/shm (role shm): its size live and, in spec mode, its line in /etc/fstab.

Spec mode expects exactly `shm_size` (rounded up to whole pages, as tmpfs does); profile mode at least
`shm_size_min`.
"""

import re

from provisioner.audit.engine import Output
from provisioner.audit.registry import ABSENT, check, each


def commands(expected):
    return {"fstab": "cat /etc/fstab", "shm": "findmnt -n -b -o SIZE /dev/shm", "page_size": "getconf PAGESIZE"}


def read(expected, out):
    shm: Output = out["shm"]
    return {"fstab": out["fstab"].text, "page_size": int(out["page_size"].text),
            "shm_bytes": int(shm.text) if shm.rc == 0 and shm.text.strip().isdigit() else None}


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
    actual = f"{facts.shm_bytes} bytes" if facts.shm_bytes is not None else "not mounted"
    if shm["exact"]:
        audit.expect("/dev/shm size", f"{wanted} bytes ({shm['size']})", actual, passed=facts.shm_bytes == wanted)
    else:
        audit.expect("/dev/shm size", f"at least {wanted} bytes ({shm['size']})", actual,
                     passed=(facts.shm_bytes or 0) >= wanted)


@each(lambda expected: [expected["shm"]] if expected["shm"].get("fstab_line") else [], ids=lambda _: "fstab")
def fstab_line(case, facts, audit):
    """`/dev/shm in /etc/fstab` — the /etc/fstab lines mounting /dev/shm against the one the shm role writes.

    Modes: spec.
    """
    pattern = re.compile(case.item["fstab_pattern"])
    lines = [line for line in facts.fstab.splitlines() if pattern.match(line)]
    audit.expect("/dev/shm in /etc/fstab", case.item["fstab_line"], lines or ABSENT)
