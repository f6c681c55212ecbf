"""Profile mode: find the vLLM servers on a host we did not build.

Units: any systemd service whose ExecStart runs `vllm serve` (or `python -m vllm.entrypoints…`),
whatever its name. Containers: those docker or podman (where the CLI exists) runs from a vLLM image
or command. GPUs: the indexes nvidia-smi lists (their checks follow the profile). One SSH round trip, through the host's ControlMaster.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

import testinfra
import yaml

from provisioner.audit.expectations import is_vllm_command
from provisioner.audit.suite.facts import Output, run_commands
from provisioner.audit.text import show_blocks, shown_argv

CONTAINER_TOOLS = ("docker", "podman")
UNITS_COMMAND = (
    "units=$( { systemctl list-unit-files --type=service --no-legend --no-pager;"
    " systemctl list-units --type=service --all --no-legend --no-pager --plain; }"
    " | awk '{print $1}' | grep -v '@\\.service$' | sort -u );"
    " systemctl show --no-pager -p Id -p FragmentPath -p ExecStart $units"
)
GPUS_COMMAND = "command -v {smi} >/dev/null || exit 3; {smi} --query-gpu=index --format=csv,noheader"
CONTAINERS_COMMAND = "command -v {tool} >/dev/null || exit 3; ids=$({tool} ps -q); [ -z \"$ids\" ] || {tool} inspect $ids"


def discover(host: testinfra.host.Host, nvidia_smi: str = "nvidia-smi") -> dict[str, Any]:
    commands = {
        "units": UNITS_COMMAND,
        "gpus": GPUS_COMMAND.format(smi=shlex.quote(nvidia_smi)),
        **{tool: CONTAINERS_COMMAND.format(tool=tool) for tool in CONTAINER_TOOLS},
    }
    out = run_commands(host, commands)
    tools = [tool for tool in CONTAINER_TOOLS if out[tool].rc != 3]
    units = vllm_units(out["units"].text)
    read_config_files(host, units)
    return {
        "units": units,
        "gpus": gpu_indexes(out["gpus"], nvidia_smi),
        "container_tools": tools,
        "containers": [
            container for tool in tools if out[tool].rc == 0 for container in vllm_containers(tool, out[tool].text)
        ],
    }


def read_config_files(host: testinfra.host.Host, units: list[dict[str, Any]]) -> None:
    """Each unit's `vllm serve --config FILE` as data (unit["config"]): where it listens and what it serves
    may be there. One more round trip, only when a unit has one."""
    paths = {index: unit["argv"][unit["argv"].index("--config") + 1] for index, unit in enumerate(units)
             if "--config" in unit["argv"][:-1]}
    if not paths:
        return
    out = run_commands(host, {f"config{index}": f"cat {shlex.quote(path)}" for index, path in paths.items()})
    for index in paths:
        text = out[f"config{index}"]
        try:
            config = yaml.safe_load(text.text) if text.rc == 0 else None
        except yaml.YAMLError:
            config = None
        units[index]["config"] = config if isinstance(config, dict) else {}


def gpu_indexes(out: Output, nvidia_smi: str) -> dict[str, Any]:
    """{"indexes": the GPUs nvidia-smi lists, "problem": why none could be listed, or None}."""
    if out.rc == 3:
        return {"indexes": [], "problem": f"no {nvidia_smi} on the PATH"}
    if out.rc != 0:
        lines = out.text.strip().splitlines()
        return {"indexes": [], "problem": f"{nvidia_smi} exited {out.rc}: {lines[0] if lines else 'no output'}"}
    indexes = [int(line) for line in out.text.split()]
    return {"indexes": indexes, "problem": None if indexes else f"{nvidia_smi} lists no GPU"}


def vllm_units(show_output: str) -> list[dict[str, Any]]:
    units = []
    for block in show_blocks(show_output):
        argv = shown_argv(block.get("ExecStart", ""))
        if argv and is_vllm_command(argv):
            units.append({"name": block["Id"], "fragment": block.get("FragmentPath", ""), "argv": argv})
    return units


def vllm_containers(tool: str, inspect_output: str) -> list[dict[str, Any]]:
    """The containers of `docker inspect` (or podman's) output whose image or command is vLLM's."""
    containers = []
    for container in json.loads(inspect_output) if inspect_output.strip() else []:
        config, host_config = container.get("Config") or {}, container.get("HostConfig") or {}
        argv = [*(config.get("Entrypoint") or []), *(config.get("Cmd") or [])]
        image = config.get("Image") or container.get("ImageName") or ""
        if "vllm" not in image.lower() and not is_vllm_command(argv):
            continue
        ports = (container.get("NetworkSettings") or {}).get("Ports") or {}
        containers.append({
            "name": container.get("Name", "").lstrip("/") or container.get("Id", "")[:12],
            "tool": tool,
            "image": image,
            "ports": sorted(
                f"{binding.get('HostIp') or '0.0.0.0'}:{binding.get('HostPort')}->{port}"
                for port, bindings in ports.items() for binding in bindings or []
            ),
            "shm_bytes": host_config.get("ShmSize"),
            "argv": argv,
            "environment": dict(entry.split("=", 1) for entry in config.get("Env") or [] if "=" in entry),
        })
    return containers
