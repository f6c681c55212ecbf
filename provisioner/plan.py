"""What `apply` would do to each host, computed without touching it.

One source: the roles, read as data (provisioner/validation/roles.py): their own templates rendered from
their defaults overlaid with the host's generated host_vars, each file where the role's own
template task puts it. Nothing here re-implements a unit or a config file in Python.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from provisioner.base.addresses import is_loopback
from provisioner.base.file_formats import compose_environment, env_file_environment, unit_environment
from provisioner.base.module_utils import value_rules
from provisioner.base.secrets import read_api_key
from provisioner.gpu.topology import multinode_split_warnings, tensor_parallel_p2p_warnings
from provisioner.spec import Host, Instance, Spec
from provisioner.spec.gateways import RouteLoad, route_loads
from provisioner.validation.memory_plan import GpuMemory, host_memory
from provisioner.validation.preflight import DriverCheck, driver_check, memory_problems
from provisioner.validation.roles import (
    COMPOSE_UNIT_TEMPLATE,
    CONFIG_TEMPLATE,
    ENV_TEMPLATE,
    NOUVEAU_TEMPLATES,
    UNIT_TEMPLATES,
    PlannedFile,
    find_task_args,
    host_variables,
    render_role_file,
    render_string,
)
from provisioner.vllm.memory import ModelShapeError, load_model_shape
from provisioner.vllm.semantics import semantic_changes
from provisioner.vllm.serve_args import ANY_ADDRESS


@dataclass(frozen=True)
class PlannedUnit:
    """One instance's systemd unit, env file and `vllm serve --config` file, and the environment its process gets."""

    instance: str
    unit: PlannedFile
    env_file: PlannedFile
    config_file: PlannedFile
    environment: dict[str, str]
    boot_unit: PlannedFile | None = None  # docker: the unit that brings the compose project up at boot


@dataclass(frozen=True)
class PlannedRoute:
    """One route of a gateway: the URL clients use, the served name, its replicas (`name address:port`)."""

    gateway: str
    url: str
    model: str
    replicas: list[str]
    carries: str = ""  # the route's stated rate against its replicas' measured capacity (gateway.rates)


@dataclass(frozen=True)
class HostPlan:
    host: str
    address: str
    sysctls: dict[str, int | str]
    sysctl_file: PlannedFile
    nouveau_files: list[PlannedFile]
    removed_files: list[str]
    fstab_line: str | None
    units: list[PlannedUnit]
    warnings: list[str] = field(default_factory=list)
    memory: list[GpuMemory] = field(default_factory=list)  # per GPU the instances use: the memory planner's table
    gateway_file: PlannedFile | None = None  # role gateway's haproxy.cfg, where the host runs gateways
    routes: list[PlannedRoute] = field(default_factory=list)
    driver: DriverCheck | None = None  # the driver gate: what the host's vLLM builds need, what is known of its driver
    # roles node_exporter's and prometheus's files, where the spec has monitoring: (docs/monitoring.md)
    monitoring_files: list[PlannedFile] = field(default_factory=list)
    # each flag an instance runs with that changes what the model generates, and why (provisioner/vllm/semantics.yml)
    semantic_changes: list[str] = field(default_factory=list)

    @property
    def memory_problems(self) -> list[str]:
        """What would keep an instance from starting (vLLM checks memory at start): apply refuses to run."""
        return memory_problems(self.host, self.memory)

    @property
    def files(self) -> list[PlannedFile]:
        """Every file written on the host, in the order the roles write them."""
        unit_files = [file for unit in self.units
                      for file in (unit.env_file, unit.config_file, unit.unit, unit.boot_unit) if file]
        return [self.sysctl_file, *self.nouveau_files, *unit_files, *([self.gateway_file] if self.gateway_file else []),
                *self.monitoring_files]


def build_plan(spec: Spec, hosts: Iterable[str] | None = None) -> list[HostPlan]:
    """One plan per host (only those named in `hosts`, when given), in spec order."""
    chosen = None if hosts is None else set(hosts)
    return [host_plan(host, spec.instances_on(host.name), spec)
            for host in spec.hosts if chosen is None or host.name in chosen]


def host_plan(host: Host, instances: list[Instance], spec: Spec | None = None) -> HostPlan:
    """The files the roles write on `host`, with the warnings, the memory plan and the driver gate of its
    instances (with `spec`, also its gateways)."""
    plan = host_files(host, host_variables(host, instances, spec))
    driver = driver_check(host, instances)
    loads = {(gateway.name, load.model): load for gateway in (spec.gateways if spec else []) if gateway.host == host.name
             for load in route_loads(gateway, list(spec.instances))}
    routes = [replace(route, carries=carried(loads[route.gateway, route.model]))
              if (route.gateway, route.model) in loads else route for route in plan.routes]
    short = [f"gateway {gateway}'s route {model}: {carried(load)}" for (gateway, model), load in loads.items()
             if load.needed is not None and load.needed > len(load.replicas)]
    return replace(plan, warnings=host_warnings(host, instances) + list(driver.warnings) + short,
                   memory=host_memory(host, instances), driver=driver, semantic_changes=instance_semantics(instances),
                   routes=routes)


def carried(load: RouteLoad) -> str:
    """How many replicas the route's rate takes, by its weakest measured replica, and whether it has them."""
    has = f"the route has {len(load.replicas)}"
    unmeasured = (f"; unmeasured: {', '.join(load.unmeasured)} (`provision tune INSTANCE --slo … --capacity --write`"
                  " measures one)") if load.unmeasured else ""
    weakest = load.weakest
    if weakest is None:
        return f"{load.rate:g}/s: unmeasured — no replica has a capacity, {has}{unmeasured}"
    capacity = weakest.capacity
    needed = load.needed
    verdict = f"short by {needed - len(load.replicas)}: add replicas" if needed > len(load.replicas) else "enough"
    return (f"{load.rate:g}/s takes {needed} replica(s) at {capacity.rate:g}/s each ({weakest.name}, SLO {capacity.slo}, "
            f"measured: {capacity.measured}); {has}: {verdict}{unmeasured}")


def instance_semantics(instances: list[Instance]) -> list[str]:
    """Each semantic flag the instances run with (a multi-node instance's once, on its first node), from their
    own options or their profile's."""
    changes = []
    for instance in instances:
        if instance.node_rank:
            continue
        try:
            context = load_model_shape(instance.model).max_position_embeddings
        except (ModelShapeError, OSError, ValueError):  # no shape known here: every max-model-len is named
            context = None
        changes += [change.text for change in semantic_changes(instance.name, instance.serve_options, context)]
    return changes


def host_files(host: Host, variables: dict[str, Any]) -> HostPlan:
    """The files the roles write on `host`, from the roles' variables there (`roles.host_variables`):
    what the audit compares, without warnings or a memory plan."""
    nouveau_enabled = variables["nouveau_blacklist_enabled"]
    nouveau_files = [render_role_file("nouveau", name, variables) for name in NOUVEAU_TEMPLATES]
    return HostPlan(
        host=host.name,
        address=host.address,
        sysctls=variables["sysctl_settings"],
        sysctl_file=render_role_file("sysctl", "sysctl.conf.j2", variables),
        nouveau_files=nouveau_files if nouveau_enabled else [],
        removed_files=[] if nouveau_enabled else [file.path for file in nouveau_files],
        fstab_line=fstab_line(variables),
        units=[planned_unit(index, variables) for index in range(len(variables["vllm_service_instances"]))],
        gateway_file=gateway_file(variables),
        routes=planned_routes(host, variables),
        monitoring_files=monitoring_files(variables),
    )


EXPORTER_TEMPLATES = ("prometheus-node-exporter.default.j2",)
GPU_TIMER_TEMPLATES = ("nvsmi-textfile.service.j2", "nvsmi-textfile.timer.j2")


def monitoring_files(variables: dict[str, Any]) -> list[PlannedFile]:
    """Role node_exporter's files (its arguments, the GPU timer's units) and, on the monitoring host, role
    prometheus's: the configuration provisioner/fleet/monitoring.py computes, and its arguments."""
    files = []
    if variables["node_exporter_enabled"]:
        names = EXPORTER_TEMPLATES + (GPU_TIMER_TEMPLATES if variables["node_exporter_gpu_timer"] else ())
        files += [render_role_file("node_exporter", name, variables) for name in names]
    if variables["prometheus_files"]:
        mode = find_task_args("prometheus", "copy", lambda args: "prometheus.yml" in str(args.get("dest")))["mode"]
        files += [PlannedFile(f"{variables['prometheus_config_dir']}/{name}", text, mode, "prometheus")
                  for name, text in sorted(variables["prometheus_files"].items())]
        files.append(render_role_file("prometheus", "prometheus.default.j2", variables))
    return files


GATEWAY_TEMPLATE = "haproxy.cfg.j2"


def gateway_file(variables: dict[str, Any], real_keys: bool = False) -> PlannedFile | None:
    """Role gateway's haproxy.cfg (the API keys its health checks send redacted; `real_keys`: as the role
    writes them, for the audit to compare, never to show); None without gateways."""
    frontends = variables["gateway_frontends"]
    if not frontends:
        return None
    read = read_api_key if real_keys else redacted_key
    keys = {route["api_key_file"]: read(route["api_key_file"])
            for frontend in frontends for route in frontend["routes"] if route["api_key_file"]}
    return render_role_file("gateway", GATEWAY_TEMPLATE, {**variables, "gateway_api_keys": keys})


def planned_routes(host: Host, variables: dict[str, Any]) -> list[PlannedRoute]:
    routes = []
    for frontend in variables["gateway_frontends"]:
        scheme = "https" if frontend["tls_certificate"] else "http"
        address = host.address if frontend["bind"] in ANY_ADDRESS else frontend["bind"]
        url = f"{scheme}://{value_rules.host_port(address, frontend['port'])}/v1"
        routes += [PlannedRoute(frontend["name"], url, route["model"],
                                [f"{server['name']} {value_rules.host_port(server['address'], server['port'])}"
                                 for server in route["servers"]])
                   for route in frontend["routes"]]
    return routes


def planned_unit(index: int, variables: dict[str, Any]) -> PlannedUnit:
    entry = variables["vllm_service_instances"][index]
    unit_variables = {**variables, "vllm_service_instance": entry, "vllm_service_instance_index": index}
    if entry["api_key_file"]:
        unit_variables["vllm_service_api_key"] = redacted_key(entry["api_key_file"])
    unit_variables["vllm_service_secret_env"] = {name: redacted_secret(source)
                                                 for name, source in entry.get("secret_env", {}).items()}
    engine = (entry.get("container") or {}).get("engine")
    # the unit, or what the container engine runs instead (a quadlet, a compose file)
    unit = render_role_file("vllm_service", UNIT_TEMPLATES[engine], unit_variables)
    env_file = render_role_file("vllm_service", ENV_TEMPLATE, unit_variables)
    config_file = render_role_file("vllm_service", CONFIG_TEMPLATE, unit_variables)
    own = compose_environment(unit.content) if engine == "docker" else unit_environment(unit.content)
    environment = {**own, **env_file_environment(env_file.content)}
    boot_unit = render_role_file("vllm_service", COMPOSE_UNIT_TEMPLATE, unit_variables) if engine == "docker" else None
    return PlannedUnit(entry["name"], unit, env_file, config_file, environment, boot_unit)


def redacted_key(path: str) -> str:
    """What the plan shows instead of the API key (as Ansible's file lookup reads it: trailing whitespace off)."""
    try:
        size = len(read_api_key(path).encode())
    except (OSError, UnicodeDecodeError):
        return f"<missing: {path}>"
    return f"<redacted: {size} bytes from {path}>"


def redacted_secret(source: dict[str, str]) -> str:
    """What the plan shows instead of a declared secret: where it comes from."""
    if source.get("file"):
        return redacted_key(source["file"])
    if source.get("vault"):
        return "<redacted: vault-encrypted in the spec>"
    return f"<redacted: from the controller's ${source['env']}>"


def fstab_line(variables: dict[str, Any]) -> str | None:
    """The /etc/fstab line of the shm role's shm_fstab task; None when shm_size is null (role skipped)."""
    if variables["shm_size"] is None:
        return None
    task = find_task_args("shm", "vllm_provision.gpu_host.shm_fstab", lambda args: "line" in args)
    return render_string(task["line"], variables)


def host_warnings(host: Host, instances: list[Instance]) -> list[str]:
    """Things that are valid but probably not what the user wants."""
    warnings = []
    for instance in instances:
        if instance.node_rank == 0 and not is_loopback(instance.bind) and not instance.api_key_file:
            warnings.append(
                f"{instance.name} listens on {instance.bind} without an API key: anyone who reaches "
                f"port {instance.port} can use it — set api_key_file"
            )
    limited = [device.index for device in host.gpus.devices if device.power_limit != "default"]
    if limited and not host.gpus.persistence_mode:
        warnings.append(
            f"power limits on GPU {', '.join(map(str, limited))} may not survive the driver unloading "
            "without persistence_mode"
        )
    warnings += tensor_parallel_p2p_warnings(host, instances)
    warnings += multinode_split_warnings(instances)
    return warnings
