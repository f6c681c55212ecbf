"""`provision audit`'s command line: what it refuses (exit 2: the audit could not run) before touching a host."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest
from typer.testing import CliRunner

from provisioner.cli.audit_cmd import host_target
from provisioner.cli.main import app
from tests.unit.conftest import host, instance, spec_data, write_spec

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(arg) for arg in args], env={"COLUMNS": "200", "NO_COLOR": "1"})


def test_audit_is_a_command():
    assert " audit " in invoke("--help").output


@pytest.mark.parametrize("args, message", [
    (("host", "ssh://root@192.0.2.1", "--spec", "spec.yml"), "No such option: --spec"),
    (("host", "gpu1", "ssh://root@192.0.2.1"), "unexpected extra argument"),
    (("host", "http://192.0.2.1"), "audit host 'http://192.0.2.1': write ssh://user@address[:port]"),
    (("host", "ssh://root@192.0.2.1", "--profile", "strict"), "no profile named 'strict'; profiles: recommended"),
    (("host", "ssh://root@192.0.2.1", "--json", "-", "--junit", "-"), "--json - and --junit - would both write to stdout"),
    (("spec", "--json", "-", "--junit", "-"), "--json - and --junit - would both write to stdout"),
])
def test_usage_problems_exit_2_with_a_message(args, message):
    result = invoke("audit", *args)
    assert result.exit_code == 2
    assert message in result.output


def test_no_spec_anywhere_exits_2_naming_the_ways_to_give_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PROVISION_SPEC", raising=False)
    result = invoke("audit", "spec")
    assert result.exit_code == 2
    for way in ("--spec FILE", "$PROVISION_SPEC", "./provision.yml", "provision init",
                "provision audit host ssh://user@address"):
        assert way in result.output


def invalid_spec(path: Path) -> Path:
    return write_spec(path, spec_data(instances=[instance("a", 8000), instance("b", 8000)]))


@pytest.mark.parametrize("how", ["--spec", "-s", "$PROVISION_SPEC", "./provision.yml"])
def test_the_spec_is_found_by_option_environment_or_current_folder(how, tmp_path, monkeypatch):
    """Each way reads the spec: an invalid one is reported (exit 2: 1 would read as drift), no host touched."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PROVISION_SPEC", raising=False)
    spec = invalid_spec(tmp_path / ("provision.yml" if how == "./provision.yml" else "mine.yml"))
    args, env = {"--spec": (["--spec", spec], {}), "-s": (["-s", spec], {}),
                 "$PROVISION_SPEC": ([], {"PROVISION_SPEC": str(spec)}), "./provision.yml": ([], {})}[how]
    result = runner.invoke(app, ["audit", "spec", *map(str, args)], env={"COLUMNS": "200", "NO_COLOR": "1", **env})
    assert result.exit_code == 2
    assert f"{spec.name if how == './provision.yml' else spec}: 1 problem" in result.output
    assert "instances[1].port" in result.output


def test_an_unknown_host_or_group_exits_2_listing_the_hosts_and_groups(tmp_path):
    spec = write_spec(tmp_path / "spec.yml", spec_data(hosts=[host(groups=["rack_a"])]))
    result = invoke("audit", "spec", "--spec", spec, "ws4070", "nope")
    assert result.exit_code == 2
    assert "no host or group 'nope'" in result.output
    assert "hosts: ws4070; groups: rack_a" in result.output


def run_audit(*args: str) -> subprocess.CompletedProcess:
    """`provision audit` as a user runs it in a pipe (stdout and stderr not a terminal)."""
    return subprocess.run([sys.executable, "-m", "provisioner.cli.main", "audit", *args],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "80"})


# a real ssh to a loopback port where nothing listens: refused at once, so the audit could not run (exit 2)
REFUSED = "ssh://root@127.0.0.1:1"


def test_json_dash_writes_the_report_to_stdout_and_nothing_else(tmp_path):
    result = run_audit("host", REFUSED, "--json", "-", "--junit", str(tmp_path / "audit.xml"))
    assert result.returncode == 2
    report = json.loads(result.stdout)  # the whole of stdout is the report
    assert report["exit_code"] == 2
    assert report["hosts"]["127.0.0.1"]["status"] == "could not run"
    assert "Connection refused" in report["hosts"]["127.0.0.1"]["error"]
    assert "127.0.0.1 (127.0.0.1): could not run" in result.stderr  # the human summary: on stderr
    assert not (tmp_path / "-").exists() and not Path("-").exists()
    assert ElementTree.parse(tmp_path / "audit.xml").getroot().find("testsuite").get("name") == "127.0.0.1"


def test_junit_dash_writes_the_xml_to_stdout(tmp_path):
    result = run_audit("host", REFUSED, "--junit", "-", "--json", str(tmp_path / "audit.json"))
    assert result.returncode == 2
    suite = ElementTree.fromstring(result.stdout).find("testsuite")
    assert (suite.get("name"), suite.get("errors")) == ("127.0.0.1", "1")
    assert json.loads((tmp_path / "audit.json").read_text())["exit_code"] == 2


def test_host_url_gives_user_port_and_sudo_for_a_user_other_than_root(tmp_path):
    target = host_target("ssh://admin@192.0.2.7:2222", Path("id_ed25519"), None)
    assert target.name == "192.0.2.7"
    connection = target.connection
    assert (connection.address, connection.user, connection.port, connection.sudo) == ("192.0.2.7", "admin", 2222, True)
    assert connection.key == str(Path("id_ed25519").absolute())
    assert host_target("192.0.2.8", None, None).connection.user == "root"
