"""The pytest plugin of the audit suite: each check's host, name, expected, actual and status.

Loaded with `-p provisioner.audit.plugin`. Writes every check's result, with its time (setup and call,
in seconds), to --audit-results (JSON) and, as checks finish, one progress line per check on stderr
(`@@audit {...}`), which the runner reads to move its progress bar. Status: passed, failed (the host
drifted), n/a (a skip whose reason starts with "not applicable:"), error (the check could not run).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from provisioner.audit.checks import NOT_APPLICABLE
from provisioner.audit.text import PROGRESS_PREFIX

RESULTS = pytest.StashKey[list]()
SETUP_SECONDS = pytest.StashKey[float]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("audit")
    group.addoption("--audit-targets", help="JSON file of the hosts to audit and their expectations")
    group.addoption("--audit-results", help="JSON file to write each check's result to")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "audit_each(items_of, ids): run the check once per item of each host")
    config.addinivalue_line("markers", "audit_no_cases: a check with nothing to check (deselected)")
    config.stash[RESULTS] = []



def emit(event: dict[str, Any]) -> None:
    sys.__stderr__.write(PROGRESS_PREFIX + json.dumps(event) + "\n")
    sys.__stderr__.flush()


def host_of(item: pytest.Item) -> str:
    case = getattr(item, "callspec", None) and item.callspec.params.get("case")
    return case.host if case is not None else "?"


def pytest_collection_finish(session: pytest.Session) -> None:
    emit({"collected": Counter(host_of(item) for item in session.items)})


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    if report.when == "setup":
        item.stash[SETUP_SECONDS] = report.duration
    if report.when == "call" or (report.when == "setup" and not report.passed):
        # the check's time: its setup (a host's first check waits there for the host's facts) and its call
        seconds = item.stash.get(SETUP_SECONDS, 0.0) + (report.duration if report.when == "call" else 0.0)
        result = check_result(item, report, call, seconds)
        item.config.stash[RESULTS].append(result)
        emit({"check": result})
    return report


def check_result(item: pytest.Item, report: pytest.TestReport, call: pytest.CallInfo,
                 seconds: float) -> dict[str, Any]:
    recorded = dict(item.user_properties)
    status, message = "passed", ""
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        status = "n/a" if reason.startswith(NOT_APPLICABLE) else "skipped"
        message = reason.removeprefix(NOT_APPLICABLE).strip()
    elif report.failed:
        error = call.excinfo.value if call.excinfo else None
        status = "failed" if isinstance(error, AssertionError) else "error"
        message = str(error) if error is not None else report.longreprtext[-500:]
    return {
        "id": item.nodeid,
        "host": host_of(item),
        "check": recorded.get("check", item.name),
        "expected": recorded.get("expected", ""),
        "actual": recorded.get("actual", "" if status != "error" else message),
        "status": status,
        "message": message,
        "seconds": round(seconds, 6),
    }


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = session.config.getoption("audit_results")
    if path:
        Path(path).write_text(json.dumps(session.config.stash[RESULTS], indent=1), encoding="utf-8")
