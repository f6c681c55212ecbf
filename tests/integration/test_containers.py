"""Container mode on a real systemd test host (Debian trixie, systemd-nspawn, over SSH): one vLLM
instance as a Podman quadlet, one as a Docker compose project, both pinned to the GPU through CDI.

The host starts without an engine: the role container_engine installs Podman and Docker from the
lab's apt repository (tests/lab/containers.py). No registry is reachable: the image is built here
(a trixie rootfs with the TEST DOUBLE vllm, `docker save` format) and the role loads it from the
spec's image_archive. There is no GPU: a TEST DOUBLE CDI spec declares the stand-in GPU's UUID.
A setting that stops both servers at start rolls each back to the files it last got ready with.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from provisioner.apply.hosts import apply_spec
from provisioner.audit.expectations import spec_targets
from provisioner.audit.runner import audit_hosts
from provisioner.spec import load_spec
from tests.integration.conftest import disk_state
from tests.lab.containers import AptRepo, ContainerHost, engine_repo, standin_image_archive, write_cdi_standin
from tests.lab.specs import MODEL, fake_gpu_uuid, host_entry, install_gpu_standin, instance_entry, write_spec

PODMAN, DOCKER = "vllm-pod", "vllm-dock"
KEPT = "/etc/vllm/previous"  # each instance's files as they last got ready (role vllm_service's commit.yml)
# an instance setting that stops it at start: the stand-in's own switch (tests/doubles/vllm_package), as a bad
# VLLM_ATTENTION_BACKEND stops the real vLLM
NO_SUCH_BACKEND = "ValueError: Invalid attention backend: 'NO_SUCH_BACKEND'"
BAD_SETTING = {"STANDIN_FAILS_AT_START": NO_SUCH_BACKEND}


@pytest.fixture(scope="module")
def container_host(lab):
    repo = AptRepo(engine_repo(), lab.gateway)
    host = lab.boot(f"ct{lab.boot_count}", kind=ContainerHost(repo))
    install_gpu_standin(host)
    write_cdi_standin(host, [fake_gpu_uuid(host)])
    yield host
    lab.destroy(host)
    repo.close()


def write_container_spec(host, path: Path, **extra) -> Path:
    """The host's spec: "pod" in Podman, "dock" in Docker, both with `extra` (e.g. env)."""
    archive, reference = standin_image_archive()
    image, tag = reference.rsplit(":", 1)

    def container(engine: str) -> dict:
        return {"engine": engine, "image": image, "tag": tag, "image_archive": str(archive), "shm_size": "2G"}

    return write_spec(path, [host_entry(host)], [
        instance_entry(host, "pod", 8000, share=0.45, container=container("podman"), **extra),
        instance_entry(host, "dock", 8001, share=0.45, container=container("docker"), **extra),
    ])


@pytest.fixture(scope="module")
def spec_path(container_host, tmp_path_factory):
    return write_container_spec(container_host, tmp_path_factory.mktemp("containers") / "spec.yml")


def audit(spec_path):
    (report,) = audit_hosts(spec_targets(load_spec(spec_path))).values()
    return report


def failed(report) -> dict[str, tuple[str, str]]:
    return {check.check: (check.expected, check.actual) for check in report.checks if check.status == "failed"}


def process_of(host, port: int) -> dict:
    """What the stand-in server on `port` runs: its argv, options, environment (asked from the host itself)."""
    return json.loads(host.ssh(f"python3 -c \"import urllib.request as u; "
                               f"print(u.urlopen('http://{host.address}:{port}/standin/process').read().decode())\"").stdout)


def file_states(host, *paths: str) -> dict[str, str]:
    """Each file's sha256, owner and mode (never its content: an env file holds the API key)."""
    script = "for f in " + " ".join(paths) + "; do echo \"$f $(sha256sum < $f | cut -c1-16) $(stat -c '%U %a' $f)\"; done"
    lines = host.ssh(script).stdout
    return dict(line.split(" ", 1) for line in lines.splitlines())


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
        process = process_of(host, port)
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


def test_a_setting_that_does_not_get_ready_rolls_back_the_quadlet_and_the_compose_project(container_host, spec_path, tmp_path):
    """Config rollback in both engines (vllm_service's tasks/transaction.yml): the files each instance got ready
    with are kept in /etc/vllm/previous/ (the quadlet; the compose file), a bad setting on both is restored
    from them in one run, the Podman unit restarted and the compose project recreated, and the run fails
    saying so; the good spec again changes nothing."""
    host = container_host
    files = ("/etc/vllm/pod.env", "/etc/vllm/pod.yaml", "/etc/containers/systemd/vllm-pod.container",
             "/etc/vllm/dock.env", "/etc/vllm/dock.yaml", "/etc/vllm/dock.compose.yaml")
    kept = tuple(f"{KEPT}/{Path(path).name}" for path in files)
    ready = file_states(host, *files)
    # kept as they got ready: content, owner, mode (the env files 0600 root)
    assert list(file_states(host, *kept).values()) == list(ready.values())

    run = apply_spec(load_spec(write_container_spec(host, tmp_path / "bad.yml", env=BAD_SETTING)))

    assert not run.succeeded
    messages = " | ".join(problem.message for problem in run.problems)
    assert (f"pod, dock did not get ready with their new config (pod: {NO_SUCH_BACKEND}; dock: {NO_SUCH_BACKEND}): "
            "restored the previous quadlet of pod; the previous compose file of dock (ready again); "
            "fix instances[pod], instances[dock]") in messages, messages
    assert file_states(host, *files) == ready and list(file_states(host, *kept).values()) == list(ready.values())
    # both serve again on their previous settings: the servers' environment and the containers' have no bad setting
    assert host.ssh("systemctl is-active vllm-pod.service").stdout.strip() == "active"
    assert host.ssh("docker inspect -f '{{.State.Health.Status}}' vllm-dock").stdout.strip() == "healthy"
    for (engine, name), port in ((("podman", PODMAN), 8000), (("docker", DOCKER), 8001)):
        assert "STANDIN_FAILS_AT_START" not in process_of(host, port)["env"], name
        environment = json.loads(host.ssh(f"{engine} inspect {name}").stdout)[0]["Config"]["Env"]
        assert not [line for line in environment if line.startswith("STANDIN_FAILS_AT_START=")], name
    assert failed(audit(spec_path)) == {}
    again = apply_spec(load_spec(spec_path))
    assert again.succeeded, again.problems
    assert again.stats[host.name].changed == 0


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
