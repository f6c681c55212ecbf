"""Audit exit codes and reports (Rich table, JUnit XML with n/a as skipped, JSON), and the SSH masters."""

from __future__ import annotations

import json
import re
import time
import xml.etree.ElementTree as ElementTree

import pytest
from rich.console import Console

from provisioner.audit.engine import Facts, audit_facts
from provisioner.audit.registry import REPORTED, Case, make_check
from provisioner.audit.report import host_table, json_text, junit_text, summary, write_json, write_junit
from provisioner.audit.runner import CheckResult, HostReport, control_path, exit_code, say_lost, ssh_config_block
from provisioner.base.unreachable import LOST
from provisioner.fleet.remote import Connection


def report(host: str, *statuses: str, error: str | None = None) -> HostReport:
    checks = [CheckResult(host, f"check {index}", "1", "1" if status != "failed" else "60", status,
                          message="a container" if status == "n/a" else "boom" if status == "error" else "")
              for index, status in enumerate(statuses)]
    return HostReport(host, "192.0.2.1", checks, error)


@pytest.mark.parametrize("reports, code", [
    ([report("a", "passed", "n/a"), report("b", "passed")], 0),
    ([report("a", "passed", "failed"), report("b", "passed")], 1),
    ([report("a", "passed"), report("b", error="ssh: connect to host b port 22: No route to host")], 2),
    ([report("a", "failed"), report("b", error="ssh: no route")], 2),
    ([report("a", "passed", "error")], 2),
])
def test_exit_code_0_all_passed_1_drift_2_could_not_run(reports, code):
    assert exit_code({r.host: r for r in reports}) == code


def shown(table) -> str:
    console = Console(record=True, width=200)
    console.print(table)
    return console.export_text()


def test_table_shows_check_expected_actual_status_and_a_summary():
    text = shown(host_table(report("ws1", "passed", "failed", "n/a"), every_check=True))
    assert "ws1 (192.0.2.1) — drift: 1 passed, 1 failed, 1 n/a" in text
    assert all(column in text for column in ("check", "expected", "actual", "status"))
    row = next(line for line in text.splitlines() if "check 1" in line)
    assert [cell.strip() for cell in row.split("│")[1:5]] == ["check 1", "1", "60", "failed"]
    assert "check 0" in text and "check 2" in text


def test_by_default_only_what_did_not_pass_is_shown_under_the_summary():
    text = shown(host_table(report("ws1", "passed", "failed", "n/a", "error")))
    assert "ws1 (192.0.2.1) — could not run: 1 passed, 1 failed, 1 n/a, 1 error" in text  # a check errored
    assert re.findall(r"check \d", text) == ["check 1", "check 3"]
    assert shown(host_table(report("ws2", "passed", "n/a"))).strip() == "ws2 (192.0.2.1) — passed: 1 passed, 1 n/a"


def test_the_title_says_how_long_connecting_and_the_checks_took():
    timed = report("ws1", "passed", "n/a")
    timed.connect_seconds, timed.checks[0].seconds, timed.checks[1].seconds = 1.26, 0.0205, 0.0025
    assert shown(host_table(timed)).strip() == (
        "ws1 (192.0.2.1) — passed: 1 passed, 1 n/a (connected in 1.3 s, 2 checks in 23 ms)")


def test_summary_of_a_host_that_could_not_run_says_why():
    assert summary(report("b", error="ssh: no route")) == "could not run: ssh: no route"


def test_junit_has_a_suite_per_host_failures_skips_for_na_and_errors(tmp_path):
    reports = {"a": report("a", "passed", "failed", "n/a", "error"), "b": report("b", error="ssh: no route")}
    write_junit(reports, tmp_path / "audit.xml")
    suites = ElementTree.parse(tmp_path / "audit.xml").getroot().findall("testsuite")
    a, b = suites
    assert (a.get("name"), a.get("tests"), a.get("failures"), a.get("errors"), a.get("skipped")) == ("a", "4", "1", "1", "1")
    cases = a.findall("testcase")
    assert cases[0].find("failure") is None and cases[0].get("name") == "check 0"
    assert cases[1].find("failure").get("message") == "expected 1, actual 60"
    assert cases[2].find("skipped").get("message") == "a container"
    assert cases[3].find("error").get("message") == "boom"
    assert b.find("testcase").get("name") == "connect"
    assert b.find("testcase/error").get("message") == "ssh: no route"


def test_junit_cases_carry_their_time_and_expected_actual_status_properties_the_suite_the_sum():
    checks = [CheckResult("a", "passed one", "1", "1", "passed", seconds=0.25),
              CheckResult("a", "reported one", "(reported)", "vllm-x.service", "passed", seconds=0.5),
              CheckResult("a", "drifted", "1", "60", "failed", seconds=1.125),
              CheckResult("a", "live", "1", "n/a: a container", "n/a", "a container", seconds=0.002)]
    root = ElementTree.fromstring(junit_text({"a": HostReport("a", "192.0.2.1", checks, connect_seconds=0.75)}))
    (suite,) = root.findall("testsuite")
    assert suite.find("properties/property").attrib == {"name": "connect_seconds", "value": "0.750"}
    cases = suite.findall("testcase")
    assert [case.get("time") for case in cases] == ["0.250", "0.500", "1.125", "0.002"]
    assert [properties(case) for case in cases] == [
        {"expected": "1", "actual": "1", "status": "passed"},
        {"expected": "(reported)", "actual": "vllm-x.service", "status": "passed"},
        {"expected": "1", "actual": "60", "status": "failed"},
        {"expected": "1", "actual": "n/a: a container", "status": "n/a"}]
    assert suite.get("time") == "1.877" and root.get("time") == "1.877"
    assert cases[2].find("failure").get("message") == "expected 1, actual 60"  # kept beside the properties
    assert cases[3].find("skipped").get("message") == "a container"


def properties(case: ElementTree.Element) -> dict[str, str]:
    return {prop.get("name"): prop.get("value") for prop in case.findall("properties/property")}


# checks run by the engine: a passed, a reported, a drifted, an n/a and an errored row, with set times
def same(audit):
    audit.expect("same", "1", "1")


def reported(audit):
    audit.expect("vLLM units", REPORTED, ["vllm-a.service", "vllm-b.service"])


def drifted(audit):
    time.sleep(0.2)
    audit.expect("ExecStart", "vllm serve m", "vllm serve m --api-key sk-secret-in-a-row")


def in_a_container(audit):
    audit.not_applicable("sysctl live: vm.swappiness", "1", "a container shares its host's kernel")


def facts_unreadable(facts):
    raise RuntimeError("ssh: connection closed")


def slow_read() -> Facts:
    time.sleep(0.3)  # a host's first check counts the read of its facts
    return Facts(problems={})


def test_every_row_from_the_engine_reaches_json_and_junit_with_expected_actual_and_its_time():
    cases = [(found, Case("h", {}), f"timed::{found.name}[h]")
             for found in map(make_check, (same, reported, drifted, in_a_container, facts_unreadable))]
    host = HostReport("h", "192.0.2.1", list(audit_facts("h", {}, slow_read, cases)), connect_seconds=0.1)
    rows = {row["check"]: row for row in json.loads(json_text({"h": host}))["hosts"]["h"]["checks"]}
    assert {name: (row["expected"], row["actual"], row["status"]) for name, row in rows.items()} == {
        "same": ("1", "1", "passed"),
        "vLLM units": ("(reported)", "vllm-a.service, vllm-b.service", "passed"),
        "ExecStart": ("vllm serve m", "vllm serve m --api-key <redacted>", "failed"),
        "sysctl live: vm.swappiness": ("1", "n/a: a container shares its host's kernel", "n/a"),
        "facts_unreadable[h]": ("", "ssh: connection closed", "error"),
    }
    assert rows["same"]["seconds"] >= 0.3  # the read's wait counts
    assert rows["ExecStart"]["seconds"] >= 0.2
    assert all(0 <= row["seconds"] < 5 for row in rows.values())
    assert json.loads(json_text({"h": host}))["hosts"]["h"]["check_seconds"] == round(sum(r["seconds"] for r in rows.values()), 3)
    junit = junit_text({"h": host})
    assert "sk-secret-in-a-row" not in junit and "sk-secret-in-a-row" not in json_text({"h": host})
    cases = {case.get("name"): case for case in ElementTree.fromstring(junit).iter("testcase")}
    assert set(cases) == set(rows)
    for name, row in rows.items():
        assert properties(cases[name]) == {key: row[key] for key in ("expected", "actual", "status")}
        assert float(cases[name].get("time")) == pytest.approx(row["seconds"], abs=0.0005)
    assert cases["facts_unreadable[h]"].find("error").get("message") == "ssh: connection closed"


def test_json_has_the_exit_code_and_every_check(tmp_path):
    write_json({"a": report("a", "passed", "failed")}, tmp_path / "audit.json")
    data = json.loads((tmp_path / "audit.json").read_text())
    assert data["exit_code"] == 1
    assert data["hosts"]["a"]["status"] == "drift"
    assert [check["status"] for check in data["hosts"]["a"]["checks"]] == ["passed", "failed"]
    assert data["hosts"]["a"]["checks"][1] | {"id": ""} == {
        "host": "a", "check": "check 1", "expected": "1", "actual": "60", "status": "failed", "message": "", "id": "",
        "seconds": 0.0}
    assert (data["hosts"]["a"]["connect_seconds"], data["hosts"]["a"]["check_seconds"]) == (None, 0.0)


def test_one_master_socket_per_connection_never_shared_with_another_key_or_host():
    connection = Connection("192.0.2.1", "root", 22, "/keys/a", "/lab/known_hosts")
    block = ssh_config_block("ws1", connection)
    assert block.startswith("Host ws1\n  HostName 192.0.2.1\n")
    for option in ("ControlMaster auto", f'ControlPath "{control_path(connection)}"', "ControlPersist 120s",
                   "BatchMode yes", 'UserKnownHostsFile "/lab/known_hosts"', "StrictHostKeyChecking yes"):
        assert f"  {option}\n" in block
    assert control_path(connection) == control_path(Connection("192.0.2.1", "root", 22, "/keys/a", "/lab/known_hosts"))
    assert control_path(connection) != control_path(Connection("192.0.2.1", "root", 22, "/keys/a", "/other/known_hosts"))
    assert control_path(connection) != control_path(Connection("192.0.2.2", "root", 22, "/keys/a", "/lab/known_hosts"))


def test_a_host_lost_after_it_connected_is_one_reason_not_an_error_row_per_check():
    lost = f"{LOST} the host stopped answering: no answer for 15 s on the open connection"
    checks = [CheckResult("a", f"check {index}", "1", "", "error", message=lost) for index in range(75)]
    lost_report = HostReport("a", "192.0.2.1", checks)
    say_lost(lost_report)
    assert (lost_report.error, lost_report.checks) == (lost, [])
    assert exit_code({"a": lost_report}) == 2


@pytest.mark.parametrize("statuses", [("error", "passed"), ("error",)])
def test_a_check_that_errs_for_its_own_reason_keeps_its_row(statuses):
    """Only a host whose every check erred with the lost-host reason is collapsed."""
    kept = report("a", *statuses)
    say_lost(kept)
    assert kept.error is None and [check.status for check in kept.checks] == list(statuses)
