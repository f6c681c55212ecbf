"""Container mode on a real systemd test host (Debian trixie, systemd-nspawn, over SSH): one vLLM
instance as a Podman quadlet, one as a Docker compose project, both pinned to the GPU through CDI.

The host starts without an engine: the role container_engine installs Podman and Docker from the
lab's apt repository (tests/lab/containers.py). No registry is reachable: the image is built here
(a trixie rootfs with the TEST DOUBLE vllm, `docker save` format) and the role loads it from the
spec's image_archive. There is no GPU: a TEST DOUBLE CDI spec declares the stand-in GPU's UUID.
"""

from __future__ import annotations

import json

import pytest

from provisioner.apply import apply_spec
from provisioner.audit.expectations import spec_targets
from provisioner.audit.runner import audit_hosts
from provisioner.spec import load_spec
from tests.integration.conftest import disk_state
from tests.lab.containers import AptRepo, ContainerHost, engine_repo, standin_image_archive, write_cdi_standin
from tests.lab.specs import MODEL, fake_gpu_uuid, host_entry, install_gpu_standin, instance_entry, write_spec

PODMAN, DOCKER = "vllm-pod", "vllm-dock"


@pytest.fixture(scope="module")
def container_host(lab):
    repo = AptRepo(engine_repo(), lab.gateway)
    host = lab.boot(f"ct{lab.boot_count}", kind=ContainerHost(repo))
    install_gpu_standin(host)
    write_cdi_standin(host, [fake_gpu_uuid(host)])
    yield host
    lab.destroy(host)
    repo.close()


@pytest.fixture(scope="module")
def spec_path(container_host, tmp_path_factory):
    archive, reference = standin_image_archive()
    image, tag = reference.rsplit(":", 1)
    host = container_host

    def container(engine: str) -> dict:
        return {"engine": engine, "image": image, "tag": tag, "image_archive": str(archive), "shm_size": "2G"}

    return write_spec(tmp_path_factory.mktemp("containers") / "spec.yml", [host_entry(host)], [
        instance_entry(host, "pod", 8000, share=0.45, container=container("podman")),
        instance_entry(host, "dock", 8001, share=0.45, container=container("docker")),
    ])


def audit(spec_path):
    (report,) = audit_hosts(spec_targets(load_spec(spec_path))).values()
    return report


def failed(report) -> dict[str, tuple[str, str]]:
    return {check.check: (check.expected, check.actual) for check in report.checks if check.status == "failed"}


def test_check_mode_on_a_fresh_host_installs_nothing_and_writes_nothing(container_host, spec_path):
    host = container_host
    before = disk_state(host)
    result = apply_spec(load_spec(spec_path), check=True)
    assert result.succeeded, result.problems
    assert disk_state(host) == before, "check mode changed files on the host"
    assert host.ssh("command -v podman docker", check=False).stdout == ""


def test_apply_runs_a_quadlet_and_a_compose_project_then_changes_nothing(container_host, spec_path):
    host = container_host
    first = apply_spec(load_spec(spec_path))
    assert first.succeeded, first.problems
    assert first.stats[host.name].changed > 0
    second = apply_spec(load_spec(spec_path))
    assert second.succeeded, second.problems
    assert second.stats[host.name].changed == 0, "second apply must report changed=0"

    # the quadlet's generated unit is active; systemd runs podman
    assert host.ssh("systemctl is-active vllm-pod.service").stdout.strip() == "active"
    # docker: an enabled unit brings the compose project up at boot (Docker < 28.2 alone does not: CDI)
    assert host.ssh("systemctl is-enabled vllm-dock.service").stdout.strip() == "enabled"
    assert "/run/systemd/generator/vllm-pod.service" in host.ssh("systemctl show -p FragmentPath vllm-pod.service").stdout
    # both servers answer on the host's address, through the published ports
    for port, name in ((8000, PODMAN), (8001, DOCKER)):
        health = host.ssh(f"python3 -c \"import urllib.request as u; print(u.urlopen('http://{host.address}:{port}/health').status)\"")
        assert health.stdout.strip() == "200", name
        process = json.loads(host.ssh(f"python3 -c \"import urllib.request as u; "
                                      f"print(u.urlopen('http://{host.address}:{port}/standin/process').read().decode())\"").stdout)
        # pinned by UUID, and the CDI device reached the container (the stand-in spec's edit)
        assert process["env"]["CUDA_VISIBLE_DEVICES"] == fake_gpu_uuid(host), name
        assert process["env"]["NVIDIA_VISIBLE_DEVICES"] == fake_gpu_uuid(host), name
        assert process["argv"][-2:] == ["--config", f"/etc/vllm/{name.removeprefix('vllm-')}.yaml"], name
        assert process["options"]["model"] == MODEL
    inspect = {name: json.loads(host.ssh(f"{engine} inspect {name}").stdout)[0]
               for engine, name in (("podman", PODMAN), ("docker", DOCKER))}
    assert inspect[PODMAN]["HostConfig"]["ShmSize"] == inspect[DOCKER]["HostConfig"]["ShmSize"] == 2 * 1024**3
    assert inspect[DOCKER]["HostConfig"]["RestartPolicy"]["Name"] == "always"
    assert inspect[DOCKER]["State"]["Health"]["Status"] == "healthy"
    assert host.ssh("stat -c %a /etc/vllm/pod.env /etc/vllm/dock.env").stdout.split() == ["600", "600"]

    report = audit(spec_path)
    assert failed(report) == {}
    checked = {check.check for check in report.checks if check.status == "passed"}
    for name in (PODMAN, DOCKER):
        assert {f"{name}: health", f"{name}: image", f"{name}: /dev/shm bytes", f"{name}: env file mode",
                f"{name}: published port {8000 if name == PODMAN else 8001}"} <= checked, name
    assert {"vllm-pod.service: Restart", "vllm-dock: restart policy", "vllm-dock.service: enabled"} <= checked


def test_audit_names_each_drift_of_a_container(container_host, spec_path):
    host = container_host
    host.ssh("chmod 0644 /etc/vllm/pod.env && docker update --restart=no vllm-dock >/dev/null")
    assert failed(audit(spec_path)) == {
        "vllm-pod: env file mode": ("0600", "0644"),
        "vllm-dock: restart policy": ("always", "no"),
    }
    host.ssh("docker stop vllm-dock >/dev/null")
    drifted = failed(audit(spec_path))
    assert drifted["vllm-dock: docker container"] == ("running", "exited")
    assert drifted["vllm-dock: GET http://%s:8001/health" % host.address][0] == "200"

    # the next apply puts back exactly what drifted
    repaired = apply_spec(load_spec(spec_path))
    assert repaired.succeeded, repaired.problems
    assert failed(audit(spec_path)) == {}


def test_a_gpu_no_cdi_spec_declares_stops_the_run_before_the_instances(container_host, spec_path):
    host = container_host
    host.ssh("mv /etc/cdi/nvidia.yaml /root/nvidia.yaml")
    try:
        result = apply_spec(load_spec(spec_path))
    finally:
        host.ssh("mv /root/nvidia.yaml /etc/cdi/nvidia.yaml")
    (problem,) = result.problems
    assert problem.task == "Check every CDI device the containers use is declared"
    assert f"nvidia.com/gpu={fake_gpu_uuid(host)} are declared by no spec in /etc/cdi or /var/run/cdi" in problem.message
    assert "install the NVIDIA container toolkit" in problem.message
    assert result.stats[host.name].changed == 0


def test_both_instances_come_back_after_a_reboot(container_host, spec_path):
    host = container_host
    host.reboot(timeout=180)
    # the quadlet's unit starts at boot ([Install]); the boot unit brings the compose project up
    host.ssh("for i in $(seq 120); do [ \"$(docker inspect -f '{{.State.Health.Status}}' vllm-dock 2>/dev/null)\" = healthy ] "
             "&& systemctl is-active -q vllm-pod.service && exit 0; sleep 1; done; exit 1", timeout=180)
    assert failed(audit(spec_path)) == {}
