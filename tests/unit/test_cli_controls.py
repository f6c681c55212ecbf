"""The controls of issue 14 without a host: where the spec is found, HOST and GROUP arguments, the spec's
groups in the inventory, what apply passes to ansible-playbook, the user's ansible.cfg, plan --json.

Every refusal here comes before any host is touched: the specs' addresses are TEST-NET ones nobody answers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from provisioner.apply.controls import Controls, phase_tags, site_tags, split_tags
from provisioner.base.ansible_config import ansible_environment, mitogen_strategy_dir
from provisioner.base.paths import EXAMPLES_DIR, role_dir
from provisioner.base.runlog import RunLog, runs_dir
from provisioner.cli.main import app
from provisioner.fleet.inventory import write_inventory
from provisioner.fleet.selection import select_hosts
from provisioner.spec import load_spec
from tests.unit.conftest import UUID1, host, instance, problems_of, spec_data, write_spec

NO_SPEC = ("no spec: give one with --spec FILE, set $PROVISION_SPEC=FILE, or write ./provision.yml "
           "(`provision init` writes an example there)")


def invoke(*args, env: dict[str, str] | None = None, input: str | None = None):
    environment = {"COLUMNS": "200", "NO_COLOR": "1", "PROVISION_SPEC": "", **(env or {})}
    return CliRunner().invoke(app, [str(arg) for arg in args], env=environment, input=input)


FITS = {"max-model-len": 4096}  # fits the GPU: apply's preflight lets the run go on to what a test checks


def two_hosts(tmp_path: Path, name: str = "spec.yml", **first) -> Path:
    """ws4070 in groups rack_a and big, ws3090 in rack_b and big."""
    data = spec_data(
        hosts=[host(groups=["rack_a", "big"], **first),
               host("ws3090", "192.0.2.10", groups=["rack_b", "big"], gpus={"devices": [{"index": 0, "uuid": UUID1}]})],
        instances=[instance("chat", 8000, options=FITS), instance("qwen", 8000, on="ws3090", options=FITS)])
    return write_spec(tmp_path / name, data)


# --------------------------------------------------------------------------- where the spec is found

SPEC_COMMANDS = [("plan",), ("inventory", "-o", "inv"), ("apply", "ws4070"), ("trust", "ws4070"), ("bench", "run", "chat"),
                 ("tune", "chat", "--slo", "ttft_p99<=1s")]


@pytest.mark.parametrize("command", SPEC_COMMANDS, ids=lambda command: command[0])
def test_no_spec_anywhere_is_one_line_naming_the_three_ways_and_init(command, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke(*command)
    assert result.exit_code == 2, result.output
    assert result.output.strip() == NO_SPEC
    assert sorted(os.listdir(tmp_path)) == []  # nothing written (no inventory folder)


def test_the_spec_is_found_as_option_then_environment_then_provision_yml(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    default = write_spec(tmp_path / "provision.yml", spec_data(hosts=[host("indefault")], instances=[]))
    from_env = write_spec(tmp_path / "env.yml", spec_data(hosts=[host("inenv")], instances=[]))
    given = write_spec(tmp_path / "given.yml", spec_data(hosts=[host("ingiven")], instances=[]))

    def planned_host(*args, env=None) -> str:
        result = invoke("plan", "--json", *args, env=env)
        assert result.exit_code == 0, result.output
        return json.loads(result.output)["hosts"][0]["host"]

    assert planned_host() == "indefault"
    assert planned_host(env={"PROVISION_SPEC": str(from_env)}) == "inenv"
    assert planned_host("-s", given, env={"PROVISION_SPEC": str(from_env)}) == "ingiven"
    assert planned_host("--spec", given) == "ingiven"
    assert default.exists()


def test_a_spec_named_but_missing_says_which_file(tmp_path):
    result = invoke("apply", "--spec", tmp_path / "nope.yml")
    assert result.exit_code == 1
    assert f"{tmp_path}/nope.yml: cannot read the spec: No such file or directory" in result.output


def test_apply_host_form_with_provision_yml(tmp_path, monkeypatch):
    """`provision apply gpu1` (the form the tool is known by) reads ./provision.yml; before, it took gpu1
    for the spec file. Stopped here by the memory check, before any host is touched."""
    monkeypatch.chdir(tmp_path)
    write_spec(tmp_path / "provision.yml", spec_data(instances=[instance("chat", 8000, 0.9, model="Qwen/Qwen2.5-7B-Instruct",
                                                                          options={"max-model-len": 32768})]))
    result = invoke("apply", "ws4070")
    assert "memory: ws4070 GPU 0: chat" in result.output, result.output
    assert "nothing applied" in result.output and result.exit_code == 1


# --------------------------------------------------------------------------- groups and HOST arguments


@pytest.mark.parametrize("groups, message", [
    (["rack-a"], "hosts[0].groups[0]: 'rack-a' is not a valid Ansible group name — use letters, digits and "
                 "underscores, not starting with a digit (e.g. rack_a, h200)"),
    (["9th"], "hosts[0].groups[0]: '9th' is not a valid Ansible group name"),
    (["ok", "vllm_hosts"], "hosts[0].groups[1]: 'vllm_hosts' is a group every host is in already (all, ungrouped "
                           "and vllm_hosts are taken) — choose another name"),
    (["all"], "hosts[0].groups[0]: 'all' is a group every host is in already"),
    (["ungrouped"], "hosts[0].groups[0]: 'ungrouped' is a group every host is in already"),
    (["ws3090"], "hosts[0].groups[0]: 'ws3090' is the name of a host — a group needs a name of its own"),
    (["a", "a"], "hosts[0].groups[1]: 'a' is listed twice — list each group once"),
    ("rack_a", "hosts[0].groups: expected a list, got 'rack_a'"),
])
def test_bad_group_names_are_refused_with_the_field_and_the_fix(groups, message):
    data = spec_data(hosts=[host(groups=groups), host("ws3090", "192.0.2.10")], instances=[])
    problems = problems_of(data)
    assert any(problem.startswith(message) for problem in problems), problems


def test_the_inventory_puts_hosts_in_their_groups_as_ansible_reads_it(tmp_path):
    """Ansible's own InventoryManager reads the generated inventory: the spec's groups are children of
    vllm_hosts (the play's target), each with its hosts."""
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader

    write_inventory(load_spec(two_hosts(tmp_path)), tmp_path / "inv")
    inventory = InventoryManager(loader=DataLoader(), sources=[str(tmp_path / "inv" / "hosts.yml")])
    members = {name: sorted(host.name for host in group.get_hosts()) for name, group in inventory.groups.items()}
    assert members["vllm_hosts"] == ["ws3090", "ws4070"]
    assert members["rack_a"] == ["ws4070"] and members["rack_b"] == ["ws3090"]
    assert members["big"] == ["ws3090", "ws4070"]
    # the site playbook's gateway and monitoring groups are there, empty: plain ansible-playbook has no pattern to warn of
    assert sorted(group.name for group in inventory.groups["vllm_hosts"].child_groups) == [
        "big", "gateway", "monitoring", "rack_a", "rack_b"]
    assert members["gateway"] == [] and members["monitoring"] == []
    assert sorted(host.name for host in inventory.get_hosts("rack_a:&big")) == ["ws4070"]


@pytest.mark.parametrize("names, chosen", [
    ([], ["ws4070", "ws3090"]),
    (["all"], ["ws4070", "ws3090"]),
    (["rack_b"], ["ws3090"]),
    (["ws3090", "ws4070"], ["ws4070", "ws3090"]),  # spec order
    (["big", "rack_a"], ["ws4070", "ws3090"]),
])
def test_host_arguments_take_hosts_groups_and_all(tmp_path, names, chosen):
    assert [host.name for host in select_hosts(load_spec(two_hosts(tmp_path)), names)] == chosen


def test_plan_of_a_group(tmp_path):
    result = invoke("plan", "rack_b", "--json", "--spec", two_hosts(tmp_path))
    assert result.exit_code == 0, result.output
    assert [plan["host"] for plan in json.loads(result.output)["hosts"]] == ["ws3090"]


@pytest.mark.parametrize("command", ["plan", "apply", "trust"])
def test_an_unknown_host_or_group_lists_the_hosts_and_groups_exit_2(tmp_path, command):
    spec = two_hosts(tmp_path)
    result = invoke(command, "ws4070", "rack_c", "nope", "--spec", spec)
    assert result.exit_code == 2, result.output
    assert result.output.strip() == (f"no hosts or groups 'rack_c', 'nope' in {spec} — hosts: ws4070, ws3090; "
                                     "groups: rack_a, big, rack_b (or all)")


def test_the_old_form_with_the_spec_as_first_argument_says_to_use_spec(tmp_path, monkeypatch):
    """`provision apply spec.yml` (the CLI before issue 14) reads spec.yml as a host name: say what to type."""
    spec = two_hosts(tmp_path)
    monkeypatch.chdir(tmp_path)
    result = invoke("apply", "spec.yml", env={"PROVISION_SPEC": str(spec)})
    assert result.exit_code == 2, result.output
    assert result.output.strip().endswith("; to read spec.yml as the spec, give it with --spec spec.yml")


def test_no_traceback_reaches_the_user_from_a_broken_installation_or_a_bug(tmp_path):
    """The `provision` script (provisioner.cli.main:run): a missing part of the installation is one line,
    exit 1; an unexpected error is named as a bug, exit 70, its traceback only with PROVISION_DEBUG=1."""
    code = ("import sys, provisioner.base.paths as paths, provisioner.cli.main as main, provisioner.plan as p; "
            "paths.ROLES_DIR = paths.ROLES_DIR.parent / 'gone'; "
            "p.build_plan = (lambda *a, **k: 1 / 0) if sys.argv[1] == 'bug' else p.build_plan; "
            "sys.argv = ['provision', 'plan', '--spec', sys.argv[2]]; main.run()")
    spec = str(EXAMPLES_DIR / "seed1-3090.yml")

    def run(kind: str, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", code, kind, spec], capture_output=True, text=True,
                              env={**os.environ, **env}, cwd=tmp_path)

    broken, bug, debug = run("broken"), run("bug"), run("bug", PROVISION_DEBUG="1")
    assert broken.returncode == 1 and "Traceback" not in broken.stderr
    assert broken.stderr.startswith("provision: role '") and "reinstall it" in broken.stderr
    assert bug.returncode == 70 and "Traceback" not in bug.stderr
    assert bug.stderr.strip().startswith("provision: internal error: ZeroDivisionError: division by zero — this is a bug")
    assert "Traceback" in debug.stderr or "ZeroDivisionError" in debug.stderr


# --------------------------------------------------------------------------- what apply passes to ansible-playbook


def test_controls_become_ansible_playbook_options():
    controls = Controls(tags=split_tags(["sysctl,shm", "sysctl"]), skip_tags=("nouveau",),
                        extra_vars=("a=1 b=2", "@vars.yml"), verbosity=3, forks=4, become_password="pw")
    assert controls.options() == ["--tags=sysctl,shm", "--skip-tags=nouveau", "--extra-vars", "a=1 b=2",
                                  "--extra-vars", "@vars.yml", "-vvv", "--forks=4", "--become-password-file", "-"]
    assert "pw" not in repr(controls) and "pw" not in controls.options()


def test_the_tags_are_the_site_playbooks_role_tags():
    assert site_tags() == ["sysctl", "nouveau", "nvidia_driver", "shm", "nvidia_gpu", "vllm_install",
                           "container_engine", "vllm_service", "node_exporter", "gateway", "prometheus"]


def test_every_role_tags_each_phase_file_with_its_name_and_the_preflight_with_every_phase():
    """A phase tag (`<role>_<phase>`, as prometheus-community's roles tag theirs) runs one phase of one role;
    a role's preflight carries all its phase tags, since every later phase reads what it found."""
    for role in site_tags():
        phases = [task for task in role_imports(role) if "ansible.builtin.import_tasks" in task]
        role_tags = phase_tags_of(role)
        assert all(tag.startswith(f"{role}_") for tag in role_tags), role
        preflight = [task for task in phases if task["ansible.builtin.import_tasks"] == "preflight.yml"]
        assert preflight and set(preflight[0]["tags"]) == role_tags, role
        assert all(task.get("tags") for task in phases), role
    assert set(phase_tags()) == {tag for role in site_tags() for tag in phase_tags_of(role)}


def role_imports(role: str) -> list[dict]:
    return yaml.safe_load((role_dir(role) / "tasks" / "main.yml").read_text(encoding="utf-8"))


def phase_tags_of(role: str) -> set[str]:
    return {tag for task in role_imports(role) for tag in task.get("tags") or []}


@pytest.mark.parametrize("args, message", [
    (["--tags", "sysctl,sysclt"], "--tags: no role tagged 'sysclt' — the tags are: sysctl, nouveau, nvidia_driver, shm, "
                                  "nvidia_gpu, vllm_install, container_engine, vllm_service"),
    (["--skip-tags", "gpu"], "--skip-tags: no role tagged 'gpu' — the tags are: sysctl"),
    (["-e", "justaword"], "-e justaword: sets no variable — write VAR=VALUE, or @FILE with a YAML or JSON mapping"),
    (["-e", "@/nonexistent/vars.yml"], "-e @/nonexistent/vars.yml: "),
    (["-e", "ansible_host_key_checking=false"], "-e ansible_host_key_checking=false: ansible_host_key_checking "
                                                "would change how ssh checks host keys"),
    (["-e", '{"ansible_ssh_common_args": "-o StrictHostKeyChecking=no"}'], "-e {\"ansible_ssh_common_args\": \"-o StrictHostKeyChecking=no\"}: "
                                                                     "ansible_ssh_common_args would change"),
    (["--forks", "0"], "--forks 0: give 1 or more"),
])
def test_bad_pass_through_options_exit_2_before_any_host(tmp_path, args, message):
    result = invoke("apply", *args, "--spec", two_hosts(tmp_path))
    assert result.exit_code == 2, result.output
    assert result.output.startswith(message), result.output
    assert "Traceback" not in result.output


def test_an_extra_vars_file_that_turns_key_checking_off_is_refused(tmp_path):
    (tmp_path / "vars.yml").write_text("ansible_ssh_host_key_checking: false\n")
    result = invoke("apply", "-e", f"@{tmp_path}/vars.yml", "--spec", two_hosts(tmp_path))
    assert result.exit_code == 2
    assert "ansible_ssh_host_key_checking would change how ssh checks host keys" in result.output


# --------------------------------------------------------------------------- the user's ansible.cfg


def effective(settings: list[str], cwd: Path, environment: dict[str, str]) -> dict[str, object]:
    """What ansible-playbook started in `cwd` with `environment` would use: Ansible's own ConfigManager,
    in a fresh process, as ansible-playbook would read it."""
    code = (
        "import json, sys\n"
        "from ansible import constants as C\n"
        "from ansible.plugins.loader import connection_loader\n"
        "connection_loader.get('ssh', class_only=True)\n"
        "out = {}\n"
        "for name in sys.argv[1:]:\n"
        "    kind, plugin, option = name.split('/') if '/' in name else (None, None, name)\n"
        "    out[name] = C.config.get_config_value(option, plugin_type=kind, plugin_name=plugin)\n"
        "print(json.dumps(out))\n"
    )
    env = {key: value for key, value in os.environ.items() if not key.startswith("ANSIBLE_")}
    result = subprocess.run([sys.executable, "-c", code, *settings], cwd=cwd, env={**env, **environment},
                            capture_output=True, text=True, check=True)
    return json.loads(result.stdout)


def test_the_users_ansible_cfg_is_kept_but_host_key_checking_stays_on(tmp_path, monkeypatch):
    (tmp_path / "ansible.cfg").write_text(
        "[defaults]\nforks = 3\ntimeout = 42\nhost_key_checking = False\n"
        "[ssh_connection]\nhost_key_checking = False\n")
    monkeypatch.chdir(tmp_path)
    for name in [key for key in os.environ if key.startswith("ANSIBLE_")]:
        monkeypatch.delenv(name)
    environment = ansible_environment()
    assert "ANSIBLE_FORKS" not in environment  # the user's forks = 3 is theirs
    assert environment["ANSIBLE_PIPELINING"] == "True"  # ours where they set nothing
    names = ["DEFAULT_FORKS", "DEFAULT_TIMEOUT", "HOST_KEY_CHECKING", "connection/ssh/host_key_checking",
             "connection/ssh/pipelining", "connection/ssh/ssh_args"]
    assert effective(names, tmp_path, {}) == {  # what the user's file alone gives
        "DEFAULT_FORKS": 3, "DEFAULT_TIMEOUT": 42, "HOST_KEY_CHECKING": False,
        "connection/ssh/host_key_checking": False, "connection/ssh/pipelining": False,
        "connection/ssh/ssh_args": "-C -o ControlMaster=auto -o ControlPersist=60s"}
    assert effective(names, tmp_path, environment) == {  # what apply runs with
        "DEFAULT_FORKS": 3, "DEFAULT_TIMEOUT": 42, "HOST_KEY_CHECKING": True,
        "connection/ssh/host_key_checking": True, "connection/ssh/pipelining": True,
        "connection/ssh/ssh_args": "-o ControlMaster=auto -o ControlPersist=120s"}


def test_mitogens_strategy_runs_the_apply_where_the_user_names_none(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in [key for key in os.environ if key.startswith("ANSIBLE_")]:
        monkeypatch.delenv(name)
    environment = ansible_environment()
    assert environment["ANSIBLE_STRATEGY"] == "mitogen_linear_cached"
    assert effective(["DEFAULT_STRATEGY", "DEFAULT_STRATEGY_PLUGIN_PATH"], tmp_path, environment) == {
        "DEFAULT_STRATEGY": "mitogen_linear_cached", "DEFAULT_STRATEGY_PLUGIN_PATH": [str(mitogen_strategy_dir())]}
    assert (mitogen_strategy_dir() / "mitogen_linear_cached.py").is_file()


def test_a_users_strategy_is_theirs_and_their_strategy_plugins_stay_on_the_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in [key for key in os.environ if key.startswith("ANSIBLE_")]:
        monkeypatch.delenv(name)
    (tmp_path / "ansible.cfg").write_text("[defaults]\nstrategy = linear\n")
    assert "ANSIBLE_STRATEGY" not in ansible_environment()  # linear, as they chose
    (tmp_path / "ansible.cfg").unlink()
    monkeypatch.setenv("ANSIBLE_STRATEGY_PLUGINS", f"{tmp_path}/mine")
    environment = ansible_environment()
    assert environment["ANSIBLE_STRATEGY_PLUGINS"] == f"{mitogen_strategy_dir()}:{tmp_path}/mine"


def test_a_users_environment_counts_as_their_configuration(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ANSIBLE_FORKS", "2")
    monkeypatch.setenv("ANSIBLE_SSH_HOST_KEY_CHECKING", "False")
    environment = ansible_environment()
    assert "ANSIBLE_FORKS" not in environment
    assert effective(["DEFAULT_FORKS", "connection/ssh/host_key_checking"], tmp_path,
                     {"ANSIBLE_FORKS": "2", "ANSIBLE_SSH_HOST_KEY_CHECKING": "False", **environment}) == {
        "DEFAULT_FORKS": 2, "connection/ssh/host_key_checking": True}


@pytest.mark.parametrize("ssh_args", ["-o StrictHostKeyChecking=no", "-C -o UserKnownHostsFile=/dev/null",
                                      "-oGlobalKnownHostsFile=/tmp/x"])
def test_ssh_args_that_set_host_key_options_are_refused(tmp_path, monkeypatch, ssh_args):
    (tmp_path / "ansible.cfg").write_text(f"[ssh_connection]\nssh_args = {ssh_args}\n")
    monkeypatch.chdir(tmp_path)
    result = invoke("apply", "--spec", two_hosts(tmp_path))
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"ssh_args ({tmp_path}/ansible.cfg) sets ")
    assert "remove the host-key options from ssh_args" in result.output


def test_a_broken_ansible_cfg_is_one_clear_line(tmp_path, monkeypatch):
    (tmp_path / "ansible.cfg").write_text("[defaults]\nforks = many\n")
    monkeypatch.chdir(tmp_path)
    result = invoke("apply", "--spec", two_hosts(tmp_path))
    assert result.exit_code == 2, result.output
    assert result.output.startswith("Ansible's configuration: ") and "Traceback" not in result.output


def test_our_ansible_cfg_is_gone_from_the_repository():
    assert not (Path(__file__).parents[2] / "ansible.cfg").exists()


# --------------------------------------------------------------------------- plan --json, the run log


def test_plan_json_is_the_whole_plan_with_secrets_redacted():
    result = invoke("plan", "--json", "--spec", EXAMPLES_DIR / "seed1-3090.yml")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    assert sorted(plan) == ["hosts", "problems", "spec"] and plan["problems"] == []
    (ws3090,) = plan["hosts"]
    assert sorted(ws3090) == ["address", "driver", "fstab_line", "gateway_file", "host", "memory", "memory_problems",
                              "monitoring_files", "nouveau_files", "removed_files", "routes", "semantic_changes",
                              "sysctl_file", "sysctls", "units", "warnings"]
    assert ws3090["driver"]["notes"] == [
        "driver not declared: apply reads it from the host — vLLM 0.25.0 (CUDA 13.0) needs ≥ 580"]
    assert ws3090["driver"]["needs"][0]["build"]["cuda"] == "13.0"
    assert ws3090["sysctls"]["vm.swappiness"] == 1
    unit = ws3090["units"][0]
    assert unit["unit"]["path"] == "/etc/systemd/system/vllm-qwen7b.service"
    assert "ExecStart=/opt/vllm/venvs/0.25.0/bin/vllm serve --config /etc/vllm/qwen7b.yaml" in unit["unit"]["content"]
    assert ws3090["memory"][0]["plan"]["instances"][0]["name"] == "qwen7b"
    assert "fake-example-key-seed1" not in result.output


def test_plan_json_of_a_plan_that_does_not_fit_exits_1_with_the_problem(tmp_path):
    spec = write_spec(tmp_path / "spec.yml", spec_data(instances=[instance(
        "chat", 8000, 0.9, model="Qwen/Qwen2.5-7B-Instruct", options={"max-model-len": 32768})]))
    result = invoke("plan", "--json", "--spec", spec)
    assert result.exit_code == 1
    problems = json.loads(result.output)["problems"]
    assert problems and problems[0]["message"].startswith("ws4070 GPU 0: chat")
    assert problems[0]["field"] == "hosts[0].gpus.devices[0]" and problems[0]["fix"]


def test_run_logs_go_under_xdg_state_home(tmp_path):
    assert runs_dir({"XDG_STATE_HOME": str(tmp_path)}) == tmp_path / "vllm-provision" / "runs"
    assert runs_dir({}) == Path.home() / ".local" / "state" / "vllm-provision" / "runs"
    first, second = (RunLog("gpu-lab", folder=tmp_path) for _ in range(2))
    first.write("api_key: sk-live-0123456789abcdef\n")
    first.close(), second.close()
    assert first.path != second.path and first.path.name.endswith("Z-gpu-lab.log")
    assert "sk-live-0123456789abcdef" not in first.path.read_text()
    assert oct(first.path.stat().st_mode & 0o777) == "0o600"


def test_the_fix_for_an_unknown_key_is_the_new_trust_form():
    from provisioner.base.hostkeys import trust_command

    assert trust_command("my specs/a.yml", "gpu1") == "provision trust gpu1 --spec 'my specs/a.yml'"
