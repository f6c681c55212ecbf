"""The spec: one YAML file that says what every host and every vLLM instance should be.

It is the single source of truth. `load_spec` reads and validates it; every
problem is collected (not just the first) and raised together as a `SpecError`.
Validation never touches a host; relative file paths (ssh keys, API key files)
are resolved against the spec file's folder and `~` is expanded.

Two passes:
1. shape: pydantic models (unknown keys rejected, types strict, ranges checked);
2. consistency: checks across hosts and instances (names, ports, GPU references,
   memory shares, options, files on disk).
The second pass also runs on the hosts and instances that passed the first one
when others did not, so one run reports as much as it can.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import re
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple, TypeVar, get_args, get_origin

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
)
from pydantic_core import PydanticCustomError

from provisioner.vllm import flags
from provisioner.vllm.profiles import profile_env, profile_options

# --------------------------------------------------------------------------- errors


class Problem(NamedTuple):
    """One thing wrong with the spec: where (`instances[2].port`) and what, with the fix."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class SpecError(Exception):
    """The spec is invalid; `.problems` lists every problem found."""

    def __init__(self, problems: list[Problem]):
        self.problems = list(problems)
        super().__init__("\n".join(str(problem) for problem in self.problems))


# --------------------------------------------------------------------------- field types

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")
GPU_UUID_RE = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
SIZE_RE = re.compile(r"^[1-9][0-9]*[KMGT]$")
HOSTNAME_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*$")
SYSCTL_KEY_RE = re.compile(r"^[a-z0-9_]+([./][A-Za-z0-9_:@*-]+)+$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
VERSION_RE = re.compile(r"^[0-9]+(\.[0-9]+)*([.+-]?[A-Za-z0-9.+-]+)?$")
IMAGE_RE = re.compile(r"^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*$")
TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


def _invalid(kind: str, message: str) -> PydanticCustomError:
    return PydanticCustomError(kind, message)


def _matching(pattern: re.Pattern, kind: str, problem: str) -> Callable[[str], str]:
    """A validator: the value must match `pattern`; else "'<value>' <problem>"."""

    def check(value: str) -> str:
        if not pattern.match(value):
            raise _invalid(kind, f"'{value}' {problem}")
        return value

    return check


_check_name = _matching(
    NAME_RE, "name",
    "is not a valid name — use lowercase letters, digits and dashes, starting with a letter or digit "
    "(e.g. qwen7b, ws-3090)",
)
_check_gpu_uuid = _matching(
    GPU_UUID_RE, "gpu_uuid",
    "is not a GPU UUID — expected GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx (lowercase hex) as printed by "
    "`nvidia-smi -L`",
)
_check_size = _matching(
    SIZE_RE, "size",
    "is not a size — write a number with a K, M, G or T suffix (e.g. 16G), or null to leave /dev/shm as it is",
)
_check_version = _matching(VERSION_RE, "version", 'is not a version — e.g. "0.25.0" (quoted)')
_check_image = _matching(
    IMAGE_RE, "image",
    "is not an image name — registry/repository in lowercase, without tag or digest "
    "(e.g. docker.io/vllm/vllm-openai; the tag and digest have keys of their own)",
)
_check_container_shm = _matching(
    SIZE_RE, "size", "is not a size — write a number with a K, M, G or T suffix (e.g. 8G)"
)
_check_tag = _matching(TAG_RE, "tag", "is not an image tag — letters, digits, '_.-' (e.g. v0.25.0)")
_check_digest = _matching(
    DIGEST_RE, "digest", "is not an image digest — sha256: and 64 lowercase hex digits, as `docker images --digests` prints"
)


def _check_address(value: str) -> str:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        if not HOSTNAME_RE.match(value):
            raise _invalid("address", f"'{value}' is neither an IP address nor a host name") from None
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # YAML's true/false are ints to Python


def _check_gpu_ref(value: Any) -> Any:
    if _is_int(value) and value >= 0:
        return value
    if isinstance(value, str) and GPU_UUID_RE.match(value):
        return value
    raise _invalid(
        "gpu_ref",
        f"{_literal(value)} is neither a GPU index nor a GPU UUID — use an index from the host's "
        "gpus.devices (e.g. 0) or a UUID as printed by `nvidia-smi -L`",
    )


def _check_power_limit(value: Any) -> Any:
    if value in ("max", "default") and isinstance(value, str):
        return value
    if _is_int(value) and value > 0:
        return value
    raise _invalid(
        "power_limit",
        f"{_literal(value)} is not a power limit — use watts (a positive integer, e.g. 450), 'max' or 'default'",
    )


def _check_scalar(value: Any) -> Any:
    if isinstance(value, str) or _is_int(value):
        return value
    raise _invalid("scalar", f"expected a string or an integer, got {_show(value)}")


def _check_absolute(value: str) -> str:
    if not value.startswith("/"):
        raise _invalid("absolute_path", f"'{value}' is not an absolute path — start it with /")
    return os.path.normpath(value)


def _resolve_path(value: str, info: ValidationInfo) -> str:
    """`~` expanded, relative paths taken from the spec file's folder (`base_dir` in the context)."""
    base_dir = Path((info.context or {}).get("base_dir") or Path.cwd())
    return os.path.normpath(base_dir.absolute() / Path(value).expanduser())


Name = Annotated[str, AfterValidator(_check_name)]
Address = Annotated[str, AfterValidator(_check_address)]
GpuUuid = Annotated[str, AfterValidator(_check_gpu_uuid)]
GpuRef = Annotated[int | str, BeforeValidator(_check_gpu_ref)]
PowerLimit = Annotated[int | Literal["max", "default"], BeforeValidator(_check_power_limit)]
Size = Annotated[str, AfterValidator(_check_size)]
SysctlValue = Annotated[int | str, BeforeValidator(_check_scalar)]
SpecPath = Annotated[str, AfterValidator(_resolve_path)]
AbsolutePath = Annotated[str, AfterValidator(_check_absolute)]
Version = Annotated[str, AfterValidator(_check_version)]
Image = Annotated[str, AfterValidator(_check_image)]
Tag = Annotated[str, AfterValidator(_check_tag)]
ContainerShmSize = Annotated[str, AfterValidator(_check_container_shm)]
Digest = Annotated[str, AfterValidator(_check_digest)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


# --------------------------------------------------------------------------- models


class Ssh(_Model):
    """How Ansible reaches the host."""

    user: str = Field("root", description="login user")
    port: int = Field(22, ge=1, le=65535, description="ssh port")
    key: SpecPath | None = Field(
        None, description="private key file (relative to the spec, ~ expanded); null: ssh's own defaults/agent"
    )
    known_hosts: SpecPath | None = Field(
        None, description="known_hosts file to check the host key against (strict checking); null: ssh's defaults"
    )
    become: bool = Field(False, description="use sudo (true when user is not root)")


class HostSettings(_Model):
    """Kernel and OS settings."""

    swappiness: int = Field(1, ge=0, le=200, description="vm.swappiness; low keeps model files and buffers in RAM")
    sysctls: dict[str, SysctlValue] = Field(
        default_factory=dict, description="other kernel parameters, e.g. {vm.max_map_count: 262144}"
    )
    shm_size: Size | None = Field(None, description="size of /dev/shm (16G, 512M); null leaves it as it is")
    nouveau_blacklist: bool = Field(True, description="blacklist the nouveau driver (modprobe, initramfs, cmdline)")


class GpuDevice(_Model):
    """One GPU of the host, as `nvidia-smi -L` lists it."""

    index: int = Field(ge=0, description="nvidia-smi index (PCI bus order)")
    uuid: GpuUuid | None = Field(None, description="GPU-… UUID; needed to pin instances to this GPU")
    model: str | None = Field(None, description="product name, for humans and the audit")
    power_limit: PowerLimit = Field("default", description="watts, 'max' (the card's maximum) or 'default'")
    memory_mib: int | None = Field(
        None, ge=1, description="memory.total of nvidia-smi, for the memory plan; null: known from the model name"
    )


class GpuSettings(_Model):
    """The host's GPUs and the rules for sharing them."""

    expected_count: int | None = Field(None, ge=0, description="GPUs the host must have; null: as many as devices")
    persistence_mode: bool = Field(True, description="keep the driver loaded (power limits stick, faster start)")
    memory_share_limit: float = Field(
        0.95, gt=0, le=1, description="the most the instances' gpu_memory_utilization on one GPU may add up to"
    )
    devices: list[GpuDevice] = Field(default_factory=list, description="the GPUs, by index")

    @property
    def count(self) -> int:
        return len(self.devices) if self.expected_count is None else self.expected_count


class VllmSettings(_Model):
    """The vLLM installation the instances run."""

    version: Version = Field("0.25.0", description="vLLM version (quoted string): 0.25.0 or 0.33.0")
    install_path: AbsolutePath = Field("/opt/vllm", description="install folder; units run <install_path>/venv/bin/vllm")
    wheelhouse: SpecPath | None = Field(
        None, description="folder on this machine with every wheel (`provision wheelhouse`): offline install; null: pip's index"
    )
    index_url: str | None = Field(None, description="pip's index URL when there is no wheelhouse; null: PyPI")


class Host(_Model):
    """A GPU server."""

    name: Name = Field(description="inventory name: lowercase letters, digits, dashes")
    address: Address = Field(description="IP address or DNS name ssh connects to")
    ssh: Ssh = Field(default_factory=Ssh)
    settings: HostSettings = Field(default_factory=HostSettings)
    gpus: GpuSettings = Field(default_factory=GpuSettings)
    vllm: VllmSettings = Field(default_factory=VllmSettings)

    def device(self, index: int) -> GpuDevice | None:
        return next((device for device in self.gpus.devices if device.index == index), None)

    def device_by_uuid(self, uuid: str) -> GpuDevice | None:
        return next((device for device in self.gpus.devices if device.uuid == uuid), None)

    def gpu_uuid(self, ref: int | str) -> str | None:
        """The UUID a GPU reference (index or UUID) stands for; None if it cannot be resolved."""
        if isinstance(ref, str):
            return ref
        device = self.device(ref)
        return device.uuid if device else None


class Container(_Model):
    """Run the instance in a container instead of the host's venv: a Podman quadlet or a Docker compose project."""

    engine: Literal["podman", "docker"] = Field(
        description="podman: a quadlet (/etc/containers/systemd/vllm-<name>.container); docker: a compose project"
    )
    image: Image = Field("docker.io/vllm/vllm-openai", description="image name, without tag or digest")
    tag: Tag | None = Field(None, description="image tag; null: v<the host's vllm.version>")
    digest: Digest | None = Field(None, description="sha256:… pins the exact image (name:tag@digest)")
    shm_size: ContainerShmSize = Field("8G", description="size of the container's /dev/shm (ignored with ipc_host)")
    ipc_host: bool = Field(False, description="share the host's IPC namespace and /dev/shm (--ipc=host)")
    image_archive: SpecPath | None = Field(
        None, description="`docker save` archive of the image (name:tag) on this machine, loaded where the host lacks "
                          "the image: hosts without a registry; null: the engine pulls it"
    )


class Instance(_Model):
    """One `vllm serve` process, run as the systemd unit vllm-<name>.service, or in a container."""

    name: Name = Field(description="unique across the spec; names the unit and the env file")
    host: str = Field(description="name of the host it runs on")
    model: str = Field(description="model to serve (Hugging Face id or local path)")
    port: int = Field(8000, ge=1, le=65535, description="--port")
    bind: Address = Field("127.0.0.1", description="--host: address to listen on")
    gpus: list[GpuRef] = Field(min_length=1, description="GPUs: indexes into the host's gpus.devices, or UUIDs")
    gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="--gpu-memory-utilization: this instance's share of each of its GPUs"
    )
    profile: Literal["latency", "throughput"] | None = Field(
        None, description="planner profile: latency (one user, fastest tokens) or throughput (many users); null: vLLM's defaults"
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="other `vllm serve` flags: long names without --, e.g. {max-model-len: 4096}"
    )
    env: dict[str, str] = Field(default_factory=dict, description="extra environment variables (strings)")
    api_key_file: SpecPath | None = Field(
        None, description="file (relative to the spec) whose content becomes VLLM_API_KEY; null: no key"
    )
    container: Container | None = Field(None, description="run in a container (podman or docker); null: the host's venv")

    @property
    def serve_options(self) -> dict[str, Any]:
        """The `vllm serve` flags the instance runs with: its profile's, overridden by its own options."""
        own = {key.replace("_", "-"): value for key, value in self.options.items()}
        return {**{key: value for key, value in profile_options(self.profile).items() if key not in own},
                **self.options}

    @property
    def serve_env(self) -> dict[str, str]:
        """The environment the instance runs with: its profile's, overridden by its own env."""
        return {**profile_env(self.profile), **self.env}


class Spec(_Model):
    """The whole spec file."""

    version: Literal[1] = Field(description="spec format version")
    hosts: list[Host] = Field(min_length=1)
    instances: list[Instance] = Field(default_factory=list)

    _source_path: Path | None = PrivateAttr(default=None)

    @property
    def source_path(self) -> Path | None:
        """The file the spec was loaded from (None when built in code)."""
        return self._source_path

    def host(self, name: str) -> Host | None:
        return next((host for host in self.hosts if host.name == name), None)

    def instances_on(self, host_name: str) -> list[Instance]:
        return [instance for instance in self.instances if instance.host == host_name]


# --------------------------------------------------------------------------- loading


def load_spec(path: str | Path) -> Spec:
    """Read, parse and validate a spec file; raise `SpecError` with every problem found."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise SpecError([Problem(str(path), f"cannot read the spec: {error.strerror or error}")]) from None
    data = parse_yaml(text, path.name)
    spec = validate_spec(data, base_dir=path.parent)
    spec._source_path = path
    return spec


def parse_yaml(text: str, source_name: str = "spec") -> Any:
    """YAML → Python data; syntax errors and duplicate keys become a `SpecError` with line:column."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f"{source_name}:{mark.line + 1}:{mark.column + 1}" if mark else source_name
        what = error.problem or "invalid YAML"
        if error.context:
            what = f"{what} ({error.context})"
        fix = "remove one of them" if what.startswith("duplicate key") else "fix the YAML syntax"
        raise SpecError([Problem(where, f"{what} — {fix}")]) from None


class _StrictLoader(yaml.SafeLoader):
    """A SafeLoader that rejects duplicate keys instead of keeping the last one silently."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key '{key}'", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def validate_spec(data: Any, base_dir: str | Path = ".", check_files: bool = True) -> Spec:
    """Validate parsed spec data; relative paths are resolved against `base_dir`.

    `check_files=False` skips the checks that files named by the spec exist.
    """
    if data is None:
        raise SpecError([Problem("(spec)", "the spec is empty — start from `provision init`")])
    if not isinstance(data, dict):
        raise SpecError([Problem("(spec)", f"expected a mapping at the top level, got {_show(data)}")])
    context = {"base_dir": Path(base_dir)}
    try:
        spec = Spec.model_validate(data, context=context)
    except ValidationError as error:
        problems = shape_problems(error)
        parts = _salvage(data, context)
    else:
        problems = []
        parts = _SpecParts(list(spec.hosts), list(spec.instances), [host.name for host in spec.hosts])
    problems += consistency_problems(parts, check_files=check_files)
    if problems:
        raise SpecError(sorted(problems, key=_spec_order))
    return spec


# --------------------------------------------------------------------------- pass 1: shape


def shape_problems(error: ValidationError) -> list[Problem]:
    """Pydantic's errors, rephrased for people who edit YAML."""
    return [Problem(path_of(detail["loc"]), _rephrase(detail)) for detail in error.errors()]


def path_of(loc: tuple) -> str:
    """('instances', 2, 'options', 'max-model-len') → instances[2].options.max-model-len"""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z0-9_-]+", str(part)):
            path += f".{part}" if path else str(part)
        else:
            path += f"['{part}']"
    return path or "(spec)"


_TYPE_NAMES = {
    "string_type": "a string",
    "int_type": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "bool_type": "true or false",
    "list_type": "a list",
    "dict_type": "a mapping (key: value)",
    "model_type": "a mapping (key: value)",
    "model_attributes_type": "a mapping (key: value)",
}
_LIMITS = {
    "greater_than": ("gt", "must be greater than"),
    "greater_than_equal": ("ge", "must be at least"),
    "less_than": ("lt", "must be less than"),
    "less_than_equal": ("le", "must be at most"),
}


def _rephrase(detail: dict) -> str:
    kind, value, ctx = detail["type"], detail.get("input"), detail.get("ctx") or {}
    if kind == "extra_forbidden":
        return _unknown_key_message(detail["loc"])
    if kind == "missing":
        return "required — add it"
    if kind in _TYPE_NAMES:
        message = f"expected {_TYPE_NAMES[kind]}, got {_show(value)}"
        if kind == "string_type" and isinstance(value, (int, float, bool)):
            message += " — put it in quotes"
        return message
    if kind in _LIMITS:
        key, words = _LIMITS[kind]
        return f"{words} {ctx[key]}, got {_show(value)}"
    if kind == "too_short":
        return f"needs at least {ctx.get('min_length', 1)} entry, got none"
    if kind == "literal_error":
        return f"must be {ctx.get('expected')}, got {_show(value)}"
    return str(detail["msg"])


def _unknown_key_message(loc: tuple) -> str:
    key = str(loc[-1])
    model = _model_at(loc[:-1])
    if model is None:
        return f"unknown key '{key}'"
    allowed = list(model.model_fields)
    guess = difflib.get_close_matches(key, allowed, n=1)
    hint = f"did you mean '{guess[0]}'? " if guess else ""
    return f"unknown key '{key}' — {hint}allowed keys: {', '.join(allowed)}"


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The model that validates the mapping at `loc` (list indexes skipped)."""
    model: type[BaseModel] | None = Spec
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(str(part)) if model else None
        if field is None:
            return None
        model = _model_in(field.annotation)
    return model


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) is list:
        return _model_in(get_args(annotation)[0])
    return None


def _spec_order(problem: Problem) -> tuple[int, int]:
    """Sort key: by section (version, hosts, instances) and entry; a stable sort keeps the rest in check order."""
    match = re.match(r"(\w+)(?:\[(\d+)\])?", problem.path)
    section, index = (match.group(1), int(match.group(2) or -1)) if match else ("", -1)
    sections = list(Spec.model_fields)
    return (sections.index(section) if section in sections else len(sections), index)


def _literal(value: Any) -> str:
    """A scalar as it reads in YAML: 'text', true, null, 450."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f"'{value}'"
    return str(value)


def _show(value: Any) -> str:
    """A value for a type error: 'text', true, null, a list, 0.25 (float)."""
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value} ({type(value).__name__})"
    return _literal(value)


# --------------------------------------------------------------------------- pass 2: consistency


_M = TypeVar("_M", bound=BaseModel)


class _SpecParts(NamedTuple):
    """The hosts and instances that passed pass 1 (None where one did not), in spec order."""

    hosts: list[Host | None]
    instances: list[Instance | None]
    host_names: list[str] | None  # names declared, also by hosts that failed pass 1; None: no list of hosts


def _salvage(data: dict, context: dict) -> _SpecParts:
    def each(items: Any, model: type[_M]) -> list[_M | None]:
        if not isinstance(items, list):
            return []
        return [_validated_or_none(model, item, context) for item in items]

    raw_hosts = data.get("hosts")
    names = None
    if isinstance(raw_hosts, list):
        names = [item["name"] for item in raw_hosts if isinstance(item, dict) and isinstance(item.get("name"), str)]
    return _SpecParts(each(raw_hosts, Host), each(data.get("instances"), Instance), names)


def _validated_or_none(model: type[_M], item: Any, context: dict) -> _M | None:
    try:
        return model.model_validate(item, context=context)
    except ValidationError:
        return None


def _present(items: list[_M | None]) -> Iterator[tuple[int, _M]]:
    return ((index, item) for index, item in enumerate(items) if item is not None)


def consistency_problems(parts: _SpecParts, check_files: bool = True) -> list[Problem]:
    problems: list[Problem] = []
    problems += _duplicate_hosts(parts.hosts)
    problems += _duplicate_gpu_uuids(parts.hosts)
    for index, host in _present(parts.hosts):
        problems += _host_problems(index, host)
    problems += _duplicate_instance_names(parts.instances)
    problems += _duplicate_ports(parts.instances)
    problems += _unknown_hosts(parts.instances, parts.host_names)
    problems += _gpu_reference_problems(parts)
    problems += _share_problems(parts)
    problems += _version_problems(parts)
    for index, instance in _present(parts.instances):
        if instance.container and instance.container.image_archive and instance.container.digest:
            problems.append(Problem(
                f"instances[{index}].container.digest",
                "an image_archive is loaded by name:tag, a digest pins an image pulled from a registry — keep one of them"))
        problems += _keyed_problems(("instances", index, "options"), instance.options, _option_problem)
        problems += _keyed_problems(("instances", index, "env"), instance.env, _env_problem)
    problems += _flag_problems(parts)
    if check_files:
        problems += _missing_files(parts)
    return problems


def _first_seen(items: list[tuple[int, Any, Any]]) -> Iterator[tuple[int, Any, int, Any]]:
    """For (index, key, item) triples: yield (index, item, first_index, first_item) for each repeated key."""
    first: dict[Any, tuple[int, Any]] = {}
    for index, key, item in items:
        if key in first:
            yield index, item, *first[key]
        else:
            first[key] = (index, item)


def _duplicate_hosts(hosts: list[Host | None]) -> list[Problem]:
    present = list(_present(hosts))
    problems = [
        Problem(f"hosts[{index}].name", f"duplicate host name '{host.name}' (also hosts[{first}]) — give each host its own name")
        for index, host, first, _ in _first_seen([(i, h.name, h) for i, h in present])
    ]
    problems += [
        Problem(
            f"hosts[{index}].address",
            f"address {host.address} (ssh port {host.ssh.port}) is already used by host '{other.name}' "
            f"(hosts[{first}]) — list each host once",
        )
        for index, host, first, other in _first_seen([(i, (h.address, h.ssh.port), h) for i, h in present])
    ]
    return problems


def _duplicate_gpu_uuids(hosts: list[Host | None]) -> list[Problem]:
    listed = [
        (f"hosts[{host_index}].gpus.devices[{device_index}]", device.uuid, host)
        for host_index, host in _present(hosts)
        for device_index, device in enumerate(host.gpus.devices)
        if device.uuid
    ]
    first: dict[str, str] = {}
    problems = []
    for path, uuid, _ in listed:
        if uuid in first:
            problems.append(
                Problem(f"{path}.uuid", f"GPU {uuid} is already listed at {first[uuid]} — every GPU has its own "
                        "UUID; copy it from `nvidia-smi -L`")
            )
        else:
            first[uuid] = path
    return problems


def _host_problems(index: int, host: Host) -> list[Problem]:
    where = f"hosts[{index}]"
    problems = [
        Problem(
            f"{where}.gpus.devices[{device_index}].index",
            f"GPU index {device.index} is listed twice (also devices[{first}]) — list each GPU once",
        )
        for device_index, device, first, _ in _first_seen(
            [(i, d.index, d) for i, d in enumerate(host.gpus.devices)]
        )
    ]
    gpus = host.gpus
    if gpus.expected_count is not None and gpus.devices and len(gpus.devices) != gpus.expected_count:
        problems.append(
            Problem(
                f"{where}.gpus.expected_count",
                f"{gpus.expected_count} GPUs expected but {len(gpus.devices)} listed under devices "
                "— list every GPU under devices or correct expected_count",
            )
        )
    problems += _keyed_problems(("hosts", index, "settings", "sysctls"), host.settings.sysctls, _sysctl_problem)
    return problems


def _sysctl_problem(key: str, value: int | str) -> str | None:
    if key == "vm.swappiness":
        return "vm.swappiness has its own setting — remove it here and set `swappiness:` under settings"
    if not SYSCTL_KEY_RE.match(key):
        return f"'{key}' is not a kernel parameter name (e.g. vm.max_map_count, as `sysctl -a` lists them)"
    return None


def _duplicate_instance_names(instances: list[Instance | None]) -> list[Problem]:
    return [
        Problem(
            f"instances[{index}].name",
            f"duplicate instance name '{instance.name}' (also instances[{first}]) — instance names must be "
            "unique across the spec (they name the systemd unit)",
        )
        for index, instance, first, _ in _first_seen([(i, inst.name, inst) for i, inst in _present(instances)])
    ]


def _duplicate_ports(instances: list[Instance | None]) -> list[Problem]:
    return [
        Problem(
            f"instances[{index}].port",
            f"port {instance.port} on host {instance.host} is already used by instance '{other.name}' "
            f"(instances[{first}]) — give each instance on a host its own port",
        )
        for index, instance, first, other in _first_seen(
            [(i, (inst.host, inst.port), inst) for i, inst in _present(instances)]
        )
    ]


def _unknown_hosts(instances: list[Instance | None], known: list[str] | None) -> list[Problem]:
    if known is None:  # the hosts themselves are unreadable: that is the problem to report
        return []
    problems = []
    for index, instance in _present(instances):
        if instance.host in known:
            continue
        guess = difflib.get_close_matches(instance.host, known, n=1)
        hint = f"did you mean '{guess[0]}'? " if guess else ""
        problems.append(
            Problem(
                f"instances[{index}].host",
                f"unknown host '{instance.host}' — {hint}hosts in this spec: {', '.join(known) or 'none'}",
            )
        )
    return problems


def _instances_with_hosts(parts: _SpecParts) -> Iterator[tuple[int, Instance, int, Host]]:
    """Instances whose host is in the spec and passed pass 1, with that host and its index."""
    hosts = {host.name: (index, host) for index, host in _present(parts.hosts)}
    for index, instance in _present(parts.instances):
        if instance.host in hosts:
            yield index, instance, *hosts[instance.host]


def _gpu_reference_problems(parts: _SpecParts) -> list[Problem]:
    problems = []
    for index, instance, host_index, host in _instances_with_hosts(parts):
        seen: set[str] = set()
        for ref_index, ref in enumerate(instance.gpus):
            where = f"instances[{index}].gpus[{ref_index}]"
            problem = _gpu_reference_problem(where, ref, host, host_index)
            if problem:
                problems.append(problem)
                continue
            key = gpu_label(host, ref)
            if key in seen:
                problems.append(Problem(where, f"{key} is listed twice — list each GPU once"))
            seen.add(key)
    return problems


def _gpu_reference_problem(where: str, ref: int | str, host: Host, host_index: int) -> Problem | None:
    devices = f"hosts[{host_index}].gpus.devices"
    if isinstance(ref, str):
        if host.gpus.devices and not host.device_by_uuid(ref):
            return Problem(
                where,
                f"GPU {ref} is not among host {host.name}'s devices — add its uuid to {devices} or fix the UUID",
            )
        return None
    device = host.device(ref)
    if device is None:
        indexes = ", ".join(str(d.index) for d in host.gpus.devices) or "none listed"
        return Problem(
            where,
            f"GPU index {ref} is not among host {host.name}'s devices (indexes: {indexes}) — use a listed index "
            f"or add the GPU to {devices}",
        )
    if device.uuid is None:
        position = host.gpus.devices.index(device)
        return Problem(
            where,
            f"GPU {ref} of host {host.name} has no uuid (instances are pinned by UUID) — add `uuid:` to "
            f"{devices}[{position}]; find it with `nvidia-smi -L` or `provision facts`",
        )
    return None


def gpu_label(host: Host, ref: int | str) -> str:
    """'GPU 0' for a device listed on the host (by index or UUID), 'GPU <uuid>' otherwise."""
    device = host.device(ref) if isinstance(ref, int) else host.device_by_uuid(ref)
    return f"GPU {device.index}" if device else f"GPU {ref}"


def _share_problems(parts: _SpecParts) -> list[Problem]:
    sharing: dict[tuple[str, str], list[tuple[int, Instance]]] = defaultdict(list)
    hosts: dict[str, Host] = {}
    for index, instance, _, host in _instances_with_hosts(parts):
        hosts[host.name] = host
        for label in dict.fromkeys(gpu_label(host, ref) for ref in instance.gpus):
            sharing[(host.name, label)].append((index, instance))
    problems = []
    for (host_name, label), users in sharing.items():
        limit = hosts[host_name].gpus.memory_share_limit
        total = sum(instance.gpu_memory_utilization for _, instance in users)
        if total <= limit + 1e-9:
            continue
        last_index = users[-1][0]
        shares = ", ".join(f"{instance.name} ({fmt_number(instance.gpu_memory_utilization)})" for _, instance in users)
        problems.append(
            Problem(
                f"instances[{last_index}].gpu_memory_utilization",
                f"shares on {label} of host {host_name} add up to {fmt_number(total)} (limit {fmt_number(limit)}) "
                f"— lower gpu_memory_utilization of {shares} so they add up to at most {fmt_number(limit)}",
            )
        )
    return problems


def fmt_number(value: float) -> str:
    """0.9500000001 → '0.95', 1.0 → '1'"""
    return f"{round(value, 4):g}"


# Options that the instance sets through its own fields.
DEDICATED_OPTIONS = {
    "model": "model",
    "port": "port",
    "host": "bind",
    "gpu-memory-utilization": "gpu_memory_utilization",
    "api-key": "api_key_file",
}


def _keyed_problems(where: tuple, mapping: dict[str, Any], problem: Callable[[str, Any], str | None]) -> list[Problem]:
    """One Problem per key of `mapping` that `problem(key, value)` finds fault with."""
    return [
        Problem(path_of((*where, key)), message)
        for key, value in mapping.items()
        if (message := problem(key, value))
    ]


def _option_problem(key: str, value: Any) -> str | None:
    if key.startswith("-"):
        return f"write option names without the leading dashes — use '{key.lstrip('-')}'"
    if not re.fullmatch(r"[a-z0-9][a-z0-9_-]*", key):
        return f"'{key}' is not a `vllm serve` long option name (e.g. max-model-len)"
    normalized = key.replace("_", "-")
    if normalized == "config":
        return "the role writes each instance's config file and runs `vllm serve --config` with it — put the flags in options"
    if normalized in DEDICATED_OPTIONS:
        field = DEDICATED_OPTIONS[normalized]
        return f"'{key}' is set by the instance's own field — remove it from options and set `{field}:` instead"
    if value is None:
        return "has no value — give one or remove the option"
    return None


def _version_problems(parts: _SpecParts) -> list[Problem]:
    """Each host's vLLM version must have a flag catalog (the versions we support)."""
    supported = flags.supported_versions()
    return [
        Problem(f"hosts[{index}].vllm.version",
                f"vLLM {host.vllm.version} is not supported — use one of {', '.join(supported)} "
                "(or add its flag catalog: python -m provisioner.vllm.make_catalog)")
        for index, host in _present(parts.hosts)
        if host.vllm.version not in supported
    ]


def _flag_problems(parts: _SpecParts) -> list[Problem]:
    """The options the host's vLLM version would reject (its catalog, from vLLM's own parser)."""
    problems = []
    for index, instance, _, host in _instances_with_hosts(parts):
        if host.vllm.version not in flags.supported_versions():
            continue  # reported once, on the host
        checkable = {key: value for key, value in instance.options.items() if _option_problem(key, value) is None}
        for key, message in flags.option_problems(host.vllm.version, checkable).items():
            problems.append(Problem(path_of(("instances", index, "options", key)), message))
    return problems


def _wheelhouse_problem(folder: str, version: str) -> str | None:
    build = f"build it with `provision wheelhouse --vllm-version {version} --out {folder}`"
    if not Path(folder).is_dir():
        return f"{folder} is not a folder — {build}"
    if not any(Path(folder).glob(f"vllm-{version}-*.whl")):
        return f"{folder} holds no vllm-{version} wheel — {build}"
    return None


# Environment variables the instance sets itself.
MANAGED_ENV = {
    "CUDA_VISIBLE_DEVICES": "it is set from `gpus:`",
    "CUDA_DEVICE_ORDER": "it is always PCI_BUS_ID",
    "VLLM_API_KEY": "use `api_key_file:` so the key stays out of the spec",
}


def _env_problem(name: str, value: str) -> str | None:
    if name in MANAGED_ENV:
        return f"{name} is managed — remove it; {MANAGED_ENV[name]}"
    if not ENV_NAME_RE.match(name):
        return f"'{name}' is not a valid environment variable name"
    return None


def _missing_files(parts: _SpecParts) -> list[Problem]:
    named = [
        (f"hosts[{index}].ssh.{field}", path, "an ssh private key" if field == "key" else "a known_hosts file")
        for index, host in _present(parts.hosts)
        for field, path in (("key", host.ssh.key), ("known_hosts", host.ssh.known_hosts))
        if path
    ]
    named += [
        (f"instances[{index}].api_key_file", instance.api_key_file, "the API key (its content becomes VLLM_API_KEY)")
        for index, instance in _present(parts.instances)
        if instance.api_key_file
    ]
    named += [
        (f"instances[{index}].container.image_archive", instance.container.image_archive,
         "the image (`docker save NAME:TAG -o FILE`)")
        for index, instance in _present(parts.instances)
        if instance.container and instance.container.image_archive
    ]
    problems = [
        Problem(f"hosts[{index}].vllm.wheelhouse", message)
        for index, host in _present(parts.hosts)
        if host.vllm.wheelhouse and (message := _wheelhouse_problem(host.vllm.wheelhouse, host.vllm.version))
    ]
    for where, path, what in named:
        if not Path(path).is_file():
            problems.append(Problem(where, f"{path} does not exist — create it with {what} or correct the path"))
        elif Path(path).stat().st_size == 0:
            problems.append(Problem(where, f"{path} is empty — put {what} in it"))
    return problems
