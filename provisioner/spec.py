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
import math
import os
import re
import unicodedata
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

from provisioner.gpu import cards
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
GROUP_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")  # Ansible's rule for group names (a Python identifier)
RESERVED_GROUPS = ("all", "ungrouped", "vllm_hosts")  # Ansible's own two and the group the playbook targets


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
_check_group = _matching(
    GROUP_RE, "group",
    "is not a valid Ansible group name — use letters, digits and underscores, not starting with a digit "
    "(e.g. rack_a, h200)",
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


def _schema_pattern(pattern: re.Pattern) -> Any:
    """The regex a validator checks, shown in the JSON Schema (editors check it too); validation stays the
    validator's, with its message."""
    return Field(json_schema_extra={"pattern": pattern.pattern})


Name = Annotated[str, AfterValidator(_check_name), _schema_pattern(NAME_RE)]
Address = Annotated[str, AfterValidator(_check_address)]
GroupName = Annotated[str, AfterValidator(_check_group), _schema_pattern(GROUP_RE)]
GpuUuid = Annotated[str, AfterValidator(_check_gpu_uuid), _schema_pattern(GPU_UUID_RE)]
GpuRef = Annotated[int | str, BeforeValidator(_check_gpu_ref)]
PowerLimit = Annotated[int | Literal["max", "default"], BeforeValidator(_check_power_limit)]
Size = Annotated[str, AfterValidator(_check_size), _schema_pattern(SIZE_RE)]
SysctlValue = Annotated[int | str, BeforeValidator(_check_scalar)]
SpecPath = Annotated[str, AfterValidator(_resolve_path)]
AbsolutePath = Annotated[str, AfterValidator(_check_absolute)]
Version = Annotated[str, AfterValidator(_check_version), _schema_pattern(VERSION_RE)]
Image = Annotated[str, AfterValidator(_check_image), _schema_pattern(IMAGE_RE)]
Tag = Annotated[str, AfterValidator(_check_tag), _schema_pattern(TAG_RE)]
ContainerShmSize = Annotated[str, AfterValidator(_check_container_shm), _schema_pattern(SIZE_RE)]
Digest = Annotated[str, AfterValidator(_check_digest), _schema_pattern(DIGEST_RE)]


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

    name: Name = Field(description="inventory name: lowercase letters, digits, dashes; unique; at most 63 "
                       "characters (a DNS label)")
    address: Address = Field(description="IP address or DNS name ssh connects to")
    ssh: Ssh = Field(default_factory=Ssh, description="how Ansible, the audit and bench reach the host over ssh")
    settings: HostSettings = Field(default_factory=HostSettings, description="kernel and OS settings")
    gpus: GpuSettings = Field(default_factory=GpuSettings, description="the host's GPUs and the rules for sharing them")
    vllm: VllmSettings = Field(default_factory=VllmSettings, description="the vLLM installation the host's venv instances run")
    groups: list[GroupName] = Field(
        default_factory=list, description="inventory groups the host belongs to (besides vllm_hosts), e.g. [rack_a]; "
        "HOST arguments of plan/apply/audit accept them")

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

    name: Name = Field(description="unique across the spec; names the unit vllm-<name> and the env file; at most "
                       "58 characters (vllm-<name> is a DNS label)")
    host: str = Field(description="name of the host it runs on (a hosts[].name)")
    model: str = Field(description="model to serve (Hugging Face id or local path); not blank")
    port: int = Field(8000, ge=1, le=65535, description="--port; unique per host")
    bind: Address = Field("127.0.0.1", description="--host: address to listen on")
    gpus: list[GpuRef] = Field(min_length=1, description="GPUs: indexes into the host's gpus.devices, or UUIDs; "
                                "as many as tensor- × pipeline- × prefill-context-parallel × data-parallel size")
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

    version: Literal[1] = Field(description="spec format version: 1")
    hosts: list[Host] = Field(min_length=1, description="the GPU servers, at least one")
    instances: list[Instance] = Field(default_factory=list, description="the vLLM servers to run on them")

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
        raw = path.read_bytes()
    except OSError as error:
        raise SpecError([Problem(str(path), f"cannot read the spec: {error.strerror or error}")]) from None
    data = parse_yaml(decode_spec(raw, path.name), path.name)
    spec = validate_spec(data, base_dir=path.parent)
    spec._source_path = path
    return spec


def parse_yaml(text: str, source_name: str = "spec") -> Any:
    """YAML → Python data; syntax errors and duplicate keys become a `SpecError` with line:column."""
    try:
        return _load_bounded(text, source_name)
    except yaml.reader.ReaderError as error:
        line, column = _line_column(text, error.position)
        raise SpecError([Problem(
            f"{source_name}:{line}:{column}",
            f"character #x{error.character:04x} is not allowed in YAML — remove it (a control character "
            "or a stray byte; save the spec as plain UTF-8 text)")]) from None
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f"{source_name}:{mark.line + 1}:{mark.column + 1}" if mark else source_name
        what = error.problem or "invalid YAML"
        if error.context:
            what = f"{what} ({error.context})"
        fix = "remove one of them" if what.startswith("duplicate key") else "fix the YAML syntax"
        raise SpecError([Problem(where, f"{what} — {fix}")]) from None
    except RecursionError:
        raise SpecError([Problem(source_name, "values nested too deeply to read — a spec nests a few levels; "
                                              "fix the brackets")]) from None


class _StrictLoader(yaml.SafeLoader):
    """A SafeLoader that rejects duplicate keys instead of keeping the last one silently.

    Merge keys (`<<: *defaults`) work as in `yaml.safe_load`: the mapping's own keys override the
    merged ones (that is no duplicate); a key written twice in the mapping itself still is."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # flattened by SafeConstructor.construct_mapping
            key = self.construct_object(key_node, deep=deep)
            try:
                repeated = key in seen
            except TypeError:
                continue  # a list or mapping as a key: SafeConstructor says "found unhashable key"
            if repeated:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key '{key}'", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def compose_document(self) -> yaml.Node:
        """yaml.composer.Composer.compose_document, keeping the anchors for the expansion check."""
        self.get_event()  # DocumentStartEvent
        node = self.compose_node(None, None)
        self.get_event()  # DocumentEndEvent
        self.composed_anchors, self.anchors = self.anchors, {}
        return node


def decode_spec(raw: bytes, source_name: str = "spec") -> str:
    """The spec's bytes as UTF-8 text; other bytes become a `SpecError` naming the line and byte offset."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        column = error.start - (raw.rfind(b"\n", 0, error.start) + 1) + 1
        raise SpecError([Problem(
            f"{source_name}:{line}:{column}",
            f"byte 0x{raw[error.start]:02x} at offset {error.start} is not UTF-8 — save the spec as UTF-8 "
            "(e.g. `iconv -f latin1 -t utf-8`)")]) from None


def _line_column(text: str, position: int) -> tuple[int, int]:
    line = text.count("\n", 0, position) + 1
    return line, position - (text.rfind("\n", 0, position) + 1) + 1


# Scalars, sequences and mappings a document may expand to once its aliases are followed. A spec
# of a hundred hosts is a few thousand; "billion laughs" documents (nested aliases, each repeating
# the one before) expand to billions from a few lines, and constructing them exhausts the memory.
MAX_EXPANDED_NODES = 100_000


def _load_bounded(text: str, source_name: str) -> Any:
    """Compose the document (aliases stay references), refuse it if its aliases expand beyond
    MAX_EXPANDED_NODES, then construct it; as `yaml.load(text, Loader=_StrictLoader)` otherwise."""
    loader = _StrictLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        problem = _alias_expansion_problem(root, loader.composed_anchors, source_name)
        if problem:
            raise SpecError([problem])
        return loader.construct_document(root)
    finally:
        loader.dispose()


def _alias_expansion_problem(root: yaml.Node, anchors: dict[str, yaml.Node], source_name: str) -> Problem | None:
    """A Problem when following the aliases would build more than MAX_EXPANDED_NODES values, or a
    value that contains itself; counted on the composed nodes (an alias is the anchored node itself)."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def expanded(node: yaml.Node) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        if id(node) in open_nodes:
            raise _SelfContaining(node)
        open_nodes.add(id(node))
        children = node.value if isinstance(node, yaml.SequenceNode) else \
            [part for pair in node.value for part in pair] if isinstance(node, yaml.MappingNode) else []
        sizes[id(node)] = 1 + sum(expanded(child) for child in children)
        open_nodes.discard(id(node))
        return sizes[id(node)]

    def anchor_of(node: yaml.Node) -> str:
        name = next((name for name, anchored in anchors.items() if anchored is node), None)
        mark = node.start_mark
        return f"&{name} (line {mark.line + 1})" if name else f"the value at line {mark.line + 1}"

    try:
        total = expanded(root)
    except _SelfContaining as error:
        return Problem(source_name, f"{anchor_of(error.node)} contains an alias of itself, which expands without end "
                                    "— write the repeated part out")
    if total <= MAX_EXPANDED_NODES or total == len(sizes):  # no alias repeats anything: as long as the text
        return None
    biggest = max(anchors.values(), key=lambda node: sizes.get(id(node), 0))
    return Problem(source_name, f"its aliases expand to {total:,} values (at most {MAX_EXPANDED_NODES:,}; "
                                f"{anchor_of(biggest)} alone is {sizes[id(biggest)]:,}): a \"billion laughs\" "
                                "document — write the repeated parts out, or alias fewer nested parts")


class _SelfContaining(Exception):
    def __init__(self, node: yaml.Node):
        self.node = node


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
    problems += _group_problems(parts)
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
    problems += _name_length_problems(parts)
    problems += _blank_model_problems(parts)
    problems += _power_limit_problems(parts)
    problems += _parallel_problems(parts)
    problems += text_problems(parts, check_files=check_files)
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


def _group_problems(parts: _SpecParts) -> list[Problem]:
    """A group may not be named like a host or a group Ansible or our playbook owns, nor listed twice."""
    host_names = set(parts.host_names or [])
    problems = []
    for index, host in _present(parts.hosts):
        seen: set[str] = set()
        for group_index, group in enumerate(host.groups):
            where = f"hosts[{index}].groups[{group_index}]"
            if group in RESERVED_GROUPS:
                problems.append(Problem(where, f"'{group}' is a group every host is in already (all, ungrouped and "
                                               "vllm_hosts are taken) — choose another name"))
            elif group in host_names:
                problems.append(Problem(where, f"'{group}' is the name of a host — a group needs a name of its own "
                                               "(HOST arguments take both)"))
            elif group in seen:
                problems.append(Problem(where, f"'{group}' is listed twice — list each group once"))
            seen.add(group)
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


# Longest names every destination takes. A host name is the inventory name and, often, the
# machine's DNS name: one DNS label, at most 63 octets (RFC 1035 §2.3.4; RFC 1123 §2.1). An
# instance name makes the unit vllm-<name>.service (systemd: unit names are shorter than
# UNIT_NAME_MAX = 256, src/basic/unit-name.h, so 242 for the name), the files /etc/vllm/<name>.env,
# .yaml, .compose.yaml and vllm-<name>.container (a file name is at most NAME_MAX = 255 bytes),
# and the container and compose project vllm-<name>, which Docker and Podman also publish as a
# DNS name on the container's network: one label, 63 octets, so 63 - len("vllm-") = 58, the
# tightest of them.
HOST_NAME_MAX = 63
INSTANCE_NAME_MAX = 63 - len("vllm-")


def _name_length_problems(parts: _SpecParts) -> list[Problem]:
    problems = [
        Problem(f"hosts[{index}].name", f"'{host.name[:20]}…' is {len(host.name)} characters long, more than a DNS "
                f"label takes ({HOST_NAME_MAX}) — use a shorter name (it is the inventory name, often the DNS name)")
        for index, host in _present(parts.hosts) if len(host.name) > HOST_NAME_MAX
    ]
    problems += [
        Problem(f"instances[{index}].name",
                f"'{instance.name[:20]}…' is {len(instance.name)} characters long, more than {INSTANCE_NAME_MAX} — "
                "use a shorter name (vllm-<name> must be a DNS label of at most 63 characters: it names the "
                "container and the unit)")
        for index, instance in _present(parts.instances) if len(instance.name) > INSTANCE_NAME_MAX
    ]
    return problems


def _blank_model_problems(parts: _SpecParts) -> list[Problem]:
    return [
        Problem(f"instances[{index}].model", "is empty — give the model to serve: a Hugging Face id (e.g. "
                "Qwen/Qwen3-1.7B-FP8) or a local path")
        for index, instance in _present(parts.instances) if not instance.model.strip()
    ]


def _power_limit_problems(parts: _SpecParts) -> list[Problem]:
    """Watts no card of that model takes (the known ranges of provisioner.gpu.cards), or no NVIDIA card at all."""
    problems = []
    for host_index, host in _present(parts.hosts):
        for device_index, device in enumerate(host.gpus.devices):
            watts = device.power_limit
            if not _is_int(watts):
                continue
            where = f"hosts[{host_index}].gpus.devices[{device_index}].power_limit"
            known = cards.power_range(device.model)
            if known and not known.min_w <= watts <= known.max_w:
                problems.append(Problem(where, f"{watts} W is outside the {device.model}'s power-limit range "
                                        f"({known.min_w}–{known.max_w} W) — use watts in that range, or 'max'"))
            elif not known and watts > cards.NO_NVIDIA_CARD_ABOVE_W:
                problems.append(Problem(where, f"{watts} W is more than any NVIDIA GPU takes (the largest modules are "
                                        f"rated well under {cards.NO_NVIDIA_CARD_ABOVE_W} W) — give the card's watts "
                                        "(nvidia-smi -q -d POWER shows its range), or 'max'"))
    return problems


# vLLM 0.25.0, read in its source: one engine's world size is pipeline × tensor × prefill-context
# parallel size (ParallelConfig.__post_init__, vllm/config/parallel.py; decode-context parallel reuses
# the tensor-parallel GPUs); data parallel runs data-parallel-size-local engines on this node, each on
# world-size GPUs, by default all of data-parallel-size, and one with external load balancing
# (data-parallel-external-lb, or a data-parallel-rank given) (EngineArgs.create_engine_config,
# vllm/engine/arg_utils.py). The instance's GPUs must be exactly those.
PARALLEL_FACTORS = ("tensor-parallel-size", "pipeline-parallel-size", "prefill-context-parallel-size")


def _parallel_problems(parts: _SpecParts) -> list[Problem]:
    problems = []
    for index, instance, _, host in _instances_with_hosts(parts):
        if len({gpu_label(host, ref) for ref in instance.gpus}) != len(instance.gpus):
            continue  # a GPU listed twice: _gpu_reference_problems says so
        options = {key.replace("_", "-"): value for key, value in instance.serve_options.items()}
        factors = {name: options[name] for name in PARALLEL_FACTORS if name in options}
        external = options.get("data-parallel-external-lb") is True or "data-parallel-rank" in options
        data_parallel = "data-parallel-size-local" if "data-parallel-size-local" in options else "data-parallel-size"
        if data_parallel in options and not external:
            factors[data_parallel] = options[data_parallel]
        if not all(_is_int(value) and value >= 1 for value in factors.values()):
            continue  # a value vLLM would not take: _flag_problems says so
        used, listed = math.prod(factors.values()), len(instance.gpus)
        if used == listed:
            continue
        first = next(iter(factors), "tensor-parallel-size")
        where = f"instances[{index}].options.{first}" if factors else f"instances[{index}].gpus"
        product = " × ".join(f"{name} {value}" for name, value in factors.items()) or \
            "vLLM's default (tensor-parallel-size 1)"
        fix = f"make their product {listed}" if len(factors) > 1 else f"set {first}: {listed}"
        problems.append(Problem(where, f"{product} makes vLLM use {_gpus(used)}, but the instance has {_gpus(listed)} "
                                f"(gpus: {_literal_list(instance.gpus)}) — {fix}, or list {_gpus(used)} under gpus"))
    return problems


def _gpus(count: int) -> str:
    return f"{count} GPU{'s' if count != 1 else ''}"


def _literal_list(values: list) -> str:
    return "[" + ", ".join(str(value) for value in values) + "]"


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
        if Path(path).is_dir():
            problems.append(Problem(where, f"{path} is a folder, not a file — name the file that holds {what}"))
        elif not Path(path).is_file():
            problems.append(Problem(where, f"{path} does not exist — create it with {what} or correct the path"))
        elif Path(path).stat().st_size == 0 and not where.endswith(".known_hosts"):  # empty: trusts no host yet
            problems.append(Problem(where, f"{path} is empty — put {what} in it"))
    return problems


# --------------------------------------------------------------------------- text that reaches a host
#
# Every string of the spec ends up in a file a role writes (a unit, a quadlet, a compose or config file,
# the sysctl file, the inventory) or on a command line. The templates quote each value for its
# destination; what no quoting can carry is refused here, for every string field alike: control
# characters and the other line breaks (our own parsers split lines with str.splitlines), and per field
# what its destination cannot take.

# the line breaks str.splitlines splits on that are not control characters
_LINE_SEPARATORS = {"\u2028": "a line separator", "\u2029": "a paragraph separator"}
_LINE_BREAKS = "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"
_CHARACTER_NAMES = {"\n": "a newline", "\r": "a carriage return", "\t": "a tab", "\0": "a NUL character",
                    "\v": "a vertical tab", "\f": "a form feed", "\x85": "a next-line character", **_LINE_SEPARATORS}

# Where a field's text goes (by the field's name under hosts[i] / instances[i]), for the messages.
_DESTINATIONS = {
    "model": "the unit (Description=, ExecStartPost=) and the config file",
    "options": "the config file (and the unit's ExecStartPost= for served-model-name)",
    "env": "the unit (Environment=)",
    "container": "the quadlet or compose file",
    "settings": "the sysctl file",
    "ssh": "the inventory and ssh's command line",
    "vllm": "the inventory and the install's command lines",
    "gpus": "the inventory",
}

USER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*\$?$")
INSTALL_PATH_RE = re.compile(r"^/[A-Za-z0-9._+@/-]*$")
API_KEY_RE = re.compile(r"^[A-Za-z0-9._~+/=-]+$")  # roles/vllm_service/tasks/preflight.yml: one env-file line


def text_problems(parts: _SpecParts, check_files: bool = True) -> list[Problem]:
    """Every string of the hosts and instances that passed pass 1, checked for where it goes."""
    problems = []
    for section, items in (("hosts", parts.hosts), ("instances", parts.instances)):
        for index, item in _present(items):
            for loc, text in _strings_of(item, (section, index)):
                message = _character_problem(text, _DESTINATIONS.get(loc[2], "the files the roles write"))
                if message:
                    problems.append(Problem(path_of(loc), message))
    flagged = {problem.path for problem in problems}  # one problem per field: its characters first
    for index, host in _present(parts.hosts):
        problems += [problem for problem in _host_text_problems(index, host) if problem.path not in flagged]
    if check_files:
        problems += _api_key_problems(parts)
    return problems


def _strings_of(value: Any, loc: tuple) -> Iterator[tuple[tuple, str]]:
    """(location, text) of every string in a model's fields, lists and mappings (keys too)."""
    if isinstance(value, str):
        yield loc, value
    elif isinstance(value, BaseModel):
        for name in type(value).model_fields:
            yield from _strings_of(getattr(value, name), (*loc, name))
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings_of(key, (*loc, key))
            yield from _strings_of(item, (*loc, key))
    elif isinstance(value, (list, tuple)):
        for position, item in enumerate(value):
            yield from _strings_of(item, (*loc, position))


def _character_problem(text: str, destination: str) -> str | None:
    for char in text:
        category = unicodedata.category(char)
        if char in _LINE_BREAKS:
            return (f"contains {_character_name(char)}, which would end its line in {destination} "
                    "— remove it")
        if char == "\t":
            return f"contains {_character_name(char)} — write spaces instead"
        if category == "Cc":
            return f"contains {_character_name(char)}, a control character {destination} cannot hold — remove it"
        if category == "Cs":
            return f"contains {_character_name(char)}, half of a character (a lone surrogate) — write the whole character"
    return None


def _character_name(char: str) -> str:
    code = f"U+{ord(char):04X}"
    return f"{_CHARACTER_NAMES[char]} ({code})" if char in _CHARACTER_NAMES else code


def _host_text_problems(index: int, host: Host) -> list[Problem]:
    where = f"hosts[{index}]"
    problems = []
    if not USER_RE.match(host.ssh.user):
        problems.append(Problem(f"{where}.ssh.user", f"'{host.ssh.user}' is not a user name — use letters, digits "
                                "and '_.-', starting with a letter or '_' (e.g. root, ubuntu)"))
    if not INSTALL_PATH_RE.match(host.vllm.install_path):
        problems.append(Problem(f"{where}.vllm.install_path", f"'{host.vllm.install_path}' cannot be written "
                                "unquoted on the install's command line (`python3 -m venv <path>/venv`) — use "
                                "letters, digits and . _ + @ - / only"))
    for field, path in (("key", host.ssh.key), ("known_hosts", host.ssh.known_hosts)):
        if path and '"' in path:  # ssh_config and Ansible's ssh arguments quote these paths with "
            problems.append(Problem(f"{where}.ssh.{field}", f"'{path}' has a double quote, which ssh's options "
                                    "cannot hold — rename the file"))
    if host.vllm.wheelhouse and any(char in host.vllm.wheelhouse for char in "*?[]"):
        problems.append(Problem(f"{where}.vllm.wheelhouse", f"'{host.vllm.wheelhouse}' has a glob character "
                                "(* ? [ ]); the roles find its wheels with a glob pattern — rename the folder"))
    if host.vllm.index_url is not None and (not host.vllm.index_url or any(char.isspace() for char in host.vllm.index_url)):
        problems.append(Problem(f"{where}.vllm.index_url", "a URL has no spaces — write a space as %20, or null for PyPI"))
    problems += _keyed_problems(("hosts", index, "settings", "sysctls"), host.settings.sysctls, _sysctl_text_problem)
    return problems


def _sysctl_text_problem(key: str, value: int | str) -> str | None:
    """The sysctl file is `key = value` lines: systemd-sysctl trims the value and the role refuses '='."""
    if not isinstance(value, str):
        return None
    if not value.strip():
        return "is empty — give the value, or remove the parameter"
    if value != value.strip():
        return f"'{value}' has spaces around it, which the sysctl file drops — remove them"
    if "=" in value:
        return f"'{value}' contains '=', which the role refuses in a sysctl file line — remove it"
    return None


def _api_key_problems(parts: _SpecParts) -> list[Problem]:
    """The key goes unquoted into the env file: one line of the role's charset. Names the file, never the key."""
    problems = []
    for index, instance in _present(parts.instances):
        path = instance.api_key_file
        if not path or not Path(path).is_file() or Path(path).stat().st_size == 0:
            continue  # a missing or empty file is reported by _missing_files
        try:
            key = Path(path).read_bytes().decode("utf-8").rstrip()  # as Ansible's file lookup reads it
        except (OSError, UnicodeDecodeError):
            key = None
        if key is None or not API_KEY_RE.match(key):
            problems.append(Problem(
                f"instances[{index}].api_key_file",
                f"the key in {path} is not one line of letters, digits and . _ ~ + / = - (it goes unquoted "
                "into an env file) — put the key alone on the file's first line, without spaces or quotes"))
    return problems
