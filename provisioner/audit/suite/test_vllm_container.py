"""Each vLLM instance in a container (role vllm_service: a Podman quadlet or a Docker compose project):
running and healthy, its image, published port, /dev/shm (or the host's IPC), restart policy, GPU
pinning, env file and `vllm serve --config` file, and the server answering on the host's address.

Spec mode only: what the role's templates render for the instance.
"""

from provisioner.audit.checks import ABSENT, UNSET, each
from provisioner.audit.suite.instance_files import (
    expect_config_file,
    expect_env_file_content,
    expect_env_file_mode,
    expect_env_file_owner,
)

containers = each(lambda expected: expected.get("vllm_containers", []), ids=lambda container: container["name"])
# podman: the quadlet's generated unit runs the container
with_unit = each(lambda expected: [container for container in expected.get("vllm_containers", []) if container["unit"]],
                 ids=lambda container: container["name"])
pinning = each(
    lambda expected: [(container, name, value) for container in expected.get("vllm_containers", [])
                      for name, value in container["environment"].items()],
    ids=lambda entry: f"{entry[0]['name']}-{entry[1]}",
)
NO_CONTAINER = f"{ABSENT}: no container of that name"


@containers
def test_running(case, facts, audit):
    container = case.item
    found = facts.containers[container["name"]].inspect
    audit.expect(f"{container['name']}: {container['engine']} container", "running",
                 found["State"]["Status"] if found else NO_CONTAINER)


@containers
def test_healthy(case, facts, audit):
    container = case.item
    found = facts.containers[container["name"]].inspect
    health = ((found or {}).get("State") or {}).get("Health") or {}
    audit.expect(f"{container['name']}: health", "healthy", health.get("Status") or (UNSET if found else NO_CONTAINER))


boot_units = each(lambda expected: [container for container in expected.get("vllm_containers", []) if container["boot_unit"]],
                  ids=lambda container: container["name"])


@boot_units
def test_boot_unit_enabled(case, facts, audit):
    container = case.item
    audit.expect(f"{container['boot_unit']}: enabled", "enabled",
                 facts.containers[container["name"]].unit.get("UnitFileState") or UNSET)


@with_unit
def test_unit_active(case, facts, audit):
    container = case.item
    audit.expect(f"{container['unit']}: active", "active", facts.containers[container["name"]].unit.get("ActiveState") or UNSET)


@containers
def test_image(case, facts, audit):
    container = case.item
    found = facts.containers[container["name"]].inspect
    # docker: Config.Image is the reference it was created from; podman: ImageName
    actual = (found.get("ImageName") or found["Config"].get("Image")) if found else NO_CONTAINER
    audit.expect(f"{container['name']}: image", container["image"], actual)


@containers
def test_published_port(case, facts, audit):
    container = case.item
    facts_of = facts.containers[container["name"]]
    port = container["publish"].rsplit(":", 1)[1]
    bindings = (facts_of.host_config("PortBindings") or {}).get(f"{port}/tcp") or []
    actual = ", ".join(f"{binding.get('HostIp') or '0.0.0.0'}:{binding.get('HostPort')}" for binding in bindings)
    audit.expect(f"{container['name']}: published port {port}", container["publish"],
                 actual or (f"port {port} not published" if facts_of.inspect else NO_CONTAINER))


@containers
def test_shm(case, facts, audit):
    container = case.item
    facts_of = facts.containers[container["name"]]
    if not facts_of.inspect:
        audit.expect(f"{container['name']}: /dev/shm", container["ipc"], NO_CONTAINER)
    ipc = facts_of.host_config("IpcMode") or ""
    if container["ipc"] == "host":
        audit.expect(f"{container['name']}: IPC namespace", "host", ipc or UNSET)
    else:
        audit.expect(f"{container['name']}: /dev/shm bytes", str(container["shm_bytes"]), str(facts_of.host_config("ShmSize")))


@containers
def test_restart_policy(case, facts, audit):
    container = case.item
    facts_of = facts.containers[container["name"]]
    if container["unit"]:  # podman: systemd restarts the quadlet's unit
        audit.expect(f"{container['unit']}: Restart", container["restart"], facts_of.unit.get("Restart") or UNSET)
    else:
        policy = (facts_of.host_config("RestartPolicy") or {}).get("Name") if facts_of.inspect else NO_CONTAINER
        audit.expect(f"{container['name']}: restart policy", container["restart"], policy or UNSET)


@pinning
def test_gpu_pinning(case, facts, audit):
    container, name, expected = case.item
    facts_of = facts.containers[container["name"]]
    audit.expect(f"{container['name']}: Env {name}", expected,
                 facts_of.environment.get(name, UNSET) if facts_of.inspect else NO_CONTAINER)


@containers
def test_env_file_mode(case, facts, audit):
    container = case.item
    expect_env_file_mode(audit, f"{container['name']}: env file", container["env_file"],
                         facts.containers[container["name"]].env_file)


@containers
def test_env_file_owner(case, facts, audit):
    container = case.item
    expect_env_file_owner(audit, f"{container['name']}: env file", container["env_file"],
                          facts.containers[container["name"]].env_file)


@containers
def test_env_file_content(case, facts, audit):
    container = case.item
    expect_env_file_content(audit, f"{container['name']}: env file", container["env_file"],
                            facts.containers[container["name"]].env_file_sha256)


@containers
def test_config_file(case, facts, audit):
    container = case.item
    expect_config_file(audit, container["name"], container["config_file"], facts.containers[container["name"]].config_text)


@containers
def test_health_endpoint(case, facts, audit):
    container = case.item
    answer = facts.containers[container["name"]].http.get("/health", {"error": "no answer"})
    audit.expect(f"{container['name']}: GET {container['url']}/health", "200", answer.get("status", answer.get("error")))
