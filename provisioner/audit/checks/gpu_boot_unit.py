"""The nvidia_gpu role's boot unit (`nvidia-gpu-limits.service`, a oneshot that re-applies persistence mode and the power limits at every boot): enabled, and its last run a success.

Spec mode, on the hosts whose spec lists GPU devices (where the role runs). The unit's name, the state the
role's systemd_service task sets and what a successful run leaves (RemainAfterExit=yes: active) come from
the role's own template and tasks (provisioner/audit/expectations.py). A unit file that is gone makes
these rows n/a: the `file PATH` row of the unit file says so.
"""

import shlex

from provisioner.audit.engine import shown_properties
from provisioner.audit.registry import UNSET, each


BOOT_UNIT_STATE = ("LoadState", "UnitFileState", "ActiveState", "SubState", "Result", "ExecMainStatus",
                   "ExecMainExitTimestamp")


def commands(expected):
    if not expected.get("gpu_boot_unit"):
        return {}
    return {"gpu_boot_unit": f"systemctl show {shlex.quote(expected['gpu_boot_unit']['name'])}"
                             f" --property={','.join(BOOT_UNIT_STATE)}"}


def read(expected, out):
    """`systemctl show` of the nvidia_gpu role's boot unit (None: not expected)."""
    return {"gpu_boot_unit": shown_properties(out["gpu_boot_unit"]) if "gpu_boot_unit" in out else None}

boot_unit = each(lambda expected: [expected["gpu_boot_unit"]] if expected.get("gpu_boot_unit") else [],
                 ids=lambda unit: unit["name"])


def loaded(audit, unit: dict, shown: dict, check: str, expected: str) -> None:
    """Go on only where systemd knows the unit file; else the row is n/a, pointing at the file's row."""
    state = shown.get("LoadState") or "unknown to systemd"
    if state == "not-found":
        audit.not_applicable(check, expected, f"the unit file is missing: see file {unit['fragment']}")
    if state not in ("loaded", "masked"):
        audit.not_applicable(check, expected, f"the unit is {state}: see file {unit['fragment']}")


@boot_unit
def boot_unit_enabled(case, facts, audit):
    """`nvidia-gpu-limits.service: enabled` — the boot unit's file state (`systemctl show UnitFileState`) against the one the role sets: without it the power limits fall back to the card's defaults at the next boot.

    Modes: spec.
    """
    unit, shown = case.item, facts.gpu_boot_unit or {}
    check = f"{unit['name']}: enabled"
    loaded(audit, unit, shown, check, unit["enabled"])
    audit.expect(check, unit["enabled"], shown.get("UnitFileState") or UNSET)


@boot_unit
def boot_unit_last_run(case, facts, audit):
    """`nvidia-gpu-limits.service: last run` — the oneshot's last run (`Result`, `ExecMainStatus`, when it exited) and its state since, against a success that left it active (RemainAfterExit=yes).

    Modes: spec.

    A failed run names its result and exit status (`exit-code (status 1 at …)`: nvidia-smi failed, the
    driver was not up, a limit did not stick: `journalctl -u nvidia-gpu-limits` says which); a unit not
    run since boot, or stopped since, fails too: the role starts it, and the settings it applies are
    only known to hold while it is active.
    """
    unit, shown = case.item, facts.gpu_boot_unit or {}
    check = f"{unit['name']}: last run"
    loaded(audit, unit, shown, check, "success")
    if shown.get("LoadState") == "masked":
        audit.not_applicable(check, "success", f"the unit is masked: see {unit['name']}: enabled")
    actual = "success" if succeeded(unit, shown) else last_run(unit, shown)
    audit.expect(check, "success", actual, passed=actual == "success")


def succeeded(unit: dict, shown: dict) -> bool:
    return (shown.get("Result") == "success" and bool(shown.get("ExecMainExitTimestamp"))
            and shown.get("ActiveState") == unit["active_after_success"])


def last_run(unit: dict, shown: dict) -> str:
    """The last run in words: 'exit-code (status 1 at Wed 2026-12-02 06:06:34 UTC); inactive (dead)'."""
    result, exited = shown.get("Result") or "unknown", shown.get("ExecMainExitTimestamp")
    now = f"{shown.get('ActiveState') or 'unknown'} ({shown.get('SubState') or 'unknown'})"
    if not exited:
        return f"not run since boot; {now}" if shown.get("ActiveState") != "activating" else f"running now; {now}"
    if result == "success":
        return f"success at {exited}, not {unit['active_after_success']} since: {now}"
    return f"{result} (status {shown.get('ExecMainStatus') or '?'} at {exited}); {now}"
