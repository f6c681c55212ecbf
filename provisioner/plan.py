"""What `apply` would do to each host, computed without touching it.

One source: the plan renders the roles' own templates with plain Jinja2, from the
roles' `defaults/main.yml` overlaid with the host's generated host_vars, and takes
each file's destination and mode from the role's own template task. Nothing here
re-implements a unit or a config file in Python.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import jinja2
import yaml

from provisioner.gpu.topology import tensor_parallel_p2p_warnings
from provisioner.inventory import host_vars
from provisioner.paths import role_dir
from provisioner.spec import Host, Instance, Spec
from provisioner.vllm.planning import GpuMemory, host_memory

ROLES = ("sysctl", "nouveau", "shm", "nvidia_gpu", "vllm_install", "container_engine", "vllm_service")  # site.yml's order
UNIT_TEMPLATE = "vllm-instance.service.j2"
QUADLET_TEMPLATE = "vllm-instance.container.j2"
COMPOSE_TEMPLATE = "vllm-instance.compose.yaml.j2"
COMPOSE_UNIT_TEMPLATE = "vllm-instance.compose.service.j2"
UNIT_TEMPLATES = {None: UNIT_TEMPLATE, "podman": QUADLET_TEMPLATE, "docker": COMPOSE_TEMPLATE}  # by container engine
ENV_TEMPLATE = "vllm-instance.env.j2"
CONFIG_TEMPLATE = "vllm-instance.yaml.j2"
NOUVEAU_TEMPLATES = ("blacklist-nouveau.conf.j2", "grub-nouveau.cfg.j2")


@dataclass(frozen=True)
class PlannedFile:
    """A file a role writes: where, with which mode, and its rendered content."""

    path: str
    content: str
    mode: str | None
    role: str


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

    @property
    def memory_problems(self) -> list[str]:
        """What would keep an instance from starting (vLLM checks memory at start): apply refuses to run."""
        return [f"{self.host} {gpu.label}: {problem}" for gpu in self.memory for problem in gpu.problems]

    @property
    def files(self) -> list[PlannedFile]:
        """Every file written on the host, in the order the roles write them."""
        unit_files = [file for unit in self.units
                      for file in (unit.env_file, unit.config_file, unit.unit, unit.boot_unit) if file]
        return [self.sysctl_file, *self.nouveau_files, *unit_files]


def build_plan(spec: Spec, hosts: Iterable[str] | None = None) -> list[HostPlan]:
    """One plan per host (only those named in `hosts`, when given), in spec order."""
    chosen = None if hosts is None else set(hosts)
    return [host_plan(host, spec.instances_on(host.name)) for host in spec.hosts if chosen is None or host.name in chosen]


def host_plan(host: Host, instances: list[Instance]) -> HostPlan:
    variables = {**role_defaults(), **host_vars(host, instances)}
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
        warnings=host_warnings(host, instances),
        memory=host_memory(host, instances),
    )


def planned_unit(index: int, variables: dict[str, Any]) -> PlannedUnit:
    entry = variables["vllm_service_instances"][index]
    unit_variables = {**variables, "vllm_service_instance": entry, "vllm_service_instance_index": index}
    if entry["api_key_file"]:
        unit_variables["vllm_service_api_key"] = redacted_key(entry["api_key_file"])
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
        size = len(Path(path).read_bytes().rstrip())
    except OSError:
        return f"<missing: {path}>"
    return f"<redacted: {size} bytes from {path}>"


def fstab_line(variables: dict[str, Any]) -> str | None:
    """The /etc/fstab line of the shm role's lineinfile task; None when shm_size is null (role skipped)."""
    if variables["shm_size"] is None:
        return None
    task = find_task_args("shm", "lineinfile", lambda args: args.get("path") == "/etc/fstab")
    return render_string(task["line"], variables)


def host_warnings(host: Host, instances: list[Instance]) -> list[str]:
    """Things that are valid but probably not what the user wants."""
    warnings = []
    for instance in instances:
        if not is_loopback(instance.bind) and not instance.api_key_file:
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
    return warnings


def is_loopback(address: str) -> bool:
    """127.0.0.0/8, ::1 or localhost: an address only this machine reaches."""
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


# --------------------------------------------------------------------------- the roles, read as data


@cache
def role_defaults() -> dict[str, Any]:
    """The roles' defaults/main.yml merged (they are literal values, no Jinja)."""
    merged: dict[str, Any] = {}
    for role in ROLES:
        path = role_dir(role) / "defaults" / "main.yml"
        merged.update(yaml.safe_load(path.read_text(encoding="utf-8")) or {})
    return merged


def render_role_file(role: str, template: str, variables: dict[str, Any]) -> PlannedFile:
    """Render roles/<role>/templates/<template> where the role's template task puts it."""
    task = find_task_args(role, "template", lambda args: args.get("src") == template)
    return PlannedFile(
        path=render_string(task["dest"], variables),
        content=_environment(role).get_template(template).render(variables),
        mode=task.get("mode"),
        role=role,
    )


def render_string(text: str, variables: dict[str, Any], role: str = ROLES[0]) -> str:
    return _environment(role).from_string(text).render(variables)


@cache
def _environment(role: str) -> jinja2.Environment:
    """Plain Jinja2 set up as Ansible's template module sets it up for a role's template: templates
    it includes or imports are looked up in the role's templates/ folder, as Ansible looks them up."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(role_dir(role) / "templates"),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


def find_task_args(role: str, module: str, matches: Callable[[dict], bool]) -> dict[str, Any]:
    """The arguments of the role's first `module` task (short or ansible.builtin name) that `matches`."""
    names = (module, f"ansible.builtin.{module}")
    for task in _role_tasks(role):
        for name in names:
            args = task.get(name)
            if isinstance(args, dict) and matches(args):
                return args
    raise LookupError(f"role {role} has no matching {module} task (looked in {role_dir(role) / 'tasks'})")


def _role_tasks(role: str) -> Iterator[dict]:
    for path in sorted((role_dir(role) / "tasks").glob("*.yml")):
        yield from _flatten(yaml.safe_load(path.read_text(encoding="utf-8")) or [])


def _flatten(tasks: list) -> Iterator[dict]:
    for task in tasks:
        if not isinstance(task, dict):
            continue
        yield task
        for section in ("block", "rescue", "always"):
            yield from _flatten(task.get(section) or [])


# --------------------------------------------------------------------------- environment of a unit


def unit_environment(unit: str) -> dict[str, str]:
    """The variables set by the Environment= lines of a unit or a quadlet, read as systemd reads them.

    systemd undoes %% first, then splits the line into words (quotes and C escapes undone); a line
    with an unbalanced quote is ignored, as systemd ignores it. A quadlet's [Container] values go into
    the podman command line of its unit's ExecStart=, where systemd also turns $$ into $.
    """
    environment = {}
    section = ""
    for line in unit.splitlines():
        if line.startswith("[") and line.rstrip().endswith("]"):
            section = line.strip()
        elif line.startswith("Environment="):
            setting = line.removeprefix("Environment=").replace("%%", "%")
            for assignment in systemd_words(setting) or []:
                key, _, value = assignment.partition("=")
                environment[key] = value.replace("$$", "$") if section == "[Container]" else value
    return environment


_C_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
              "\\": "\\", '"': '"', "'": "'", "s": " "}


def systemd_words(text: str) -> list[str] | None:
    """The words of a unit setting as systemd's extract_first_word(UNQUOTE|CUNESCAPE) splits them;
    None where systemd refuses the line (an unbalanced quote, an unknown escape). The \\x, \\u and
    octal escapes are not read: the templates never write them."""
    words: list[str] = []
    word: list[str] | None = None  # None: between words
    quote = ""
    characters = iter(text)
    for char in characters:
        if char == "\\":
            escaped = _C_ESCAPES.get(next(characters, ""))
            if escaped is None:
                return None
            word = (word or []) + [escaped]
        elif quote and char == quote:
            quote = ""
        elif quote:
            word.append(char)
        elif char in "\"'":
            quote, word = char, word or []
        elif char in " \t":
            if word is not None:
                words.append("".join(word))
            word = None
        else:
            word = (word or []) + [char]
    if quote:
        return None
    if word is not None:
        words.append("".join(word))
    return words


def compose_environment(compose: str) -> dict[str, str]:
    """The variables a compose file's service sets (`environment:`), $$ undone."""
    service = yaml.safe_load(compose)["services"]["vllm"]
    return {key: str(value).replace("$$", "$") for key, value in (service.get("environment") or {}).items()}


def env_file_environment(content: str) -> dict[str, str]:
    """The variables of an EnvironmentFile= (KEY=VALUE lines; comments skipped)."""
    environment = {}
    for line in content.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            environment[key.strip()] = value.strip()
    return environment
