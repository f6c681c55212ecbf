"""`provision audit`'s command line: what it refuses (exit 2: the audit could not run) before touching a host."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from provisioner.cli.audit_cmd import host_target
from provisioner.cli.main import app
from tests.unit.conftest import instance, spec_data, write_spec

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(arg) for arg in args], env={"COLUMNS": "200", "NO_COLOR": "1"})


def test_audit_is_a_command():
    assert " audit " in invoke("--help").output


@pytest.mark.parametrize("args, message", [
    ((), "give a spec file, or --host ssh://user@address"),
    (("spec.yml", "--host", "ssh://root@192.0.2.1"), "give a spec file, or --host ssh://user@address"),
    (("--host", "http://192.0.2.1"), "--host 'http://192.0.2.1': write ssh://user@address[:port]"),
    (("--host", "ssh://root@192.0.2.1", "--profile", "strict"), "no profile named 'strict'; profiles: recommended"),
])
def test_usage_problems_exit_2_with_a_message(args, message):
    result = invoke("audit", *args)
    assert result.exit_code == 2
    assert message in result.output


def test_an_invalid_spec_exits_2_not_1_which_means_drift(tmp_path):
    spec = write_spec(tmp_path / "bad.yml", spec_data(instances=[instance("a", 8000), instance("b", 8000)]))
    result = invoke("audit", spec)
    assert result.exit_code == 2
    assert "instances[1].port" in result.output


def test_an_unknown_limit_exits_2(tmp_path):
    spec = write_spec(tmp_path / "spec.yml", spec_data())
    result = invoke("audit", spec, "--limit", "nope")
    assert result.exit_code == 2
    assert "no host named 'nope'" in result.output


def test_host_url_gives_user_port_and_sudo_for_a_user_other_than_root(tmp_path):
    target = host_target("ssh://admin@192.0.2.7:2222", Path("id_ed25519"), None)
    assert target.name == "192.0.2.7"
    connection = target.connection
    assert (connection.address, connection.user, connection.port, connection.sudo) == ("192.0.2.7", "admin", 2222, True)
    assert connection.key == str(Path("id_ed25519").absolute())
    assert host_target("192.0.2.8", None, None).connection.user == "root"
