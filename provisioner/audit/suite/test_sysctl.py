"""Kernel parameters (role sysctl): what systemd-sysctl sets at boot, and live where the host has a kernel of its own.

Both modes read every sysctl.d file the way systemd-sysctl does (plugins/module_utils/sysctl_files.py, the
role's module shares it): per file name the first directory's file, all files in name order, the last
assignment of a key wins. Spec mode expects our drop-in (`sysctl_file`) to be the winner, with our value.
"""

from provisioner.audit.checks import ABSENT, each
from provisioner.base.module_utils import sysctl_files

settings = each(lambda expected: expected["sysctl"]["settings"].items(), ids=lambda setting: setting[0])


@settings
def test_at_boot(case, facts, audit):
    """`sysctl at boot: KEY` — the value systemd-sysctl sets at boot and its file, against our drop-in's (spec) or the profile's value.

    Every sysctl.d file counts (the winner is the last assignment in file name order); spec mode expects
    our drop-in to win with our value, so another file overriding it and our own file edited both fail
    here, each naming the winning file. Profile mode compares the value alone.

    Modes: spec, profile.
    """
    key, value = case.item
    check, ours = f"sysctl at boot: {key}", case.target["sysctl"]["file"]
    expected = f"{value} ({ours})" if ours else value
    if facts.sysctl_at_boot is None:
        audit.expect(check, expected, facts.sysctl_problem)
    won = facts.sysctl_at_boot.get(sysctl_files.normalize(key))
    if won is None:
        audit.expect(check, expected, f"{ABSENT} (no sysctl.d file sets it)")
    found, path = won
    actual = f"not set ({path}: -{key})" if found is None else f"{' '.join(found.split())} ({path})"
    # spec: value and file, as shown; profile (no file of ours): the value alone
    passed = None if ours else found is not None and found.split() == value.split()
    audit.expect(check, expected, actual, passed=passed)


@settings
def test_live(case, facts, audit):
    """`sysctl live: KEY` — the kernel's value in /proc/sys; n/a in a container (it shares its host's kernel).

    Modes: spec, profile.
    """
    key, value = case.item
    check = f"sysctl live: {key}"
    if facts.container:
        audit.not_applicable(check, value, f"a container ({facts.container}) shares its host's kernel")
    audit.expect(check, value, facts.sysctl_live[key] or ABSENT)
