"""The audit's expectations come from the roles' variables and the roles' own rendered templates."""

from __future__ import annotations

import hashlib
import json

import pytest

from provisioner.audit.expectations import (
    load_profile,
    profile_expectations,
    spec_targets,
    time_span,
)
from provisioner.base.paths import EXAMPLES_DIR
from provisioner.fleet.inventory import host_vars
from provisioner.plan import build_plan
from provisioner.spec import load_spec, validate_spec
from provisioner.vllm.serve_args import serving_expectations
from tests.unit.conftest import UUID0, UUID1, host, instance, spec_data

SEED1_UUID = "GPU-5e3c1a2b-7d4f-4c1e-9a8b-3f2e1d0c9b8a"


@pytest.fixture(scope="module")
def seed1():
    spec = load_spec(EXAMPLES_DIR / "seed1-3090.yml")
    (target,) = spec_targets(spec)
    return spec, target


def test_connection_and_host_settings_come_from_the_spec(seed1):
    _, target = seed1
    assert (target.name, target.connection.address, target.connection.user, target.connection.port) == (
        "ws3090", "192.0.2.10", "root", 22)
    expected = target.expected
    assert expected["sysctl"] == {"file": "/etc/sysctl.d/60-vllm-provision.conf", "settings": {"vm.swappiness": "1"}}
    assert expected["shm"] == {"size": "16G", "bytes": 16 * 1024**3, "exact": True,
                               "fstab_line": "tmpfs /dev/shm tmpfs defaults,nosuid,nodev,size=16G 0 0"}


def test_nouveau_files_are_the_rendered_templates(seed1):
    spec, target = seed1
    (plan,) = build_plan(spec)
    nouveau = target.expected["nouveau"]
    assert nouveau["files"] == {file.path: file.content for file in plan.nouveau_files}
    assert nouveau["modprobe_lines"] == ["blacklist nouveau", "install nouveau /bin/false", "options nouveau modeset=0"]
    assert nouveau["modules"] == ["nouveau"]
    assert nouveau["cmdline_flags"] == ["nouveau.modeset=0", "rd.driver.blacklist=nouveau", "modprobe.blacklist=nouveau"]
    assert nouveau["initramfs_file"] == "etc/modprobe.d/blacklist-nouveau.conf"
    assert nouveau["reboot_marker"] == {"path": "/run/reboot-required.pkgs", "line": "vllm-provision:nouveau"}


def test_unit_expectations_are_the_rendered_unit_as_systemctl_show_reports_it(seed1):
    _, target = seed1
    (unit,) = target.expected["units"]
    assert unit["name"] == "vllm-qwen7b.service"
    assert unit["fragment"] == "/etc/systemd/system/vllm-qwen7b.service"
    properties = unit["properties"]
    assert properties["User"] == "vllm" and properties["Group"] == "vllm"
    assert properties["NoNewPrivileges"] == "yes" and properties["ProtectSystem"] == "strict"
    assert properties["Restart"] == "on-failure"
    assert properties["TimeoutStartUSec"] == "30min" and properties["RestartUSec"] == "10s"
    assert not {"Environment", "EnvironmentFile", "ExecStart", "ExecStartPost", "TimeoutStartSec"} & set(properties)
    assert unit["environment"] == {"CUDA_VISIBLE_DEVICES": SEED1_UUID, "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                                   "HF_HOME": "/var/lib/vllm/hf",
                                   "VLLM_CACHE_ROOT": "/var/lib/vllm/cache/0.25.0/vllm",
                                   "TORCHINDUCTOR_CACHE_DIR": "/var/lib/vllm/cache/0.25.0/inductor",
                                   "TRITON_CACHE_DIR": "/var/lib/vllm/cache/0.25.0/triton",
                                   "VLLM_WORKER_MULTIPROC_METHOD": "fork"}
    assert unit["command_line"] == "/opt/vllm/venvs/0.25.0/bin/vllm serve --config /etc/vllm/qwen7b.yaml"
    # where it listens and what it serves: read from the rendered config file
    assert (unit["listen"], unit["url"], unit["served_names"]) == (
        "127.0.0.1:8000", "http://127.0.0.1:8000", ["Qwen/Qwen2.5-7B-Instruct"])
    assert unit["config_file"]["path"] == "/etc/vllm/qwen7b.yaml"
    assert "max-num-seqs: 128" in unit["config_file"]["content"].splitlines()


def test_env_file_is_expected_by_hash_with_the_real_key_which_never_appears(seed1):
    spec, target = seed1
    (unit,) = target.expected["units"]
    (plan,) = build_plan(spec)
    secret = (EXAMPLES_DIR / "secrets" / "seed1-qwen.key").read_text().strip()
    redacted = plan.units[0].env_file.content
    with_key = "\n".join(
        f"VLLM_API_KEY={secret}" if line.startswith("VLLM_API_KEY=") else line for line in redacted.split("\n"))
    assert unit["env_file"] == {"path": "/etc/vllm/qwen7b.env", "mode": "0600", "owner": "root:root",
                                "sha256": hashlib.sha256(with_key.encode()).hexdigest()}
    assert secret not in json.dumps(target.expected)


def test_a_changed_spec_changes_the_expectations():
    data = spec_data(
        hosts=[host(settings={"swappiness": 10, "nouveau_blacklist": False, "shm_size": None})],
        instances=[instance("chat", 8001, bind="0.0.0.0", options={"served-model-name": "chat"}, env={"A": "b c"})],
    )
    (target,) = spec_targets(validate_spec(data, check_files=False))
    expected = target.expected
    assert expected["sysctl"]["settings"] == {"vm.swappiness": "10"}
    assert expected["nouveau"] == {
        "enabled": False,
        "absent_files": ["/etc/modprobe.d/blacklist-nouveau.conf", "/etc/default/grub.d/60-vllm-provision-nouveau.cfg"],
    }
    assert expected["shm"] == {"size": None}
    (unit,) = expected["units"]
    assert unit["environment"]["A"] == "b c" and unit["environment"]["CUDA_VISIBLE_DEVICES"] == UUID0
    assert (unit["listen"], unit["url"], unit["served_names"]) == ("0.0.0.0:8001", "http://127.0.0.1:8001", ["chat"])


def test_limit_picks_one_host():
    second = host("ws2", "192.0.2.21", gpus={"devices": [{"index": 0, "uuid": UUID1}]})
    data = spec_data(hosts=[host(), second], instances=[instance("chat", 8000)])
    spec = validate_spec(data, check_files=False)
    assert [target.name for target in spec_targets(spec)] == ["ws4070", "ws2"]
    assert [target.name for target in spec_targets(spec, limit="ws2")] == ["ws2"]


@pytest.mark.parametrize("argv, listen, url, served", [
    (["vllm", "serve", "m"], "0.0.0.0:8000", "http://127.0.0.1:8000", ["m"]),
    (["vllm", "serve", "m", "--host", "::1", "--port", "9000"], "[::1]:9000", "http://[::1]:9000", ["m"]),
    (["vllm", "serve", "m", "--ssl-certfile", "c.pem", "--served-model-name", "a", "b"],
     "0.0.0.0:8000", "https://127.0.0.1:8000", ["a", "b"]),
    (["python3", "-m", "vllm.entrypoints.openai.api_server", "--model=m", "--port=8002"],
     "0.0.0.0:8002", "http://127.0.0.1:8002", ["m"]),
])
def test_where_a_vllm_command_line_listens_and_what_it_serves(argv, listen, url, served):
    assert serving_expectations(argv) == {"listen": listen, "url": url, "served_names": served}


@pytest.mark.parametrize("seconds, shown", [(10, "10s"), (1800, "30min"), (5410, "1h 30min 10s"), (90000, "1d 1h")])
def test_time_spans_read_as_systemctl_show_writes_them(seconds, shown):
    assert time_span(seconds) == shown


def test_profile_expectations_apply_the_profile_to_what_was_discovered():
    profile = load_profile("recommended")
    discovered = {
        "units": [{"name": "llm.service", "fragment": "/etc/systemd/system/llm.service",
                   "argv": ["/usr/bin/vllm", "serve", "m", "--port", "8100"]}],
        "gpus": {"indexes": [0, 1], "problem": None},
        "container_tools": ["docker"],
        "containers": [{"name": "v", "tool": "docker", "image": "vllm/vllm-openai", "ports": [], "shm_bytes": 67108864,
                        "argv": ["vllm", "serve", "m", "--api-key", "sk-x"],
                        "environment": {"CUDA_VISIBLE_DEVICES": "0", "HF_TOKEN": "hf_secret"}}],
    }
    expected = profile_expectations(profile, discovered)
    assert expected["sysctl"] == {"file": None, "settings": {"vm.swappiness": "1"}}
    assert expected["shm"] == {"size": "1G", "bytes": 1024**3, "exact": False}
    assert expected["nouveau"]["cmdline_flags"][0] == "nouveau.modeset=0"  # from the role's defaults
    (unit,) = expected["units"]
    assert unit["properties"] == profile["unit"]["properties"]
    assert unit["listen"] == "0.0.0.0:8100"
    (container,) = expected["containers"]["found"]
    assert container["environment"] == {"CUDA_VISIBLE_DEVICES": "0"}  # HF_TOKEN dropped: not asked about
    assert container["command_line"] == "vllm serve m --api-key <redacted>"
    assert "sk-x" not in json.dumps(expected) and "hf_secret" not in json.dumps(expected)
    # the GPUs nvidia-smi listed, with no power target (a server we did not build states none)
    assert expected["gpu"] == {"nvidia_smi": "nvidia-smi", "expected_count": None, "persistence_mode": True,
                               "devices": [{"index": 0}, {"index": 1}]}
    no_gpus = {**discovered, "gpus": {"indexes": [], "problem": "no nvidia-smi on the PATH"}}
    assert profile_expectations(profile, no_gpus)["gpu"] is None  # nothing to read, no GPU rows


def test_gpu_expectations_are_the_nvidia_gpu_roles_variables(seed1):
    spec, target = seed1
    variables = host_vars(spec.hosts[0], spec.instances)
    assert target.expected["gpu"] == {
        "nvidia_smi": "nvidia-smi",  # the role's default
        "expected_count": variables["nvidia_gpu_expected_count"],
        "persistence_mode": variables["nvidia_gpu_persistence_mode"],
        "devices": variables["nvidia_gpu_devices"],
    }
    assert target.expected["gpu"]["devices"] == [
        {"index": 0, "uuid": SEED1_UUID, "model": "NVIDIA GeForce RTX 3090", "power_limit": "default"}]


def test_a_host_whose_spec_lists_no_gpu_has_no_gpu_checks():
    data = spec_data(hosts=[host("bare", gpus={"devices": []})], instances=[])
    (target,) = spec_targets(validate_spec(data))
    assert target.expected["gpu"] is None


def test_an_unknown_profile_names_the_known_ones():
    with pytest.raises(ValueError, match="no profile named 'strict'; profiles: recommended"):
        load_profile("strict")


# --------------------------------------------------------------------------- what the roles leave: boot unit, vLLM, files

from provisioner.base.paths import role_dir  # noqa: E402


def test_the_gpu_boot_unit_is_the_roles_own_oneshot_enabled_and_active_after_a_run(seed1):
    _, target = seed1
    assert target.expected["gpu_boot_unit"] == {
        "name": "nvidia-gpu-limits.service", "fragment": "/etc/systemd/system/nvidia-gpu-limits.service",
        "enabled": "enabled", "type": "oneshot", "active_after_success": "active"}
    no_gpus = host(gpus={"devices": []})
    (target,) = spec_targets(validate_spec(spec_data([no_gpus], [])))
    assert target.expected["gpu_boot_unit"] is None  # the role does nothing without devices


def test_the_pinned_vllm_is_expected_in_the_roles_venv_where_the_role_runs(seed1):
    _, target = seed1
    assert target.expected["vllm_install"] == {
        "venv": "/opt/vllm/venvs/0.25.0", "version": "0.25.0", "path": "/opt/vllm", "venvs": "/opt/vllm/venvs",
        "current": "/opt/vllm/current", "previous": "/opt/vllm/previous", "unversioned": "/opt/vllm/venv"}
    elsewhere = host(vllm={"version": "0.33.0", "install_path": "/srv/vllm"})
    (target,) = spec_targets(validate_spec(spec_data([elsewhere])))
    assert target.expected["vllm_install"]["venv"] == "/srv/vllm/venvs/0.33.0"
    assert target.expected["vllm_install"]["current"] == "/srv/vllm/current"
    in_a_container = instance("chat", 8000, container={"engine": "podman"})
    (target,) = spec_targets(validate_spec(spec_data([host()], [in_a_container])))
    assert target.expected["vllm_install"] is None  # site.yml skips vllm_install: no venv instance


def test_managed_files_are_the_roles_files_that_no_other_row_checks(seed1):
    spec, target = seed1
    files = {file["path"]: file for file in target.expected["managed_files"]}
    assert list(files) == [
        "/usr/local/lib/vllm-provision/nvidia-gpu-limits", "/etc/vllm-provision/nvidia-gpu-limits.conf",
        "/etc/systemd/system/nvidia-gpu-limits.service", "/usr/local/lib/vllm-provision/wait-ready",
        "/usr/local/lib/vllm-provision/vllm-check-args", "/etc/systemd/system/vllm-qwen7b.service"]
    (plan,) = build_plan(spec)
    # the env file (secret), the config file, the sysctl file and the nouveau files have rows of their own
    assert not {plan.sysctl_file.path, plan.units[0].env_file.path, plan.units[0].config_file.path,
                *(file.path for file in plan.nouveau_files)} & set(files)
    script = files["/usr/local/lib/vllm-provision/nvidia-gpu-limits"]
    assert (script["owner"], script["mode"], script["role"]) == ("root:root", "0755", "nvidia_gpu")
    assert script["content"] == (role_dir("nvidia_gpu") / "files" / "nvidia-gpu-limits").read_text()
    unit = files["/etc/systemd/system/vllm-qwen7b.service"]
    assert unit["content"] == plan.units[0].unit.content and (unit["owner"], unit["mode"]) == ("root:root", "0644")
    # the lines read as systemd runs them by rows of their own; EnvironmentFile= and ExecStartPost= stay
    assert {"User", "Restart", "ExecStart", "TimeoutStartSec"} <= set(unit["skip"]["keys"])
    assert not {"EnvironmentFile", "ExecStartPost", "Environment"} & set(unit["skip"]["keys"])
    assert unit["skip"]["environment"] == ["CUDA_DEVICE_ORDER", "CUDA_VISIBLE_DEVICES", "HF_HOME",
                                           "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "VLLM_CACHE_ROOT",
                                           "VLLM_WORKER_MULTIPROC_METHOD"]
    settings = files["/etc/vllm-provision/nvidia-gpu-limits.conf"]
    assert settings["content"] is None  # rendered by the suite from the GPUs it reads
    assert settings["render"]["devices"] == [{"index": 0, "uuid": SEED1_UUID, "model": "NVIDIA GeForce RTX 3090",
                                              "power_limit": "default"}]
    assert files["/etc/systemd/system/nvidia-gpu-limits.service"]["skip"] is None


def test_a_container_instances_quadlet_is_a_managed_file_whole():
    in_a_container = instance("chat", 8000, container={"engine": "podman"})
    (target,) = spec_targets(validate_spec(spec_data([host()], [in_a_container])))
    quadlet = target.expected["managed_files"][-1]
    assert quadlet["path"] == "/etc/containers/systemd/vllm-chat.container" and quadlet["skip"] is None
