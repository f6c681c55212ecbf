"""The audit's reports: a Rich table per host, JUnit XML (n/a as skipped) and JSON; both files hold every
check's expected, actual, status and time."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ElementTree
from dataclasses import asdict, replace
from pathlib import Path

from rich.table import Table
from rich.text import Text

from provisioner.audit.runner import HostReport, exit_code
from provisioner.base.secrets import redact

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


def timing(report: HostReport) -> str:
    """' (connected in 0.4 s, 54 checks in 23 ms)' for a host the audit reached; '' for one it did not time."""
    if report.connect_seconds is None:
        return ""
    checks = f", {len(report.checks)} checks in {duration(report.check_seconds)}" if report.checks else ""
    return f" (connected in {duration(report.connect_seconds)}{checks})"


def duration(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.1f} s"


def host_table(report: HostReport, every_check: bool = False) -> Table | Text:
    """The host's checks that did not pass (every check with `every_check`) under its summary line;
    the summary line alone when there are none to show."""
    report = redacted(report)
    title = f"{report.host} ({report.address}) — {summary(report)}{timing(report)}"
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
    """One <testsuite> per host, one <testcase> per check with its time and, for every check (passed and
    reported ones too), <properties> expected, actual and status; a host that could not run: one errored
    case. The suite's time is the sum of its cases'; its connect time is a suite property."""
    suites = ElementTree.Element("testsuites", name="provision audit")
    for report in map(redacted, reports.values()):
        suite = ElementTree.SubElement(suites, "testsuite", name=report.host, hostname=report.address)
        if report.connect_seconds is not None:
            properties = ElementTree.SubElement(suite, "properties")
            ElementTree.SubElement(properties, "property", name="connect_seconds",
                                   value=seconds_text(report.connect_seconds))
        if report.error is not None:
            case = ElementTree.SubElement(suite, "testcase", classname=report.host, name="connect",
                                          time=seconds_text(report.connect_seconds or 0.0))
            ElementTree.SubElement(case, "error", message=report.error)
        for check in report.checks:
            case = ElementTree.SubElement(suite, "testcase", classname=report.host, name=check.check,
                                          time=seconds_text(check.seconds))
            properties = ElementTree.SubElement(case, "properties")
            for name in ("expected", "actual", "status"):
                ElementTree.SubElement(properties, "property", name=name, value=getattr(check, name))
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
        suite.set("time", seconds_text(sum(float(case.get("time")) for case in cases)))
    suites.set("time", seconds_text(sum(float(suite.get("time")) for suite in suites)))
    ElementTree.indent(suites)
    return "<?xml version='1.0' encoding='utf-8'?>\n" + ElementTree.tostring(suites, encoding="unicode") + "\n"


def seconds_text(seconds: float) -> str:
    """A time as JUnit's time= attributes hold it: seconds, to the millisecond."""
    return f"{seconds:.3f}"


def write_json(reports: dict[str, HostReport], path: Path) -> None:
    Path(path).write_text(json_text(reports), encoding="utf-8")


def json_text(reports: dict[str, HostReport]) -> str:
    """The exit code; per host its status, connect_seconds, check_seconds (the sum of its checks') and every
    check with its expected, actual, status, message and seconds."""
    data = {
        "exit_code": exit_code(reports),
        "hosts": {name: {**asdict(redacted(report)), "status": report.status,
                         "check_seconds": round(report.check_seconds, 3)}
                  for name, report in reports.items()},
    }
    return json.dumps(data, indent=2) + "\n"
