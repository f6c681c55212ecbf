"""Each vLLM instance in a container (role vllm_service: a Podman quadlet or a Docker compose project):
running and healthy, its image, published port, /dev/shm (or the host's IPC), restart policy, GPU
pinning, env file and `vllm serve --config` file, and the server answering on the host's address.

Spec mode only: what the role's templates render for the instance. A container that is not there fails its
`CONTAINER: ENGINE container` row alone (with the fix); the rows of its settings and its server are n/a.
"""

import json
import shlex
from dataclasses import dataclass
from typing import Any

from provisioner.audit.engine import Output, shown_properties
from provisioner.audit.instance_files import (
    env_file_command,
    env_file_stat,
    expect_config_file,
    expect_env_file_content,
    expect_env_file_mode,
    expect_env_file_owner,
    http_answers,
    http_probe_command,
)
from provisioner.audit.registry import ABSENT, UNSET, each


@dataclass
class ContainerFacts:
    inspect: dict[str, Any] | None  # `<engine> inspect <name>`; None: no such container
    unit: dict[str, str]  # podman: `systemctl show` of the quadlet's unit (ActiveState, Restart)
    env_file: tuple[str, str] | None
    env_file_sha256: str | None
    config_text: str | None
    http: dict[str, Any]

    def host_config(self, key: str) -> Any:
        return ((self.inspect or {}).get("HostConfig") or {}).get(key)

    @property
    def environment(self) -> dict[str, str]:
        words = ((self.inspect or {}).get("Config") or {}).get("Env") or []
        return dict(word.split("=", 1) for word in words if "=" in word)


def commands(expected):
    found = {}
    for index, container in enumerate(expected.get("vllm_containers", [])):
        name = shlex.quote(container["name"])
        unit = container["unit"] or container["boot_unit"]
        found.update({
            f"container{index}": f"{container['engine']} inspect {name}",
            f"container_unit{index}": f"systemctl show {shlex.quote(unit)} --property=ActiveState,Restart,UnitFileState",
            f"container_http{index}": http_probe_command(name, container["url"]),
            f"container_env_file{index}": env_file_command(container["env_file"]["path"]),
            f"container_config{index}": f"cat {shlex.quote(container['config_file']['path'])}",
        })
    return found


def read(expected, out):
    return {"containers": {container["name"]: parse_container(index, out)
                           for index, container in enumerate(expected.get("vllm_containers", []))}}


def parse_container(index: int, out: dict[str, Output]) -> ContainerFacts:
    inspect = out[f"container{index}"]
    try:
        found = json.loads(inspect.text) if inspect.rc == 0 else []
    except ValueError:
        found = []
    unit = out.get(f"container_unit{index}")
    stat, sha256 = env_file_stat(out[f"container_env_file{index}"])
    config = out[f"container_config{index}"]
    return ContainerFacts(found[0] if found else None, shown_properties(unit) if unit else {}, stat, sha256,
                          config.text if config.rc == 0 else None, http_answers(out[f"container_http{index}"].text))

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


def present(audit, container: dict, facts, check: str, expected) -> None:
    """Go on only where the container exists; else the row is n/a, pointing at the `CONTAINER: ENGINE container` row
    (one row for a missing container, not one per setting)."""
    if facts.containers[container["name"]].inspect is None:
        audit.not_applicable(check, expected, f"no container {container['name']}: see {container['name']}: "
                                              f"{container['engine']} container")


@containers
def running(case, facts, audit):
    """`CONTAINER: ENGINE container` — the container's state (docker/podman inspect) against `running`.

    Modes: spec.
    """
    container = case.item
    found = facts.containers[container["name"]].inspect
    missing = f"{NO_CONTAINER}: provision apply creates and starts it"
    audit.expect(f"{container['name']}: {container['engine']} container", "running",
                 found["State"]["Status"] if found else missing)


@containers
def healthy(case, facts, audit):
    """`CONTAINER: health` — the container's health check status against `healthy`.

    Modes: spec.
    """
    container = case.item
    present(audit, container, facts, f"{container['name']}: health", "healthy")
    found = facts.containers[container["name"]].inspect
    health = ((found or {}).get("State") or {}).get("Health") or {}
    audit.expect(f"{container['name']}: health", "healthy", health.get("Status") or (UNSET if found else NO_CONTAINER))


boot_units = each(lambda expected: [container for container in expected.get("vllm_containers", []) if container["boot_unit"]],
                  ids=lambda container: container["name"])


@boot_units
def boot_unit_enabled(case, facts, audit):
    """`UNIT: enabled` — the unit that brings the container up at boot (docker) is enabled.

    Modes: spec.
    """
    container = case.item
    audit.expect(f"{container['boot_unit']}: enabled", "enabled",
                 facts.containers[container["name"]].unit.get("UnitFileState") or UNSET)


@with_unit
def unit_active(case, facts, audit):
    """`UNIT: active` — the unit podman generates from the quadlet, against `active`.

    Modes: spec.
    """
    container = case.item
    audit.expect(f"{container['unit']}: active", "active", facts.containers[container["name"]].unit.get("ActiveState") or UNSET)


@containers
def image(case, facts, audit):
    """`CONTAINER: image` — the image the container was created from against the one the spec pins.

    Modes: spec.
    """
    container = case.item
    present(audit, container, facts, f"{container['name']}: image", container["image"])
    found = facts.containers[container["name"]].inspect
    # docker: Config.Image is the reference it was created from; podman: ImageName
    actual = (found.get("ImageName") or found["Config"].get("Image")) if found else NO_CONTAINER
    audit.expect(f"{container['name']}: image", container["image"], actual)


@containers
def published_port(case, facts, audit):
    """`CONTAINER: published port PORT` — the host address and port the server's port is published on.

    Modes: spec.
    """
    container = case.item
    port = container["publish"].rsplit(":", 1)[1]
    present(audit, container, facts, f"{container['name']}: published port {port}", container["publish"])
    facts_of = facts.containers[container["name"]]
    bindings = (facts_of.host_config("PortBindings") or {}).get(f"{port}/tcp") or []
    actual = ", ".join(f"{binding.get('HostIp') or '0.0.0.0'}:{binding.get('HostPort')}" for binding in bindings)
    audit.expect(f"{container['name']}: published port {port}", container["publish"],
                 actual or (f"port {port} not published" if facts_of.inspect else NO_CONTAINER))


@containers
def shm(case, facts, audit):
    """`CONTAINER: /dev/shm bytes` or `CONTAINER: IPC namespace` — the container's /dev/shm size, or the host's IPC.

    Modes: spec.
    """
    container = case.item
    facts_of = facts.containers[container["name"]]
    if container["ipc"] == "host":
        present(audit, container, facts, f"{container['name']}: IPC namespace", "host")
    else:
        present(audit, container, facts, f"{container['name']}: /dev/shm bytes", str(container["shm_bytes"]))
    ipc = facts_of.host_config("IpcMode") or ""
    if container["ipc"] == "host":
        audit.expect(f"{container['name']}: IPC namespace", "host", ipc or UNSET)
    else:
        audit.expect(f"{container['name']}: /dev/shm bytes", str(container["shm_bytes"]), str(facts_of.host_config("ShmSize")))


@containers
def restart_policy(case, facts, audit):
    """`UNIT: Restart` or `CONTAINER: restart policy` — systemd's Restart= (podman) or docker's restart policy.

    Modes: spec.
    """
    container = case.item
    facts_of = facts.containers[container["name"]]
    if container["unit"]:  # podman: systemd restarts the quadlet's unit
        audit.expect(f"{container['unit']}: Restart", container["restart"], facts_of.unit.get("Restart") or UNSET)
    else:
        present(audit, container, facts, f"{container['name']}: restart policy", container["restart"])
        policy = (facts_of.host_config("RestartPolicy") or {}).get("Name")
        audit.expect(f"{container['name']}: restart policy", container["restart"], policy or UNSET)


@pinning
def gpu_pinning(case, facts, audit):
    """`CONTAINER: Env NAME` — CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER in the container against the spec's GPUs.

    Modes: spec.
    """
    container, name, expected = case.item
    present(audit, container, facts, f"{container['name']}: Env {name}", expected)
    audit.expect(f"{container['name']}: Env {name}", expected, facts.containers[container["name"]].environment.get(name, UNSET))


@containers
def env_file_mode(case, facts, audit):
    """`CONTAINER: env file mode` — the env file's mode against the one the role sets.

    Modes: spec.
    """
    container = case.item
    expect_env_file_mode(audit, f"{container['name']}: env file", container["env_file"],
                         facts.containers[container["name"]].env_file)


@containers
def env_file_owner(case, facts, audit):
    """`CONTAINER: env file owner` — the env file's owner:group against the one the role sets.

    Modes: spec.
    """
    container = case.item
    expect_env_file_owner(audit, f"{container['name']}: env file", container["env_file"],
                          facts.containers[container["name"]].env_file)


@containers
def env_file_content(case, facts, audit):
    """`CONTAINER: env file content` — the env file's sha256 against the file rendered with the real key (never shown).

    Modes: spec.
    """
    container = case.item
    expect_env_file_content(audit, f"{container['name']}: env file", container["env_file"],
                            facts.containers[container["name"]].env_file_sha256)


@containers
def config_file(case, facts, audit):
    """`CONTAINER: config file PATH` — the `vllm serve --config` file against the rendered one (the first differing line).

    Modes: spec.
    """
    container = case.item
    expect_config_file(audit, container["name"], container["config_file"], facts.containers[container["name"]].config_text)


@containers
def health_endpoint(case, facts, audit):
    """`CONTAINER: GET URL/health` — the HTTP status of the server's /health, asked on the host, against 200.

    Modes: spec.
    """
    container = case.item
    present(audit, container, facts, f"{container['name']}: GET {container['url']}/health", "200")
    answer = facts.containers[container["name"]].http.get("/health", {"error": "no answer"})
    audit.expect(f"{container['name']}: GET {container['url']}/health", "200", answer.get("status", answer.get("error")))
