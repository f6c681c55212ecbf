"""Kernel parameters (role sysctl): what systemd-sysctl sets at boot, and live where the host has a kernel of its own.

Both modes read every sysctl.d file the way systemd-sysctl does (plugins/module_utils/sysctl_files.py, the
role's module shares it): per file name the first directory's file, all files in name order, the last
assignment of a key wins. Spec mode expects our drop-in (`sysctl_file`) to be the winner, with our value.
"""

import shlex

from provisioner.audit.engine import Output, json_answer
from provisioner.audit.registry import ABSENT, each
from provisioner.base.module_utils import sysctl_files
from provisioner.base.paths import module_utils_file

# the sysctl.d files as JSON, read on the host by the same code the role's module runs (read_tree)
SYSCTL_READER = module_utils_file("sysctl_files")


def commands(expected):
    found = {
        # JSON, not cat-config's "# /path" headers, which a comment line in a file can imitate
        "sysctl": "python3 -c " + shlex.quote(
            SYSCTL_READER.read_text() + "\nimport json\nprint(json.dumps(read_tree('/')))\n"),
    }
    for index, key in enumerate(expected["sysctl"]["settings"]):
        found[f"live{index}"] = f"cat {shlex.quote(proc_sys_path(key))}"
    return found


def read(expected, out):
    # what systemd-sysctl sets at boot, by normalised key: (value, the winning file as shown); None: the files
    # could not be read (sysctl_problem says why). The precedence: plugins/module_utils/sysctl_files.py
    at_boot, problem = parse_sysctl(out["sysctl"])
    live = {key: " ".join(out[f"live{index}"].text.split()) if out[f"live{index}"].rc == 0 else None
            for index, key in enumerate(expected["sysctl"]["settings"])}
    return {"sysctl_at_boot": at_boot, "sysctl_problem": problem, "sysctl_live": live}


def proc_sys_path(key: str) -> str:
    """sysctl's own rule: a key with a slash is already a path, dots in it are literal."""
    return "/proc/sys/" + (key if "/" in key else key.replace(".", "/"))


def parse_sysctl(out: Output) -> tuple[dict[str, tuple[str | None, str]] | None, str | None]:
    """The reader's JSON → ({normalised key: (value at boot, winning file)}, None), or (None, why not)."""
    entries, problem = json_answer(out, list)
    if problem:
        return None, f"could not read the sysctl.d files ({problem})"
    winners = sysctl_files.effective(sysctl_files.conf_files(entries))
    return {key: (won["value"], sysctl_files.shown_path(won["entry"])) for key, won in winners.items()}, None

settings = each(lambda expected: expected["sysctl"]["settings"].items(), ids=lambda setting: setting[0])


@settings
def at_boot(case, facts, audit):
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
def live(case, facts, audit):
    """`sysctl live: KEY` — the kernel's value in /proc/sys; n/a in a container (it shares its host's kernel).

    Modes: spec, profile.
    """
    key, value = case.item
    check = f"sysctl live: {key}"
    if facts.container:
        audit.not_applicable(check, value, f"a container ({facts.container}) shares its host's kernel")
    audit.expect(check, value, facts.sysctl_live[key] or ABSENT)
