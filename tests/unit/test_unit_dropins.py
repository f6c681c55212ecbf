"""Drop-ins of our units: the shared parser (plugins/module_utils/systemd_dropins.py), the module
unit_overrides as Ansible runs it (ad hoc, on this machine, against a unit tree in a temporary
folder: `root`), and the audit rows they give (the check functions on parsed facts)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from provisioner.audit.checks import vllm_service as checks
from provisioner.audit.checks.vllm_service import dropin_files, parse_unit
from provisioner.audit.engine import Output
from provisioner.audit.expectations import spec_targets
from provisioner.audit.registry import Case
from provisioner.base.module_utils import (
    systemd_dropins as dropins,  # the role's module judges drop-ins with the same code
)
from provisioner.base.paths import COLLECTION, EXAMPLES_DIR, collections_dir
from provisioner.plan import build_plan
from provisioner.spec import load_spec
from tests.unit.audit_rows import run_row

UNIT = "vllm-chat.service"
OUR_UNIT = """\
# Managed by vllm-provision
[Unit]
Description=vLLM chat
After=network-online.target

[Service]
User=vllm
Environment=CUDA_VISIBLE_DEVICES=GPU-1
Environment="HF_HOME=/var/lib/vllm/hf" CUDA_DEVICE_ORDER=PCI_BUS_ID
ExecStart=/opt/vllm/venv/bin/vllm serve \\
  --config /etc/vllm/chat.yaml
TimeoutStartSec=1800

[Install]
WantedBy=multi-user.target
"""
MANAGED = dropins.managed_settings(OUR_UNIT)


def test_managed_settings_are_every_key_of_our_unit_and_its_environment_variables():
    assert MANAGED == {
        "keys": ["Install/WantedBy", "Service/ExecStart", "Service/TimeoutStartSec", "Service/User",
                 "Unit/After", "Unit/Description"],
        "environment": ["CUDA_DEVICE_ORDER", "CUDA_VISIBLE_DEVICES", "HF_HOME"],
    }


def test_managed_settings_of_the_role_s_rendered_unit():
    (plan,) = build_plan(load_spec(EXAMPLES_DIR / "seed1-3090.yml"))
    managed = dropins.managed_settings(plan.units[0].unit.content)
    assert {"Service/User", "Service/ExecStart", "Service/ExecStartPost", "Service/ProtectSystem",
            "Service/EnvironmentFile", "Unit/After", "Install/WantedBy"} <= set(managed["keys"])
    assert {"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "HF_HOME"} <= set(managed["environment"])
    (target,) = spec_targets(load_spec(EXAMPLES_DIR / "seed1-3090.yml"))
    assert target.expected["units"][0]["managed"] == managed  # the audit judges with the same settings


@pytest.mark.parametrize("dropin, described, changes_managed", [
    ("[Service]\nEnvironment=CUDA_VISIBLE_DEVICES=1\n", "sets Environment CUDA_VISIBLE_DEVICES", True),
    ("[Service]\nEnvironment=\n", "resets Environment", True),
    ("[Service]\nExecStart=\nExecStart=/bin/true\n", "replaces ExecStart", True),
    ("[Service]\nUnsetEnvironment=HF_HOME\n", "unsets Environment HF_HOME", True),
    ("[Service]\n# User=root\n; Environment=X=1\nLimitNOFILE=4096\nEnvironment=MY_FLAG=1\n",
     "sets LimitNOFILE, Environment MY_FLAG", False),
    ("[Unit]\nAfter=other.service\n", "sets After", True),
    ("[Service]\nAfter=other.service\n", "sets After", False),  # another section: not what our unit sets
    ("[Service]\nEnvironment='A=1 2' \"CUDA_DEVICE_ORDER=FASTEST_FIRST\"\n",
     "sets Environment A, Environment CUDA_DEVICE_ORDER", True),
    ("[Service]\nEnvironment=\"A=1\n", "sets nothing", False),  # an unbalanced quote: systemd ignores the line
    ("", "sets nothing", False),
])
def test_what_a_dropin_changes(dropin, described, changes_managed):
    changes = dropins.dropin_changes(dropin, MANAGED)
    assert dropins.describe(changes) == described
    assert bool(dropins.changes_managed(changes)) is changes_managed


def test_an_environment_reset_touches_every_variable_and_nothing_is_managed_in_a_unit_we_did_not_write():
    reset = dropins.dropin_changes("[Service]\nEnvironment=\n", MANAGED)
    assert dropins.touches(reset, "Environment HF_HOME") and not dropins.touches(reset, "User")
    assert dropins.changes_managed(dropins.dropin_changes("[Service]\nUser=root\n", None)) == []


def test_dropin_directories_most_specific_first():
    assert dropins.dropin_dir_names("vllm-my-chat.service") == [
        "vllm-my-chat.service.d", "vllm-my-.service.d", "vllm-.service.d", "service.d"]


def write(root: Path, path: str, text: str = "[Service]\n") -> None:
    (root / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
    (root / path.lstrip("/")).write_text(text)


def test_find_dropins_in_systemd_s_order_the_higher_directory_winning_a_name(tmp_path):
    write(tmp_path, f"/usr/lib/systemd/system/{UNIT}.d/10-vendor.conf")
    write(tmp_path, f"/usr/lib/systemd/system/{UNIT}.d/override.conf")  # hidden by /etc's file of that name
    write(tmp_path, f"/etc/systemd/system/{UNIT}.d/override.conf")
    write(tmp_path, "/etc/systemd/system/vllm-.service.d/50-prefix.conf")
    write(tmp_path, "/run/systemd/system/service.d/zz-all.conf")
    write(tmp_path, f"/etc/systemd/system/{UNIT}.d/notes.txt")  # not a .conf
    (tmp_path / f"etc/systemd/system/{UNIT}.d/05-masked.conf").symlink_to("/dev/null")
    assert dropins.find_dropins(UNIT, str(tmp_path)) == [
        f"/usr/lib/systemd/system/{UNIT}.d/10-vendor.conf",
        "/etc/systemd/system/vllm-.service.d/50-prefix.conf",
        f"/etc/systemd/system/{UNIT}.d/override.conf",
        "/run/systemd/system/service.d/zz-all.conf",
    ]
    assert dropins.is_own_dropin(UNIT, f"/etc/systemd/system/{UNIT}.d/override.conf")
    assert dropins.is_own_dropin(UNIT, f"/run/systemd/system/{UNIT}.d/x.conf")
    assert not dropins.is_own_dropin(UNIT, "/etc/systemd/system/vllm-.service.d/50-prefix.conf")
    assert not dropins.is_own_dropin(UNIT, f"/usr/lib/systemd/system/{UNIT}.d/10-vendor.conf")
    assert dropins.shared_reach(UNIT, "/etc/systemd/system/service.d/x.conf") == "every service on the host"
    assert dropins.shared_reach(UNIT, "/etc/systemd/system/vllm-.service.d/x.conf") == (
        "every service whose name starts with vllm-")


# --------------------------------------------------------------------------- the module, as Ansible runs it


def run_module(tmp_path: Path, *options: str, unit: str = UNIT, content: str = OUR_UNIT) -> dict:
    ansible = Path(sys.executable).parent / "ansible"
    tree = tmp_path / "tree"
    done = subprocess.run(
        [str(ansible), "localhost", "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}", "-t", str(tree),
         "-m", f"{COLLECTION}.unit_overrides", "-a", json.dumps({"unit": unit, "content": content, "root": str(tmp_path / "root")}),
         *options],
        env={**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(collections_dir(tmp_path / "collections")),
             "ANSIBLE_REMOTE_TMP": str(tmp_path / "ansible-tmp"), "ANSIBLE_LOCALHOST_WARNING": "false", "ANSIBLE_NOCOLOR": "1"},
        capture_output=True, text=True, timeout=120,
    )
    return {**json.loads((tree / "localhost").read_text()), "failed": done.returncode != 0, "stdout": done.stdout}


def test_the_module_removes_our_own_managed_dropins_and_the_mask_check_mode_first(tmp_path):
    root = tmp_path / "root"
    override = f"/etc/systemd/system/{UNIT}.d/override.conf"
    write(root, override, "[Service]\nEnvironment=CUDA_VISIBLE_DEVICES=1\n")
    write(root, f"/run/systemd/system/{UNIT}.d/limits.conf", "[Service]\nLimitNOFILE=65536\n")  # unmanaged: stays
    (root / "run/systemd/system").mkdir(parents=True, exist_ok=True)
    (root / f"run/systemd/system/{UNIT}").symlink_to("/dev/null")

    predicted = run_module(tmp_path, "--check", "--diff")
    assert not predicted["failed"] and predicted["changed"], predicted
    assert predicted["removed"] == [override, f"/run/systemd/system/{UNIT}", f"/etc/systemd/system/{UNIT}.d"]
    assert f"-# {override}\n-[Service]\n-Environment=CUDA_VISIBLE_DEVICES=1" in predicted["stdout"]  # the diff
    assert (root / override.lstrip("/")).exists() and (root / f"run/systemd/system/{UNIT}").is_symlink()

    done = run_module(tmp_path)
    assert done["changed"] and done["removed"] == predicted["removed"]
    assert not (root / f"etc/systemd/system/{UNIT}.d").exists()
    assert not (root / f"run/systemd/system/{UNIT}").is_symlink()
    assert (root / f"run/systemd/system/{UNIT}.d/limits.conf").exists()
    assert [(d["path"], d["changes_managed"]) for d in done["dropins"]] == [
        (f"/run/systemd/system/{UNIT}.d/limits.conf", False), (override, True)]

    again = run_module(tmp_path)
    assert not again["changed"] and again["removed"] == []


def test_a_runtime_mask_under_our_unit_file_masks_nothing_and_is_left(tmp_path):
    root = tmp_path / "root"
    write(root, f"/etc/systemd/system/{UNIT}", OUR_UNIT)
    (root / "run/systemd/system").mkdir(parents=True)
    (root / f"run/systemd/system/{UNIT}").symlink_to("/dev/null")
    assert dropins.find_masks(UNIT, str(root)) == []  # /etc comes first in the search path
    result = run_module(tmp_path)
    assert not result["changed"] and (root / f"run/systemd/system/{UNIT}").is_symlink()
    (root / f"etc/systemd/system/{UNIT}").unlink()
    (root / f"etc/systemd/system/{UNIT}").symlink_to("/dev/null")
    assert dropins.find_masks(UNIT, str(root)) == [f"/etc/systemd/system/{UNIT}"]


def test_the_module_refuses_a_shared_dropin_that_changes_a_managed_setting_and_removes_nothing(tmp_path):
    root = tmp_path / "root"
    own = f"/etc/systemd/system/{UNIT}.d/override.conf"
    write(root, own, "[Service]\nUser=root\n")
    write(root, "/etc/systemd/system/vllm-.service.d/gpu.conf", "[Service]\nEnvironment=CUDA_VISIBLE_DEVICES=1\n")
    result = run_module(tmp_path)
    assert result["failed"] and not result["changed"]
    assert result["msg"].startswith(f"A drop-in outside {UNIT}.d changes what vllm-provision manages: "
                                    "/etc/systemd/system/vllm-.service.d/gpu.conf sets Environment CUDA_VISIBLE_DEVICES, ")
    assert "every service whose name starts with vllm-" in result["msg"] and "put what" in result["msg"]
    assert (root / own.lstrip("/")).exists()  # the unit's own drop-in too: nothing changes before the fix


# --------------------------------------------------------------------------- the audit rows


def row(check, case, facts) -> tuple[str, str, str, str]:
    """(check, expected, actual, status) of one check function on these facts."""
    status, recorded = run_row(check, case, facts)
    return recorded["check"], recorded["expected"], recorded["actual"], status


@pytest.fixture(scope="module")
def chat_unit():
    (target,) = spec_targets(load_spec(EXAMPLES_DIR / "seed1-3090.yml"))
    return target.expected["units"][0]


def unit_facts(unit: dict, shown: str, dropin_lines: str = ""):
    outputs = {"unit0": Output(shown, 0), "unit_env0": Output("", 1), "http0": Output("", 0),
               "dropins0": Output(dropin_lines, 0)}
    return type("Facts", (), {"units": {unit["name"]: parse_unit(0, outputs)}, "listening": set()})()


def framed(*files: tuple[str, str]) -> str:
    """The drop-ins command's output: each path, then its content in base64."""
    return "".join(f"{path}\n{base64.b64encode(text.encode()).decode()}\n" for path, text in files)


def test_a_dropin_fails_the_dropins_row_and_the_value_row_names_it(chat_unit):
    name = chat_unit["name"]
    override = f"/etc/systemd/system/{name}.d/override.conf"
    limits = f"/etc/systemd/system/{name}.d/limits.conf"
    lines = framed((limits, "[Service]\nLimitNOFILE=4096\n"), (override, "[Service]\nEnvironment=CUDA_VISIBLE_DEVICES=1\n"))
    assert dropin_files(Output(lines, 0))[1] == (override, "[Service]\nEnvironment=CUDA_VISIBLE_DEVICES=1\n")
    facts = unit_facts(chat_unit, "LoadState=loaded\nEnvironment=CUDA_VISIBLE_DEVICES=1 CUDA_DEVICE_ORDER=PCI_BUS_ID\n", lines)
    case = Case("ws3090", {}, chat_unit)
    assert row(checks.dropins_applied, case, facts) == (
        f"{name}: drop-ins", "none that change a managed setting",
        f"{limits} sets LimitNOFILE (not managed); {override} sets Environment CUDA_VISIBLE_DEVICES", "failed")
    environment = Case("ws3090", {}, (chat_unit, "CUDA_VISIBLE_DEVICES", chat_unit["environment"]["CUDA_VISIBLE_DEVICES"]))
    assert row(checks.environment, environment, facts)[2:] == (f"1 (from {override})", "failed")
    order = Case("ws3090", {}, (chat_unit, "CUDA_DEVICE_ORDER", "PCI_BUS_ID"))
    assert row(checks.environment, order, facts)[2:] == ("PCI_BUS_ID", "passed")

    only_unmanaged = unit_facts(chat_unit, "LoadState=loaded\n", framed((limits, "[Service]\nLimitNOFILE=4096\n")))
    assert row(checks.dropins_applied, case, only_unmanaged)[2:] == (f"{limits} sets LimitNOFILE (not managed)", "passed")
    assert row(checks.dropins_applied, case, unit_facts(chat_unit, "LoadState=loaded\n"))[2:] == ("none", "passed")


@pytest.mark.parametrize("shown, actual", [
    ("LoadState=masked\nFragmentPath=/etc/systemd/system/{name}\nLoadError=org.freedesktop.systemd1.UnitMasked \"Unit is masked.\"\n",
     "masked (/etc/systemd/system/{name} -> /dev/null): provision apply unmasks it (by hand: systemctl unmask {name}, then provision apply)"),
    ("LoadState=masked\nFragmentPath=/run/systemd/system/{name}\n",
     "masked (/run/systemd/system/{name} -> /dev/null): provision apply unmasks it (by hand: systemctl unmask --runtime {name}, then provision apply)"),
    ("LoadState=not-found\nFragmentPath=\n", "not found (no /etc/systemd/system/{name}): provision apply writes it"),
    ("LoadState=bad-setting\nFragmentPath=/etc/systemd/system/{name}\n"
     "LoadError=org.freedesktop.systemd1.BadUnitSetting \"Unit {name} has a bad unit file setting.\"\n",
     "bad-setting: Unit {name} has a bad unit file setting. (/etc/systemd/system/{name}): `systemd-analyze verify {name}`"
     " names the setting; provision apply rewrites the unit and removes its own drop-ins that change it"),
])
def test_a_unit_not_loaded_fails_one_row_that_says_how_to_fix_it_the_others_are_na(chat_unit, shown, actual):
    name = chat_unit["name"]
    facts = unit_facts(chat_unit, shown.format(name=name) + "ActiveState=active\nSubState=running\n")
    case = Case("ws3090", {}, chat_unit)
    assert row(checks.unit_file, case, facts) == (
        f"{name}: unit file", f"loaded from /etc/systemd/system/{name}", actual.format(name=name), "failed")
    others = [checks.enabled, checks.active, checks.unit_file_reloaded, checks.command_line,
              checks.dropins_applied, checks.env_file_mode, checks.env_file_owner, checks.env_file_content,
              checks.config_file, checks.listening, checks.health, checks.served_models, checks.ready]
    per_key = [(checks.property, (chat_unit, key, value)) for key, value in chat_unit["properties"].items()] + [
        (checks.environment, (chat_unit, key, value)) for key, value in chat_unit["environment"].items()]
    rows = [row(check, case, facts) for check in others] + [row(check, Case("ws3090", {}, item), facts) for check, item in per_key]
    assert len(rows) > 20
    why = {"masked": "the unit is masked", "not-found": "the unit file is missing",
           "bad-setting": "the unit has a bad setting"}[shown.split("\n")[0].split("=")[1]]
    assert {(status, actual) for _, _, actual, status in rows} == {("n/a", f"n/a: {why}: see {name}: unit file")}
    assert all(expected for _, expected, _, _ in rows)


def test_the_http_rows_show_the_url_they_asked(chat_unit):
    facts = unit_facts(chat_unit, "LoadState=loaded\n")
    case = Case("ws3090", {}, chat_unit)
    assert chat_unit["url"] == "http://127.0.0.1:8000"  # bound to 0.0.0.0: asked on the host's loopback
    check, expected, actual, status = row(checks.health, case, facts)
    assert (check, expected, status) == (f"{chat_unit['name']}: GET http://127.0.0.1:8000/health", "200", "failed")
    assert row(checks.served_models, case, facts)[:2] == (
        f"{chat_unit['name']}: GET http://127.0.0.1:8000/v1/models", ", ".join(chat_unit["served_names"]))


def test_the_module_documentation_renders(tmp_path):
    module = f"{COLLECTION}.unit_overrides"
    env = {key: value for key, value in os.environ.items() if not key.startswith(("ANSIBLE_", "VIRTUAL_ENV"))}
    env.update(ANSIBLE_COLLECTIONS_PATH=str(collections_dir(tmp_path / "collections")),
               ANSIBLE_HOME=str(tmp_path / "ansible-home"), NO_COLOR="1")
    doc = subprocess.run([str(Path(sys.executable).parent / "ansible-doc"), "--type", "module", "--json", module],
                         env=env, capture_output=True, text=True, timeout=120)
    assert doc.returncode == 0, doc.stderr
    entry = json.loads(doc.stdout)[module]
    assert set(entry["doc"]["options"]) == {"unit", "content", "root"}
    assert entry["doc"]["attributes"]["check_mode"]["support"] == "full"
    assert set(entry["return"]) == {"dropins", "removed", "refused"} and entry["examples"].strip()


def test_a_missing_container_fails_one_row_the_settings_of_it_are_na():
    from provisioner.audit.checks import vllm_container
    from provisioner.audit.checks.vllm_container import ContainerFacts
    from provisioner.spec import validate_spec
    from tests.unit.test_audit_check_docs import containers_spec

    (target,) = spec_targets(validate_spec(containers_spec(), check_files=False))
    names = ["running", "healthy", "image", "published_port", "shm", "restart_policy", "health_endpoint"]
    for container in target.expected["vllm_containers"]:
        facts = type("Facts", (), {"containers": {container["name"]: ContainerFacts(None, {}, None, None, None, {})}})()
        case = Case("ws4070", {}, container)
        found = [row(getattr(vllm_container, name), case, facts) for name in names]
        found += [row(vllm_container.gpu_pinning, Case("ws4070", {}, (container, key, value)),
                      facts) for key, value in container["environment"].items()]
        head = f"{container['name']}: {container['engine']} container"
        assert found[0] == (head, "running", "(absent): no container of that name: provision apply creates and starts it",
                            "failed")
        restart_is_the_unit_s = container["unit"] is not None  # podman: systemd's Restart= of the quadlet's unit
        na = [entry for entry in found[1:] if not (restart_is_the_unit_s and entry[0].endswith(": Restart"))]
        assert {(status, actual) for _, _, actual, status in na} == {("n/a", f"n/a: no container {container['name']}: see {head}")}
