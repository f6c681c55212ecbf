"""The spec's shape: pydantic models of the hosts and instances, and the field types they use.

Pass 1 of the validation: unknown keys are rejected, types are strict, ranges and the grammar of
each field (names, UUIDs, sizes, images, versions) are checked; each message names the fix.
Checks across fields and entries live in `cross_checks` and `text_checks`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic import Tag as UnionTag
from pydantic_core import PydanticCustomError

from provisioner.base.module_utils import value_rules
from provisioner.base.vault import is_vault_text
from provisioner.spec.wording import literal, show
from provisioner.vllm.builds import build_of
from provisioner.vllm.profiles import profile_env, profile_options

# --------------------------------------------------------------------------- field types

# the kinds of value the roles and the audit check too: one rule each, in plugins/module_utils/value_rules.py
NAME_RE = re.compile(value_rules.NAME_PATTERN)
GPU_UUID_RE = re.compile(value_rules.GPU_UUID_PATTERN)
SIZE_RE = re.compile(value_rules.SIZE_PATTERN)
VERSION_RE = re.compile(value_rules.VLLM_VERSION_PATTERN)  # as pip writes it: 0.25.0
IMAGE_RE = re.compile(r"^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*$")
TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
GROUP_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")  # Ansible's rule for group names (a Python identifier)
BRANCH_RE = re.compile(value_rules.DRIVER_BRANCH_PATTERN)  # a driver branch: the number before the first dot (580)
DRIVER_VERSION_RE = re.compile(value_rules.DRIVER_VERSION_PATTERN)  # 580.95.05, 550.120
CUDA_RE = re.compile(r"^[1-9][0-9]?\.[0-9]$")  # a CUDA major.minor (12.9, 13.0)
TOOLKIT_VERSION_RE = re.compile(value_rules.TOOLKIT_VERSION_PATTERN)  # a package version: 1.18.0-1
DURATION_RE = re.compile(value_rules.DURATION_PATTERN)  # Prometheus's duration: 15s, 5m, 1m30s
# NCCL_SOCKET_IFNAME's forms: interface names or prefixes, comma-separated, `^` excludes, `=` matches exactly
IFNAME_RE = re.compile(r"^[=^]?[A-Za-z0-9_.:@-]{1,15}(,[A-Za-z0-9_.:@-]{1,15})*$")


def _invalid(kind: str, message: str) -> PydanticCustomError:
    return PydanticCustomError(kind, message)


def _matching(pattern: re.Pattern, kind: str, problem: str) -> Callable[[str], str]:
    """A validator: the value must match `pattern`; else "'<value>' <problem>"."""

    def check(value: str) -> str:
        if not pattern.match(value):
            raise _invalid(kind, f"'{value}' {problem}")
        return value

    return check


def _ruled(rule: Callable[[Any], str | None], kind: str, fix_also: str = "") -> Callable[[Any], Any]:
    """A validator: the value must pass `rule` (value_rules); else its problem, and `fix_also` after it."""

    def check(value: Any) -> Any:
        problem = rule(value)
        if problem:
            raise _invalid(kind, problem + fix_also)
        return value

    return check


_check_name = _ruled(value_rules.name_problem, "name")
_check_gpu_uuid = _ruled(value_rules.gpu_uuid_problem, "gpu_uuid")
_check_size = _ruled(value_rules.size_problem, "size", ", or null to leave /dev/shm as it is")
_check_version = _ruled(value_rules.vllm_version_problem, "version")
_check_image = _matching(
    IMAGE_RE, "image",
    "is not an image name — registry/repository in lowercase, without tag or digest "
    "(e.g. docker.io/vllm/vllm-openai; the tag and digest have keys of their own)",
)
_check_container_shm = _ruled(value_rules.size_problem, "size")
_check_group = _matching(
    GROUP_RE, "group",
    "is not a valid Ansible group name — use letters, digits and underscores, not starting with a digit "
    "(e.g. rack_a, h200)",
)
_check_tag = _matching(TAG_RE, "tag", "is not an image tag — letters, digits, '_.-' (e.g. v0.25.0)")
_check_branch = _ruled(value_rules.driver_branch_problem, "branch")
_check_driver_version = _ruled(value_rules.driver_version_problem, "driver_version")
_check_cuda = _matching(CUDA_RE, "cuda", 'is not a CUDA version — write major.minor, quoted (e.g. "12.9")')
_check_toolkit_version = _ruled(value_rules.toolkit_version_problem, "toolkit_version")
_check_digest = _matching(
    DIGEST_RE, "digest", "is not an image digest — sha256: and 64 lowercase hex digits, as `docker images --digests` prints"
)

_check_ifname = _matching(
    IFNAME_RE, "ifname", "is not a network interface for NCCL — an interface name or prefix (e.g. eth1, ib0, "
    "ens5f0), several comma-separated, ^ before them to exclude, = to match exactly")

_check_duration = _ruled(value_rules.duration_problem, "duration")
_check_address = _ruled(value_rules.address_problem, "address")


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # YAML's true/false are ints to Python


def _check_gpu_ref(value: Any) -> Any:
    if is_int(value) and value >= 0:
        return value
    if isinstance(value, str) and GPU_UUID_RE.match(value):
        return value
    raise _invalid(
        "gpu_ref",
        f"{literal(value)} is neither a GPU index nor a GPU UUID — use an index from the host's "
        "gpus.devices (e.g. 0) or a UUID as printed by `nvidia-smi -L`",
    )


def _check_power_limit(value: Any) -> Any:
    if value in ("max", "default") and isinstance(value, str):
        return value
    if is_int(value) and value > 0:
        return value
    raise _invalid(
        "power_limit",
        f"{literal(value)} is not a power limit — use watts (a positive integer, e.g. 450), 'max' or 'default'",
    )


def _check_scalar(value: Any) -> Any:
    if isinstance(value, str) or is_int(value):
        return value
    raise _invalid("scalar", f"expected a string or an integer, got {show(value)}")


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
DriverBranch = Annotated[str, AfterValidator(_check_branch), _schema_pattern(BRANCH_RE)]
DriverVersion = Annotated[str, AfterValidator(_check_driver_version), _schema_pattern(DRIVER_VERSION_RE)]
CudaVersion = Annotated[str, AfterValidator(_check_cuda), _schema_pattern(CUDA_RE)]
ToolkitVersion = Annotated[str, AfterValidator(_check_toolkit_version), _schema_pattern(TOOLKIT_VERSION_RE)]
Duration = Annotated[str, AfterValidator(_check_duration), _schema_pattern(DURATION_RE)]
Ifname = Annotated[str, AfterValidator(_check_ifname), _schema_pattern(IFNAME_RE)]


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


class GpuPolicy(_Model):
    """The rules for a host's GPUs, which defaults and groups may set too (devices are per host)."""

    expected_count: int | None = Field(None, ge=0, description="GPUs the host must have; null: as many as devices")
    persistence_mode: bool = Field(True, description="keep the driver loaded (power limits stick, faster start)")
    memory_share_limit: float = Field(
        0.95, gt=0, le=1, description="the most the instances' gpu_memory_utilization on one GPU may add up to"
    )


class GpuSettings(GpuPolicy):
    """The host's GPUs and the rules for sharing them."""

    devices: list[GpuDevice] = Field(default_factory=list, description="the GPUs, by index")

    @property
    def count(self) -> int:
        return len(self.devices) if self.expected_count is None else self.expected_count


class VllmSettings(_Model):
    """The vLLM installation the instances run."""

    version: Version = Field("0.25.0", description="vLLM version (quoted string): 0.25.0 or 0.33.0")
    install_path: AbsolutePath = Field(
        "/opt/vllm", description="install folder: each version in its own venv, <install_path>/venvs/<version> (<version>+cu129 "
                                 "for the CUDA 12.9 build); "
                                 "units run its bin/vllm")
    wheelhouse: SpecPath | None = Field(
        None, description="folder on this machine with every wheel (`provision wheelhouse`): offline install; null: pip's index"
    )
    index_url: str | None = Field(None, description="pip's index URL when there is no wheelhouse; null: PyPI")
    cuda: CudaVersion | None = Field(
        None, description='the CUDA build of vLLM (quoted, e.g. "12.9": for drivers below 580), one the version\'s '
                          'catalog lists (docs/vllm.md); its wheels from vllm.wheelhouse or vllm.index_url; null: the '
                          'default build, the one PyPI serves (CUDA 13.0 for 0.25.0 and 0.33.0)')

    @property
    def package_version(self) -> str:
        """The version pip installs and reports: `version`, with the build's local label for a CUDA build other
        than the default (0.25.0+cu129, as vLLM publishes it); role vllm_install's `vllm_install_version`."""
        build = build_of(self.version, self.cuda) if self.cuda else None
        return f"{self.version}+{build.variant}" if build is not None and not build.default else self.version

    @property
    def venv(self) -> str:
        """The venv of this version and build (role vllm_install's `_vllm_install_venv`)."""
        return f"{self.install_path}/venvs/{self.package_version}"


class DriverSettings(_Model):
    """The NVIDIA driver, installed and held by apply (role nvidia_driver), or declared where something else
    manages it. Without this section the driver is left alone: apply only checks it is new enough."""

    manage: bool = Field(
        True, description="apply installs the branch and holds it; false: managed elsewhere, only checked (give "
                          "its version, else apply reads it from the host)")
    source: Literal["nvidia", "distribution"] = Field(
        "nvidia", description="nvidia: NVIDIA's CUDA repository (every branch); distribution: the OS's own packages "
                              "(Debian's stop at 535 on bookworm and 550 on trixie)")
    branch: DriverBranch = Field(
        "580", description='the driver branch, quoted ("580": the R580 long-term branch, what CUDA 13 builds need)')
    version: DriverVersion | None = Field(
        None, description='an exact version of the branch ("580.95.05"); null: the newest of the branch. With '
                          'manage: false, the version the host has')
    modules: Literal["auto", "open", "proprietary"] = Field(
        "auto", description="kernel modules: open (Turing and later; Blackwell runs only on them) or proprietary "
                            "(Maxwell, Pascal, Volta); auto: open, unless a GPU of the host is older than Turing")
    reboot: bool = Field(
        False, description="reboot the host when the installed driver needs a reboot to load; false: the run says "
                           "a reboot is pending and leaves it to you")
    hold: bool = Field(
        True, description="hold the packages (apt-mark hold): only apply moves the driver, not an upgrade")


class ContainerToolkitSettings(_Model):
    """NVIDIA's container toolkit, for the host's instances that run in containers on its GPUs (CDI devices):
    installed from NVIDIA's repository at a pinned version and held by apply (role container_engine), the GPUs'
    CDI spec regenerated when the driver changes. Without this section the toolkit is the host's own: apply only
    generates the CDI spec with its nvidia-ctk where a GPU is not declared."""

    manage: bool = Field(
        True, description="apply installs nvidia-container-toolkit-base at the version and holds it; false: the "
                          "host's own toolkit")
    version: ToolkitVersion = Field(
        "1.18.0-1", description='the package\'s version, quoted ("1.18.0-1"); from 1.18.0 the toolkit\'s own '
                                'nvidia-cdi-refresh units regenerate the spec, before it the role\'s')


class Host(_Model):
    """A GPU server."""

    name: Name = Field(description="inventory name: lowercase letters, digits, dashes; unique; at most 63 "
                       "characters (a DNS label)")
    address: Address = Field(description="IP address or DNS name ssh connects to")
    ssh: Ssh = Field(default_factory=Ssh, description="how Ansible, the audit and bench reach the host over ssh")
    settings: HostSettings = Field(default_factory=HostSettings, description="kernel and OS settings")
    gpus: GpuSettings = Field(default_factory=GpuSettings, description="the host's GPUs and the rules for sharing them")
    vllm: VllmSettings = Field(default_factory=VllmSettings, description="the vLLM installation the host's venv instances run")
    driver: DriverSettings | None = Field(
        None, description="the NVIDIA driver apply installs and holds (or declares, manage: false); null: left "
                          "alone, only checked against what the host's vLLM needs (read from the host at apply)")
    container_toolkit: ContainerToolkitSettings | None = Field(
        None, description="NVIDIA's container toolkit apply installs and holds for the host's containers (CDI); "
                          "null: the host's own")
    groups: list[GroupName] = Field(
        default_factory=list, description="inventory groups the host belongs to (besides vllm_hosts), e.g. [rack_a]; "
        "HOST arguments of plan/apply/audit accept them; the host takes the values of those with an entry under "
        "groups:, in this order, over defaults and under its own")

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


# What defaults and groups may set: a host's fields but name, address, groups and gpus.devices, each optional.
SharedSsh = Annotated[Ssh | None, Field(description="any fields of hosts[].ssh; null: none")]
SharedSettings = Annotated[HostSettings | None, Field(description="any fields of hosts[].settings; null: none")]
SharedGpus = Annotated[GpuPolicy | None, Field(
    description="any rules of hosts[].gpus; not devices: every GPU has its own UUID, each host lists its own; "
                "null: none")]
SharedVllm = Annotated[VllmSettings | None, Field(description="any fields of hosts[].vllm; null: none")]
SharedDriver = Annotated[DriverSettings | None, Field(
    description="any fields of hosts[].driver (a host that takes any has a driver section); null: none")]
SharedToolkit = Annotated[ContainerToolkitSettings | None, Field(
    description="any fields of hosts[].container_toolkit (a host that takes any has that section); null: none")]


class HostDefaults(_Model):
    """Values every host takes unless one of its groups or the host itself sets them; per field (a host that
    sets settings.shm_size keeps the sysctls it takes), sysctls key by key."""

    ssh: SharedSsh = None
    settings: SharedSettings = None
    gpus: SharedGpus = None
    vllm: SharedVllm = None
    driver: SharedDriver = None
    container_toolkit: SharedToolkit = None


class HostGroup(_Model):
    """Values shared by the hosts that list the group in their groups: over the defaults, under the host's own
    values; a host in several groups takes them in the order it lists them."""

    name: GroupName = Field(description="the group's name, as hosts[].groups lists it; an inventory group")
    ssh: SharedSsh = None
    settings: SharedSettings = None
    gpus: SharedGpus = None
    vllm: SharedVllm = None
    driver: SharedDriver = None
    container_toolkit: SharedToolkit = None


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


class Slo(_Model):
    """An instance's latency objectives: the alert rules fire when a p99 over the alerts' rate_window is above one."""

    ttft_p99_ms: int | None = Field(None, ge=1, le=value_rules.MAX_LATENCY_MS,
                                    description="time to first token, p99, in ms; null: no alert")
    itl_p99_ms: int | None = Field(None, ge=1, le=value_rules.MAX_LATENCY_MS,
                                   description="inter-token latency, p99, in ms; null: no alert")
    tpot_p99_ms: int | None = Field(None, ge=1, le=value_rules.MAX_LATENCY_MS,
                                    description="time per output token of a request, p99, in ms; null: no alert")


class Capacity(_Model):
    """What one instance was measured to carry (`provision tune --capacity` writes it): the highest request rate
    at which its SLO held, and the measurement that says so."""

    rate: float = Field(gt=0, le=1_000_000, description="requests per second the instance sustained within the SLO")
    slo: str = Field(min_length=1, description="the SLO it held, as `provision tune --slo` takes it")
    measured: str = Field(min_length=1, description="the measurement: its capacity.json (RESULTS/NAME/capacity.json) "
                                                    "and when")


class Nccl(_Model):
    """How the nodes of a multi-node instance talk (NCCL and Gloo, vLLM's collectives): environment of every node."""

    socket_ifname: Ifname | None = Field(
        None, description="network interface NCCL and Gloo use between the nodes (NCCL_SOCKET_IFNAME, "
                          "GLOO_SOCKET_IFNAME), e.g. eth1; null: their own choice")
    p2p_disable: bool = Field(False, description="NCCL_P2P_DISABLE=1: no P2P between the GPUs of a node (PCIe "
                                                 "paths where P2P hangs)")
    ib_disable: bool = Field(False, description="NCCL_IB_DISABLE=1: no InfiniBand/RoCE between the nodes (TCP "
                                                "sockets only)")


class Follower(_Model):
    """One more node of a multi-node instance: a host and the GPUs it gives (node ranks 1, 2, … in list order)."""

    host: str = Field(description="name of the host (a hosts[].name); runs the unit vllm-<name> headless")
    gpus: list[GpuRef] = Field(min_length=1, description="its GPUs: indexes into that host's gpus.devices, or "
                                                         "UUIDs; as many as the leader's")


class MultiNode(_Model):
    """One model served across several hosts by vLLM's own multi-node launcher (--nnodes, --node-rank,
    --master-addr, --master-port; --headless on the followers): the instance's host is node rank 0, which
    serves the API; each follower runs headless and joins its rendezvous (docs/multinode.md)."""

    followers: list[Follower] = Field(min_length=1, description="the other nodes, ranks 1, 2, … in list order")
    master_addr: Address | None = Field(
        None, description="--master-addr: where the followers reach the leader's rendezvous; null: the leader "
                          "host's address")
    master_port: int = Field(29501, ge=1, le=65535, description="--master-port: the rendezvous port on the leader "
                                                                "(vLLM's default 29501)")
    nccl: Nccl = Field(default_factory=Nccl, description="how the nodes talk: interface, P2P and InfiniBand switches")


# the flags the multi-node launcher takes from an instance's multinode section (never from its options)
GROUP_OPTIONS = ("nnodes", "node-rank", "master-addr", "master-port", "headless")


class SecretValue(_Model):
    """A secret, declared: where the controller reads it at run time (never its value in the spec). Only the
    instance's 0600 env file on the host holds it; the inventory holds where it comes from."""

    file: SpecPath | None = Field(None, description="a file on the controller (relative to the spec) whose content, "
                                  "trailing whitespace off, is the value")
    env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
                            description="an environment variable of the controller (read by plan, apply and audit)")
    vault: str | None = Field(None, description="the value encrypted with Ansible Vault, as `ansible-vault "
                              "encrypt_string` prints it (`NAME: !vault |` then the $ANSIBLE_VAULT block); the "
                              "controller decrypts it with ansible-playbook's password (ANSIBLE_VAULT_PASSWORD_FILE)")

    @field_validator("vault")
    @classmethod
    def _vault_text(cls, value: str | None) -> str | None:
        if value is not None and not is_vault_text(value):
            raise _invalid("vault_text", "not a vault-encrypted value (it starts with $ANSIBLE_VAULT;) — paste what "
                                         "`ansible-vault encrypt_string --name NAME` prints")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> SecretValue:
        if sum(source is not None for source in (self.file, self.env, self.vault)) != 1:
            raise _invalid("secret_source", "give one of file:, env: or vault: — e.g. {file: secrets/db.pass}, "
                                            "{env: DB_PASS}, or `DB_PASS: !vault |` as `ansible-vault encrypt_string "
                                            "--name DB_PASS` prints it")
        return self


# an env value: a string, or a mapping that declares a secret (the tags name the branch, never shown in a path)
ENV_VALUE_TAGS = ("(string)", "(secret)")
EnvValue = Annotated[
    Union[Annotated[str, UnionTag(ENV_VALUE_TAGS[0])], Annotated[SecretValue, UnionTag(ENV_VALUE_TAGS[1])]],  # noqa: UP007
    Discriminator(lambda value: ENV_VALUE_TAGS[isinstance(value, (dict, SecretValue))]),
]


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
        None, description="planner profile, performance flags only (what the model generates is kept): latency (the prefill chunk and CUDA graphs that cut the per-token tail under load) or throughput (vLLM's defaults); null: vLLM's defaults"
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="other `vllm serve` flags: long names without --, e.g. {max-model-len: 4096}"
    )
    env: dict[str, EnvValue] = Field(
        default_factory=dict, description="extra environment variables: a string, or a secret declared as "
                                          "{file: PATH}, {env: NAME} or `!vault |` (it goes into the 0600 env file only)")
    api_key_file: SpecPath | None = Field(
        None, description="file (relative to the spec) whose content becomes VLLM_API_KEY; null: no key"
    )
    container: Container | None = Field(None, description="run in a container (podman or docker); null: the host's venv")
    slo: Slo | None = Field(None, description="latency objectives the alert rules watch (monitoring:); null: none")
    capacity: Capacity | None = Field(
        None, description="the request rate this instance was measured to carry within an SLO (`provision tune "
                          "--capacity --write`); a gateway route's `rates` counts its replicas by it; null: unmeasured")
    multinode: MultiNode | None = Field(
        None, description="serve the model across several hosts (vLLM's multi-node launcher): host and gpus are "
                          "node rank 0, which serves the API; null: one host")

    _node_rank: int = PrivateAttr(default=0)  # which node of a multi-node instance this is (Spec.instances_on)
    _master_addr: str | None = PrivateAttr(default=None)  # multinode.master_addr, else the leader host's address

    @property
    def node_rank(self) -> int:
        """0: the instance as the spec writes it (a multi-node instance's leader); n: its follower n's node."""
        return self._node_rank

    @property
    def group_options(self) -> dict[str, Any]:
        """The multi-node launcher's flags of this node ({} for an instance on one host)."""
        if self.multinode is None:
            return {}
        group = {"nnodes": len(self.multinode.followers) + 1, "node-rank": self._node_rank,
                 "master-addr": self.multinode.master_addr or self._master_addr,
                 "master-port": self.multinode.master_port}
        return {**group, "headless": True} if self._node_rank > 0 else group

    @property
    def serve_options(self) -> dict[str, Any]:
        """The `vllm serve` flags the instance runs with: its profile's, overridden by its own options, and the
        multi-node launcher's (its multinode section)."""
        own = {key.replace("_", "-"): value for key, value in self.options.items()}
        return {**{key: value for key, value in profile_options(self.profile).items() if key not in own},
                **self.options, **self.group_options}

    def node(self, rank: int, master_addr: str) -> Instance:
        """Node `rank` of a multi-node instance (0: the leader, on the instance's host; n: follower n, on its
        host with its GPUs), the rendezvous address resolved."""
        follower = self.multinode.followers[rank - 1] if self.multinode and rank > 0 else None
        node = self.model_copy(update={"host": follower.host, "gpus": follower.gpus} if follower else {})
        node._node_rank, node._master_addr = rank, master_addr
        return node

    @property
    def served_names(self) -> list[str]:
        """The names clients ask for in a request's "model" (served-model-name, else the model)."""
        options = {key.replace("_", "-"): value for key, value in self.options.items()}
        served = options.get("served-model-name") or self.model
        return [str(name) for name in (served if isinstance(served, list) else [served])]

    @property
    def serve_env(self) -> dict[str, str]:
        """The environment the instance's unit sets: its profile's, overridden by its own env, and the NCCL
        settings of its multinode section; not its secrets (`secret_env`)."""
        plain = {name: value for name, value in self.env.items() if isinstance(value, str)}
        served = {**profile_env(self.profile), **plain, **nccl_env(self.multinode.nccl if self.multinode else None)}
        return {name: value for name, value in served.items() if name not in self.secret_env}

    @property
    def secret_env(self) -> dict[str, SecretValue]:
        """The environment variables the spec declares secret (their values are read on the controller)."""
        return {name: value for name, value in self.env.items() if isinstance(value, SecretValue)}


def nccl_env(nccl: Nccl | None) -> dict[str, str]:
    """The environment a multinode section's nccl settings make (Gloo carries vLLM's CPU-side group)."""
    if nccl is None:
        return {}
    env = {"NCCL_SOCKET_IFNAME": nccl.socket_ifname, "GLOO_SOCKET_IFNAME": nccl.socket_ifname} \
        if nccl.socket_ifname else {}
    if nccl.p2p_disable:
        env["NCCL_P2P_DISABLE"] = "1"
    if nccl.ib_disable:
        env["NCCL_IB_DISABLE"] = "1"
    return env


class Gateway(_Model):
    """An HAProxy on one of the spec's hosts: one base URL, a route per served model to its replicas."""

    name: Name = Field(description="unique across the spec; names the HAProxy frontend and its routes")
    host: str = Field(description="name of the host it runs on (a hosts[].name)")
    port: int = Field(8080, ge=1, le=65535, description="port clients connect to")
    bind: Address = Field("0.0.0.0", description="address to listen on")
    tls_certificate: SpecPath | None = Field(
        None, description="PEM file on this machine with the certificate and its key (HAProxy's `ssl crt`); "
                          "null: plain HTTP")
    models: list[str] | None = Field(
        None, description="served names to route (each: the instances serving it are its replicas); "
                          "null: every served name in the spec")
    rates: dict[str, float] = Field(
        default_factory=dict, description="requests per second a route must carry, by served name: `provision plan` "
                                          "says how many replicas that takes, by each replica's measured `capacity`")


class MonitoringAlerts(_Model):
    """The thresholds of the alert rules (docs/monitoring.md lists every rule)."""

    kv_cache_usage: float = Field(0.9, gt=0, le=1, description="vllm:kv_cache_usage_perc above this (0-1) for "
                                                                "pending_for: VllmKvCacheHigh")
    requests_waiting: int = Field(10, ge=0, description="vllm:num_requests_waiting above this for pending_for: "
                                                         "VllmRequestsQueueing")
    memory_share_slack: float = Field(
        0.03, ge=0, le=1, description="a GPU's used memory may exceed the spec's shares of it (the instances' "
                                      "gpu_memory_utilization added up) by this much of its total before "
                                      "GpuMemorySharesExceeded")
    down_for: Duration = Field("1m", description="how long an instance or exporter is down before its alert fires")
    pending_for: Duration = Field("5m", description="how long any other condition holds before its alert fires")
    rate_window: Duration = Field("5m", description="the window of rates and latency quantiles (SLOs, swapping)")


class Monitoring(_Model):
    """Exporters on every host, and Prometheus on one of them or a scrape configuration for your own
    (docs/monitoring.md): targets and alert rules from this spec."""

    host: str | None = Field(
        None, description="the spec host that runs Prometheus (role prometheus), scraping every target; null: "
                          "none of ours (`provision monitoring export` writes the configuration for your own)")
    gpu_metrics: Literal["textfile", "dcgm"] = Field(
        "textfile", description="textfile: nvidia-smi on a timer feeds node_exporter's textfile collector; dcgm: "
                                "NVIDIA's dcgm-exporter from NVIDIA's repository (its package and service are the "
                                "role's variables; not proven by our tests)")
    gpu_metrics_interval: Duration = Field("15s", description="how often the timer reads nvidia-smi (textfile)")
    scrape_interval: Duration = Field("15s", description="how often Prometheus scrapes each target")
    node_exporter_port: int = Field(9100, ge=1, le=65535, description="node_exporter's port on every host")
    dcgm_exporter_port: int = Field(9400, ge=1, le=65535, description="dcgm-exporter's port (gpu_metrics: dcgm)")
    prometheus_port: int = Field(9090, ge=1, le=65535, description="Prometheus's port on the monitoring host")
    alerts: MonitoringAlerts = Field(default_factory=MonitoringAlerts, description="the alert rules' thresholds")


class Spec(_Model):
    """The whole spec file."""

    version: Literal[1] = Field(description="spec format version: 1")
    hosts: list[Host] = Field(min_length=1, description="the GPU servers, at least one")
    instances: list[Instance] = Field(default_factory=list, description="the vLLM servers to run on them")
    gateways: list[Gateway] = Field(default_factory=list, description="HAProxy gateways in front of the instances")
    defaults: HostDefaults | None = Field(
        None, description="values every host takes, under its groups' and its own; null: none")
    groups: list[HostGroup] = Field(
        default_factory=list, description="values shared by the hosts that list the group in their groups")
    monitoring: Monitoring | None = Field(
        None, description="exporters on every host, Prometheus and alert rules from this spec; null: no monitoring")

    _source_path: Path | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _resolve_rendezvous(self) -> Spec:
        """A multi-node instance's rendezvous address, where its multinode section leaves it to the leader's host."""
        for instance in self.instances:
            if instance.multinode is not None:
                instance._master_addr = self.nodes_of(instance)[0]._master_addr
        return self

    @property
    def source_path(self) -> Path | None:
        """The file the spec was loaded from (None when built in code)."""
        return self._source_path

    def host(self, name: str) -> Host | None:
        return next((host for host in self.hosts if host.name == name), None)

    def instances_on(self, host_name: str) -> list[Instance]:
        """The instances that run a unit on the host: its own, and the node it runs of a multi-node instance."""
        return [node for instance in self.instances for node in self.nodes_of(instance) if node.host == host_name]

    def nodes_of(self, instance: Instance) -> list[Instance]:
        """The nodes of an instance, by rank: itself alone on one host; a multi-node instance's leader, then its
        followers (each with its rendezvous address resolved)."""
        if instance.multinode is None:
            return [instance]
        leader = self.host(instance.host)
        master_addr = instance.multinode.master_addr or (leader.address if leader else instance.host)
        return [instance.node(rank, master_addr) for rank in range(len(instance.multinode.followers) + 1)]

    def gateways_on(self, host_name: str) -> list[Gateway]:
        return [gateway for gateway in self.gateways if gateway.host == host_name]
