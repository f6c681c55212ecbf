"""Run one audit check function on facts made here, as the engine runs it: its status and its row."""

from __future__ import annotations

from typing import Any

from provisioner.audit.registry import Audit, CannotCheck, Case, Drift, NotApplicable


def run_row(check, case: Case, facts: Any) -> tuple[str, dict[str, str]]:
    """(status, {check, expected, actual}) of `check` on this case and these facts: passed, failed, n/a or error
    (it could not be checked)."""
    audit = Audit()
    try:
        check(case=case, facts=facts, audit=audit)
        status = "passed"
    except Drift:
        status = "failed"
    except NotApplicable:
        status = "n/a"
    except CannotCheck:
        status = "error"
    return status, audit.row
