"""The plan renders the roles' own templates: units, env files, sysctl drop-in, nouveau files, fstab line."""

from __future__ import annotations

import pytest
import yaml

from provisioner.base.file_formats import env_file_environment, unit_environment, unit_settings
from provisioner.base.paths import EXAMPLES_DIR
from provisioner.plan import HostPlan, build_plan
from provisioner.spec import load_spec, validate_spec
from provisioner.validation.roles import render_role_file, role_defaults
from tests.unit.conftest import UUID0, UUID1, host, instance, spec_data


def plan_of(data: dict) -> HostPlan:
    (plan,) = build_plan(validate_spec(data, check_files=False))
    return plan


def exec_start(unit: str) -> str:
    """The ExecStart= command with its line continuations joined."""
    text = unit.replace(" \\\n    ", " ")
    return next(line for line in text.splitlines() if line.startswith("ExecStart="))


@pytest.fixture(scope="module")
def seed1() -> HostPlan:
    (plan,) = build_plan(load_spec(EXAMPLES_DIR / "seed1-3090.yml"))
    return plan


@pytest.fixture(scope="module")
def seed2() -> HostPlan:
    (plan,) = build_plan(load_spec(EXAMPLES_DIR / "seed2-4070.yml"))
    return plan


def test_unit_runs_vllm_serve_with_the_instance_config_file(seed1):
    (unit,) = seed1.units
    assert unit.unit.path == "/etc/systemd/system/vllm-qwen7b.service"
    assert unit.unit.mode == "0644"
    assert exec_start(unit.unit.content) == "ExecStart=/opt/vllm/venvs/0.25.0/bin/vllm serve --config /etc/vllm/qwen7b.yaml"
    assert (unit.config_file.path, unit.config_file.mode) == ("/etc/vllm/qwen7b.yaml", "0644")
    assert config_lines(unit) == [
        'model: "Qwen/Qwen2.5-7B-Instruct"', 'host: "127.0.0.1"', "port: 8000", "gpu-memory-utilization: 0.95",
        "shutdown-timeout: 30", "block-size: 16", 'dtype: "bfloat16"', "max-model-len: 4096", "max-num-seqs: 128",
    ]
    assert yaml.safe_load(unit.config_file.content) == {
        "model": "Qwen/Qwen2.5-7B-Instruct", "host": "127.0.0.1", "port": 8000, "gpu-memory-utilization": 0.95,
        "shutdown-timeout": 30, "block-size": 16, "dtype": "bfloat16", "max-model-len": 4096, "max-num-seqs": 128}


def test_a_stop_lets_the_requests_in_flight_finish_before_it_kills():
    """vLLM's --shutdown-timeout defaults to 0, which aborts every stream in flight on SIGTERM (recorded on
    the H200: tests/fixtures/vllm/h200-drain): the role writes its own default, and the unit waits that
    long plus a grace before it kills; an instance's own shutdown-timeout, 0 included, wins."""
    def rendered(options: dict) -> tuple[dict, str]:
        entry = {"name": "chat", "model": "m", "host": "127.0.0.1", "port": 8000, "gpu_uuids": [UUID0],
                 "gpu_memory_utilization": 0.5, "options": options}
        variables = {**role_defaults(), "vllm_service_instance": entry, "vllm_service_instance_index": 0,
                     "vllm_service_instances": [entry]}
        config = yaml.safe_load(render_role_file("vllm_service", "vllm-instance.yaml.j2", variables).content)
        return config, render_role_file("vllm_service", "vllm-instance.service.j2", variables).content

    config, unit = rendered({})
    assert config["shutdown-timeout"] == 30
    assert dict(unit_settings(unit, "Service"))["TimeoutStopSec"] == "60"
    for own in (0, 120):
        config, unit = rendered({"shutdown-timeout": own})
        assert config["shutdown-timeout"] == own
        assert dict(unit_settings(unit, "Service"))["TimeoutStopSec"] == str(own + 30)


def config_lines(unit) -> list[str]:
    return [line for line in unit.config_file.content.splitlines() if not line.startswith("#")]


def test_config_file_values_read_back_as_written_and_false_becomes_the_negative_flag():
    """vLLM drops `false` booleans read from a config file (0.25-0.33): the template writes the negative flag."""
    options = {"enable-prefix-caching": True, "served-model-name": ["chat", "qwen"], "stream-interval": 10,
               "compilation-config": {"cudagraph_mode": "NONE"}, "chat-template": "a 'quoted' # {x}: y",
               "quantization": None}
    entry = {"name": "chat", "model": "m", "host": "0.0.0.0", "port": 8000, "gpu_uuids": [UUID0],
             "gpu_memory_utilization": 0.5, "options": {**options, "enforce-eager": False, "no-enable-chunked-prefill": False}}
    rendered = render_role_file("vllm_service", "vllm-instance.yaml.j2", {
        **role_defaults(), "vllm_service_instance": entry}).content
    read = yaml.safe_load(rendered)
    assert read["enable-prefix-caching"] is True and read["served-model-name"] == ["chat", "qwen"]
    assert read["compilation-config"] == '{"cudagraph_mode": "NONE"}'  # JSON text, which vLLM parses
    assert read["chat-template"] == "a 'quoted' # {x}: y" and read["stream-interval"] == 10
    assert read["no-enforce-eager"] is True and read["enable-chunked-prefill"] is True
    assert "enforce-eager" not in read and "quantization" not in read  # null: left out


def test_unit_pins_the_gpu_by_uuid_in_pci_order(seed1):
    lines = seed1.units[0].unit.content.splitlines()
    assert "Environment=CUDA_VISIBLE_DEVICES=GPU-5e3c1a2b-7d4f-4c1e-9a8b-3f2e1d0c9b8a" in lines
    assert "Environment=CUDA_DEVICE_ORDER=PCI_BUS_ID" in lines
    assert "EnvironmentFile=/etc/vllm/qwen7b.env" in lines


def test_env_file_shows_the_key_redacted_never_the_secret(seed1):
    (unit,) = seed1.units
    key_file = EXAMPLES_DIR / "secrets" / "seed1-qwen.key"
    secret = key_file.read_text().strip()
    assert unit.env_file.path == "/etc/vllm/qwen7b.env"
    assert unit.env_file.mode == "0600"
    assert f"VLLM_API_KEY=<redacted: {len(secret)} bytes from {key_file}>" in unit.env_file.content.splitlines()
    assert all(secret not in file.content for file in seed1.files)
    assert unit.environment["VLLM_API_KEY"] == f"<redacted: {len(secret)} bytes from {key_file}>"


def test_environment_combines_unit_and_env_file(seed1):
    assert seed1.units[0].environment == {
        "CUDA_VISIBLE_DEVICES": "GPU-5e3c1a2b-7d4f-4c1e-9a8b-3f2e1d0c9b8a",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "HF_HOME": "/var/lib/vllm/hf",
        "VLLM_CACHE_ROOT": "/var/lib/vllm/cache/0.25.0/vllm",
        "TORCHINDUCTOR_CACHE_DIR": "/var/lib/vllm/cache/0.25.0/inductor",
        "TRITON_CACHE_DIR": "/var/lib/vllm/cache/0.25.0/triton",
        "VLLM_WORKER_MULTIPROC_METHOD": "fork",
        "VLLM_API_KEY": seed1.units[0].environment["VLLM_API_KEY"],
    }
    assert seed1.units[0].environment["VLLM_API_KEY"].startswith("<redacted: ")


def test_instances_sharing_a_gpu_start_one_after_another(seed2):
    after = {unit.instance: [line for line in unit.unit.content.splitlines() if line.startswith("After=vllm-")]
             for unit in seed2.units}
    assert after == {
        "reranker": [],
        "embed": ["After=vllm-reranker.service"],
        "chat": ["After=vllm-reranker.service", "After=vllm-embed.service"],
    }


def test_chat_model_gets_max_num_batched_tokens(seed2):
    chat = next(unit for unit in seed2.units if unit.instance == "chat")
    assert "max-num-batched-tokens: 4096" in config_lines(chat)
    assert "gpu-memory-utilization: 0.5" in config_lines(chat)


def test_sysctl_file_and_fstab_line(seed1):
    assert seed1.sysctls == {"vm.swappiness": 1}
    assert seed1.sysctl_file.path == "/etc/sysctl.d/60-vllm-provision.conf"
    assert seed1.sysctl_file.content.splitlines()[1:] == ["vm.swappiness = 1"]
    assert seed1.fstab_line == "tmpfs /dev/shm tmpfs defaults,nosuid,nodev,size=16G 0 0"


def test_sysctls_are_written_sorted():
    plan = plan_of(spec_data(hosts=[host(settings={"swappiness": 5, "sysctls": {"vm.max_map_count": 262144}})]))
    assert plan.sysctl_file.content.splitlines()[1:] == ["vm.max_map_count = 262144", "vm.swappiness = 5"]


def test_nouveau_files_when_blacklisted(seed1):
    files = {file.path: file.content for file in seed1.nouveau_files}
    assert sorted(files) == ["/etc/default/grub.d/60-vllm-provision-nouveau.cfg", "/etc/modprobe.d/blacklist-nouveau.conf"]
    assert "blacklist nouveau" in files["/etc/modprobe.d/blacklist-nouveau.conf"].splitlines()
    assert "nouveau.modeset=0 rd.driver.blacklist=nouveau" in files["/etc/default/grub.d/60-vllm-provision-nouveau.cfg"]
    assert seed1.removed_files == []


def test_nouveau_files_removed_when_not_blacklisted():
    plan = plan_of(spec_data(hosts=[host(settings={"nouveau_blacklist": False})]))
    assert plan.nouveau_files == []
    assert sorted(plan.removed_files) == [
        "/etc/default/grub.d/60-vllm-provision-nouveau.cfg", "/etc/modprobe.d/blacklist-nouveau.conf",
    ]


def test_no_fstab_line_without_shm_size():
    assert plan_of(spec_data()).fstab_line is None


def test_instance_without_api_key_and_extra_env():
    plan = plan_of(spec_data(instances=[instance("chat", 8000, env={"HF_HUB_OFFLINE": "1", "NOTE": "a b%c"})]))
    (unit,) = plan.units
    assert "VLLM_API_KEY" not in unit.environment
    assert "No api_key_file for chat" in unit.env_file.content
    assert unit.environment["HF_HUB_OFFLINE"] == "1"
    assert unit.environment["NOTE"] == "a b%c"  # quoted and %-escaped in the unit, read back as written


def test_files_lists_everything_written(seed2):
    assert [file.path for file in seed2.files] == [
        "/etc/sysctl.d/60-vllm-provision.conf",
        "/etc/modprobe.d/blacklist-nouveau.conf",
        "/etc/default/grub.d/60-vllm-provision-nouveau.cfg",
        "/etc/vllm/reranker.env", "/etc/vllm/reranker.yaml", "/etc/systemd/system/vllm-reranker.service",
        "/etc/vllm/embed.env", "/etc/vllm/embed.yaml", "/etc/systemd/system/vllm-embed.service",
        "/etc/vllm/chat.env", "/etc/vllm/chat.yaml", "/etc/systemd/system/vllm-chat.service",
    ]


def test_warnings():
    two_gpus = {"persistence_mode": False,
                "devices": [{"index": 0, "uuid": UUID0, "power_limit": 450}, {"index": 1, "uuid": UUID1}]}
    plan = plan_of(spec_data(hosts=[host(gpus=two_gpus)], instances=[
        instance("open", 8000, bind="0.0.0.0", gpus=[0]),
        instance("tp", 8001, gpus=[0, 1], options={"tensor-parallel-size": 2}),
    ]))
    assert plan.warnings == [
        "open listens on 0.0.0.0 without an API key: anyone who reaches port 8000 can use it — set api_key_file",
        "power limits on GPU 0 may not survive the driver unloading without persistence_mode",
    ]


def test_examples_plan_without_warnings():
    for spec_path in sorted(EXAMPLES_DIR.glob("*.yml")):
        for plan in build_plan(load_spec(spec_path)):
            assert plan.warnings == [], spec_path


def test_environment_parsers():
    assert unit_environment('Environment=A=1\nEnvironment="B=x y" C=2\nEnvironment="D=50%%"\n') == {
        "A": "1", "B": "x y", "C": "2", "D": "50%",
    }
    assert env_file_environment("# comment\nVLLM_API_KEY=abc\n\n") == {"VLLM_API_KEY": "abc"}
