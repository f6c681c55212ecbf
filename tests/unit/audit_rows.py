"""Run one audit check function on facts made here, as the engine runs it: its status and its row."""

from __future__ import annotations

from typing import Any

from provisioner.audit.engine import run_case
from provisioner.audit.registry import Audit, Case, Drift, NotApplicable, Unknown, make_check


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
    except Unknown:
        status = "error"
    return status, audit.row


def run_check(function, item, facts, target: dict[str, Any] | None = None) -> tuple[str, dict[str, str]]:
    """(status, row) of one check function on `item` as the engine runs it: passed, failed, n/a or error (`facts`:
    an engine.Facts, its `problems` too)."""
    result = run_case(make_check(function), Case("h", target or {}, item), "t", facts)
    return result.status, {"check": result.check, "expected": result.expected, "actual": result.actual}
