"""Pass 2: checks across hosts and instances (names, ports, GPU references, memory shares, options,
versions, files on disk), run on what passed pass 1 so that one run reports as much as it can."""

from __future__ import annotations

import difflib
import math
import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from provisioner.base.module_utils import value_rules
from provisioner.gpu import cards
from provisioner.spec.driver import cuda_problems, driver_problems
from provisioner.spec.errors import Problem
from provisioner.spec.gateway_checks import gateway_problems
from provisioner.spec.gateways import GATEWAY_GROUP
from provisioner.spec.messages import gpu_label, path_of
from provisioner.spec.models import GROUP_OPTIONS, Host, Instance, is_int
from provisioner.spec.monitoring_checks import MONITORING_GROUP, monitoring_problems
from provisioner.spec.multinode_checks import multinode_problems
from provisioner.spec.parts import SpecParts, keyed_problems, present
from provisioner.spec.port_checks import port_problems
from provisioner.spec.secret_checks import inline_secret_problem, secret_source_problems
from provisioner.spec.text_checks import text_problems
from provisioner.spec.wording import fmt_number
from provisioner.vllm import flags
from provisioner.vllm.builds import Build, build_of

SYSCTL_KEY_RE = re.compile(r"^[a-z0-9_]+([./][A-Za-z0-9_:@*-]+)+$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
RESERVED_GROUPS = ("all", "ungrouped", "vllm_hosts")  # Ansible's own two and the group the playbook targets


def consistency_problems(parts: SpecParts, check_files: bool = True) -> list[Problem]:
    problems: list[Problem] = []
    problems += _duplicate_hosts(parts.hosts)
    problems += _group_problems(parts)
    problems += _group_entry_problems(parts)
    problems += _duplicate_gpu_uuids(parts.hosts)
    for index, host in present(parts.hosts):
        problems += _host_problems(index, host)
    problems += _duplicate_instance_names(parts.instances)
    problems += port_problems(parts)
    problems += _unknown_hosts(parts.instances, parts.host_names)
    problems += _gpu_reference_problems(parts)
    problems += _share_problems(parts)
    problems += _version_problems(parts)
    problems += cuda_problems(parts)
    problems += driver_problems(parts)
    for index, instance in present(parts.instances):
        if instance.container and instance.container.image_archive and instance.container.digest:
            problems.append(Problem(
                f"instances[{index}].container.digest",
                "an image_archive is loaded by name:tag, a digest pins an image pulled from a registry — keep one of them"))
        problems += keyed_problems(("instances", index, "options"), instance.options, _option_problem)
        problems += keyed_problems(("instances", index, "env"), instance.env, _env_problem)
    problems += _flag_problems(parts)
    problems += _name_length_problems(parts)
    problems += _blank_model_problems(parts)
    problems += _power_limit_problems(parts)
    problems += _parallel_problems(parts)
    problems += multinode_problems(parts)
    problems += text_problems(parts, check_files=check_files)
    problems += gateway_problems(parts, check_files=check_files)
    problems += monitoring_problems(parts)
    if check_files:
        problems += _missing_files(parts)
        problems += secret_source_problems(parts)
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
    entries = list(present(hosts))
    problems = [
        Problem(f"hosts[{index}].name", f"duplicate host name '{host.name}' (also hosts[{first}]) — give each host its own name")
        for index, host, first, _ in _first_seen([(i, h.name, h) for i, h in entries])
    ]
    problems += [
        Problem(
            f"hosts[{index}].address",
            f"address {host.address} (ssh port {host.ssh.port}) is already used by host '{other.name}' "
            f"(hosts[{first}]) — list each host once",
        )
        for index, host, first, other in _first_seen([(i, (h.address, h.ssh.port), h) for i, h in entries])
    ]
    return problems


def _group_problems(parts: SpecParts) -> list[Problem]:
    """The groups hosts list: each once, each name fit for a group; a name with an entry under `groups:` is
    checked there, once."""
    host_names = set(parts.host_names or [])
    entries = {group.name for _, group in present(parts.groups)}
    problems = []
    for index, host in present(parts.hosts):
        seen: set[str] = set()
        for group_index, group in enumerate(host.groups):
            where = f"hosts[{index}].groups[{group_index}]"
            message = None if group in entries else _group_name_problem(group, host_names)
            if message is None and group in seen:
                message = f"'{group}' is listed twice — list each group once"
            if message:
                problems.append(Problem(where, message))
            seen.add(group)
    return problems


def _group_name_problem(group: str, host_names: set[str]) -> str | None:
    """A group may not be named like a host or a group Ansible, our playbook or our inventory owns."""
    if group in RESERVED_GROUPS:
        return (f"'{group}' is a group every host is in already (all, ungrouped and vllm_hosts are taken) "
                "— choose another name")
    if group == GATEWAY_GROUP:
        return f"'{group}' is the group of the hosts that run a gateway (the inventory makes it) — choose another name"
    if group == MONITORING_GROUP:
        return f"'{group}' is the group of the host that runs Prometheus (the inventory makes it) — choose another name"
    if group in host_names:
        return f"'{group}' is the name of a host — a group needs a name of its own (HOST arguments take both)"
    return None


def _group_entry_problems(parts: SpecParts) -> list[Problem]:
    """The entries of `groups:`: each name once, fit for a group, and listed by a host."""
    host_names = set(parts.host_names or [])
    entries = {group.name for _, group in present(parts.groups)}
    membership_only = [name for name in dict.fromkeys(parts.listed_groups or []) if name not in entries]
    problems = [
        Problem(f"groups[{index}].name", f"duplicate group name '{group.name}' (also groups[{first}]) — give each "
                "group its own name")
        for index, group, first, _ in _first_seen([(i, g.name, g) for i, g in present(parts.groups)])
    ]
    for index, group in present(parts.groups):
        message = _group_name_problem(group.name, host_names)
        if message is None and parts.listed_groups is not None and group.name not in parts.listed_groups:
            message = _unlisted_group_message(group.name, membership_only)
        if message:
            problems.append(Problem(f"groups[{index}].name", message))
    return problems


def _unlisted_group_message(name: str, membership_only: list[str]) -> str:
    """An entry no host lists: its values reach no host (a typo here or in the hosts' groups)."""
    guess = difflib.get_close_matches(name, membership_only, n=1)
    hint = f"did you mean '{guess[0]}' (hosts list it)? " if guess else ""
    return (f"no host lists '{name}' in its groups, so no host takes these values — {hint}add it to the groups "
            "of the hosts that share them, or remove the entry")


def _duplicate_gpu_uuids(hosts: list[Host | None]) -> list[Problem]:
    listed = [
        (f"hosts[{host_index}].gpus.devices[{device_index}]", device.uuid, host)
        for host_index, host in present(hosts)
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
    problems += keyed_problems(("hosts", index, "settings", "sysctls"), host.settings.sysctls, _sysctl_problem)
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
        for index, instance, first, _ in _first_seen([(i, inst.name, inst) for i, inst in present(instances)])
    ]


def _unknown_hosts(instances: list[Instance | None], known: list[str] | None) -> list[Problem]:
    if known is None:  # the hosts themselves are unreadable: that is the problem to report
        return []
    problems = []
    for index, instance in present(instances):
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


def _instances_with_hosts(parts: SpecParts) -> Iterator[tuple[int, Instance, int, Host]]:
    """Instances whose host is in the spec and passed pass 1, with that host and its index."""
    hosts = {host.name: (index, host) for index, host in present(parts.hosts)}
    for index, instance in present(parts.instances):
        if instance.host in hosts:
            yield index, instance, *hosts[instance.host]


def _placements(parts: SpecParts) -> Iterator[tuple[int, str, Instance, list, int, Host]]:
    """Each instance's GPUs on each of its hosts whose host is in the spec and passed pass 1: (instance index,
    where its gpus are written, the instance, the GPUs, host index, host): an instance on its host, then a
    multi-node instance's followers on theirs."""
    hosts = {host.name: (index, host) for index, host in present(parts.hosts)}
    for index, instance in present(parts.instances):
        nodes = [(f"instances[{index}]", instance.host, instance.gpus)] + [
            (f"instances[{index}].multinode.followers[{rank}]", follower.host, follower.gpus)
            for rank, follower in enumerate(instance.multinode.followers if instance.multinode else [])]
        seen = set()
        for where, host_name, gpus in nodes:
            if host_name in hosts and host_name not in seen:  # a host twice: multinode_problems says so
                seen.add(host_name)
                yield index, where, instance, gpus, *hosts[host_name]


def _gpu_reference_problems(parts: SpecParts) -> list[Problem]:
    problems = []
    for _, placed, _, gpus, host_index, host in _placements(parts):
        seen: set[str] = set()
        for ref_index, ref in enumerate(gpus):
            where = f"{placed}.gpus[{ref_index}]"
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


def _share_problems(parts: SpecParts) -> list[Problem]:
    sharing: dict[tuple[str, str], list[tuple[int, Instance]]] = defaultdict(list)
    hosts: dict[str, Host] = {}
    for index, _, instance, gpus, _, host in _placements(parts):
        hosts[host.name] = host
        for label in dict.fromkeys(gpu_label(host, ref) for ref in gpus):
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


# Options that the instance sets through its own fields.
DEDICATED_OPTIONS = {
    "model": "model",
    "port": "port",
    "host": "bind",
    "gpu-memory-utilization": "gpu_memory_utilization",
    "api-key": "api_key_file",
    **{option: "multinode" for option in GROUP_OPTIONS},  # the multi-node launcher's: each node's own
}


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


def _version_problems(parts: SpecParts) -> list[Problem]:
    """Each host's vLLM version must have a flag catalog (the versions we support)."""
    supported = flags.supported_versions()
    return [
        Problem(f"hosts[{index}].vllm.version",
                f"vLLM {host.vllm.version} is not supported — use one of {', '.join(supported)} "
                "(or add its flag catalog: python -m provisioner.vllm.make_catalog)")
        for index, host in present(parts.hosts)
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


def _name_length_problems(parts: SpecParts) -> list[Problem]:
    problems = [
        Problem(f"hosts[{index}].name", f"'{host.name[:20]}…' is {len(host.name)} characters long, more than a DNS "
                f"label takes ({HOST_NAME_MAX}) — use a shorter name (it is the inventory name, often the DNS name)")
        for index, host in present(parts.hosts) if len(host.name) > HOST_NAME_MAX
    ]
    problems += [
        Problem(f"instances[{index}].name",
                f"'{instance.name[:20]}…' is {len(instance.name)} characters long, more than {INSTANCE_NAME_MAX} — "
                "use a shorter name (vllm-<name> must be a DNS label of at most 63 characters: it names the "
                "container and the unit)")
        for index, instance in present(parts.instances) if len(instance.name) > INSTANCE_NAME_MAX
    ]
    return problems


def _blank_model_problems(parts: SpecParts) -> list[Problem]:
    return [
        Problem(f"instances[{index}].model", "is empty — give the model to serve: a Hugging Face id (e.g. "
                "Qwen/Qwen3-1.7B-FP8) or a local path")
        for index, instance in present(parts.instances) if not instance.model.strip()
    ]


def _power_limit_problems(parts: SpecParts) -> list[Problem]:
    """Watts no card of that model takes (the known ranges of provisioner.gpu.cards), or no NVIDIA card at all."""
    problems = []
    for host_index, host in present(parts.hosts):
        for device_index, device in enumerate(host.gpus.devices):
            watts = device.power_limit
            if not is_int(watts):
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


def _parallel_problems(parts: SpecParts) -> list[Problem]:
    problems = []
    placed: dict[int, list[tuple[list, Host]]] = defaultdict(list)
    for index, _, instance, gpus, _, host in _placements(parts):
        placed[index].append((gpus, host))
    for index, instance in present(parts.instances):
        nodes = placed[index]
        if len(nodes) != 1 + len(instance.multinode.followers if instance.multinode else []):
            continue  # a host not in the spec: _unknown_hosts and multinode_problems say so
        if any(len({gpu_label(host, ref) for ref in gpus}) != len(gpus) for gpus, host in nodes):
            continue  # a GPU listed twice: _gpu_reference_problems says so
        options = {key.replace("_", "-"): value for key, value in instance.serve_options.items()}
        factors = {name: options[name] for name in PARALLEL_FACTORS if name in options}
        external = options.get("data-parallel-external-lb") is True or "data-parallel-rank" in options
        data_parallel = "data-parallel-size-local" if "data-parallel-size-local" in options else "data-parallel-size"
        if data_parallel in options and not external:
            factors[data_parallel] = options[data_parallel]
        if not all(is_int(value) and value >= 1 for value in factors.values()):
            continue  # a value vLLM would not take: _flag_problems says so
        used, listed = math.prod(factors.values()), sum(len(gpus) for gpus, _ in nodes)
        if used == listed:
            continue
        first = next(iter(factors), "tensor-parallel-size")
        where = f"instances[{index}].options.{first}" if factors else f"instances[{index}].gpus"
        product = " × ".join(f"{name} {value}" for name, value in factors.items()) or \
            "vLLM's default (tensor-parallel-size 1)"
        fix = f"make their product {listed}" if len(factors) > 1 else f"set {first}: {listed}"
        has = f"{_gpus(listed)} (gpus: {_literal_list(instance.gpus)})" if len(nodes) == 1 else (
            f"{_gpus(listed)} on {len(nodes)} hosts ("
            + ", ".join(f"{_literal_list(gpus)} on {host.name}" for gpus, host in nodes) + ")")
        problems.append(Problem(where, f"{product} makes vLLM use {_gpus(used)}, but the instance has {has} "
                                f"— {fix}, or list {_gpus(used)} under gpus"))
    return problems


def _gpus(count: int) -> str:
    return f"{count} GPU{'s' if count != 1 else ''}"


def _literal_list(values: list) -> str:
    return "[" + ", ".join(str(value) for value in values) + "]"


def _flag_problems(parts: SpecParts) -> list[Problem]:
    """The options the host's vLLM version would reject (its catalog, from vLLM's own parser)."""
    problems = []
    for index, instance, _, host in _instances_with_hosts(parts):
        if host.vllm.version not in flags.supported_versions():
            continue  # reported once, on the host
        checkable = {key: value for key, value in instance.options.items() if _option_problem(key, value) is None}
        for key, message in flags.option_problems(host.vllm.version, checkable).items():
            problems.append(Problem(path_of(("instances", index, "options", key)), message))
    return problems


def _wheelhouse_problem(folder: str, version: str, build: Build | None = None) -> str | None:
    """Why `folder` cannot install vllm==version (0.25.0, or a CUDA build's 0.25.0+cu129); None: it can."""
    if build is None or build.default:
        build_it = f"build it with `provision wheelhouse --vllm-version {version} --out {folder}`"
    else:  # published on vLLM's own index, with the torch of that CUDA on PyTorch's
        indexes = " ".join(f"--extra-index-url {url}" for url in (build.index_url, build.extra_index_url) if url)
        build_it = (f"download {build.label}'s wheels into it: `pip download vllm=={version} {indexes} "
                    f"--only-binary=:all: --dest {folder}`")
    if not Path(folder).is_dir():
        return f"{folder} is not a folder — {build_it}"
    if not any(Path(folder).glob(f"vllm-{version}-*.whl")):
        return f"{folder} holds no vllm-{version} wheel — {build_it}"
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
    return inline_secret_problem(name, value)


def _missing_files(parts: SpecParts) -> list[Problem]:
    named = [
        (f"hosts[{index}].ssh.{field}", path, "an ssh private key" if field == "key" else "a known_hosts file")
        for index, host in present(parts.hosts)
        for field, path in (("key", host.ssh.key), ("known_hosts", host.ssh.known_hosts))
        if path
    ]
    named += [
        (f"instances[{index}].api_key_file", instance.api_key_file, "the API key (its content becomes VLLM_API_KEY)")
        for index, instance in present(parts.instances)
        if instance.api_key_file
    ]
    named += [
        (f"instances[{index}].env.{name}.file", source.file, f"the value of {name}")
        for index, instance in present(parts.instances)
        for name, source in instance.secret_env.items() if source.file
    ]
    named += [
        (f"instances[{index}].container.image_archive", instance.container.image_archive,
         "the image (`docker save NAME:TAG -o FILE`)")
        for index, instance in present(parts.instances)
        if instance.container and instance.container.image_archive
    ]
    problems = [
        Problem(f"hosts[{index}].vllm.wheelhouse", message)
        for index, host in present(parts.hosts)
        if host.vllm.wheelhouse and (message := _wheelhouse_problem(
                host.vllm.wheelhouse, host.vllm.package_version, build_of(host.vllm.version, host.vllm.cuda)))
    ]
    for where, path, what in named:
        # ours to read whole: a key; not the others (an image archive is large, ssh reads known_hosts itself).
        # An empty known_hosts file trusts no host yet.
        small = where.endswith((".key", ".api_key_file"))
        message = value_rules.file_problem(path, what, value_rules.MAX_SMALL_FILE_BYTES if small else None,
                                           may_be_empty=where.endswith(".known_hosts"))
        if message:
            problems.append(Problem(where, message))
    return problems
