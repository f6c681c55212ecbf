"""Spec → inventory, per docs/variables.md."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from provisioner.base.paths import EXAMPLES_DIR
from provisioner.fleet.inventory import build_inventory, control_path, write_inventory
from provisioner.spec import load_spec, validate_spec
from tests.unit.conftest import UUID0, UUID1, host, instance, spec_data, write_spec

TWO_GPUS = {"devices": [{"index": 0, "uuid": UUID0, "power_limit": 450}, {"index": 1, "uuid": UUID1}]}


def test_host_vars_hold_exactly_the_contract_variables():
    files = build_inventory(validate_spec(spec_data()))
    assert sorted(files) == ["group_vars/all.yml", "host_vars/ws4070.yml", "hosts.yml"]
    assert list(files["host_vars/ws4070.yml"]) == [
        "sysctl_settings", "nouveau_blacklist_enabled",
        "nvidia_driver_manage", "nvidia_driver_source", "nvidia_driver_branch", "nvidia_driver_version",
        "nvidia_driver_modules", "nvidia_driver_hold", "nvidia_driver_reboot", "nvidia_driver_expect_gpus",
        "nvidia_driver_minimum_branch",
        "shm_size", "vllm_service_bin", "vllm_service_instances",
        "container_engine_engines", "container_engine_cdi_devices", "container_engine_nvidia_toolkit_manage",
        "container_engine_nvidia_toolkit_version",
        "nvidia_gpu_expected_count", "nvidia_gpu_persistence_mode", "nvidia_gpu_devices",
        "vllm_install_enabled", "vllm_install_version", "vllm_install_path", "vllm_install_wheelhouse", "vllm_install_index_url",
        "vllm_install_minimum_driver",
    ]


def test_gpu_indexes_resolve_to_uuids_and_uuids_pass_through():
    data = spec_data(
        hosts=[host(gpus=TWO_GPUS)],
        instances=[instance("a", 8000, gpus=[1]), instance("b", 8001, gpus=[UUID0, 1], options={"tensor-parallel-size": 2})],
    )
    entries = build_inventory(validate_spec(data))["host_vars/ws4070.yml"]["vllm_service_instances"]
    assert [entry["gpu_uuids"] for entry in entries] == [[UUID1], [UUID0, UUID1]]


def test_instance_entry_fields():
    data = spec_data(instances=[instance(
        "chat", 8123, 0.45, bind="0.0.0.0", options={"max-num-seqs": 128, "block-size": 16},
        env={"HF_HUB_OFFLINE": "1"},
    )])
    (entry,) = build_inventory(validate_spec(data))["host_vars/ws4070.yml"]["vllm_service_instances"]
    assert entry == {
        "name": "chat",
        "model": "Qwen/Qwen3-1.7B-FP8",
        "host": "0.0.0.0",
        "port": 8123,
        "gpu_uuids": [UUID0],
        "gpu_memory_utilization": 0.45,
        "options": {"block-size": 16, "max-num-seqs": 128},
        "env": {"HF_HUB_OFFLINE": "1"},
        "secret_env": {},
        "api_key_file": None,
        "container": None,
    }


DIGEST = "sha256:" + "ab" * 32


def test_container_instances_name_their_engine_image_and_cdi_devices_and_need_no_venv():
    data = spec_data(hosts=[host(gpus=TWO_GPUS)], instances=[
        instance("pod", 8000, 0.4, gpus=[1], container={"engine": "podman"}),
        instance("dock", 8001, 0.4, gpus=[1, 0], options={"tensor-parallel-size": 2}, container={
            "engine": "docker", "image": "registry.local:5000/vllm", "tag": "nightly", "digest": DIGEST,
            "ipc_host": True}),
    ])
    variables = build_inventory(validate_spec(data))["host_vars/ws4070.yml"]
    pod, dock = variables["vllm_service_instances"]
    assert pod["container"] == {"engine": "podman", "image": "docker.io/vllm/vllm-openai:v0.25.0",
                                "shm_size": "8G", "ipc_host": False, "image_archive": None}
    assert dock["container"] == {"engine": "docker", "image": f"registry.local:5000/vllm:nightly@{DIGEST}",
                                 "shm_size": "8G", "ipc_host": True, "image_archive": None}
    assert variables["container_engine_engines"] == ["docker", "podman"]
    assert variables["container_engine_cdi_devices"] == [f"nvidia.com/gpu={UUID0}", f"nvidia.com/gpu={UUID1}"]
    assert variables["vllm_install_enabled"] is False


def test_one_instance_in_the_venv_keeps_vllm_installed():
    data = spec_data(instances=[instance("pod", 8000, 0.4, container={"engine": "podman"}), instance("venv", 8001, 0.4)])
    variables = build_inventory(validate_spec(data))["host_vars/ws4070.yml"]
    assert variables["vllm_install_enabled"] is True
    assert variables["container_engine_engines"] == ["podman"]


def test_sysctl_settings_merge_swappiness_with_sysctls():
    settings = {"swappiness": 10, "sysctls": {"vm.max_map_count": 262144, "net.core.somaxconn": 4096}}
    variables = build_inventory(validate_spec(spec_data(hosts=[host(settings=settings)])))["host_vars/ws4070.yml"]
    assert variables["sysctl_settings"] == {"net.core.somaxconn": 4096, "vm.max_map_count": 262144, "vm.swappiness": 10}
    assert list(variables["sysctl_settings"]) == ["net.core.somaxconn", "vm.max_map_count", "vm.swappiness"]


def test_settings_and_seam_variables():
    data = spec_data(hosts=[host(
        settings={"shm_size": "16G", "nouveau_blacklist": False},
        gpus={**TWO_GPUS, "persistence_mode": False},
        vllm={"version": "0.33.0", "install_path": "/srv/vllm/"},
    )], instances=[])
    variables = build_inventory(validate_spec(data))["host_vars/ws4070.yml"]
    assert variables["shm_size"] == "16G"
    assert variables["nouveau_blacklist_enabled"] is False
    assert variables["vllm_service_bin"] == "/srv/vllm/venvs/0.33.0/bin/vllm"
    assert variables["vllm_service_instances"] == []
    assert variables["nvidia_gpu_expected_count"] == 2  # defaults to the devices listed
    assert variables["nvidia_gpu_persistence_mode"] is False
    assert variables["nvidia_gpu_devices"] == [
        {"index": 0, "uuid": UUID0, "model": None, "power_limit": 450},
        {"index": 1, "uuid": UUID1, "model": None, "power_limit": "default"},
    ]
    assert (variables["vllm_install_version"], variables["vllm_install_path"]) == ("0.33.0", "/srv/vllm")


def test_hosts_yml_with_absolute_key_and_known_hosts(tmp_path):
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "id").write_text("key")
    (tmp_path / "known_hosts").write_text("x")
    data = spec_data(hosts=[
        host(ssh={"user": "ubuntu", "port": 2222, "key": "keys/id", "known_hosts": "known_hosts", "become": True}),
        host("ws3090", "192.0.2.10", gpus={}),
    ], instances=[])
    spec = load_spec(write_spec(tmp_path / "spec.yml", data))
    hosts = build_inventory(spec)["hosts.yml"]["all"]["children"]["vllm_hosts"]["hosts"]
    liveness = "-o 'ServerAliveInterval 5' -o 'ServerAliveCountMax 3'"
    assert hosts == {
        "ws4070": {
            "ansible_host": "192.0.2.20",
            "ansible_port": 2222,
            "ansible_user": "ubuntu",
            "ansible_ssh_private_key_file": f"{tmp_path}/keys/id",
            # the spec's file is the only trust source; strict; ssh writes no key (UpdateHostKeys no);
            # a silent host is given up after 3 unanswered questions 5 s apart
            "ansible_ssh_common_args": f"-o 'UserKnownHostsFile \"{tmp_path}/known_hosts\"' "
                                       "-o 'GlobalKnownHostsFile /dev/null' -o 'StrictHostKeyChecking yes' "
                                       f"-o 'UpdateHostKeys no' {liveness}",
            # Mitogen's own keepalive options, which it writes before any ssh_args
            "mitogen_ssh_keepalive_interval": 5,
            "mitogen_ssh_keepalive_count": 3,
            "ansible_control_path": hosts["ws4070"]["ansible_control_path"],
            "ansible_become": True,
        },
        "ws3090": {"ansible_host": "192.0.2.10", "ansible_port": 22, "ansible_user": "root",
                   "ansible_ssh_common_args": f"-o 'StrictHostKeyChecking yes' -o 'UpdateHostKeys no' {liveness}",
                   "mitogen_ssh_keepalive_interval": 5,
                   "mitogen_ssh_keepalive_count": 3,
                   "ansible_control_path": hosts["ws3090"]["ansible_control_path"],
                   "ansible_become": False},
    }
    assert all(re.fullmatch(r"%\(directory\)s/vp-[0-9a-f]{16}", entry["ansible_control_path"])
               for entry in hosts.values())


@pytest.mark.parametrize("change", [
    {"user": "ubuntu"}, {"port": 2222}, {"key": "keys/other"}, {"known_hosts": "other_known_hosts"},
])
def test_ssh_master_socket_differs_with_every_option_that_decides_who_connects_how(tmp_path, change):
    """A spec that names another key (or user, port, known_hosts) never rides a master an earlier run opened."""
    (tmp_path / "keys").mkdir()
    for name in ("keys/id", "keys/other", "known_hosts", "other_known_hosts"):
        (tmp_path / name).write_text("x")
    base = {"user": "root", "port": 22, "key": "keys/id", "known_hosts": "known_hosts"}

    def socket(ssh):
        spec = load_spec(write_spec(tmp_path / "spec.yml", spec_data(hosts=[host(ssh=ssh)], instances=[])))
        return control_path(spec.hosts[0])

    assert socket(base) == socket(dict(base))
    assert socket({**base, **change}) != socket(base)


def test_instances_go_to_their_own_host_in_spec_order():
    data = spec_data(
        hosts=[host(), host("ws3090", "192.0.2.10", gpus={"devices": [{"index": 0, "uuid": UUID1}]})],
        instances=[instance("a", 8000), instance("b", 8000, on="ws3090"), instance("c", 8001)],
    )
    files = build_inventory(validate_spec(data))
    assert [e["name"] for e in files["host_vars/ws4070.yml"]["vllm_service_instances"]] == ["a", "c"]
    assert [e["name"] for e in files["host_vars/ws3090.yml"]["vllm_service_instances"]] == ["b"]
    assert files["host_vars/ws3090.yml"]["vllm_service_instances"][0]["gpu_uuids"] == [UUID1]


def test_seed3_example_pins_one_instance_per_card_with_absolute_key_paths():
    spec = load_spec(EXAMPLES_DIR / "seed3-2x4090.yml")
    variables = build_inventory(spec)["host_vars/ws2x4090.yml"]
    entries = {entry["name"]: entry for entry in variables["vllm_service_instances"]}
    assert entries["qwen2-gpu0"]["gpu_uuids"] == ["GPU-0c1d2e3f-4a5b-4c6d-8e7f-9a0b1c2d3e4f"]
    assert entries["qwen2-gpu1"]["gpu_uuids"] == ["GPU-f4e3d2c1-b0a9-4f8e-9d7c-6b5a4f3e2d1c"]
    assert entries["qwen2-gpu0"]["api_key_file"] == str(EXAMPLES_DIR / "secrets" / "seed3.key")
    assert [device["power_limit"] for device in variables["nvidia_gpu_devices"]] == [450, 450]
    assert variables["nvidia_gpu_persistence_mode"] is True


def test_written_files_have_a_header_and_load_back_as_the_data(tmp_path):
    spec = load_spec(write_spec(tmp_path / "my-spec.yml", spec_data()))
    result = write_inventory(spec, tmp_path / "inv")
    assert sorted(p.relative_to(tmp_path / "inv").as_posix() for p in result.written) == [
        "group_vars/all.yml", "host_vars/ws4070.yml", "hosts.yml",
    ]
    text = (tmp_path / "inv" / "host_vars" / "ws4070.yml").read_text()
    assert text.splitlines()[:2] == [
        "# Generated by `provision inventory` from my-spec.yml.",
        "# Do not edit: change the spec and run `provision inventory` again.",
    ]
    for relative, data in build_inventory(spec, tmp_path / "inv").items():
        assert yaml.safe_load((tmp_path / "inv" / relative).read_text()) == data


def test_writing_twice_gives_the_same_bytes(tmp_path):
    spec = load_spec(write_spec(tmp_path / "spec.yml", spec_data()))
    write_inventory(spec, tmp_path / "a")
    write_inventory(spec, tmp_path / "b")
    for name in ("hosts.yml", "group_vars/all.yml", "host_vars/ws4070.yml"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_stale_generated_host_vars_are_removed_but_hand_written_ones_kept(tmp_path):
    two_hosts = spec_data(hosts=[host(), host("ws3090", "192.0.2.10", gpus={})], instances=[])
    write_inventory(validate_spec(two_hosts), tmp_path)
    (tmp_path / "host_vars" / "mine.yml").write_text("my_var: 1\n")

    result = write_inventory(validate_spec(spec_data(instances=[])), tmp_path)

    assert result.removed == [tmp_path / "host_vars" / "ws3090.yml"]
    assert sorted(p.name for p in (tmp_path / "host_vars").iterdir()) == ["mine.yml", "ws4070.yml"]
    assert (tmp_path / "host_vars" / "mine.yml").read_text() == "my_var: 1\n"


def project(folder: Path) -> Path:
    """A spec in `folder` naming its files relative to it: ssh key, known_hosts, wheelhouse, API key."""
    for name in ("keys/id", "known_hosts", "wheelhouse/vllm-0.25.0-py3-none-any.whl", "secrets/chat.key"):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("sk-0123\n" if name.endswith(".key") else "x\n")
    return write_spec(folder / "provision.yml", spec_data(
        hosts=[host(ssh={"key": "keys/id", "known_hosts": "known_hosts"}, vllm={"wheelhouse": "wheelhouse"})],
        instances=[instance("chat", 8000, api_key_file="secrets/chat.key")]))


def test_the_written_inventory_names_the_specs_files_from_its_own_folder(tmp_path):
    spec = load_spec(project(tmp_path / "project"))
    write_inventory(spec, tmp_path / "project" / "inventory")

    inventory = tmp_path / "project" / "inventory"
    reach = yaml.safe_load((inventory / "hosts.yml").read_text())["all"]["children"]["vllm_hosts"]["hosts"]["ws4070"]
    assert reach["ansible_ssh_private_key_file"] == "{{ inventory_dir }}/../keys/id"
    assert reach["ansible_ssh_common_args"].startswith("-o 'UserKnownHostsFile \"{{ inventory_dir }}/../known_hosts\"' ")
    variables = yaml.safe_load((inventory / "host_vars" / "ws4070.yml").read_text())
    assert variables["vllm_install_wheelhouse"] == "{{ inventory_dir }}/../wheelhouse"
    assert variables["vllm_service_instances"][0]["api_key_file"] == "{{ inventory_dir }}/../secrets/chat.key"
    for path in inventory.rglob("*.yml"):
        assert str(tmp_path) not in path.read_text(), path
    # the inventory as data (plan and audit read it) keeps the absolute paths
    assert build_inventory(spec)["host_vars/ws4070.yml"]["vllm_install_wheelhouse"] == str(tmp_path / "project" / "wheelhouse")


def test_files_in_the_home_folder_are_named_with_a_tilde_and_others_absolute(tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id").write_text("key")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "known_hosts").write_text("")
    monkeypatch.setenv("HOME", str(home))
    (tmp_path / "specs").mkdir()
    spec_file = write_spec(tmp_path / "specs" / "provision.yml", spec_data(hosts=[host(
        ssh={"key": "~/.ssh/id", "known_hosts": str(tmp_path / "elsewhere" / "known_hosts")})]))
    write_inventory(load_spec(spec_file), tmp_path / "inventory")
    reach = yaml.safe_load((tmp_path / "inventory" / "hosts.yml").read_text())["all"]["children"]["vllm_hosts"]["hosts"]
    assert reach["ws4070"]["ansible_ssh_private_key_file"] == "~/.ssh/id"
    assert f"UserKnownHostsFile \"{tmp_path}/elsewhere/known_hosts\"" in reach["ws4070"]["ansible_ssh_common_args"]


SHOWN = ("{{ [ansible_ssh_private_key_file, ansible_ssh_common_args, vllm_install_wheelhouse, "
         "vllm_service_instances[0].api_key_file, vllm_service_instances[0].api_key_file is file, "
         "query('ansible.builtin.fileglob', vllm_install_wheelhouse ~ '/*.whl')] }}")


def test_ansible_finds_the_files_after_the_spec_folder_is_moved(tmp_path):
    """Real Ansible reads the moved inventory (the debug action connects to nothing): every path is the moved file."""
    write_inventory(load_spec(project(tmp_path / "project")), tmp_path / "project" / "inventory")
    moved = tmp_path / "somewhere" / "else"
    moved.parent.mkdir()
    shutil.move(tmp_path / "project", moved)

    ansible = Path(sys.executable).with_name("ansible")
    result = subprocess.run([str(ansible), "ws4070", "-i", str(moved / "inventory" / "hosts.yml"), "-m",
                             "ansible.builtin.debug", "-a", f"msg={SHOWN}", "-o"],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("ws4070 | SUCCESS => ")  # one line: -o
    shown = json.loads(result.stdout.partition(" => ")[2])["msg"]
    key, ssh_args, wheelhouse, api_key_file, api_key_is_file, wheels = shown
    inventory = moved / "inventory"
    assert key == f"{inventory}/../keys/id" and Path(key).resolve() == moved / "keys" / "id"
    assert f"UserKnownHostsFile \"{inventory}/../known_hosts\"" in ssh_args
    assert Path(wheelhouse).resolve() == moved / "wheelhouse"
    assert Path(api_key_file).resolve() == moved / "secrets" / "chat.key" and api_key_is_file is True
    assert [Path(wheel).name for wheel in wheels] == ["vllm-0.25.0-py3-none-any.whl"]


def test_spec_values_that_look_like_jinja_stay_data_for_ansible(tmp_path):
    """Ansible templates inventory values: a spec value must reach the roles as written, never run (a
    pipe lookup would run a command on the controller). Real Ansible reads the written inventory."""
    lookup = "{{ lookup('pipe', 'echo INJECTED-$((6*7))') }}"
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "{{ 6*7 }}.key").write_text("sk-0123\n")
    spec = load_spec(write_spec(tmp_path / "provision.yml", spec_data(instances=[instance(
        "chat", 8000, model=lookup, env={"FLAG": "{% if true %}on{% endif %}"}, api_key_file="secrets/{{ 6*7 }}.key")])))
    write_inventory(spec, tmp_path / "inventory")

    ansible = Path(sys.executable).with_name("ansible")
    shown = "{{ [vllm_service_instances[0].model, vllm_service_instances[0].env.FLAG, vllm_service_instances[0].api_key_file] }}"
    result = subprocess.run([str(ansible), "ws4070", "-i", str(tmp_path / "inventory" / "hosts.yml"), "-m",
                             "ansible.builtin.debug", "-a", f"msg={shown}", "-o"],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    model, flag, api_key_file = json.loads(result.stdout.partition(" => ")[2])["msg"]
    assert model == lookup and "INJECTED" not in result.stdout.replace(lookup, "")
    assert flag == "{% if true %}on{% endif %}"
    assert api_key_file == str(tmp_path / "secrets" / "{{ 6*7 }}.key")  # not portable, but as written
