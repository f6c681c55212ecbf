"""The `provision` command line, through Typer's CliRunner."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from provisioner.base.paths import EXAMPLES_DIR
from provisioner.cli.main import app
from provisioner.spec_docs import SCHEMA_FILE_NAME, example_with_modeline, schema_text
from tests.unit.conftest import UUID1, host, instance, spec_data, write_spec

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, [str(arg) for arg in args], env={"COLUMNS": "200", "NO_COLOR": "1"})


@pytest.fixture
def invalid_spec(tmp_path):
    data = spec_data(instances=[instance("chat", 8000, 0.6), instance("embed", 8000, 0.6)])
    return write_spec(tmp_path / "bad.yml", data)


INVALID_SPEC_PROBLEMS = [
    "instances[1].port: port 8000 on host ws4070 is already used by instance 'chat' (instances[0].port) "
    "— give each instance on a host its own port",
    "instances[1].gpu_memory_utilization: shares on GPU 0 of host ws4070 add up to 1.2 (limit 0.95) "
    "— lower gpu_memory_utilization of chat (0.6), embed (0.6) so they add up to at most 0.95",
]


def test_every_command_is_registered():
    result = invoke("--help")
    assert result.exit_code == 0
    for command in ("init", "inventory", "plan", "apply"):
        assert f" {command} " in result.output


def test_init_writes_the_example_and_refuses_to_overwrite(tmp_path):
    target = tmp_path / "fleet.yml"
    first = invoke("init", target)
    assert first.exit_code == 0, first.output
    assert target.read_text() == example_with_modeline()
    assert (tmp_path / SCHEMA_FILE_NAME).read_text() == schema_text()
    assert f"run `provision plan --spec {target}`" in first.output

    target.write_text("mine\n")
    second = invoke("init", target)
    assert second.exit_code == 1
    assert f"{target} already exists; pass --force to overwrite it" in second.output
    assert target.read_text() == "mine\n"

    forced = invoke("init", target, "--force")
    assert forced.exit_code == 0
    assert target.read_text() == example_with_modeline()


def test_init_defaults_to_provision_yml_in_the_current_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PROVISION_SPEC", raising=False)
    result = invoke("init")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "provision.yml").read_text() == example_with_modeline()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["provision.schema.json", "provision.yml", "secrets"]
    assert "run `provision plan`" in result.output  # found there without --spec


def test_the_untouched_example_plans_with_the_key_init_wrote_and_never_shows_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PROVISION_SPEC", raising=False)
    written = invoke("init")
    key = tmp_path / "secrets" / "qwen.key"
    assert "wrote secrets/qwen.key (a new random API key" in written.output
    assert (key.stat().st_mode & 0o777, key.parent.stat().st_mode & 0o777) == (0o600, 0o700)
    secret = key.read_text().strip()
    assert secret.startswith("sk-") and len(secret) > 40
    planned = invoke("plan")
    assert planned.exit_code == 0, planned.output
    assert "vllm-qwen7b.service" in planned.output and secret not in planned.output
    again = invoke("init", "--force")  # the spec written again; the key kept as it is
    assert again.exit_code == 0 and "qwen.key" not in again.output and key.read_text().strip() == secret


@pytest.mark.parametrize("where, message", [
    ("folder", "is a folder — name the spec file to write, e.g. "),
    ("provision.schema.json", "init writes the spec's JSON Schema under that name — choose another name"),
])
def test_init_refuses_a_path_it_cannot_write_the_spec_to(tmp_path, where, message):
    (tmp_path / "folder").mkdir()
    result = invoke("init", tmp_path / where)
    assert result.exit_code == 1
    assert message in result.output
    assert sorted(path.name for path in tmp_path.iterdir()) == ["folder"]


def test_inventory_writes_the_files(tmp_path):
    out = tmp_path / "inv"
    result = invoke("inventory", "--spec", EXAMPLES_DIR / "seed2-4070.yml", "-o", out)
    assert result.exit_code == 0, result.output
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.yml")) == [
        "group_vars/all.yml", "host_vars/ws4070.yml", "hosts.yml",
    ]
    assert f"wrote {out / 'host_vars' / 'ws4070.yml'}" in result.output.splitlines()


def test_inventory_reports_removed_host_vars(tmp_path):
    fits = [instance("chat", 8000, options={"max-model-len": 4096})]  # the gate refuses one that does not
    two = write_spec(tmp_path / "spec.yml", spec_data(hosts=[host(), host("ws3090", "192.0.2.10", gpus={})],
                                                      instances=fits))
    assert invoke("inventory", "--spec", two, "-o", tmp_path / "inv").exit_code == 0
    write_spec(two, spec_data(instances=fits))
    result = invoke("inventory", "--spec", two, "-o", tmp_path / "inv")
    assert result.exit_code == 0
    assert f"removed {tmp_path / 'inv' / 'host_vars' / 'ws3090.yml'} (host no longer in the spec)" in result.output


def test_invalid_spec_exits_1_lists_every_problem_and_writes_nothing(invalid_spec, tmp_path):
    result = invoke("inventory", "--spec", invalid_spec, "-o", tmp_path / "inv")
    assert result.exit_code == 1
    assert result.output.splitlines() == [f"{invalid_spec}: 2 problems", *INVALID_SPEC_PROBLEMS]
    assert not (tmp_path / "inv").exists()


def test_plan_of_an_invalid_spec_exits_1_with_the_problems(invalid_spec):
    result = invoke("plan", "--spec", invalid_spec)
    assert result.exit_code == 1
    assert result.output.splitlines()[1:] == INVALID_SPEC_PROBLEMS


def test_plan_yaml_error_exits_1(tmp_path):
    path = tmp_path / "spec.yml"
    path.write_text("version: 1\nhosts: [\n")
    result = invoke("plan", "--spec", path)
    assert result.exit_code == 1
    assert result.output.splitlines()[1] == (
        "spec.yml:3:1: expected the node content, but found '<stream end>' (while parsing a flow node) "
        "— fix the YAML syntax"
    )


def test_plan_shows_sysctls_files_units_and_environment():
    result = invoke("plan", "--spec", EXAMPLES_DIR / "seed1-3090.yml")
    assert result.exit_code == 0, result.output
    lines = [line.strip() for line in result.output.splitlines()]
    assert "ws3090 (192.0.2.10)" in result.output
    assert any(line.startswith("│ vm.swappiness") and line.endswith("│ 1     │") for line in lines)
    assert "/etc/fstab: tmpfs /dev/shm tmpfs defaults,nosuid,nodev,size=16G 0 0" in lines
    assert "/etc/systemd/system/vllm-qwen7b.service (mode 0644, role vllm_service)" in lines
    assert "ExecStart=/opt/vllm/venvs/0.25.0/bin/vllm serve --config /etc/vllm/qwen7b.yaml" in lines
    assert "/etc/vllm/qwen7b.yaml (mode 0644, role vllm_service)" in lines
    assert "max-num-seqs: 128" in lines
    assert "/etc/vllm/qwen7b.env (mode 0600, role vllm_service)" in lines
    assert any("CUDA_VISIBLE_DEVICES" in line and "GPU-5e3c1a2b-7d4f-4c1e-9a8b-3f2e1d0c9b8a" in line for line in lines)
    assert "fake-example-key-seed1" not in result.output


def test_plan_of_named_hosts_only(tmp_path):
    data = spec_data(hosts=[host(), host("ws3090", "192.0.2.10", gpus={"devices": [{"index": 0, "uuid": UUID1}]})],
                     instances=[instance("chat", 8000), instance("qwen", 8000, on="ws3090")])
    path = write_spec(tmp_path / "spec.yml", data)
    result = invoke("plan", "ws3090", "--spec", path)
    assert result.exit_code == 0, result.output
    assert "vllm-qwen.service" in result.output
    assert "vllm-chat.service" not in result.output

    unknown = invoke("plan", "ws9999", "--spec", path)
    assert unknown.exit_code == 2
    assert unknown.output.strip() == f"no host or group 'ws9999' in {path} — hosts: ws4070, ws3090 (or all)"


def test_every_command_and_group_is_described_and_no_help_sends_users_to_source_paths():
    """An installed user has no checkout: help names commands and docs/, never a module, a test fixture or a role's
    files; every command and group has a line in `provision --help`."""
    import click
    from typer.main import get_command

    root = get_command(app)
    seen = []

    def walk(command: click.Command, path: list[str]) -> None:
        seen.append((path, command))
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, [*path, name])

    walk(root, [])
    for path, command in seen[1:]:
        assert (command.short_help or command.help or "").strip(), f"provision {' '.join(path)} has no description"
    for path, command in seen:
        texts = [command.help or "", *(getattr(param, "help", "") or "" for param in command.params)]
        for text in texts:
            assert not re.search(r"\b(provisioner|tests|roles|plugins)/", text), (path, text)
