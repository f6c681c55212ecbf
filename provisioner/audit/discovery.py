"""Profile mode: find the vLLM servers on a host we did not build, however they run.

Units: any systemd service whose ExecStart runs `vllm serve` (or `python -m vllm.entrypoints…`),
whatever its name. Containers: those docker or podman (where the CLI exists) runs from a vLLM image
or command. Processes: every vLLM server among the host's processes (provisioner/audit/processes.py,
run there: exact command lines from /proc, one server per process tree), each placed by its cgroup —
in a discovered unit's or container's cgroup it belongs to that unit or container (never reported
twice); in a unit that does not run vLLM itself it is that unit's (a wrapper script: the unit joins
the units found), unless the unit only started it (cron, an ssh session, a getty: KNOWN_STARTERS);
anywhere else (a login session's scope, no systemd at all) it is a bare process, which nothing
restarts. GPUs: the cards nvidia-smi lists, and its compute processes, each mapped to the server
whose process tree holds it (vLLM's memory is held by its `VLLM::EngineCore` child, not by the
process whose command line says `vllm serve`). One SSH round trip through the host's ControlMaster
(and one more only for a unit's --config file).
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import testinfra
import yaml

from provisioner.audit import processes
from provisioner.audit.engine import Output, json_answer, run_commands
from provisioner.audit.processes import is_vllm_command
from provisioner.audit.text import show_blocks, shown_argv

CONTAINER_TOOLS = ("docker", "podman")
UNITS_COMMAND = (
    "units=$( { systemctl list-unit-files --type=service --no-legend --no-pager;"
    " systemctl list-units --type=service --all --no-legend --no-pager --plain; }"
    " | awk '{print $1}' | grep -v '@\\.service$' | sort -u );"
    " systemctl show --no-pager -p Id -p FragmentPath -p ExecStart $units"
)
GPUS_COMMAND = ("command -v {smi} >/dev/null || exit 3;"
                " {smi} --query-gpu=index,uuid,memory.total,memory.used --format=csv,noheader,nounits")
COMPUTE_APPS_COMMAND = ("command -v {smi} >/dev/null || exit 3;"
                        " {smi} --query-compute-apps=pid,used_memory,gpu_uuid --format=csv,noheader,nounits")
PROCESSES_COMMAND = "command -v python3 >/dev/null || exit 3; python3 -c {source} {request}"
# units that start processes without supervising them: a vLLM server in their cgroup is a bare process
KNOWN_STARTERS = re.compile(r"^(cron|crond|anacron|atd|ssh|sshd|(serial-|console-|container-)?getty(@.*)?)\.service$")
CONTAINER_CGROUP = re.compile(r"(?:^|/)(?:docker|libpod|libpod-payload|cri-containerd|crio)[-/]([0-9a-f]{12,64})(?:\.scope)?(?:/|$)")
CONTAINERS_COMMAND = "command -v {tool} >/dev/null || exit 3; ids=$({tool} ps -q); [ -z \"$ids\" ] || {tool} inspect $ids"


def discover(host: testinfra.host.Host, nvidia_smi: str = "nvidia-smi") -> dict[str, Any]:
    smi = shlex.quote(nvidia_smi)
    commands = {
        "units": UNITS_COMMAND,
        "gpus": GPUS_COMMAND.format(smi=smi),
        "compute_apps": COMPUTE_APPS_COMMAND.format(smi=smi),
        "processes": processes_command(),
        **{tool: CONTAINERS_COMMAND.format(tool=tool) for tool in CONTAINER_TOOLS},
    }
    out = run_commands(host, commands)
    tools = [tool for tool in CONTAINER_TOOLS if out[tool].rc != 3]
    blocks = show_blocks(out["units"].text)
    units = vllm_units(out["units"].text)
    containers = [container for tool in tools if out[tool].rc == 0 for container in vllm_containers(tool, out[tool].text)]
    scan, problem = process_scan(out["processes"])
    servers = place_servers(scan["servers"], units, containers, blocks)
    read_config_files(host, units)
    gpus = gpu_indexes(out["gpus"], nvidia_smi)
    cards = gpu_cards(out["gpus"]) if gpus["problem"] is None else []
    apps = compute_apps(out["compute_apps"].text) if out["compute_apps"].rc == 0 else []
    if cards and out["compute_apps"].rc != 0:
        lines = out["compute_apps"].text.strip().splitlines()
        for card in cards:
            card["apps_problem"] = f"{nvidia_smi} --query-compute-apps exited {out['compute_apps'].rc}: " + (
                lines[-1] if lines else "no output")
    return {
        "units": units,
        "gpus": gpus,
        "container_tools": tools,
        "containers": containers,
        "servers": servers,
        "processes_problem": problem,
        "gpu_cards": attach_gpu_use(cards, apps, servers, scan),
    }


def processes_command(request: dict[str, Any] | None = None) -> str:
    """processes.py run on the host (`request`: {"files": [PATH, ...]}, the times it also reads)."""
    return PROCESSES_COMMAND.format(source=shlex.quote(Path(processes.__file__).read_text(encoding="utf-8")),
                                    request=shlex.quote(json.dumps(request or {})))


def process_scan(out: Output) -> tuple[dict[str, Any], str | None]:
    """processes.py's answer, or (nothing, why it could not be read)."""
    empty = {"parents": {}, "comm": {}, "servers": [], "problems": []}
    if out.rc == 3:
        return empty, "no python3 on the host to read its processes"
    scan, problem = json_answer(out, dict)
    return (empty, f"reading the processes failed ({problem})") if problem else (scan, None)


def supervision(cgroup: str) -> dict[str, str]:
    """Where a process's cgroup says it runs: {"kind", "name", "cgroup"}. kind: container (name: its id),
    unit (a system service), user unit (a user's systemd; name: the unit, manager: user@UID.service),
    session (a login's session-N.scope), scope (another scope: systemd-run --scope, init.scope),
    none (no systemd unit, scope or container: e.g. a host without systemd)."""
    found = {"cgroup": cgroup}
    container = CONTAINER_CGROUP.search(cgroup)
    parts = [part for part in cgroup.split("/") if part]
    if container:
        return {**found, "kind": "container", "name": container.group(1)}
    if any(part.startswith("kubepods") for part in parts):
        return {**found, "kind": "container", "name": "kubepods"}
    services = [part for part in parts if part.endswith(".service")]
    if services and services[0].startswith("user@"):
        if len(services) > 1:
            return {**found, "kind": "user unit", "name": services[-1], "manager": services[0]}
        services = []  # the user manager's own processes (its init.scope): no unit of its own
    if services:
        return {**found, "kind": "unit", "name": services[-1]}
    if parts and re.fullmatch(r"session-[^/]+\.scope", parts[-1]):
        return {**found, "kind": "session", "name": parts[-1]}
    if parts and parts[-1].endswith(".scope"):
        return {**found, "kind": "scope", "name": parts[-1]}
    return {**found, "kind": "none", "name": cgroup}


def place_servers(found: list[dict[str, Any]], units: list[dict[str, Any]], containers: list[dict[str, Any]],
                  blocks: list[dict[str, str]]) -> list[dict[str, Any]]:
    """Each server the process scan found, named after what runs it: the unit (`NAME.service`), the
    container (`container NAME`) or itself (`process PID`, kind "process": a bare process). A unit
    that does not run vLLM itself but holds a server (a wrapper script) joins `units` (by its process's
    command line, which says where it listens); a unit that only started it (cron, ssh) does not."""
    unit_names = {unit["name"] for unit in units}
    shown = {block.get("Id"): block for block in blocks}
    servers = []
    for server in found:
        placed = supervision(server.get("cgroup", ""))
        kind, label = "process", f"process {server['pid']}"
        if placed["kind"] == "container":
            match = next((c for c in containers if c.get("id") and (c["id"].startswith(placed["name"])
                                                                   or placed["name"].startswith(c["id"]))), None)
            if match is not None:
                kind, label = "container", f"container {match['name']}"
                server = {**server, "container": {key: match[key] for key in ("tool", "restart", "ipc", "ports")}}
                match["server_pid"] = server["pid"]
        elif placed["kind"] == "unit" and not KNOWN_STARTERS.match(placed["name"]):
            kind, label = "unit", placed["name"]
            if placed["name"] not in unit_names:
                block = shown.get(placed["name"], {})
                units.append({"name": placed["name"], "fragment": block.get("FragmentPath", ""),
                              "argv": server["cmdline"], "wrapper": shown_argv(block.get("ExecStart", ""))})
                unit_names.add(placed["name"])
        servers.append({**server, "kind": kind, "name": label, "supervision": placed,
                        "fragment": shown.get(placed["name"], {}).get("FragmentPath", ""),
                        "config": parsed_config(server.get("config"))})
    return servers


def parsed_config(text: str | None) -> dict[str, Any]:
    """A --config file's YAML as data ({} when there is none or it does not parse)."""
    if not text:
        return {}
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError:
        return {}
    return config if isinstance(config, dict) else {}


def compute_apps(text: str) -> list[dict[str, Any]]:
    """`nvidia-smi --query-compute-apps=pid,used_memory,gpu_uuid --format=csv,noheader,nounits` →
    [{"pid", "mib", "uuid"}] (a row nvidia-smi cannot fill, e.g. `[N/A]` memory, counts 0 MiB)."""
    apps = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != 3 or not cells[0].isdigit():
            continue
        apps.append({"pid": int(cells[0]), "mib": int(cells[1]) if cells[1].isdigit() else 0, "uuid": cells[2]})
    return apps


def gpu_cards(out: Output) -> list[dict[str, Any]]:
    """`--query-gpu=index,uuid,memory.total,memory.used` rows → [{"index", "uuid", "total_mib", "used_mib"}]."""
    cards = []
    for line in out.text.splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) == 4 and cells[0].isdigit():
            cards.append({"index": int(cells[0]), "uuid": cells[1],
                          "total_mib": int(cells[2]) if cells[2].isdigit() else None,
                          "used_mib": int(cells[3]) if cells[3].isdigit() else None})
    return cards


def owner_of(pid: int, parents: dict[str, int], servers: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The server whose process tree holds `pid`, walking up its parents (vLLM's engine core is a child
    of the server's main process); None: no vLLM server's."""
    trees = {member: server for server in servers for member in server["tree"]}
    seen = set()
    while pid not in trees and pid > 1 and pid not in seen:
        seen.add(pid)
        pid = parents.get(str(pid), 0)
    return trees.get(pid)


def attach_gpu_use(cards: list[dict[str, Any]], apps: list[dict[str, Any]], servers: list[dict[str, Any]],
                   scan: dict[str, Any]) -> list[dict[str, Any]]:
    """Each compute process to its server (server["gpus"]: [{"index", "uuid", "mib"}]) and to its card
    (card["apps"]: [{"pid", "mib", "server"}], server None for a process that is no vLLM server's)."""
    by_uuid = {card["uuid"]: card for card in cards}
    for card in cards:
        card["apps"] = []
    for server in servers:
        server["gpus"] = []
    for app in apps:
        server = owner_of(app["pid"], scan.get("parents", {}), servers)
        card = by_uuid.get(app["uuid"])
        index = card["index"] if card else None
        if server is not None:
            held = next((gpu for gpu in server["gpus"] if gpu["uuid"] == app["uuid"]), None)
            if held is None:
                server["gpus"].append({"index": index, "uuid": app["uuid"], "mib": app["mib"]})
            else:
                held["mib"] += app["mib"]
        if card is not None:
            card["apps"].append({"pid": app["pid"], "mib": app["mib"], "server": server["name"] if server else None,
                                 "comm": scan.get("comm", {}).get(str(app["pid"]), "")})
    return cards


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
    indexes = [int(line.split(",")[0]) for line in out.text.splitlines() if line.split(",")[0].strip().isdigit()]
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
        state = container.get("State") or {}
        containers.append({
            "name": container.get("Name", "").lstrip("/") or container.get("Id", "")[:12],
            "id": container.get("Id", ""),
            "pid": state.get("Pid"),
            "restart": ((host_config.get("RestartPolicy") or {}).get("Name") or "no"),
            "ipc": host_config.get("IpcMode") or "",
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
