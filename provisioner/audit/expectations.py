"""What the audit expects on each host, taken from the same sources apply uses.

Spec mode: per host, the roles' variables (`plan.role_defaults()` overlaid with the host_vars that
`build_inventory(spec)` generates: exactly what the roles read) and the files the roles' own
templates render (`build_plan(spec)`). Nothing here states an expected value of its own.

Profile mode (a server we did not build): the values of a profile (profiles/<name>.yml) in the same
variable shapes, and its rules applied to each vLLM unit and container that discovery found.

An expectation is either a plain value (the actual value must equal it) or a rule
`{"expected": "what a person reads", "pattern": "a regular expression the actual value must match"}`.
A target is plain JSON data: the suite reads it in its own pytest process.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from provisioner.inventory import build_inventory
from provisioner.plan import (
    ENV_TEMPLATE,
    HostPlan,
    PlannedUnit,
    build_plan,
    find_task_args,
    render_role_file,
    role_defaults,
    unit_environment,
)
from provisioner.audit.text import sysctl_settings
from provisioner.secrets import redact_environment, shown_command
from provisioner.spec import Host, Spec

PROFILES_DIR = Path(__file__).resolve().parent / "profiles"
MODPROBE_TEMPLATE = "blacklist-nouveau.conf.j2"
# [Service] settings checked on their own (not as a `systemctl show` property of the same name)
CHECKED_APART = {"Environment", "EnvironmentFile", "ExecStart", "ExecStartPost"}
# settings in seconds that `systemctl show` reports under another name, as a time span
TIME_SPANS = {"TimeoutStartSec": "TimeoutStartUSec", "RestartSec": "RestartUSec"}
VLLM_DEFAULT_PORT = 8000
ANY_ADDRESS = ("", "0.0.0.0", "::", "[::]")


@dataclass(frozen=True)
class Connection:
    """How to reach a host over SSH."""

    address: str
    user: str = "root"
    port: int = 22
    key: str | None = None
    known_hosts: str | None = None
    sudo: bool = False


@dataclass
class Target:
    """One host to audit: how to reach it and what to expect there (JSON-able)."""

    name: str
    connection: Connection
    expected: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- spec mode


def spec_targets(spec: Spec, limit: str | None = None) -> list[Target]:
    """One target per host of the spec (or only `limit`), in spec order."""
    inventory = build_inventory(spec)
    plans = {plan.host: plan for plan in build_plan(spec)}
    return [
        Target(host.name, spec_connection(host), host_expectations(audit_variables(inventory, host.name), plans[host.name]))
        for host in spec.hosts
        if limit in (None, host.name)
    ]


def spec_connection(host: Host) -> Connection:
    ssh = host.ssh
    return Connection(host.address, ssh.user, ssh.port, ssh.key, ssh.known_hosts, ssh.become)


def audit_variables(inventory: dict[str, dict], host_name: str) -> dict[str, Any]:
    """What the roles read on this host: their defaults overlaid with its generated host_vars."""
    return {**role_defaults(), **inventory[f"host_vars/{host_name}.yml"]}


def host_expectations(variables: dict[str, Any], plan: HostPlan) -> dict[str, Any]:
    nouveau = nouveau_expectations(variables)
    if variables["nouveau_blacklist_enabled"]:
        nouveau["files"] = {file.path: file.content for file in plan.nouveau_files}
        nouveau["initramfs_file"] = variables["nouveau_modprobe_file"].lstrip("/")
        nouveau["reboot_marker"] = reboot_marker()
    nouveau["absent_files"] = plan.removed_files
    shm = shm_expectations(variables["shm_size"], exact=True)
    if plan.fstab_line:
        shm["fstab_line"] = plan.fstab_line
        shm["fstab_pattern"] = find_task_args("shm", "lineinfile", lambda args: args.get("path") == "/etc/fstab")["regexp"]
    return {
        "sysctl": {"file": plan.sysctl_file.path, "settings": sysctl_settings(plan.sysctl_file.content)},
        "nouveau": nouveau,
        "shm": shm,
        "gpu": gpu_expectations(variables, variables["nvidia_gpu_devices"]) if variables["nvidia_gpu_devices"] else None,
        "units": [
            unit_expectations(variables, unit, entry)
            for unit, entry in zip(plan.units, variables["vllm_service_instances"]) if not entry["container"]
        ],
        "vllm_containers": [
            container_expectations(variables, unit, entry)
            for unit, entry in zip(plan.units, variables["vllm_service_instances"]) if entry["container"]
        ],
    }


def gpu_expectations(variables: dict[str, Any], devices: list[dict[str, Any]]) -> dict[str, Any]:
    """The nvidia_gpu role's variables the GPU checks (provisioner/gpu/checks.py) compare a host with;
    spec mode: the role's own devices (None where it sets none); profile mode: the GPUs discovery found."""
    return {
        "nvidia_smi": variables["nvidia_gpu_nvidia_smi"],
        "expected_count": variables["nvidia_gpu_expected_count"],
        "persistence_mode": variables["nvidia_gpu_persistence_mode"],
        "devices": devices,
    }


def nouveau_expectations(variables: dict[str, Any]) -> dict[str, Any]:
    """What any host that blacklists nouveau has (both modes); spec mode adds our files."""
    if not variables["nouveau_blacklist_enabled"]:
        return {"enabled": False}
    modprobe = render_role_file("nouveau", MODPROBE_TEMPLATE, variables).content
    return {
        "enabled": True,
        "modprobe_lines": [line for line in modprobe.splitlines() if line and not line.startswith("#")],
        "modules": [line.split()[1] for line in modprobe.splitlines() if line.startswith("blacklist ")],
        "cmdline_flags": list(variables["nouveau_kernel_cmdline_flags"]),
    }


def reboot_marker() -> dict[str, str]:
    """Where the nouveau role flags a pending reboot, and the line it writes there."""
    task = find_task_args("nouveau", "lineinfile", lambda args: "reboot-required" in str(args.get("path")))
    return {"path": task["path"], "line": task["line"]}


def shm_expectations(size: str | None, exact: bool) -> dict[str, Any]:
    """/dev/shm of `size` (exact: as the shm role sets it; else: at least that)."""
    if size is None:
        return {"size": None}
    return {"size": size, "bytes": size_bytes(size), "exact": exact}


def size_bytes(size: str) -> int:
    """'16G' → bytes; K, M, G and T are powers of 1024, as tmpfs reads them."""
    size = str(size)
    if size[-1].upper() in "KMGT":
        return int(size[:-1]) * 1024 ** ("KMGT".index(size[-1].upper()) + 1)
    return int(size)


def unit_expectations(variables: dict[str, Any], planned: PlannedUnit, entry: dict[str, Any]) -> dict[str, Any]:
    service = unit_settings(planned.unit.content, "Service")
    argv = exec_argv(next(value for key, value in service if key == "ExecStart"))
    config = yaml.safe_load(planned.config_file.content)
    return {
        "name": Path(planned.unit.path).name,
        "fragment": planned.unit.path,
        "properties": shown_properties(service),
        "environment": unit_environment(planned.unit.content),
        "command_line": shown_command(argv),
        "env_file": env_file_expectations(variables, planned, entry),
        "config_file": {"path": planned.config_file.path, "content": planned.config_file.content},
        **serving_expectations(argv, config),
    }


def container_expectations(variables: dict[str, Any], planned: PlannedUnit, entry: dict[str, Any]) -> dict[str, Any]:
    """An instance in a container (role vllm_service: a quadlet or a compose project) as its files set it up."""
    container = entry["container"]
    bind = "127.0.0.1" if entry["host"] in ANY_ADDRESS else entry["host"]
    config = yaml.safe_load(planned.config_file.content)
    served = config.get("served-model-name") or entry["model"]
    scheme = "https" if config.get("ssl-certfile") else "http"
    return {
        "name": f"vllm-{entry['name']}",
        "engine": container["engine"],
        # podman: the quadlet's generated unit runs the container; docker: an enabled unit brings it up at boot
        "unit": f"vllm-{entry['name']}.service" if container["engine"] == "podman" else None,
        "boot_unit": Path(planned.boot_unit.path).name if planned.boot_unit else None,
        "image": container["image"],
        "publish": f"{_bracketed(entry['host'])}:{entry['port']}",
        "ipc": "host" if container["ipc_host"] else "private",
        "shm_bytes": None if container["ipc_host"] else size_bytes(container["shm_size"]),
        "restart": variables["vllm_service_container_restart"],
        "environment": {name: planned.environment[name] for name in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")},
        "env_file": env_file_expectations(variables, planned, entry),
        "config_file": {"path": planned.config_file.path, "content": planned.config_file.content},
        "url": f"{scheme}://{_bracketed(bind)}:{entry['port']}",
        "served_names": [str(name) for name in (served if isinstance(served, list) else [served])],
    }


def env_file_expectations(variables: dict[str, Any], planned: PlannedUnit, entry: dict[str, Any]) -> dict[str, str]:
    env_task = find_task_args("vllm_service", "template", lambda args: args.get("src") == ENV_TEMPLATE)
    return {
        "path": planned.env_file.path,
        "mode": planned.env_file.mode,
        "owner": f"{env_task['owner']}:{env_task['group']}",
        "sha256": env_file_sha256(variables, entry),
    }


def unit_settings(content: str, section: str) -> list[tuple[str, str]]:
    """(key, value) of one section of a unit file, line continuations joined, comments skipped."""
    settings, current = [], None
    for line in content.replace("\\\n", " ").splitlines():
        line = line.strip()
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
        elif current == section and "=" in line and not line.startswith(("#", ";")):
            key, _, value = line.partition("=")
            settings.append((key.strip(), " ".join(value.split())))
    return settings


def exec_argv(command: str) -> list[str]:
    """An ExecStart= command as the process gets it: systemd quoting, $$ and %% undone."""
    return [word.replace("$$", "$").replace("%%", "%") for word in shlex.split(command)]


def shown_properties(service: list[tuple[str, str]]) -> dict[str, str]:
    """The [Service] settings as `systemctl show` reports them (name → value)."""
    shown = {}
    for key, value in service:
        if key in CHECKED_APART:
            continue
        if key in TIME_SPANS:
            shown[TIME_SPANS[key]] = time_span(int(value))
        else:
            shown[key] = value
    return shown


def time_span(seconds: int) -> str:
    """Seconds as systemd shows a time span: 1800 → '30min', 5410 → '1h 30min 10s'."""
    parts = []
    for unit, length in (("d", 86400), ("h", 3600), ("min", 60), ("s", 1)):
        if seconds >= length:
            parts.append(f"{seconds // length}{unit}")
            seconds %= length
    return " ".join(parts) or "0"


def env_file_sha256(variables: dict[str, Any], entry: dict[str, Any]) -> str:
    """sha256 of the env file as the role renders it, with the real key (never shown; only its hash)."""
    unit_variables = {**variables, "vllm_service_instance": entry, "vllm_service_api_key": ""}
    if entry.get("api_key_file"):
        # as Ansible's file lookup reads it: trailing whitespace off
        unit_variables["vllm_service_api_key"] = Path(entry["api_key_file"]).read_text(encoding="utf-8").rstrip()
    content = render_role_file("vllm_service", ENV_TEMPLATE, unit_variables).content
    return hashlib.sha256(content.encode()).hexdigest()


# --------------------------------------------------------------------------- the vllm serve command line


def serving_expectations(argv: list[str], config: dict[str, Any] | None = None) -> dict[str, Any]:
    """Where a `vllm serve` command line listens and which model names it answers with; `config`: the
    content of its --config file (the command line wins over it, as in vLLM)."""
    options = {**config_options(config or {}), **command_options(argv)}
    bind = options.get("--host", [""])[0]
    port = int(options.get("--port", [VLLM_DEFAULT_PORT])[0])
    model = serve_model(argv, options)
    scheme = "https" if options.get("--ssl-certfile") else "http"
    probe_host = "127.0.0.1" if bind in ANY_ADDRESS else bind
    return {
        "listen": f"{_bracketed(bind or '0.0.0.0')}:{port}",
        "url": f"{scheme}://{_bracketed(probe_host)}:{port}",
        "served_names": options.get("--served-model-name") or [model],
    }


def command_options(argv: list[str]) -> dict[str, list[str]]:
    """--flag value... / --flag=value / --flag → {flag: [values]} (a bare flag: [])."""
    options: dict[str, list[str]] = {}
    current = None
    for word in argv:
        if word.startswith("--"):
            name, equals, value = word.partition("=")
            current = name
            options[current] = [value] if equals else []
        elif current is not None:
            options[current].append(word)
    return options


def config_options(config: dict[str, Any]) -> dict[str, list[str]]:
    """A --config file's keys as command_options gives them: {"--served-model-name": ["a", "b"], ...}."""
    options = {}
    for key, value in config.items():
        values = value if isinstance(value, list) else [] if value is True else [value]
        options["--" + str(key).replace("_", "-")] = [str(item) for item in values]
    return options


def serve_model(argv: list[str], options: dict[str, list[str]]) -> str:
    """The model of `vllm serve MODEL …` (or of `--model MODEL`)."""
    if "serve" in argv and argv.index("serve") + 1 < len(argv):
        candidate = argv[argv.index("serve") + 1]
        if not candidate.startswith("--"):
            return candidate
    return (options.get("--model") or ["(unknown)"])[0]


def _bracketed(address: str) -> str:
    return f"[{address}]" if ":" in address and not address.startswith("[") else address


# --------------------------------------------------------------------------- profile mode


def load_profile(name: str) -> dict[str, Any]:
    """profiles/<name>.yml; a ValueError names the profiles there are."""
    path = PROFILES_DIR / f"{name}.yml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in PROFILES_DIR.glob("*.yml")))
        raise ValueError(f"no profile named {name!r}; profiles: {known}")
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def profile_variables(profile: dict[str, Any]) -> dict[str, Any]:
    """The profile's host values over the role defaults: the variables a host like it would get."""
    return {**role_defaults(), **profile["host"]}


def profile_expectations(profile: dict[str, Any], discovered: dict[str, Any]) -> dict[str, Any]:
    """The profile's values for the host, and its unit rules applied to each discovered vLLM unit."""
    variables = profile_variables(profile)
    rules = profile["unit"]
    indexes = discovered["gpus"]["indexes"]
    return {
        "sysctl": {"file": None, "settings": {key: str(value) for key, value in variables["sysctl_settings"].items()}},
        "nouveau": nouveau_expectations(variables),
        "shm": shm_expectations(variables.get("shm_size_min"), exact=False),
        # a device with no power_limit: the limit is reported, not checked (we do not know what it should be)
        "gpu": gpu_expectations(variables, [{"index": index} for index in indexes]) if indexes else None,
        "gpus_found": discovered["gpus"],
        "units": [profile_unit(unit, rules) for unit in discovered["units"]],
        "containers": {
            "tools": discovered["container_tools"],
            "found": [profile_container(container, rules) for container in discovered["containers"]],
        },
    }


def profile_unit(unit: dict[str, Any], rules: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": unit["name"],
        "fragment": unit["fragment"],
        "properties": rules["properties"],
        "environment": rules["environment"],
        "command_line": rules["command_line"],
        **serving_expectations(unit["argv"], unit.get("config")),
    }


def profile_container(container: dict[str, Any], rules: dict[str, Any]) -> dict[str, Any]:
    """A discovered container: what was read (secrets left out) and the rules that apply to it."""
    return {
        **{key: container[key] for key in ("name", "tool", "image", "ports", "shm_bytes")},
        # only the variables the rules ask about, and the command line with secret flags redacted
        "environment": redact_environment(
            {name: value for name, value in container["environment"].items() if name in rules["environment"]}),
        "command_line": shown_command(container["argv"]),
        "rules": {"environment": rules["environment"], "command_line": rules["command_line"]},
    }


def is_vllm_command(argv: list[str]) -> bool:
    """`vllm serve …` (any path to vllm) or `python -m vllm.entrypoints…`."""
    words = [Path(word).name for word in argv]
    serves = any(word == "vllm" and after == "serve" for word, after in zip(words, words[1:]))
    return serves or any(re.match(r"vllm\.entrypoints\b", word) for word in argv)
