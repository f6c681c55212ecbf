"""The audit's reports: a Rich table per host, JUnit XML (n/a as skipped) and JSON."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ElementTree
from dataclasses import asdict, replace
from pathlib import Path

from rich.table import Table
from rich.text import Text

from provisioner.audit.runner import HostReport, exit_code
from provisioner.secrets import redact

STATUS_STYLE = {"passed": "green", "failed": "bold red", "n/a": "cyan", "error": "bold red", "skipped": "yellow"}
COUNTED = ("passed", "failed", "n/a", "error")


def redacted(report: HostReport) -> HostReport:
    """The report as every output shows it: secrets in a check's values, its message or the host's
    error (e.g. pytest's or ssh's own words) redacted."""
    checks = [replace(check, check=redact(check.check), expected=redact(check.expected), actual=redact(check.actual),
                      message=redact(check.message)) for check in report.checks]
    return replace(report, checks=checks, error=None if report.error is None else redact(report.error))


def summary(report: HostReport) -> str:
    """'drift: 50 passed, 1 failed, 5 n/a' or 'could not run: <why>'."""
    if report.error is not None:
        return f"could not run: {redact(report.error)}"
    counts = ", ".join(f"{report.count(status)} {status}" for status in COUNTED if report.count(status))
    return f"{report.status}: {counts or 'no checks'}"


def host_table(report: HostReport, every_check: bool = False) -> Table | Text:
    """The host's checks that did not pass (every check with `every_check`) under its summary line;
    the summary line alone when there are none to show."""
    report = redacted(report)
    title = f"{report.host} ({report.address}) — {summary(report)}"
    shown = [check for check in report.checks if every_check or check.status in ("failed", "error")]
    if not shown:
        return Text(title, style="green" if report.status == "passed" else "")
    table = Table(title=title, title_justify="left", min_width=len(title))
    for column in ("check", "expected", "actual", "status"):
        table.add_column(column, overflow="fold")
    for check in shown:
        table.add_row(Text(check.check), Text(check.expected), Text(check.actual),
                      Text(check.status, style=STATUS_STYLE.get(check.status, "")))
    return table


def write_junit(reports: dict[str, HostReport], path: Path) -> None:
    Path(path).write_text(junit_text(reports), encoding="utf-8")


def junit_text(reports: dict[str, HostReport]) -> str:
    """One <testsuite> per host, one <testcase> per check; a host that could not run: one errored case."""
    suites = ElementTree.Element("testsuites", name="provision audit")
    for report in map(redacted, reports.values()):
        suite = ElementTree.SubElement(suites, "testsuite", name=report.host, hostname=report.address)
        if report.error is not None:
            case = ElementTree.SubElement(suite, "testcase", classname=report.host, name="connect")
            ElementTree.SubElement(case, "error", message=report.error)
        for check in report.checks:
            case = ElementTree.SubElement(suite, "testcase", classname=report.host, name=check.check)
            if check.status == "failed":
                ElementTree.SubElement(case, "failure", message=f"expected {check.expected}, actual {check.actual}")
            elif check.status == "error":
                ElementTree.SubElement(case, "error", message=check.message)
            elif check.status in ("n/a", "skipped"):
                ElementTree.SubElement(case, "skipped", message=check.message)
        cases = suite.findall("testcase")
        suite.set("tests", str(len(cases)))
        for kind, attribute in (("failure", "failures"), ("error", "errors"), ("skipped", "skipped")):
            suite.set(attribute, str(sum(case.find(kind) is not None for case in cases)))
    ElementTree.indent(suites)
    return "<?xml version='1.0' encoding='utf-8'?>\n" + ElementTree.tostring(suites, encoding="unicode") + "\n"


def write_json(reports: dict[str, HostReport], path: Path) -> None:
    Path(path).write_text(json_text(reports), encoding="utf-8")


def json_text(reports: dict[str, HostReport]) -> str:
    data = {
        "exit_code": exit_code(reports),
        "hosts": {name: {**asdict(redacted(report)), "status": report.status} for name, report in reports.items()},
    }
    return json.dumps(data, indent=2) + "\n"
