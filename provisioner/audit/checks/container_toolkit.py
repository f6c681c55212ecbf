"""NVIDIA's container toolkit as role container_engine manages it (the spec's `container_toolkit:` section): the
package at the pinned version and held, and the path unit that regenerates the CDI spec when the driver changes.

Spec mode, on the hosts whose containers use GPUs (CDI devices) and whose spec has the section (manage: true).
The package, and which path unit the version has (NVIDIA's nvidia-cdi-refresh.path from 1.18.0, the role's own
vllm-provision-cdi-refresh.path before), come from the role's vars/main.yml (provisioner/audit/expectations.py).
"""

import shlex

from provisioner.audit.engine import shown_properties
from provisioner.audit.registry import UNSET, each


def commands(expected):
    toolkit = expected.get("container_toolkit")
    if not toolkit:
        return {}
    return {
        "toolkit_package": (f"dpkg-query --show --showformat='${{Version}} ${{db:Status-Abbrev}}' "
                            f"{shlex.quote(toolkit['package'])} 2>/dev/null; true"),
        "toolkit_unit": f"systemctl show {shlex.quote(toolkit['path_unit'])} --property=LoadState,UnitFileState,ActiveState,SubState",
    }


def read(expected, out):
    """The package's `Version db:Status-Abbrev` ('' when not installed), `systemctl show` of the CDI refresh path unit."""
    if "toolkit_package" not in out:
        return {"toolkit_package": None, "toolkit_unit": {}}
    return {"toolkit_package": out["toolkit_package"].text.strip(), "toolkit_unit": shown_properties(out["toolkit_unit"])}

toolkits = each(lambda expected: [expected["container_toolkit"]] if expected.get("container_toolkit") else [],
                ids=lambda toolkit: toolkit["package"])


@toolkits
def toolkit_package(case, facts, audit):
    """`nvidia-container-toolkit-base` — the toolkit's installed version and hold (`dpkg-query`) against the pinned `container_toolkit.version`, held: an upgrade would move it otherwise.

    Modes: spec.
    """
    toolkit, read = case.item, (facts.toolkit_package or "").split()
    installed = read[0] if read and read[1:2] and read[1][1] == "i" else None
    held = bool(read[1:2]) and read[1].startswith("h")
    actual = f"{installed}, {'held' if held else 'not held'}" if installed else "(not installed)"
    audit.expect(toolkit["package"], f"{toolkit['version']}, held", actual)


@toolkits
def cdi_refresh_unit(case, facts, audit):
    """`CDI refresh UNIT` — the path unit that regenerates the CDI spec when the driver's modules change (`systemctl show`): enabled and waiting.

    Modes: spec.
    """
    unit, shown = case.item["path_unit"], facts.toolkit_unit
    state = shown.get("UnitFileState") or UNSET
    if shown.get("LoadState") == "not-found":
        state = "not installed"
    actual = f"{state}, {shown.get('ActiveState', '?')} ({shown.get('SubState', '?')})"
    audit.expect(f"CDI refresh {unit}", "enabled, active (waiting)", actual)
