"""No value of the spec can add a line or a word to what the roles write (issue 13, part 2).

Each string field of the spec gets each nasty value: either the spec is refused with the field's path and
why, or the plan renders it so that the target program reads back exactly the value (the unit as systemd
splits it, the config and compose files as YAML, the quadlet's health command as sh splits it). The role's
own preflight refuses what the spec refuses, and accepts what the spec accepts.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import unicodedata
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from provisioner.base.file_formats import systemd_words
from provisioner.base.paths import ROLES_DIR, collections_dir
from provisioner.cli.main import app
from provisioner.fleet.inventory import host_vars
from provisioner.plan import build_plan
from provisioner.spec import SpecError, validate_spec
from tests.injection_values import CONTROL, LINE_BREAKING, NASTY, QUOTED, REFUSED
from tests.unit.conftest import host, instance, spec_data, write_spec


def _served_model_name(value: str) -> dict:
    return spec_data(instances=[instance("chat", 8000, options={"served-model-name": value})])


# field path -> spec data with the value in that field
FIELDS = {
    "instances[0].model": lambda value: spec_data(instances=[instance("chat", 8000, model=value)]),
    "instances[0].env.FOO": lambda value: spec_data(instances=[instance("chat", 8000, env={"FOO": value})]),
    "instances[0].options.served-model-name": _served_model_name,
    "instances[0].options.served-model-name[1]": lambda value: spec_data(instances=[instance(
        "chat", 8000, options={"served-model-name": ["chat", value]})]),
    "instances[0].options.chat-template": lambda value: spec_data(instances=[instance(
        "chat", 8000, options={"chat-template": value})]),
    "instances[0].options.compilation-config.backend": lambda value: spec_data(instances=[instance(
        "chat", 8000, options={"compilation-config": {"backend": value}})]),
    "hosts[0].gpus.devices[0].model": lambda value: spec_data(hosts=[host(gpus={"devices": [
        {"index": 0, "uuid": "GPU-00000000-0000-4000-8000-000000000000", "model": value}]})]),
    "hosts[0].ssh.user": lambda value: spec_data(hosts=[host(ssh={"user": value})]),
    "hosts[0].vllm.install_path": lambda value: spec_data(hosts=[host(vllm={"install_path": "/opt/" + value})]),
    "hosts[0].vllm.index_url": lambda value: spec_data(hosts=[host(vllm={"index_url": "https://pypi.example/" + value})]),
    "hosts[0].settings.sysctls['net.core.x']": lambda value: spec_data(hosts=[host(
        settings={"sysctls": {"net.core.x": value}})]),
}


def _problems(data: dict) -> list[str] | None:
    """The problems validation reports, or None when the spec is valid."""
    try:
        validate_spec(data, check_files=False)
    except SpecError as error:
        return [str(problem) for problem in error.problems]
    return None


def _refused(data: dict, value: str) -> bool:
    """Whether the spec refuses it: always for a control character, else only by a field's own rule
    (e.g. an option value starting with '-'), never by the text check."""
    problems = _problems(data)
    if value in REFUSED:
        assert problems, f"{value!r} was accepted"
    else:
        assert not [problem for problem in problems or [] if ": contains " in problem], problems
    return problems is not None


def _unit_command_words(line: str) -> list[str]:
    """A unit's command line as systemd reads it: %% undone, words split (quotes, escapes), $$ undone."""
    words = systemd_words(line.replace("%%", "%"))
    assert words is not None, f"systemd would refuse {line!r}"
    return [word.replace("$$", "$") for word in words]


def _setting(content: str, key: str) -> str:
    lines = [line for line in content.splitlines() if line.startswith(f"{key}=")]
    assert len(lines) == 1, f"{key}= lines: {lines}"
    return lines[0].removeprefix(f"{key}=")


def _rendered_exactly(path: str, value: str, data: dict) -> None:
    """The plan's files carry exactly `value` for the field at `path`, and add no line."""
    (plan,) = build_plan(validate_spec(data, check_files=False))
    for unit in plan.units:
        config = yaml.safe_load(unit.config_file.content)
        words = _unit_command_words(_setting(unit.unit.content, "ExecStartPost"))
        served = words[words.index("--model") + 1]
        if path == "instances[0].model":
            assert config["model"] == value
            assert served == value
            assert _setting(unit.unit.content, "Description").replace("%%", "%") == \
                f"vLLM chat: {value} on port 8000"
        elif path == "instances[0].env.FOO":
            assert unit.environment["FOO"] == value
        elif path.startswith("instances[0].options.served-model-name"):
            assert config["served-model-name"] in (value, ["chat", value])
            assert served == (value if path.endswith("name") else "chat")
        elif path == "instances[0].options.chat-template":
            assert config["chat-template"] == value
        elif path == "instances[0].options.compilation-config.backend":
            assert json.loads(config["compilation-config"]) == {"backend": value}
        elif path == "hosts[0].vllm.install_path":
            assert _unit_command_words(_setting(unit.unit.content, "ExecStart"))[0] == f"/opt/{value}/venvs/0.25.0/bin/vllm"
    if path.startswith("hosts[0].settings.sysctls"):
        assert f"\nnet.core.x = {value}\n" in plan.sysctl_file.content
    for file in plan.files:  # no value added a line of its own
        assert all(not line.startswith(("ExecStartPre=", "ExecStartPost=/bin/touch")) for line in file.content.splitlines())


@pytest.mark.parametrize("value", NASTY, ids=ascii)
@pytest.mark.parametrize("path", list(FIELDS))
def test_each_value_is_refused_with_its_path_or_rendered_exactly(path, value):
    data = FIELDS[path](value)
    problems = _problems(data)
    if value in REFUSED:
        assert problems is not None, f"{path} = {value!r} was accepted"
    if problems is not None:  # refused: by the text check or by the field's own rule, naming the field
        assert {problem.split(": ")[0] for problem in problems} <= {path, re.sub(r"\[\d+\]$", "", path)}, problems
        return
    _rendered_exactly(path, value, data)


@pytest.mark.parametrize("char", ["\n", "\r", "\x00", "\x85", "\u2028", "\u2029", "\x1c", "\x1d", "\x1e", "\x0b", "\x0c"])
def test_every_line_break_is_refused_in_env_with_the_why(char):
    problems = _problems(spec_data(instances=[instance("chat", 8000, env={"FOO": f"a{char}b"})]))
    code = f"U+{ord(char):04X}"
    assert problems == [next(p for p in problems if p.startswith("instances[0].env.FOO: contains"))]
    assert code in problems[0] and problems[0].endswith("— remove it"), problems


def test_the_message_says_where_the_value_goes_and_the_fix():
    problems = _problems(spec_data(instances=[instance("chat", 8000, env={"FOO": "a\nb"})]))
    assert problems == ["instances[0].env.FOO: contains a newline (U+000A), which would end its line in the "
                        "unit (Environment=) — remove it"]


def test_a_nested_option_key_is_checked_too():
    problems = _problems(spec_data(instances=[instance("chat", 8000, options={
        "compilation-config": {"pass_config": {"a\nb": 1}}})]))
    assert problems and problems[0].startswith("instances[0].options.compilation-config.pass_config['a\nb']: contains a newline")


@pytest.mark.parametrize("value", ["4096 87380\n6291456", "1\nkernel.panic = 1", "a=b", " 1", ""])
def test_a_sysctl_value_cannot_add_a_line_to_the_sysctl_file(value):
    problems = _problems(spec_data(hosts=[host(settings={"sysctls": {"net.ipv4.tcp_rmem": value}})]))
    assert problems and problems[0].startswith("hosts[0].settings.sysctls['net.ipv4.tcp_rmem']: "), problems


@pytest.mark.parametrize("value", NASTY, ids=ascii)
def test_the_quadlet_health_command_and_probe_get_exactly_the_served_name(value):
    """podman runs a string HealthCmd= with /bin/sh -c: sh's words of it (after systemd's %% and $$,
    which quadlet leaves to systemd) hold the name as one word; ExecStartPost= as systemd splits it."""
    data = _served_model_name(value)
    data["instances"][0]["container"] = {"engine": "podman"}
    if _refused(data, value):
        return
    (plan,) = build_plan(validate_spec(data, check_files=False))
    quadlet = plan.units[0].unit.content
    health = _setting(quadlet, "HealthCmd").replace("%%", "%").replace("$$", "$")
    words = shlex.split(health)
    assert words[words.index("--model"):] == ["--model", value, "--timeout", "20", "--once"]
    probe = [line for line in quadlet.splitlines() if line.startswith("ExecStartPost=/usr/bin/python3")]
    probe_words = _unit_command_words(probe[0].removeprefix("ExecStartPost="))
    assert probe_words[probe_words.index("--model") + 1] == value


@pytest.mark.parametrize("value", NASTY, ids=ascii)
def test_the_quadlet_environment_is_exactly_the_value(value):
    data = spec_data(instances=[instance("chat", 8000, env={"FOO": value}, container={"engine": "podman"})])
    if _refused(data, value):
        return
    (plan,) = build_plan(validate_spec(data, check_files=False))
    assert plan.units[0].environment["FOO"] == value


@pytest.mark.parametrize("value", NASTY, ids=ascii)
def test_the_compose_file_reads_back_exactly(value):
    """Compose interpolates $ (written $$); its YAML parser refuses JSON's surrogate pairs (emoji)."""
    data = spec_data(instances=[instance("chat", 8000, env={"FOO": value}, container={"engine": "docker"},
                                         options={"served-model-name": value})])
    if _refused(data, value):
        return
    (plan,) = build_plan(validate_spec(data, check_files=False))
    service = yaml.safe_load(plan.units[0].unit.content)["services"]["vllm"]
    assert service["environment"]["FOO"].replace("$$", "$") == value
    test = service["healthcheck"]["test"]
    assert test[test.index("--model") + 1].replace("$$", "$") == value
    assert "$" not in re.sub(r"\$\$", "", plan.units[0].unit.content.split("healthcheck")[1].split("interval")[0])


def _everywhere(value: str) -> list[dict]:
    """Specs with the value in every field at once: the instance's and the GPU's, then the host's own."""
    return [
        spec_data(hosts=[host(gpus={"devices": [{"index": 0, "uuid": "GPU-00000000-0000-4000-8000-000000000000",
                                                  "model": value}]}, settings={"sysctls": {"net.core.x": value}})],
                  instances=[instance("chat", 8000, model=value, env={"FOO": value}, options={
                      "served-model-name": [value], "chat-template": value, "compilation-config": {"backend": value}})]),
        spec_data(hosts=[host(ssh={"user": value}, vllm={"install_path": "/opt/" + value,
                                                         "index_url": "https://pypi.example/" + value})]),
    ]


@pytest.mark.parametrize("value", NASTY, ids=ascii)
def test_provision_plan_never_shows_a_traceback(tmp_path, value):
    runner = CliRunner()
    for data in _everywhere(value):
        result = runner.invoke(app, ["plan", "--spec", str(write_spec(tmp_path / "spec.yml", data))])
        assert "Traceback" not in result.output, result.output
        assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
        assert result.exit_code in (0, 1, 2), (result.exit_code, result.output)
        if value in REFUSED:  # the refusal, not a plan
            assert result.exit_code != 0 and "contains" in result.output, result.output


# --------------------------------------------------------------------------- the API key file


@pytest.mark.parametrize("content", ["sk-SECRET1\nsk-SECRET2\n", "sk SECRET\n", 'sk-"SECRET"\n', "sk-$SECRET\n",
                                     "sk-\x00SECRET", "sk-%SECRET", "\n\nsk-SECRET\n", "sk-SECRET\u2028x\n", " \n"])
def test_an_api_key_that_does_not_fit_one_env_file_line_is_refused_naming_the_file_never_the_key(tmp_path, content):
    key_file = tmp_path / "chat.key"
    key_file.write_bytes(content.encode())
    data = spec_data(instances=[instance("chat", 8000, api_key_file=str(key_file))])
    with pytest.raises(SpecError) as caught:
        validate_spec(data, base_dir=tmp_path)
    (problem,) = [str(problem) for problem in caught.value.problems]
    assert problem.startswith(f"instances[0].api_key_file: the key in {key_file} is not one line")
    assert "SECRET" not in problem and "sk-" not in problem


def test_an_api_key_on_one_line_is_accepted(tmp_path):
    key_file = tmp_path / "chat.key"
    key_file.write_text("sk-Abc.123_~+/=\n")
    validate_spec(spec_data(instances=[instance("chat", 8000, api_key_file=str(key_file))]), base_dir=tmp_path)


# --------------------------------------------------------------------------- the role agrees with the spec


def _role_vars() -> dict:
    return yaml.safe_load((ROLES_DIR / "vllm_service/vars/main.yml").read_text())


def _check_each_instance_task() -> dict:
    tasks = yaml.safe_load((ROLES_DIR / "vllm_service/tasks/preflight.yml").read_text())
    return next(task for task in tasks if task.get("name") == "Check each instance")


def test_the_roles_preflight_refuses_what_the_spec_refuses_and_accepts_what_it_accepts(tmp_path):
    """The role's own assert (run by real Ansible on localhost) against entries built by the spec's
    inventory: the spec's accepted values pass it; the refused ones, bypassing the spec, fail it."""
    entries = [
        instance(f"q{index}", 8000 + index, share=0.01, model=f"m{value}", env={"FOO": value},
                 options={"served-model-name": value, "compilation-config": {"backend": value}})
        for index, value in enumerate(QUOTED)
    ]
    entries = [entry for entry in entries if _problems(spec_data(instances=[entry])) is None]
    assert len(entries) >= len(QUOTED) - 2  # a field's own rule may refuse one (an option value starting with -)
    accepted_spec = validate_spec(spec_data(instances=entries), check_files=False)
    accepted = host_vars(accepted_spec.hosts[0], accepted_spec.instances)["vllm_service_instances"]
    template = accepted[0]
    refused = [
        {**template, "name": f"r{index}-{where}", **change}
        for index, value in enumerate(REFUSED)
        for where, change in (("model", {"model": value}), ("env", {"env": {"FOO": value}}),
                              ("option", {"options": {"served-model-name": [value]}}),
                              ("nested", {"options": {"compilation-config": {"a": {value: 1}}}}))
    ]
    task = _check_each_instance_task()
    task["loop"] = "{{ entries }}"
    task["ignore_errors"] = True
    task["register"] = "checked"
    playbook = [{"hosts": "localhost", "gather_facts": False, "tasks": [
        task,
        {"ansible.builtin.copy": {"dest": str(tmp_path / "results.json"), "mode": "0600",
                                  "content": "{{ checked.results | map(attribute='failed') | list | to_json }}"}},
    ], "vars": {"entries": accepted + refused, "ansible_python_interpreter": "{{ ansible_playbook_python }}",
                # the role's vars the task reads (vars/main.yml): the options and variables the role sets itself
                **{name: _role_vars()[name] for name in ("_vllm_service_owned_options", "_vllm_service_managed_env")}}}]
    (tmp_path / "playbook.yml").write_text(json.dumps(playbook))
    ansible = Path(__file__).resolve().parents[2] / ".venv/bin/ansible-playbook"
    collections = collections_dir(tmp_path / "collections")  # the preflight's tests: vllm_provision.gpu_host.name
    run = subprocess.run([str(ansible), "-i", "localhost,", "-c", "local", str(tmp_path / "playbook.yml")],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(collections)})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    failed = json.loads((tmp_path / "results.json").read_text())
    assert failed[:len(accepted)] == [False] * len(accepted), [
        entry["model"] for entry, result in zip(accepted, failed) if result]
    assert failed[len(accepted):] == [True] * len(refused), [
        entry["name"] for entry, result in zip(refused, failed[len(accepted):]) if not result]


def test_the_nasty_values_cover_every_line_break_splitlines_knows():
    breaks = {char for char in map(chr, range(0x3000)) if len(f"a{char}b".splitlines()) > 1}
    covered = {char for value in LINE_BREAKING for char in value if char in breaks}
    assert breaks == covered
    assert all(unicodedata.category(char) == "Cc" for value in CONTROL for char in value if not char.isalnum())
