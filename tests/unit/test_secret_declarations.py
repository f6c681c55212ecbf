"""Secrets by declaration (issue 34): an env value is secret because the spec says where it comes from
(`{file: PATH}`, `{env: NAME}`), never because of its name; an inline value whose name looks secret is refused
with the syntax to use; every declared value is redacted wherever it appears (plan, plan --json, errors, any
text); the inventory holds where each comes from, never the value, in 0600 files under 0700 folders."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from provisioner.base.secrets import REDACTED, redact, redact_argv
from provisioner.cli.main import app
from provisioner.fleet.inventory import build_inventory, write_inventory
from provisioner.plan import build_plan
from provisioner.spec import validate_spec
from tests.unit.conftest import instance, problems_of, spec_data, write_spec

FILE_SECRET = "db-pass-planted-7f3a91"  # in a file beside the spec
ENV_SECRET = "ghp-planted-env-52c0d8"  # in the controller's environment
KEY_SECRET = "sk-planted-apikey-e41b6"  # the instance's api_key_file
VARIABLE = "VP_TEST_PLANTED_PAT"


@pytest.fixture
def secret_spec(tmp_path, monkeypatch):
    """A spec beside its secrets folder: DB_CONN (a name no rule finds secret) from a file, GITHUB_PAT from the
    controller's environment, the API key from api_key_file."""
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "db_conn").write_text(FILE_SECRET + "\n")
    (tmp_path / "secrets" / "chat.key").write_text(KEY_SECRET + "\n")
    monkeypatch.setenv(VARIABLE, ENV_SECRET)
    env = {"HF_HUB_OFFLINE": "1", "DB_CONN": {"file": "secrets/db_conn"}, "GITHUB_PAT": {"env": VARIABLE}}
    data = spec_data(instances=[instance("chat", 8000, env=env, api_key_file="secrets/chat.key",
                                         options={"max-model-len": 4096})])
    return write_spec(tmp_path / "provision.yml", data)


def invoke(*args):
    return CliRunner().invoke(app, [str(arg) for arg in args], env={"COLUMNS": "200", "NO_COLOR": "1"})


# --------------------------------------------------------------------------- the declaration


def test_a_secret_is_declared_by_where_it_comes_from(tmp_path, monkeypatch):
    (tmp_path / "db.pass").write_text("p\n")
    monkeypatch.setenv(VARIABLE, "v")
    data = spec_data(instances=[instance("chat", 8000, env={
        "PLAIN": "1", "DB_PASS": {"file": "db.pass"}, "GITHUB_PAT": {"env": VARIABLE}})])
    (chat,) = validate_spec(data, base_dir=tmp_path).instances
    assert chat.serve_env == {"PLAIN": "1"}
    assert {name: source.model_dump() for name, source in chat.secret_env.items()} == {
        "DB_PASS": {"file": str(tmp_path / "db.pass"), "env": None, "vault": None},
        "GITHUB_PAT": {"file": None, "env": VARIABLE, "vault": None}}


@pytest.mark.parametrize(("value", "message"), [
    ({"file": "a", "env": "B"}, "instances[0].env.X: give one of file:, env: or vault:"),
    ({}, "instances[0].env.X: give one of file:, env: or vault:"),
    ({"vault": "x"}, "instances[0].env.X.vault: not a vault-encrypted value"),
    ({"secret": "x"}, "instances[0].env.X.secret: unknown key"),
    ({"env": "not a name"}, "instances[0].env.X.env: String should match pattern"),
    (1, "instances[0].env.X: expected a string, got 1"),
])
def test_a_declaration_names_one_source(value, message):
    problems = problems_of(spec_data(instances=[instance("chat", 8000, env={"X": value})]))
    assert any(problem.startswith(message) for problem in problems), problems


@pytest.mark.parametrize("name", ["DB_PASS", "GITHUB_PAT", "MY_CREDENTIALS", "HF_TOKEN", "S3_SECRET", "DB_PASSWORD"])
def test_an_inline_value_whose_name_looks_secret_is_refused_with_the_syntax_to_use(name):
    problems = problems_of(spec_data(instances=[instance("chat", 8000, env={name: "in-clear-9b1"})]))
    (problem,) = problems
    assert problem.startswith(f"instances[0].env.{name}: '{name}' looks like a secret")
    assert f"`{name}: {{file: secrets/{name.lower()}}}`" in problem and f"`{name}: {{env: {name}}}`" in problem
    assert f"`{name}: !vault |` as `ansible-vault encrypt_string --name {name}` prints it" in problem
    assert "in-clear-9b1" not in problem


def test_an_unset_variable_and_a_missing_file_are_named_never_a_value(tmp_path, monkeypatch):
    monkeypatch.delenv(VARIABLE, raising=False)
    (tmp_path / "two-lines").write_text("first-line-3c1\nsecond\n")
    data = spec_data(instances=[instance("chat", 8000, env={
        "A": {"env": VARIABLE}, "B": {"file": "missing"}, "C": {"file": "two-lines"}})])
    problems = problems_of(data, base_dir=tmp_path)
    assert len(problems) == 3
    assert any(problem.startswith(f"instances[0].env.A: {VARIABLE} is not set in the controller's environment")
               for problem in problems)
    assert any(problem.startswith(f"instances[0].env.B.file: {tmp_path / 'missing'} does not exist") for problem in problems)
    assert any(problem.startswith(f"instances[0].env.C: the value in the file {tmp_path / 'two-lines'} is not one line")
               for problem in problems)
    assert not any("first-line-3c1" in problem for problem in problems)


# --------------------------------------------------------------------------- redaction by value


def test_a_declared_value_is_redacted_wherever_it_appears_whatever_names_it(secret_spec):
    from provisioner.spec import load_spec

    load_spec(secret_spec)
    for secret in (FILE_SECRET, ENV_SECRET, KEY_SECRET):
        assert redact(f"connect postgres://u@db?x={secret}&y=1 then {secret}") == (
            f"connect postgres://u@db?x={REDACTED}&y=1 then {REDACTED}")
        assert redact_argv(["tool", secret, f"--opt={secret}"]) == ["tool", REDACTED, f"--opt={REDACTED}"]


def test_plan_and_plan_json_show_where_a_secret_comes_from_never_its_value(secret_spec):
    shown = invoke("plan", "--spec", secret_spec)
    as_json = invoke("plan", "--json", "--spec", secret_spec)
    assert shown.exit_code == 0, shown.output
    assert as_json.exit_code == 0, as_json.output
    for output in (shown.output, as_json.output):
        for secret in (FILE_SECRET, ENV_SECRET, KEY_SECRET):
            assert secret not in output
    assert f"DB_CONN=<redacted: {len(FILE_SECRET)} bytes from" in shown.output
    assert f"GITHUB_PAT=<redacted: from the controller's ${VARIABLE}>" in shown.output
    json.loads(as_json.output)


def test_the_unit_sets_no_secret_the_env_file_holds_them(secret_spec):
    from provisioner.spec import load_spec

    (host,) = build_plan(load_spec(secret_spec))
    (unit,) = host.units
    assert "DB_CONN" not in unit.unit.content and "GITHUB_PAT" not in unit.unit.content
    assert "Environment=HF_HUB_OFFLINE=1" in unit.unit.content
    assert unit.env_file.mode == "0600"
    assert "DB_CONN=<redacted" in unit.env_file.content and "GITHUB_PAT=<redacted" in unit.env_file.content


# --------------------------------------------------------------------------- the inventory


def test_the_inventory_holds_where_each_secret_comes_from(secret_spec, tmp_path):
    from provisioner.spec import load_spec

    files = build_inventory(load_spec(secret_spec), tmp_path / "inventory")
    (entry,) = files["host_vars/ws4070.yml"]["vllm_service_instances"]
    assert entry["env"] == {"HF_HUB_OFFLINE": "1"}
    assert entry["secret_env"] == {"DB_CONN": {"file": "{{ inventory_dir }}/../secrets/db_conn"},
                                   "GITHUB_PAT": {"env": VARIABLE}}


def test_no_written_inventory_file_holds_a_secret_and_only_its_owner_reads_them(secret_spec, tmp_path):
    out = tmp_path / "inventory"
    result = invoke("inventory", "--spec", secret_spec, "-o", out)
    assert result.exit_code == 0, result.output
    written = [path for path in out.rglob("*") if path.is_file()]
    assert len(written) == 3
    for path in written:
        text = path.read_text()
        assert not any(secret in text for secret in (FILE_SECRET, ENV_SECRET, KEY_SECRET)), path
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    for folder in [out, *(path for path in out.rglob("*") if path.is_dir())]:
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder


def test_an_inventory_written_again_into_an_open_folder_is_made_private(secret_spec, tmp_path):
    from provisioner.spec import load_spec

    out = tmp_path / "inventory"
    (out / "host_vars").mkdir(parents=True)
    (out / "host_vars").chmod(0o755)
    out.chmod(0o755)
    previous = os.umask(0o022)
    try:
        write_inventory(load_spec(secret_spec), out)
    finally:
        os.umask(previous)
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    assert stat.S_IMODE((out / "host_vars").stat().st_mode) == 0o700
    assert stat.S_IMODE((out / "host_vars" / "ws4070.yml").stat().st_mode) == 0o600


def test_a_spec_problem_never_shows_a_declared_value(tmp_path, monkeypatch):
    """The secrets are declared before the checks across fields run: a problem quoting a value redacts it."""
    monkeypatch.setenv(VARIABLE, ENV_SECRET)
    data = spec_data(instances=[instance("chat", 8000, env={"TOKEN_ID": {"env": VARIABLE}},
                                         options={"served-model-name": ENV_SECRET, "api-key": "x"})])
    result = invoke("plan", "--spec", write_spec(tmp_path / "provision.yml", data))
    assert result.exit_code == 1, result.output
    assert "api-key" in result.output and ENV_SECRET not in result.output
