"""`provision plan` for instances in containers: the quadlet and the compose project the role writes,
rendered from the role's own templates; and the audit's expectations for them."""

from __future__ import annotations

import configparser

import yaml

from provisioner.audit.expectations import container_expectations, host_expectations
from provisioner.plan import build_plan
from provisioner.spec import validate_spec
from provisioner.validation.roles import host_variables
from tests.unit.conftest import UUID0, UUID1, host, instance, spec_data

DIGEST = "sha256:" + "0f" * 32
TWO_GPUS = {"devices": [{"index": 0, "uuid": UUID0}, {"index": 1, "uuid": UUID1}]}


def containers_spec() -> dict:
    return spec_data(hosts=[host(gpus=TWO_GPUS)], instances=[
        instance("pod", 8000, 0.45, gpus=[0, 1], bind="10.0.0.5", options={"tensor-parallel-size": 2},
                 env={"VLLM_LOGGING_LEVEL": "DEBUG"}, container={"engine": "podman", "shm_size": "16G"}),
        instance("dock", 8001, 0.45, gpus=[1], container={"engine": "docker", "digest": DIGEST, "ipc_host": True}),
    ])


def quadlet(content: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None, comment_prefixes=("#",))
    parser.optionxform = str
    parser.read_string(content)
    return parser


def test_podman_instance_is_a_quadlet_pinned_by_cdi_and_uuid():
    (plan,) = build_plan(validate_spec(containers_spec(), check_files=False))
    pod = plan.units[0]
    assert pod.unit.path == "/etc/containers/systemd/vllm-pod.container" and pod.unit.mode == "0644"
    text = pod.unit.content
    settings = quadlet(text)
    assert settings["Container"]["Image"] == "docker.io/vllm/vllm-openai:v0.25.0"
    assert settings["Container"]["Exec"] == "--config /etc/vllm/pod.yaml"
    assert f"AddDevice=nvidia.com/gpu={UUID0}\nAddDevice=nvidia.com/gpu={UUID1}\n" in text
    assert settings["Container"]["PublishPort"] == "10.0.0.5:8000:8000"
    assert settings["Container"]["ShmSize"] == "16G"
    assert settings["Service"]["Restart"] == "always"
    # a stop lets the requests in flight finish (--shutdown-timeout 30), then podman kills, then systemd
    assert yaml.safe_load(pod.config_file.content)["shutdown-timeout"] == 30
    assert (settings["Container"]["StopTimeout"], settings["Service"]["TimeoutStopSec"]) == ("60", "70")
    assert pod.environment["CUDA_VISIBLE_DEVICES"] == f"{UUID0},{UUID1}"
    assert pod.environment["VLLM_LOGGING_LEVEL"] == "DEBUG"
    # the server listens on all of the container's addresses; the port is published on the instance's
    assert yaml.safe_load(pod.config_file.content)["host"] == "0.0.0.0"
    assert pod.boot_unit is None


def test_docker_instance_is_a_compose_project_with_a_boot_unit():
    (plan,) = build_plan(validate_spec(containers_spec(), check_files=False))
    dock = plan.units[1]
    assert dock.unit.path == "/etc/vllm/dock.compose.yaml"
    service = yaml.safe_load(dock.unit.content)["services"]["vllm"]
    assert service["image"] == f"docker.io/vllm/vllm-openai:v0.25.0@{DIGEST}"
    assert service["command"] == ["--config", "/etc/vllm/dock.yaml"]
    assert service["ports"] == ["127.0.0.1:8001:8001"]
    assert service["ipc"] == "host" and "shm_size" not in service
    assert service["env_file"] == ["/etc/vllm/dock.env"]
    assert service["stop_grace_period"] == "60s" and yaml.safe_load(dock.config_file.content)["shutdown-timeout"] == 30
    assert service["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "cdi", "device_ids": [f"nvidia.com/gpu={UUID1}"], "capabilities": ["gpu"]}]
    assert service["healthcheck"]["test"][:3] == ["CMD", "python3", "/usr/local/lib/vllm-provision/wait-ready"]
    assert dock.environment["CUDA_VISIBLE_DEVICES"] == UUID1
    boot = dock.boot_unit
    assert boot.path == "/etc/systemd/system/vllm-dock.service"
    # shares GPU 1 with pod, which loads first; after the Docker daemon
    assert "After=vllm-pod.service" in boot.content and "Requires=docker.service" in boot.content
    assert "ExecStart=/usr/bin/docker compose --file /etc/vllm/dock.compose.yaml up --detach --wait" in boot.content
    assert "TimeoutStopSec=70\n" in boot.content
    assert boot in plan.files


def test_audit_expects_what_the_templates_render():
    spec = validate_spec(containers_spec(), check_files=False)
    (plan,) = build_plan(spec)
    variables = host_variables(spec.hosts[0], spec.instances)
    expected = host_expectations(variables, plan)
    assert expected["units"] == []
    pod, dock = expected["vllm_containers"]
    assert (pod["engine"], pod["unit"], pod["boot_unit"]) == ("podman", "vllm-pod.service", None)
    assert (pod["publish"], pod["ipc"], pod["shm_bytes"]) == ("10.0.0.5:8000", "private", 16 * 1024**3)
    assert (dock["engine"], dock["unit"], dock["boot_unit"]) == ("docker", None, "vllm-dock.service")
    assert (dock["ipc"], dock["shm_bytes"], dock["restart"]) == ("host", None, "always")
    assert dock["url"] == "http://127.0.0.1:8001"
    assert pod["environment"] == {"CUDA_VISIBLE_DEVICES": f"{UUID0},{UUID1}", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert dock["env_file"]["mode"] == "0600"
    assert container_expectations(variables, plan.units[1], variables["vllm_service_instances"][1]) == dock


def test_audit_probes_a_container_serving_tls_over_https():
    data = spec_data(instances=[instance("tls", 8443, 0.5, bind="10.0.0.5", options={"ssl-certfile": "/etc/vllm/tls.pem"},
                                         container={"engine": "podman"})])
    spec = validate_spec(data, check_files=False)
    (plan,) = build_plan(spec)
    variables = host_variables(spec.hosts[0], spec.instances)
    (tls,) = host_expectations(variables, plan)["vllm_containers"]
    assert tls["url"] == "https://10.0.0.5:8443"
