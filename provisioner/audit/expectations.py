"""What the audit expects on each host, taken from the same sources apply uses.

Spec mode: per host, the roles' variables (`roles.host_variables`: their defaults overlaid with the
host_vars the inventory generates, exactly what the roles read) and the files the roles' own
templates render (`plan.host_files`). Nothing here states an expected value of its own.

Profile mode (a server we did not build): the values of a profile (profiles/<name>.yml) in the same
variable shapes, and its rules applied to each vLLM unit, container and bare process that discovery found.

An expectation is either a plain value (the actual value must equal it) or a rule
`{"expected": "what a person reads", "pattern": "a regular expression the actual value must match"}`.
A target is plain JSON data.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from provisioner.audit import running
from provisioner.base.file_formats import exec_argv, sysctl_settings, unit_environment, unit_settings
from provisioner.base.module_utils import driver_state, systemd_dropins
from provisioner.base.paths import role_dir
from provisioner.base.secrets import declared_digests, read_api_key, read_secret, redact_environment, shown_command
from provisioner.fleet.inventory import secret_sources
from provisioner.fleet.monitoring import duration_seconds, expected_targets
from provisioner.fleet.remote import Connection, spec_connection
from provisioner.plan import (
    EXPORTER_TEMPLATES,
    GATEWAY_TEMPLATE,
    GPU_TIMER_TEMPLATES,
    HostPlan,
    PlannedUnit,
    gateway_file,
    host_files,
)
from provisioner.spec import Host, Instance, Spec
from provisioner.spec.driver import builds_used
from provisioner.validation.roles import (
    ENV_TEMPLATE,
    UNIT_TEMPLATES,
    find_task_args,
    host_variables,
    read_yaml,
    render_role_file,
    render_string,
    role_defaults,
    role_vars,
)
from provisioner.vllm.serve_args import (
    ANY_ADDRESS,
    bracketed,
    command_options,
    config_options,
    memory_share,
    serving_expectations,
)

PROFILES_DIR = Path(__file__).resolve().parent / "profiles"
MODPROBE_TEMPLATE = "blacklist-nouveau.conf.j2"
# [Service] settings checked on their own (not as a `systemctl show` property of the same name)
CHECKED_APART = {"Environment", "EnvironmentFile", "ExecStart", "ExecStartPost"}
# settings in seconds that `systemctl show` reports under another name, as a time span
TIME_SPANS = {"TimeoutStartSec": "TimeoutStartUSec", "TimeoutStopSec": "TimeoutStopUSec", "RestartSec": "RestartUSec"}


@dataclass
class Target:
    """One host to audit: how to reach it and what to expect there (JSON-able)."""

    name: str
    connection: Connection
    expected: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- spec mode


def spec_targets(spec: Spec, limit: str | None = None) -> list[Target]:
    """One target per host of the spec (or only `limit`), in spec order: per host in one pass, the
    roles' variables there, the files they write, and what the checks compare."""
    return [spec_target(host, spec.instances_on(host.name), spec) for host in spec.hosts if limit in (None, host.name)]


def spec_target(host: Host, instances: list[Instance], spec: Spec | None = None) -> Target:
    variables = host_variables(host, instances, spec)
    expected = host_expectations(variables, host_files(host, variables))
    return Target(host.name, spec_connection(host), {**expected, "driver": driver_expectations(variables, host, instances),
                                                     "driver_install": driver_install_expectations(variables),
                                                     "monitoring": monitoring_expectations(variables, spec)})


def monitoring_expectations(variables: dict[str, Any], spec: Spec | None) -> dict[str, Any] | None:
    """Where the spec has monitoring: node_exporter answering on the host (with fresh GPU metrics where the
    timer runs) and, on the monitoring host, Prometheus with every target of the spec up (None elsewhere)."""
    if not variables.get("node_exporter_enabled") or spec is None:
        return None
    timer = bool(variables["node_exporter_gpu_timer"])
    exporter = {"url": f"http://127.0.0.1:{variables['node_exporter_port']}/metrics", "gpu_timer": timer,
                "gpu_interval": variables["node_exporter_gpu_interval"],
                "max_age_s": 3 * duration_seconds(variables["node_exporter_gpu_interval"]) + 10 if timer else None}
    prometheus = {"url": f"http://127.0.0.1:{variables['prometheus_port']}/api/v1/targets",
                  "targets": expected_targets(spec)} if variables.get("prometheus_files") else None
    return {"exporter": exporter, "prometheus": prometheus}


def driver_install_expectations(variables: dict[str, Any]) -> dict[str, Any] | None:
    """What role nvidia_driver installs where it manages the driver (None where it does not): the settings, and
    per release the package set it chooses (roles/nvidia_driver/vars/packages.yml, chosen by the module's own
    code) or why there is none; the host's release picks one when the audit reads it."""
    if not variables["nvidia_driver_manage"]:
        return None
    sets = read_yaml(role_dir("nvidia_driver") / "vars" / "packages.yml")["_nvidia_driver_package_sets"]
    branch, source, modules = str(variables["nvidia_driver_branch"]), variables["nvidia_driver_source"], variables["nvidia_driver_modules"]
    by_release: dict[str, Any] = {}
    for release in sets:
        try:
            by_release[release] = driver_state.choose_set(sets, release, source, branch, modules)
        except driver_state.SetProblem as problem:
            by_release[release] = str(problem)
    return {"source": source, "branch": branch, "version": variables["nvidia_driver_version"], "modules": modules,
            "hold": variables["nvidia_driver_hold"], "expect_gpus": variables["nvidia_driver_expect_gpus"],
            "sets": by_release}


def driver_expectations(variables: dict[str, Any], host: Host, instances: list[Instance]) -> dict[str, Any] | None:
    """What the host's venv vLLM build needs of the driver (the row `driver ≥ what vLLM <version> (CUDA <x>)
    needs`), read with the nvidia_gpu role's nvidia-smi; None without venv instances."""
    venv = next((use for use in builds_used(host, instances) if use.image is None), None)
    if venv is None or venv.minimum_branch is None:
        return None
    return {"name": f"driver ≥ what {venv.build.label} needs", "minimum": venv.minimum_branch,
            "nvidia_smi": variables["nvidia_gpu_nvidia_smi"]}


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
    return {
        "sysctl": {"file": plan.sysctl_file.path, "settings": sysctl_settings(plan.sysctl_file.content)},
        "nouveau": nouveau,
        "shm": shm,
        "gpu": gpu_expectations(variables, variables["nvidia_gpu_devices"]) if variables["nvidia_gpu_devices"] else None,
        "gpu_boot_unit": gpu_boot_unit_expectations(variables) if variables["nvidia_gpu_devices"] else None,
        "vllm_install": vllm_install_expectations(variables),
        "container_toolkit": container_toolkit_expectations(variables),
        "managed_files": managed_files(variables, plan),
        # the spec's secrets as (length, sha256): row `secrets readable by others` finds them in a file by digest
        "secret_digests": declared_digests(),
        "gateway": gateway_expectations(variables) if variables["gateway_frontends"] else None,
        "units": [
            unit_expectations(variables, unit, entry)
            for unit, entry in zip(plan.units, variables["vllm_service_instances"]) if not entry["container"]
        ],
        "vllm_containers": [
            container_expectations(variables, unit, entry)
            for unit, entry in zip(plan.units, variables["vllm_service_instances"]) if entry["container"]
        ],
        # spec mode reads the running servers: what each unit's process runs, and the ones the spec does not declare
        "running": True,
    }


def gateway_expectations(variables: dict[str, Any]) -> dict[str, Any]:
    """Role gateway's service: the states its systemd_service task sets; and each replica of each route, which
    HAProxy should have in rotation and UP (read on the admin socket role rollout drains through)."""
    task = find_task_args("gateway", "systemd_service", lambda args: "enabled" in args)
    rollout = read_yaml(role_dir("rollout") / "defaults" / "main.yml")
    return {"name": task["name"], "enabled": "enabled" if task["enabled"] else "disabled",
            "active": "active" if task["state"] == "started" else "inactive",
            "socket": rollout["rollout_haproxy_socket"], "record_dir": rollout["rollout_record_dir"],
            "servers": [{"backend": route["backend"], "server": server["name"], "model": route["model"]}
                        for frontend in variables["gateway_frontends"] for route in frontend["routes"]
                        for server in route["servers"]]}


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
        # what a drop-in must not change (plugins/module_utils/systemd_dropins.py, shared with the role)
        "managed": systemd_dropins.managed_settings(planned.unit.content),
        "env_file": env_file_expectations(variables, planned, entry),
        "config_file": {"path": planned.config_file.path, "content": planned.config_file.content},
        **serving_expectations(argv, config),
        "group": group_expectations(config),
        # what the running process must not be older than, the vLLM it must run, the key the API probes ask with
        "started_from": [planned.unit.path, planned.env_file.path, planned.config_file.path],
        "vllm_version": str(variables["vllm_install_version"]),
        "api_key": {"file": entry.get("api_key_file")},
    }


def group_expectations(config: dict[str, Any]) -> dict[str, Any] | None:
    """A node of a multi-node instance, as its `vllm serve --config` file makes it (None: an instance on one
    host): its rank of how many, where the leader's rendezvous is; a headless node serves no API."""
    size = int(config.get("nnodes") or 1)
    if size < 2:
        return None
    return {"rank": int(config.get("node-rank") or 0), "size": size, "master_addr": str(config["master-addr"]),
            "master_port": int(config["master-port"]), "headless": bool(config.get("headless"))}


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
        "publish": f"{bracketed(entry['host'])}:{entry['port']}",
        "ipc": "host" if container["ipc_host"] else "private",
        "shm_bytes": None if container["ipc_host"] else size_bytes(container["shm_size"]),
        "restart": variables["vllm_service_container_restart"],
        "environment": {name: planned.environment[name] for name in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")},
        "env_file": env_file_expectations(variables, planned, entry),
        "config_file": {"path": planned.config_file.path, "content": planned.config_file.content},
        "url": f"{scheme}://{bracketed(bind)}:{entry['port']}",
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
    """sha256 of the env file as the role renders it, with the real key and secrets (never shown; only its hash)."""
    unit_variables = {**variables, "vllm_service_instance": entry, "vllm_service_api_key": "",
                      "vllm_service_secret_env": {name: read_secret(source, name)
                                                  for name, source in secret_sources(variables, entry).items()}}
    if entry.get("api_key_file"):
        # as Ansible's file lookup reads it: trailing whitespace off
        unit_variables["vllm_service_api_key"] = read_api_key(entry["api_key_file"])
    content = render_role_file("vllm_service", ENV_TEMPLATE, unit_variables).content
    return hashlib.sha256(content.encode()).hexdigest()


# --------------------------------------------------------------------------- spec mode: what the roles leave on the host

GPU_UNIT_TEMPLATE = "nvidia-gpu-limits.service.j2"
GPU_CONFIG_TEMPLATE = "nvidia-gpu-limits.conf.j2"
GPU_SCRIPT = "nvidia-gpu-limits"  # roles/nvidia_gpu/files/
VLLM_SERVICE_FILES = ("wait-ready", "vllm-check-args.py")  # roles/vllm_service/files/, installed on every host
COMPOSE_BOOT_TEMPLATE = "vllm-instance.compose.service.j2"


def gpu_boot_unit_expectations(variables: dict[str, Any]) -> dict[str, Any]:
    """The nvidia_gpu role's boot unit: its name (its template task's dest), the unit file state the
    role's systemd_service task sets, and the state a successful run leaves (a oneshot with
    RemainAfterExit=yes stays active after it succeeded; without it, it goes back to inactive)."""
    unit = render_role_file("nvidia_gpu", GPU_UNIT_TEMPLATE, variables)
    name = Path(unit.path).name
    task = find_task_args("nvidia_gpu", "systemd_service", lambda args: args.get("name") == name and "enabled" in args)
    service = dict(unit_settings(unit.content, "Service"))
    remains = service.get("RemainAfterExit", "no").lower() in ("yes", "true", "on", "1")
    return {
        "name": name,
        "fragment": unit.path,
        "enabled": "enabled" if task["enabled"] else "disabled",
        "type": service.get("Type", "simple"),
        "active_after_success": "active" if remains else "inactive",
    }


def container_toolkit_expectations(variables: dict[str, Any]) -> dict[str, str] | None:
    """NVIDIA's container toolkit as role container_engine manages it: its package at the pinned version, held, and
    the CDI refresh path unit enabled and waiting (the toolkit's own from the version that ships it, the role's
    before: the role's vars/main.yml); None where the role leaves the toolkit alone, or no container uses a GPU."""
    if not (variables.get("container_engine_nvidia_toolkit_manage") and variables.get("container_engine_cdi_devices")):
        return None
    names = role_vars("container_engine")
    version = str(variables["container_engine_nvidia_toolkit_version"])
    refreshes = _release(version) >= _release(names["_container_engine_toolkit_refresh_since"])
    unit = names["_container_engine_refresh_units"]["toolkit" if refreshes else "own"]
    return {"package": names["_container_engine_toolkit_package"], "version": version, "path_unit": f"{unit}.path"}


def _release(version: str) -> tuple[int, ...]:
    """1.18.0 of 1.18.0-1 (or 1.18.0~rc.1-1), as numbers."""
    return tuple(int(number) for number in version.split("-")[0].split("~")[0].split("."))


def vllm_install_expectations(variables: dict[str, Any]) -> dict[str, str] | None:
    """The vLLM version the vllm_install role pins, the venv it installs it in, the folder of every
    version's venv and the links to the running and the previous one (the role's own names); None where
    the role does not run (site.yml: every instance in a container)."""
    if not variables.get("vllm_install_enabled", True):
        return None
    names = role_vars("vllm_install")
    paths = {key: render_string(names[f"_vllm_install_{name}"], variables)
             for key, name in (("venv", "venv"), ("venvs", "venvs"), ("current", "current_link"),
                               ("previous", "previous_link"), ("unversioned", "unversioned_venv"))}
    return {**paths, "path": str(variables["vllm_install_path"]), "version": str(variables["vllm_install_version"])}


def managed_files(variables: dict[str, Any], plan: HostPlan) -> list[dict[str, Any]]:
    """The files the `file PATH` rows compare (provisioner/audit/checks/managed_files.py says which
    and why), in the order the roles write them: each with its path, `owner:group` and mode (the role's
    own task), its rendered content, and:
    - `render` instead of content for the GPU settings file: its content holds the power limits the
      module resolved on the cards ('max' → watts), rendered by the audit from the GPUs it reads;
    - `skip` for a venv instance's unit: the [Service] lines that rows of their own read as systemd
      runs them (`UNIT: SETTING`, `UNIT: ExecStart`, `UNIT: Environment NAME`), left out here;
    - `unit` for a unit file (a venv instance's, the GPU boot unit): its name, so that a unit systemd
      did not load (masked, gone) is left to the unit's own row."""
    files = []
    if variables["nvidia_gpu_devices"]:
        files.append(copied_file("nvidia_gpu", GPU_SCRIPT, variables))
        config = find_task_args("nvidia_gpu", "template", lambda args: args.get("src") == GPU_CONFIG_TEMPLATE)
        files.append({
            "path": render_string(config["dest"], variables), "role": "nvidia_gpu",
            "owner": f"{config['owner']}:{config['group']}", "mode": config["mode"], "content": None, "skip": None,
            "render": {
                "template": GPU_CONFIG_TEMPLATE,
                "variables": {name: variables[name] for name in (
                    "nvidia_gpu_persistence_mode", "nvidia_gpu_apply_script", "nvidia_gpu_config_file")},
                "devices": variables["nvidia_gpu_devices"],
            },
        })
        boot_unit = render_role_file("nvidia_gpu", GPU_UNIT_TEMPLATE, variables)
        files.append({**rendered_file(boot_unit, GPU_UNIT_TEMPLATE), "unit": Path(boot_unit.path).name})
    files += [copied_file("vllm_service", name, variables) for name in VLLM_SERVICE_FILES]
    for planned, entry in zip(plan.units, variables["vllm_service_instances"]):
        engine = (entry.get("container") or {}).get("engine")
        if engine:
            files.append(rendered_file(planned.unit, UNIT_TEMPLATES[engine]))
        else:
            files.append({**rendered_file(planned.unit, UNIT_TEMPLATES[engine], unit_rows_lines(planned.unit.content)),
                          "unit": Path(planned.unit.path).name})
        if planned.boot_unit:
            files.append(rendered_file(planned.boot_unit, COMPOSE_BOOT_TEMPLATE))
    if variables["gateway_frontends"]:
        # with the real API keys, as the role writes it: the row shows only line numbers and redacted lines
        files.append(rendered_file(gateway_file(variables, real_keys=True), GATEWAY_TEMPLATE))
    return files + monitoring_managed_files(variables)


def monitoring_managed_files(variables: dict[str, Any]) -> list[dict[str, Any]]:
    """Role node_exporter's files (its arguments; the GPU timer's script and units) and, on the monitoring host,
    role prometheus's (the configuration provisioner/fleet/monitoring.py computes, its arguments): the files
    `provision plan` shows, in the order the roles write them."""
    files = []
    if variables.get("node_exporter_enabled"):
        files.append(rendered_file(render_role_file("node_exporter", EXPORTER_TEMPLATES[0], variables),
                                   EXPORTER_TEMPLATES[0]))
        if variables["node_exporter_gpu_timer"]:
            files.append(copied_file("node_exporter", "nvsmi-textfile", variables))
            files += [rendered_file(render_role_file("node_exporter", name, variables), name)
                      for name in GPU_TIMER_TEMPLATES]
    if variables.get("prometheus_files"):
        task = find_task_args("prometheus", "copy", lambda args: "prometheus.yml" in str(args.get("dest")))
        files += [{"path": f"{variables['prometheus_config_dir']}/{name}", "role": "prometheus",
                   "owner": f"{task['owner']}:{task['group']}", "mode": task["mode"], "content": text, "skip": None}
                  for name, text in sorted(variables["prometheus_files"].items())]
        files.append(rendered_file(render_role_file("prometheus", "prometheus.default.j2", variables),
                                   "prometheus.default.j2"))
    return files


def rendered_file(planned: Any, template: str, skip: dict[str, Any] | None = None) -> dict[str, Any]:
    """A file a role's template task writes (owner and group: that task's)."""
    task = find_task_args(planned.role, "template", lambda args: args.get("src") == template)
    return {"path": planned.path, "role": planned.role, "owner": f"{task['owner']}:{task['group']}",
            "mode": planned.mode, "content": planned.content, "skip": skip}


def copied_file(role: str, source: str, variables: dict[str, Any]) -> dict[str, Any]:
    """A file a role's copy task installs from its files/ folder, byte for byte."""
    task = find_task_args(role, "copy", lambda args: args.get("src") == source)
    return {"path": render_string(task["dest"], variables), "role": role, "owner": f"{task['owner']}:{task['group']}",
            "mode": task["mode"], "content": (role_dir(role) / "files" / source).read_text(encoding="utf-8"), "skip": None}


def unit_rows_lines(content: str) -> dict[str, Any]:
    """The lines of a venv instance's unit that its own rows check (as `systemctl show` reports them): every
    [Service] key but the CHECKED_APART ones, ExecStart, and Environment= lines that set only variables
    the `Environment NAME` rows check (a line setting another variable stays in the file's row)."""
    service = unit_settings(content, "Service")
    return {
        "section": "Service",
        "keys": sorted({key for key, _ in service if key not in CHECKED_APART} | {"ExecStart"}),
        "environment": sorted(unit_environment(content)),
    }


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
    """The profile's values for the host, its unit rules applied to each discovered vLLM unit and
    container, and each running server's rows and each GPU's memory shares (profile_servers)."""
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
            "found": [profile_container(container, rules, discovered.get("servers", []))
                      for container in discovered["containers"]],
        },
        **profile_servers(discovered, rules),
    }


def profile_unit(unit: dict[str, Any], rules: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": unit["name"],
        "fragment": unit["fragment"],
        "properties": rules["properties"],
        "environment": rules["environment"],
        "command_line": rules["command_line"],
        "managed": None,  # a unit we did not write: its drop-ins are reported, not judged
        **serving_expectations(unit["argv"], unit.get("config")),
    }


def profile_container(container: dict[str, Any], rules: dict[str, Any],
                      servers: list[dict[str, Any]] = ()) -> dict[str, Any]:
    """A discovered container: what was read (secrets left out) and the rules that apply to it. Its
    /dev/shm: the size its server process sees where the process scan found it (with --ipc=host the
    host's, whatever ShmSize says), else docker's ShmSize."""
    server = next((found for found in servers if found.get("name") == f"container {container['name']}"), None)
    seen = server.get("shm_bytes") if server else None
    return {
        **{key: container[key] for key in ("name", "tool", "image", "ports")},
        "shm_bytes": seen if seen is not None else container["shm_bytes"],
        # only the variables the rules ask about, and the command line with secret flags redacted
        "environment": redact_environment(
            {name: value for name, value in container["environment"].items() if name in rules["environment"]}),
        "command_line": shown_command(container["argv"]),
        "rules": {"environment": rules["environment"], "command_line": rules["command_line"]},
    }


# --------------------------------------------------------------------------- profile mode: the servers running

SUPERVISED = "a systemd unit or a container (restarts after a crash and a reboot)"
NOT_ROOT = "a dedicated user, not root"
BIND = "one address, or every interface only with an API key"
SHARES = "the --gpu-memory-utilization of the vLLM servers on it add up to at most 1.0"
RESTARTING_POLICIES = ("always", "unless-stopped", "on-failure")


def profile_servers(discovered: dict[str, Any], rules: dict[str, Any]) -> dict[str, Any]:
    """Every vLLM server running (unit, container or bare process: discovery's `servers`) with what
    its rows compare, and each GPU with the servers' memory shares on it. Names: a unit's name
    (`my-llm.service`), `container NAME`, `process PID` (a bare process: it has no other name)."""
    servers = [profile_server(server, rules) for server in discovered.get("servers", [])]
    shares = {server["name"]: server["share"] for server in servers}
    return {
        "processes": {"problem": discovered.get("processes_problem"),
                      "bare": [f"{server['name']} ({server['where']})" for server in servers if server["kind"] == "process"]},
        "servers": servers,
        "gpu_cards": [gpu_card_shares(card, shares) for card in discovered.get("gpu_cards", [])],
    }


def profile_server(server: dict[str, Any], rules: dict[str, Any]) -> dict[str, Any]:
    """One running server: its rows' expected and actual (command line redacted; of its environment only
    the CUDA variables the rules ask about: the process scan reads no other)."""
    argv, config = server["cmdline"], server.get("config") or {}
    options = {**config_options(config), **command_options(argv)}
    serving = serving_expectations(argv, config)
    share, source = memory_share(options)
    container = server.get("container") or {}
    supervised, where = supervision_verdict(server)
    return {
        "name": server["name"],
        "kind": server["kind"],
        "pid": server["pid"],
        "where": where,
        "supervised": supervised,
        "user": {"actual": f"{server['user']} (uid {server['uid']})", "passed": server["uid"] != 0},
        "bind": bind_verdict(serving["listen"], container.get("ports"), bool(
            options.get("--api-key") or server.get("api_key_in_environment"))),
        "command_line": shown_command(argv),
        "environment": redact_environment({name: value for name, value in (server.get("environment") or {}).items()
                                           if name in rules["environment"]}),
        "rules": {"environment": rules["environment"], "command_line": rules["command_line"]},
        "listen": serving["listen"],
        "shm": {"bytes": server.get("shm_bytes"), "hosts": server.get("host_shm") is not False},
        "ipc": ipc_text(server),
        "gpus": server.get("gpus", []),
        "share": share,
        "share_source": source,
        **running_rows(server),
    }


def running_rows(server: dict[str, Any]) -> dict[str, Any]:
    """How the server was started, whether a file it was started from changed since (passed None: unknown), the
    vLLM it imported."""
    passed, actual = running.restart_pending(server["pid"], server.get("started") or 0, server.get("files") or {})
    version, source = running.running_version(server)
    return {"started_by": running.started_by(server, server["supervision"], server.get("fragment", "")),
            "restart": {"passed": passed, "actual": actual}, "version": f"{version or 'unknown'} ({source})"}


def supervision_verdict(server: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """({"passed", "actual"} of `SERVER: supervised`, where it runs in words). A unit passes (its own rows
    check Restart=); a container passes with a restart policy that brings it back (or a unit running it);
    a bare process fails: nothing brings it back after a crash or a reboot."""
    placed, kind = server["supervision"], server["kind"]
    if kind == "unit":
        return {"passed": True, "actual": f"systemd unit {server['name']}"}, f"unit {server['name']}"
    if kind == "container":
        container = server.get("container") or {}
        units = [part for part in placed["cgroup"].split("/") if part.endswith(".service")]
        name = server["name"].removeprefix("container ")
        if units:
            return {"passed": True, "actual": f"{container.get('tool', '')} container {name}, run by unit {units[-1]}"}, units[-1]
        policy = container.get("restart") or "no"
        actual = f"{container.get('tool', '')} container {name}, restart policy {policy}"
        if policy in RESTARTING_POLICIES:
            return {"passed": True, "actual": actual}, actual
        return {"passed": False, "actual": f"{actual}: it comes back neither after a crash nor at boot — "
                                           "--restart unless-stopped, or run it from a unit"}, actual
    if placed["kind"] == "user unit":
        where = f"user unit {placed['name']} of {placed['manager']}"
        return {"passed": False, "actual": f"{where}: it starts at boot only if that user lingers — "
                                           "run it as a system unit"}, where
    where = {"session": placed["name"], "scope": placed["name"], "unit": f"started by {placed['name']}",
             "container": f"container {placed['name'][:12]}, not one docker or podman lists"}.get(
        placed["kind"], f"cgroup {placed['cgroup'] or '(unknown)'}")
    where = ", ".join([*server.get("via", []), where])
    return {"passed": False, "actual": f"bare process {server['pid']} ({where}): nothing restarts it after a crash "
                                       "or a reboot — run it as a unit"}, where


def bind_verdict(listen: str, published: list[str] | None, has_key: bool) -> dict[str, Any]:
    """`SERVER: bind address`. Listening on every interface (0.0.0.0, ::, no --host) is how a server
    behind a firewall or a load balancer is often run, and fine while /v1 asks for an API key; on
    every interface with no key, anyone who reaches the port can use the GPU: that fails. Where the
    key is given (command line or environment) is judged by the command-line rows, not here. A
    container: the addresses docker publishes its ports on (what it listens on inside is its own)."""
    addresses = [entry.split("->")[0] for entry in published] if published is not None else [listen]
    if published is not None and not published:
        return {"passed": True, "actual": "no port published"}
    shown = ", ".join(addresses)
    open_to_all = [address for address in addresses if address.rsplit(":", 1)[0] in (*ANY_ADDRESS, "[::]")]
    if not open_to_all:
        return {"passed": True, "actual": shown}
    port = open_to_all[0].rsplit(":", 1)[1]
    if has_key:
        return {"passed": True, "actual": f"{shown}: every interface, /v1 needs the API key"}
    return {"passed": False, "actual": f"{shown}: every interface and no API key — anyone who reaches port {port} can use it"}


def ipc_text(server: dict[str, Any]) -> str:
    container = server.get("container")
    if container is not None and container.get("ipc"):
        return f"IPC mode {container['ipc']}"
    return {True: "the host's IPC namespace", False: "its own IPC namespace"}.get(server.get("host_ipc"), "unknown")


def gpu_card_shares(card: dict[str, Any], shares: dict[str, float]) -> dict[str, Any]:
    """`GPU N: memory shares`: the shares of the servers holding memory on the card, their sum (at most
    1.0: each server takes its share of the whole card, so more than that cannot all fit), the memory
    they hold and the card's used and total memory."""
    servers = list(dict.fromkeys(app["server"] for app in card["apps"] if app["server"]))
    held = {name: sum(app["mib"] for app in card["apps"] if app["server"] == name) for name in servers}
    total = round(sum(shares[name] for name in servers), 4)
    parts = [f"{name} {shares[name]:.2f} ({held[name]} MiB)" for name in servers]
    others = [f"pid {app['pid']} ({app['comm'] or '?'}) {app['mib']} MiB, no vLLM server's" for app in card["apps"]
              if not app["server"]]
    memory = f"{card['used_mib']} of {card['total_mib']} MiB used"
    if card.get("apps_problem"):  # which servers hold memory there is not known: nothing to add up
        return {"index": card["index"], "uuid": card["uuid"], "actual": f"not read: {card['apps_problem']}; {memory}",
                "passed": False, "sum": None}
    if servers:
        actual = f"{' + '.join(parts)} = {total:.2f}; {memory}"
    else:
        actual = f"no vLLM server on it; {memory}"
    return {"index": card["index"], "uuid": card["uuid"], "actual": "; ".join([actual, *others]),
            "passed": total <= 1.0 + 1e-9, "sum": total}
