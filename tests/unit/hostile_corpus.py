"""The hostile corpus (issue 34, point 5): specs every command that reads a spec must refuse, cleanly.

Each case is a name, the spec section it attacks, the field the refusal must name, and a change to a valid
base spec (`base_spec`). tests/unit/test_hostile_corpus.py runs every case through every command; a case whose
refusal waits for work not yet on main says so in `pending` ({command: reason}, "*" for every command).

Adding a case: one line in the section's list, usually `put(PATH, VALUE)` (the refusal names PATH). Values
that need the case's folder or its secret are `Made`: a FIFO, a symlink, a file holding the secret.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.unit.conftest import UUID0, UUID1

SPEC_NAME = "spec.yml"
KEY_FILE = "keys/chat.key"  # the base instance's API key file, holding the case's secret
TOKEN_FILE = "secrets/hf_token"  # the base instance's HF_TOKEN, declared {file: TOKEN_FILE}, holding it too
HUGE = 10**40  # a 40-digit number
NAN, INF = float("nan"), float("inf")

# the commands that read a spec, as `provision` arguments (the spec is appended as --spec FILE)
COMMANDS = {
    "plan": ["plan"],
    "plan --json": ["plan", "--json"],
    "inventory": ["inventory", "-o", "inventory-out"],
    "apply": ["apply"],
    "audit spec": ["audit", "spec"],
    "monitoring export": ["monitoring", "export", "--out", "monitoring-out"],
    "tune": ["tune", "chat", "--slo", "ttft_p99<=200ms"],
    "bench": ["bench", "run", "chat"],
}
# exit code of a refused spec: 1 ("problems found"); audit's 1 means drift, so it refuses with 2
REFUSAL_EXIT = {command: 2 if command == "audit spec" else 1 for command in COMMANDS}



@dataclass(frozen=True)
class Made:
    """A value made when the case runs, from its folder and its secret (a FIFO, a file, text with the secret)."""

    make: Callable[[Path, str], Any]


def base_spec(folder: Path, secret: str) -> dict:
    """A valid spec: two hosts in group rack_a, one instance that fits its GPU, monitoring; `secret` planted in
    the instance's HF_TOKEN (declared from secrets/hf_token) and in its API key file (keys/chat.key), beside the
    spec."""
    (folder / KEY_FILE).parent.mkdir(parents=True, exist_ok=True)
    (folder / KEY_FILE).write_text(f"sk-{secret}\n")
    (folder / TOKEN_FILE).parent.mkdir(parents=True, exist_ok=True)
    (folder / TOKEN_FILE).write_text(f"hf_{secret}\n")
    return {
        "version": 1,
        "defaults": {"ssh": {"user": "root"}},
        "groups": [{"name": "rack_a", "settings": {"swappiness": 1}}],
        "hosts": [
            {"name": "ws4070", "address": "192.0.2.20", "groups": ["rack_a"],
             "gpus": {"devices": [{"index": 0, "uuid": UUID0, "model": "NVIDIA GeForce RTX 4070"}]}},
            {"name": "ws3090", "address": "2001:db8::21", "groups": ["rack_a"],
             "gpus": {"devices": [{"index": 0, "uuid": UUID1, "model": "NVIDIA GeForce RTX 3090"}]}},
        ],
        "instances": [
            {"name": "chat", "host": "ws4070", "model": "Qwen/Qwen3-1.7B-FP8", "port": 8000, "bind": "0.0.0.0",
             "gpus": [0], "gpu_memory_utilization": 0.9, "options": {"max-model-len": 4096},
             "env": {"HF_TOKEN": {"file": TOKEN_FILE}}, "api_key_file": KEY_FILE},
        ],
        "monitoring": {},
    }


@dataclass(frozen=True)
class Case:
    name: str
    section: str
    field: str  # what the refusal names: a field's path, or the file's name for what breaks YAML itself
    change: Callable[[dict, Path, str], Any] | None = None  # changes the base spec data in place
    text: Callable[[Path, str], str] | None = None  # or: the spec file's whole text
    pending: dict[str, str] = field(default_factory=dict)  # command (or "*") -> why it does not refuse yet

    @property
    def id(self) -> str:
        return f"{self.section}/{self.name}"


# --------------------------------------------------------------------------- building changes

STEP = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def steps(path: str) -> list[str | int]:
    """'hosts[0].ssh.port' -> ['hosts', 0, 'ssh', 'port']."""
    return [int(index) if index else key for key, index in STEP.findall(path)]


def resolved(value: Any, folder: Path, secret: str) -> Any:
    """`value` with each `Made` in it made."""
    if isinstance(value, Made):
        return value.make(folder, secret)
    if isinstance(value, dict):
        return {key: resolved(item, folder, secret) for key, item in value.items()}
    if isinstance(value, list):
        return [resolved(item, folder, secret) for item in value]
    return value


def put_at(data: dict, path: str, value: Any) -> None:
    """Set `path` (missing mappings made on the way) to `value`."""
    *parents, last = steps(path)
    node = data
    for step in parents:
        if isinstance(step, str) and step not in node:
            node[step] = {}
        node = node[step]
    node[last] = value


def put(path: str, value: Any) -> Callable[[dict, Path, str], None]:
    return lambda data, folder, secret: put_at(data, path, resolved(value, folder, secret))


def drop(path: str) -> Callable[[dict, Path, str], None]:
    def change(data: dict, folder: Path, secret: str) -> None:
        *parents, last = steps(path)
        node = data
        for step in parents:
            node = node[step]
        del node[last]

    return change


def add(path: str, item: Any) -> Callable[[dict, Path, str], None]:
    """Append `item` to the list at `path`."""

    def change(data: dict, folder: Path, secret: str) -> None:
        node = data
        for step in steps(path):
            node = node[step]
        node.append(resolved(item, folder, secret))

    return change


def both(*changes: Callable[[dict, Path, str], None]) -> Callable[[dict, Path, str], None]:
    def change(data: dict, folder: Path, secret: str) -> None:
        for each in changes:
            each(data, folder, secret)

    return change


def case(section: str, name: str, path: str, value: Any, field: str | None = None, **extra) -> Case:
    """The usual case: `value` at `path`, refused naming `field` (default: `path`)."""
    return Case(name, section, field or path, put(path, value), **extra)


# --------------------------------------------------------------------------- files a spec names


def fifo(name: str) -> Made:
    def make(folder: Path, secret: str) -> str:
        os.mkfifo(folder / name)
        return name
    return Made(make)


def folder_named(name: str) -> Made:
    def make(folder: Path, secret: str) -> str:
        (folder / name).mkdir()
        return name
    return Made(make)


def symlink_to(target: str, name: str) -> Made:
    def make(folder: Path, secret: str) -> str:
        (folder / name).symlink_to(target)
        return name
    return Made(make)


def file_with(name: str, content: Callable[[str], bytes]) -> Made:
    """A file beside the spec; `content` gets the case's secret."""
    def make(folder: Path, secret: str) -> str:
        (folder / name).write_bytes(content(secret))
        return name
    return Made(make)


def with_secret(template: str) -> Made:
    """Text holding the case's secret where `template` says {secret}."""
    return Made(lambda folder, secret: template.format(secret=secret))


def file_cases(section: str, path: str, **extra) -> list[Case]:
    """A path field given everything but a plain readable file."""
    stem = path.rsplit(".", 1)[-1].replace("_", "-")
    return [
        case(section, f"{stem}-fifo", path, fifo(f"{stem}.fifo"), **extra),
        case(section, f"{stem}-dev-zero", path, "/dev/zero", **extra),
        case(section, f"{stem}-folder", path, folder_named(f"{stem}.d"), **extra),
        case(section, f"{stem}-missing", path, f"{stem}-missing.pem", **extra),
        case(section, f"{stem}-traversal-to-nothing", path, "../../../../../../nonexistent/../etc/nothing-here", **extra),
        case(section, f"{stem}-dangling-symlink", path, symlink_to("/nonexistent/shadow", f"{stem}.link"), **extra),
    ]


# --------------------------------------------------------------------------- hosts

H = "hosts"
HOSTS = [
    case(H, "address-empty", "hosts[0].address", ""),
    case(H, "address-newline", "hosts[0].address", "192.0.2.20\nws0"),
    case(H, "address-nul", "hosts[0].address", "192.0.2.20\x00"),
    case(H, "address-ansi", "hosts[0].address", "\x1b[31m192.0.2.20"),
    case(H, "address-shell", "hosts[0].address", "192.0.2.20; touch /tmp/pwned"),
    case(H, "address-option", "hosts[0].address", "-oProxyCommand=touch /tmp/pwned"),
    case(H, "address-zone-id", "hosts[0].address", "fe80::1%eth0"),
    case(H, "address-zone-id-encoded", "hosts[0].address", "2001:db8::20%25eth0"),
    case(H, "address-with-port", "hosts[0].address", "192.0.2.20:22"),
    case(H, "address-bracketed", "hosts[0].address", "[2001:db8::20]"),
    case(H, "address-url", "hosts[0].address", "ssh://192.0.2.20/"),
    case(H, "address-int", "hosts[0].address", 3221226004),
    case(H, "address-null", "hosts[0].address", None),
    case(H, "address-too-long", "hosts[0].address", "a" * 300),
    Case("address-duplicate", H, "hosts[1].address", put("hosts[1].address", "192.0.2.20")),
    case(H, "name-uppercase", "hosts[0].name", "WS4070", field="hosts[0].name"),
    case(H, "name-underscore", "hosts[1].name", "ws_3090"),
    case(H, "name-leading-dash", "hosts[1].name", "-ws3090"),
    case(H, "name-nul", "hosts[1].name", "ws\x003090"),
    case(H, "name-int", "hosts[1].name", 3090),
    case(H, "name-too-long", "hosts[1].name", "h" * 64),
    Case("name-duplicate", H, "hosts[1].name", put("hosts[1].name", "ws4070")),
    case(H, "ssh-port-zero", "hosts[0].ssh.port", 0),
    case(H, "ssh-port-too-big", "hosts[0].ssh.port", 65536),
    case(H, "ssh-port-negative", "hosts[0].ssh.port", -22),
    case(H, "ssh-port-40-digits", "hosts[0].ssh.port", HUGE),
    case(H, "ssh-port-string", "hosts[0].ssh.port", "22x"),
    case(H, "ssh-port-float", "hosts[0].ssh.port", 22.5),
    case(H, "ssh-port-inf", "hosts[0].ssh.port", INF),
    case(H, "ssh-port-nan", "hosts[0].ssh.port", NAN),
    case(H, "ssh-port-unicode-digits", "hosts[0].ssh.port", "٢٢"),
    case(H, "ssh-port-bool", "hosts[0].ssh.port", True),
    case(H, "ssh-user-newline", "hosts[0].ssh.user", "root\nProxyCommand touch /tmp/pwned"),
    case(H, "ssh-user-nul", "hosts[0].ssh.user", "root\x00"),
    case(H, "ssh-user-ansi", "hosts[0].ssh.user", "\x1b[2Jroot"),
    case(H, "ssh-user-int", "hosts[0].ssh.user", 0),
    case(H, "ssh-become-string", "hosts[0].ssh.become", "yes"),
    case(H, "ssh-unknown-key", "hosts[0].ssh.prot", 22),
    *file_cases(H, "hosts[0].ssh.key"),
    case(H, "key-newline", "hosts[0].ssh.key", "id_ed25519\nProxyCommand touch /tmp/pwned"),
    case(H, "known-hosts-fifo", "hosts[0].ssh.known_hosts", fifo("known.fifo")),
    case(H, "known-hosts-dev-zero", "hosts[0].ssh.known_hosts", "/dev/zero"),
    case(H, "known-hosts-folder", "hosts[0].ssh.known_hosts", folder_named("known.d")),
    case(H, "known-hosts-double-quote", "hosts[0].ssh.known_hosts", file_with('odd"name', lambda secret: b"")),
    case(H, "swappiness-too-big", "hosts[0].settings.swappiness", 201),
    case(H, "swappiness-negative", "hosts[0].settings.swappiness", -1),
    case(H, "swappiness-string", "hosts[0].settings.swappiness", "1"),
    case(H, "swappiness-40-digits", "hosts[0].settings.swappiness", HUGE),
    case(H, "swappiness-inf", "hosts[0].settings.swappiness", INF),
    case(H, "shm-size-GB", "hosts[0].settings.shm_size", "8GB"),
    case(H, "shm-size-lowercase", "hosts[0].settings.shm_size", "16g"),
    case(H, "shm-size-unicode-digits", "hosts[0].settings.shm_size", "١٦G"),
    case(H, "shm-size-zero", "hosts[0].settings.shm_size", "0G"),
    case(H, "shm-size-40-digits", "hosts[0].settings.shm_size", f"{HUGE}G"),
    case(H, "shm-size-negative", "hosts[0].settings.shm_size", "-1G"),
    case(H, "shm-size-newline", "hosts[0].settings.shm_size", "16G\n"),
    case(H, "shm-size-int", "hosts[0].settings.shm_size", 16),
    case(H, "sysctl-value-newline", "hosts[0].settings.sysctls", {"net.core.somaxconn": "1\nkernel.panic = 1"},
         field="hosts[0].settings.sysctls['net.core.somaxconn']"),
    case(H, "sysctl-value-float", "hosts[0].settings.sysctls", {"vm.max_map_count": 1.5},
         field="hosts[0].settings.sysctls"),
    case(H, "sysctl-value-null", "hosts[0].settings.sysctls", {"vm.max_map_count": None},
         field="hosts[0].settings.sysctls"),
    case(H, "sysctl-value-list", "hosts[0].settings.sysctls", {"vm.max_map_count": [1]},
         field="hosts[0].settings.sysctls"),
    case(H, "sysctl-key-traversal", "hosts[0].settings.sysctls", {"../../etc/passwd": 1},
         field="hosts[0].settings.sysctls"),
    case(H, "sysctl-key-space", "hosts[0].settings.sysctls", {"vm.max map count": 1},
         field="hosts[0].settings.sysctls"),
    case(H, "sysctls-a-list", "hosts[0].settings.sysctls", ["vm.max_map_count=1"]),
    case(H, "nouveau-string", "hosts[0].settings.nouveau_blacklist", "false"),
    case(H, "settings-unknown-key", "hosts[0].settings.shm", "16G"),
    case(H, "gpu-index-negative", "hosts[0].gpus.devices[0].index", -1),
    case(H, "gpu-index-string", "hosts[0].gpus.devices[0].index", "0"),
    case(H, "gpu-index-duplicate", "hosts[0].gpus.devices",
         [{"index": 0, "uuid": UUID0}, {"index": 0, "uuid": "GPU-22222222-2222-4222-8222-222222222222"}]),
    case(H, "gpu-uuid-malformed", "hosts[0].gpus.devices[0].uuid", "GPU-xyz"),
    case(H, "gpu-uuid-uppercase", "hosts[0].gpus.devices[0].uuid", "GPU-6F1D2C3B-4A59-4E87-9B1A-0C2D3E4F5A6B"),
    case(H, "gpu-uuid-duplicate-across-hosts", "hosts[1].gpus.devices[0].uuid", UUID0),
    case(H, "gpu-model-newline", "hosts[0].gpus.devices[0].model", "RTX 4070\nExecStartPre=/bin/true"),
    case(H, "gpu-model-ansi", "hosts[0].gpus.devices[0].model", "\x1b]0;pwned\x07RTX"),
    case(H, "power-limit-word", "hosts[0].gpus.devices[0].power_limit", "maximum"),
    case(H, "power-limit-negative", "hosts[0].gpus.devices[0].power_limit", -5),
    case(H, "power-limit-40-digits", "hosts[0].gpus.devices[0].power_limit", HUGE),
    case(H, "power-limit-float", "hosts[0].gpus.devices[0].power_limit", 250.5),
    case(H, "memory-mib-zero", "hosts[0].gpus.devices[0].memory_mib", 0),
    case(H, "memory-mib-string", "hosts[0].gpus.devices[0].memory_mib", "12G"),
    case(H, "expected-count-negative", "hosts[0].gpus.expected_count", -1),
    case(H, "share-limit-above-1", "hosts[0].gpus.memory_share_limit", 1.5),
    case(H, "share-limit-zero", "hosts[0].gpus.memory_share_limit", 0),
    case(H, "share-limit-nan", "hosts[0].gpus.memory_share_limit", NAN),
    case(H, "persistence-string", "hosts[0].gpus.persistence_mode", "on"),
    case(H, "gpus-unknown-key", "hosts[0].gpus.device", []),
    case(H, "vllm-version-unsupported", "hosts[0].vllm.version", "0.99.0"),
    case(H, "vllm-version-float", "hosts[0].vllm.version", 0.25),
    case(H, "vllm-version-newline", "hosts[0].vllm.version", "0.25.0\n"),
    case(H, "install-path-relative", "hosts[0].vllm.install_path", "opt/vllm"),
    case(H, "install-path-newline", "hosts[0].vllm.install_path", "/opt/vllm\nExecStartPre=/bin/true"),
    case(H, "install-path-nul", "hosts[0].vllm.install_path", "/opt/\x00vllm"),
    case(H, "wheelhouse-fifo", "hosts[0].vllm.wheelhouse", fifo("wheels.fifo")),
    case(H, "wheelhouse-missing", "hosts[0].vllm.wheelhouse", "no-wheels-here"),
    case(H, "index-url-newline", "hosts[0].vllm.index_url", with_secret("https://u:{secret}@pypi.example/\nx")),
    case(H, "cuda-unknown-build", "hosts[0].vllm.cuda", "12.8"),
    case(H, "cuda-float", "hosts[0].vllm.cuda", 12.9),
    case(H, "driver-branch-int", "hosts[0].driver", {"branch": 580}, field="hosts[0].driver.branch"),
    case(H, "driver-branch-word", "hosts[0].driver", {"branch": "latest"}, field="hosts[0].driver.branch"),
    case(H, "driver-version-other-branch", "hosts[0].driver", {"branch": "580", "version": "575.51.03"},
         field="hosts[0].driver.version"),
    case(H, "driver-modules-unknown", "hosts[0].driver", {"modules": "closed"}, field="hosts[0].driver.modules"),
    case(H, "driver-source-unknown", "hosts[0].driver", {"source": "ubuntu"}, field="hosts[0].driver.source"),
    case(H, "driver-too-old", "hosts[0].driver", {"source": "distribution", "branch": "535"}, field="driver"),
    case(H, "toolkit-version-word", "hosts[0].container_toolkit", {"version": "latest"},
         field="hosts[0].container_toolkit.version"),
    case(H, "host-unknown-key", "hosts[0].adress", "192.0.2.20"),
    case(H, "hosts-groups-bad-name", "hosts[0].groups", ["1rack"], field="hosts[0].groups[0]"),
]

# --------------------------------------------------------------------------- defaults and groups

G = "groups"
GROUPS = [
    case(G, "defaults-ssh-port-zero", "defaults.ssh.port", 0),
    case(G, "defaults-shm-size", "defaults.settings.shm_size", "8GB"),
    case(G, "defaults-devices", "defaults.gpus.devices", [{"index": 0, "uuid": UUID0}]),
    case(G, "defaults-name", "defaults.name", "ws4070"),
    case(G, "defaults-address", "defaults.address", "192.0.2.99"),
    case(G, "defaults-a-string", "defaults", "ssh: root"),
    case(G, "defaults-vllm-version", "defaults.vllm.version", "latest"),
    case(G, "defaults-driver-branch-int", "defaults.driver", {"branch": 580}, field="defaults.driver.branch"),
    case(G, "defaults-unknown-key", "defaults.setting", {"swappiness": 1}),
    case(G, "group-name-all", "groups[0].name", "all", field="groups[0].name"),
    case(G, "group-name-host", "groups[0].name", "ws4070"),
    case(G, "group-name-dash", "groups[0].name", "rack-a"),
    case(G, "group-name-newline", "groups[0].name", "rack_a\nb"),
    Case("group-duplicate", G, "groups[1].name", add("groups", {"name": "rack_a"})),
    Case("group-no-host-lists", G, "groups[1].name", add("groups", {"name": "rack_b", "settings": {"swappiness": 5}})),
    case(G, "group-swappiness", "groups[0].settings.swappiness", 500),
    case(G, "group-shm-size-ansi", "groups[0].settings.shm_size", "\x1b[31m16G"),
    case(G, "group-ssh-user-nul", "groups[0].ssh.user", "root\x00"),
    case(G, "group-driver-branch-int", "groups[0].driver", {"branch": 580}, field="groups[0].driver.branch"),
    case(G, "group-devices", "groups[0].gpus", {"devices": []}, field="groups[0].gpus.devices"),
    case(G, "groups-a-mapping", "groups", {"rack_a": {}}),
]

# --------------------------------------------------------------------------- instances

I = "instances"
INSTANCES = [
    case(I, "name-uppercase", "instances[0].name", "Chat"),
    case(I, "name-newline", "instances[0].name", "chat\nx"),
    case(I, "name-empty", "instances[0].name", ""),
    case(I, "name-too-long", "instances[0].name", "c" * 59),
    case(I, "name-int", "instances[0].name", 7),
    case(I, "name-traversal", "instances[0].name", "../../etc/chat"),
    Case("name-duplicate", I, "instances[1].name",
         add("instances", {"name": "chat", "host": "ws3090", "model": "m/m", "gpus": [0], "port": 8000,
                           "gpu_memory_utilization": 0.5, "bind": "0.0.0.0"})),
    case(I, "host-unknown", "instances[0].host", "ws4007"),
    case(I, "host-newline", "instances[0].host", "ws4070\n"),
    case(I, "host-null", "instances[0].host", None),
    case(I, "model-empty", "instances[0].model", ""),
    case(I, "model-blank", "instances[0].model", "   "),
    case(I, "model-newline", "instances[0].model", "Qwen/Qwen3\nExecStartPre=/bin/touch /tmp/pwned"),
    case(I, "model-nul", "instances[0].model", "Qwen\x00"),
    case(I, "model-ansi", "instances[0].model", "\x1b[31mQwen"),
    case(I, "model-int", "instances[0].model", 42),
    case(I, "model-list", "instances[0].model", ["a", "b"]),
    case(I, "port-zero", "instances[0].port", 0),
    case(I, "port-too-big", "instances[0].port", 70000),
    case(I, "port-string", "instances[0].port", "8000"),
    case(I, "port-float", "instances[0].port", 8000.0),
    case(I, "port-40-digits", "instances[0].port", HUGE),
    case(I, "port-negative", "instances[0].port", -1),
    case(I, "port-inf", "instances[0].port", INF),
    case(I, "port-unicode-digits", "instances[0].port", "８０００"),
    Case("port-duplicate", I, "instances[1].port",
         add("instances", {"name": "embed", "host": "ws4070", "model": "m/m", "gpus": [0], "port": 8000,
                           "gpu_memory_utilization": 0.01, "bind": "0.0.0.0", "options": {"max-model-len": 512}})),
    case(I, "bind-shell", "instances[0].bind", "0.0.0.0; touch /tmp/pwned"),
    case(I, "bind-zone-id", "instances[0].bind", "fe80::1%eth0"),
    case(I, "bind-newline", "instances[0].bind", "0.0.0.0\n"),
    case(I, "bind-int", "instances[0].bind", 0),
    case(I, "bind-star", "instances[0].bind", "*"),
    case(I, "gpus-empty", "instances[0].gpus", []),
    case(I, "gpus-unknown-index", "instances[0].gpus", [5]),
    case(I, "gpus-bad-uuid", "instances[0].gpus", ["GPU-bad"], field="instances[0].gpus[0]"),
    case(I, "gpus-negative", "instances[0].gpus", [-1], field="instances[0].gpus[0]"),
    case(I, "gpus-a-string", "instances[0].gpus", "0"),
    case(I, "gpus-bool", "instances[0].gpus", [True], field="instances[0].gpus[0]"),
    case(I, "share-zero", "instances[0].gpu_memory_utilization", 0),
    case(I, "share-above-1", "instances[0].gpu_memory_utilization", 1.5),
    case(I, "share-negative", "instances[0].gpu_memory_utilization", -0.1),
    case(I, "share-string", "instances[0].gpu_memory_utilization", "0.9"),
    case(I, "share-nan", "instances[0].gpu_memory_utilization", NAN),
    case(I, "share-inf", "instances[0].gpu_memory_utilization", INF),
    case(I, "share-40-digits", "instances[0].gpu_memory_utilization", HUGE),
    case(I, "share-over-the-limit", "instances[0].gpu_memory_utilization", 0.96),
    case(I, "share-too-small-for-the-model", "instances[0].gpu_memory_utilization", 0.05,
         field="gpu_memory_utilization"),
    case(I, "profile-unknown", "instances[0].profile", "fast"),
    case(I, "option-dashes", "instances[0].options", {"--max-model-len": 4096},
         field="instances[0].options.--max-model-len"),
    case(I, "option-false", "instances[0].options", {"max-model-len": 4096, "enable-prefix-caching": False},
         field="instances[0].options.enable-prefix-caching"),
    case(I, "option-unknown", "instances[0].options", {"max-model-len": 4096, "max-modle-len": 1},
         field="instances[0].options.max-modle-len"),
    case(I, "option-bad-size", "instances[0].options", {"max-model-len": "1.5K"},
         field="instances[0].options.max-model-len"),
    case(I, "option-dedicated-port", "instances[0].options", {"max-model-len": 4096, "port": 9000},
         field="instances[0].options.port"),
    case(I, "option-parallel-too-big", "instances[0].options", {"max-model-len": 4096, "tensor-parallel-size": 4},
         field="instances[0].options.tensor-parallel-size"),
    case(I, "option-newline", "instances[0].options", {"max-model-len": 4096, "served-model-name": "a\nb"},
         field="instances[0].options.served-model-name"),
    case(I, "option-secret-newline", "instances[0].options",
         {"max-model-len": 4096, "hf-token": with_secret("hf_{secret}\nx")},
         field="instances[0].options.hf-token"),
    case(I, "option-40-digits", "instances[0].options", {"max-model-len": HUGE}, field="max-model-len"),  # vLLM's int() takes it: the memory plan refuses it
    case(I, "options-a-list", "instances[0].options", ["max-model-len=4096"]),
    case(I, "env-newline", "instances[0].env.FOO", "a\nExecStartPre=/bin/touch /tmp/pwned"),
    case(I, "env-nul", "instances[0].env.FOO", "a\x00b"),
    case(I, "env-ansi", "instances[0].env.FOO", "\x1b[2J"),
    case(I, "env-int", "instances[0].env.FOO", 1),
    case(I, "env-null", "instances[0].env.FOO", None),
    case(I, "env-bad-name", "instances[0].env", {"A B": "x"}, field="instances[0].env"),
    case(I, "env-empty-name", "instances[0].env", {"": "x"}, field="instances[0].env"),
    case(I, "env-managed", "instances[0].env.CUDA_VISIBLE_DEVICES", "1"),
    case(I, "env-secret-newline", "instances[0].env.HF_TOKEN", with_secret("hf_{secret}\nx")),
    case(I, "env-secret-ansi", "instances[0].env.HF_TOKEN", with_secret("\x1b[8mhf_{secret}")),
    case(I, "env-secret-nul", "instances[0].env.HF_TOKEN", with_secret("hf_{secret}\x00")),
    case(I, "env-a-list", "instances[0].env", ["FOO=1"]),
    # secrets by declaration: an inline value whose name looks secret, a declared source that cannot be read
    case(I, "env-inline-db-pass", "instances[0].env.DB_PASS", with_secret("pw-{secret}")),
    case(I, "env-inline-github-pat", "instances[0].env.GITHUB_PAT", with_secret("ghp_{secret}")),
    case(I, "env-inline-credentials", "instances[0].env.MY_CREDENTIALS", with_secret("user:{secret}")),
    case(I, "env-secret-file-two-lines", "instances[0].env.HF_TOKEN",
         {"file": file_with("two.token", lambda secret: f"hf_{secret}\nhf_{secret}2\n".encode())}),
    case(I, "env-secret-file-spaces", "instances[0].env.HF_TOKEN",
         {"file": file_with("spaced.token", lambda secret: f"hf_{secret} x\n".encode())}),
    case(I, "env-secret-file-fifo", "instances[0].env.HF_TOKEN", {"file": fifo("token.fifo")}),
    case(I, "env-secret-file-missing", "instances[0].env.HF_TOKEN", {"file": "secrets/nowhere"}),
    case(I, "env-secret-unset-variable", "instances[0].env.HF_TOKEN", {"env": "VP_CORPUS_UNSET_VARIABLE"}),
    case(I, "env-secret-two-sources", "instances[0].env.HF_TOKEN", {"file": TOKEN_FILE, "env": "HOME"}),
    case(I, "env-secret-no-source", "instances[0].env.HF_TOKEN", {}),
    case(I, "env-secret-bad-variable-name", "instances[0].env.HF_TOKEN", {"env": "A B"}),
    *file_cases(I, "instances[0].api_key_file"),
    case(I, "api-key-file-shadow", "instances[0].api_key_file", symlink_to("/etc/shadow", "shadow.link")),
    case(I, "api-key-file-passwd-traversal", "instances[0].api_key_file", "../" * 12 + "etc/passwd"),
    case(I, "api-key-file-empty", "instances[0].api_key_file", file_with("empty.key", lambda secret: b"")),
    case(I, "api-key-file-huge", "instances[0].api_key_file",
         file_with("huge.key", lambda secret: secret.encode() * (80 * 1024 // len(secret) + 1))),
    case(I, "api-key-two-lines", "instances[0].api_key_file",
         file_with("two.key", lambda secret: f"sk-{secret}\nsk-{secret}2\n".encode())),
    case(I, "api-key-nul", "instances[0].api_key_file", file_with("nul.key", lambda secret: f"sk-\x00{secret}".encode())),
    case(I, "api-key-not-utf8", "instances[0].api_key_file", file_with("latin.key", lambda secret: b"sk-\xe9\xff")),
    case(I, "container-engine", "instances[0].container", {"engine": "lxc"}, field="instances[0].container.engine"),
    case(I, "container-a-string", "instances[0].container", "podman"),
    case(I, "container-image-uppercase", "instances[0].container", {"engine": "podman", "image": "Docker.io/VLLM"},
         field="instances[0].container.image"),
    case(I, "container-image-with-tag", "instances[0].container",
         {"engine": "podman", "image": "docker.io/vllm/vllm-openai:latest"}, field="instances[0].container.image"),
    case(I, "container-tag-shell", "instances[0].container", {"engine": "docker", "tag": "v0.25.0;reboot"},
         field="instances[0].container.tag"),
    case(I, "container-digest", "instances[0].container", {"engine": "docker", "digest": "sha256:xyz"},
         field="instances[0].container.digest"),
    case(I, "container-shm-size", "instances[0].container", {"engine": "podman", "shm_size": "8GB"},
         field="instances[0].container.shm_size"),
    case(I, "container-archive-fifo", "instances[0].container", {"engine": "podman", "image_archive": fifo("image.fifo")},
         field="instances[0].container.image_archive"),
    case(I, "container-archive-dev-zero", "instances[0].container", {"engine": "podman", "image_archive": "/dev/zero"},
         field="instances[0].container.image_archive"),
    case(I, "container-unknown-key", "instances[0].container", {"engine": "podman", "egine": "docker"},
         field="instances[0].container.egine"),
    case(I, "instance-unknown-key", "instances[0].gpu_memory_utilisation", 0.5),
    case(I, "instances-a-mapping", "instances", {"chat": {}}),
    case(I, "multinode-no-followers", "instances[0].multinode", {"followers": []},
         field="instances[0].multinode.followers"),
    case(I, "multinode-unknown-host", "instances[0].multinode", {"followers": [{"host": "ws9999", "gpus": [0]}]},
         field="instances[0].multinode.followers[0].host"),
    case(I, "multinode-master-port-zero", "instances[0].multinode",
         {"followers": [{"host": "ws3090", "gpus": [0]}], "master_port": 0}, field="instances[0].multinode.master_port"),
    case(I, "multinode-master-addr-zone", "instances[0].multinode",
         {"followers": [{"host": "ws3090", "gpus": [0]}], "master_addr": "fe80::1%eth0"},
         field="instances[0].multinode.master_addr"),
    case(I, "multinode-ifname-shell", "instances[0].multinode",
         {"followers": [{"host": "ws3090", "gpus": [0]}], "nccl": {"socket_ifname": "eth0;reboot"}},
         field="instances[0].multinode.nccl.socket_ifname"),
    case(I, "multinode-p2p-string", "instances[0].multinode",
         {"followers": [{"host": "ws3090", "gpus": [0]}], "nccl": {"p2p_disable": "yes"}},
         field="instances[0].multinode.nccl.p2p_disable"),
    case(I, "multinode-env-and-nccl", "instances[0]",
         {"name": "chat", "host": "ws4070", "model": "Qwen/Qwen3-1.7B-FP8", "bind": "0.0.0.0", "gpus": [0],
          "options": {"max-model-len": 4096, "pipeline-parallel-size": 2}, "env": {"NCCL_SOCKET_IFNAME": "eth0"},
          "multinode": {"followers": [{"host": "ws3090", "gpus": [0]}], "nccl": {"socket_ifname": "eth1"}}},
         field="instances[0].env.NCCL_SOCKET_IFNAME"),
    case(I, "multinode-follower-gpus-empty", "instances[0].multinode", {"followers": [{"host": "ws3090", "gpus": []}]},
         field="instances[0].multinode.followers[0].gpus"),
    case(I, "slo-zero", "instances[0].slo.ttft_p99_ms", 0),
    case(I, "slo-negative", "instances[0].slo.itl_p99_ms", -1),
    case(I, "slo-40-digits", "instances[0].slo.ttft_p99_ms", HUGE),
    case(I, "slo-inf", "instances[0].slo.tpot_p99_ms", INF),
    case(I, "slo-nan", "instances[0].slo.tpot_p99_ms", NAN),
    case(I, "slo-with-unit", "instances[0].slo.ttft_p99_ms", "200ms"),
    case(I, "slo-above-an-hour", "instances[0].slo.ttft_p99_ms", 3_600_001),
    case(I, "slo-float", "instances[0].slo.itl_p99_ms", 1.5),
    case(I, "slo-unknown-key", "instances[0].slo.ttft_p95_ms", 200),
]

# --------------------------------------------------------------------------- gateways

W = "gateways"
GATEWAY = {"name": "front", "host": "ws4070", "port": 8080}


def gateway_case(name: str, changes: dict, field: str, **extra) -> Case:
    return Case(name, W, field, put("gateways", [{**GATEWAY, **changes}]), **extra)


GATEWAYS = [
    gateway_case("name-uppercase", {"name": "Front"}, "gateways[0].name"),
    gateway_case("name-newline", {"name": "front\nx"}, "gateways[0].name"),
    gateway_case("host-unknown", {"host": "ws9999"}, "gateways[0].host"),
    gateway_case("port-zero", {"port": 0}, "gateways[0].port"),
    gateway_case("port-40-digits", {"port": HUGE}, "gateways[0].port"),
    gateway_case("port-string", {"port": "8080"}, "gateways[0].port"),
    gateway_case("port-of-an-instance", {"port": 8000}, "gateways[0].port"),
    gateway_case("port-of-node-exporter", {"port": 9100}, "gateways[0].port"),
    gateway_case("bind-zone-id", {"bind": "fe80::1%eth0"}, "gateways[0].bind"),
    gateway_case("bind-shell", {"bind": "0.0.0.0 && reboot"}, "gateways[0].bind"),
    gateway_case("tls-fifo", {"tls_certificate": fifo("cert.fifo")}, "gateways[0].tls_certificate"),
    gateway_case("tls-missing", {"tls_certificate": "missing.pem"}, "gateways[0].tls_certificate"),
    gateway_case("tls-dev-zero", {"tls_certificate": "/dev/zero"}, "gateways[0].tls_certificate"),
    gateway_case("models-unknown", {"models": ["no-such-model"]}, "gateways[0].models"),
    gateway_case("models-a-string", {"models": "Qwen/Qwen3-1.7B-FP8"}, "gateways[0].models"),
    gateway_case("models-newline", {"models": ["Qwen\nx"]}, "gateways[0].models"),
    gateway_case("unknown-key", {"prot": 8080}, "gateways[0].prot"),
    Case("duplicate-name", W, "gateways[1].name", put("gateways", [GATEWAY, {**GATEWAY, "port": 8081}])),
    Case("duplicate-port", W, "gateways[1].port", put("gateways", [GATEWAY, {**GATEWAY, "name": "back"}])),
    case(W, "gateways-a-mapping", "gateways", {"front": GATEWAY}),
]

# --------------------------------------------------------------------------- monitoring

M = "monitoring"
MONITORING = [
    case(M, "host-unknown", "monitoring.host", "ws9999"),
    case(M, "host-newline", "monitoring.host", "ws4070\n"),
    case(M, "scrape-no-unit", "monitoring.scrape_interval", "15"),
    case(M, "scrape-with-space", "monitoring.scrape_interval", "1h 30m"),
    case(M, "scrape-40-digits", "monitoring.scrape_interval", f"{HUGE}s"),
    case(M, "scrape-zero", "monitoring.scrape_interval", "0s"),
    case(M, "scrape-newline", "monitoring.scrape_interval", "15s\n"),
    case(M, "scrape-int", "monitoring.scrape_interval", 15),
    case(M, "scrape-unicode-digits", "monitoring.scrape_interval", "١٥s"),
    case(M, "scrape-wrong-order", "monitoring.scrape_interval", "30s1m"),
    case(M, "gpu-interval-ansi", "monitoring.gpu_metrics_interval", "\x1b[31m15s"),
    case(M, "gpu-metrics-unknown", "monitoring.gpu_metrics", "nvml"),
    case(M, "node-exporter-port-zero", "monitoring.node_exporter_port", 0),
    case(M, "node-exporter-port-40-digits", "monitoring.node_exporter_port", HUGE),
    case(M, "node-exporter-on-instance-port", "monitoring.node_exporter_port", 8000),
    case(M, "dcgm-port-too-big", "monitoring.dcgm_exporter_port", 70000),
    case(M, "prometheus-port-string", "monitoring.prometheus_port", "9090"),
    case(M, "prometheus-on-instance-port", "monitoring",
         {"host": "ws4070", "prometheus_port": 8000}, field="monitoring.prometheus_port"),
    case(M, "kv-cache-above-1", "monitoring.alerts.kv_cache_usage", 1.5),
    case(M, "kv-cache-nan", "monitoring.alerts.kv_cache_usage", NAN),
    case(M, "requests-waiting-negative", "monitoring.alerts.requests_waiting", -1),
    case(M, "requests-waiting-float", "monitoring.alerts.requests_waiting", 2.5),
    case(M, "slack-inf", "monitoring.alerts.memory_share_slack", INF),
    case(M, "down-for-space", "monitoring.alerts.down_for", "1 m"),
    case(M, "rate-window-empty", "monitoring.alerts.rate_window", ""),
    case(M, "pending-for-above-a-year", "monitoring.alerts.pending_for", "400d"),
    case(M, "alerts-unknown-key", "monitoring.alerts.kv_cache", 0.5),
    case(M, "monitoring-a-string", "monitoring", "yes"),
    case(M, "unknown-key", "monitoring.scrape_intervall", "15s"),
]

# --------------------------------------------------------------------------- the file itself


def billion_laughs(folder: Path, secret: str) -> str:
    lines = ["version: 1", 'l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"l{n}: &l{n} [{', '.join([f'*l{n - 1}'] * 9)}]" for n in range(1, 9)]
    return "\n".join(lines) + "\n"


F = "file"
FILE = [
    case(F, "version-2", "version", 2),
    case(F, "version-string", "version", "1"),
    Case("hosts-missing", F, "hosts", drop("hosts")),
    case(F, "hosts-empty", "hosts", []),
    case(F, "hosts-a-mapping", "hosts", {"ws4070": {}}),
    case(F, "unknown-top-level-key", "instance", []),
    Case("a-list", F, "(spec)", text=lambda folder, secret: "- version: 1\n"),
    Case("empty", F, "(spec)", text=lambda folder, secret: ""),
    Case("only-a-comment", F, "(spec)", text=lambda folder, secret: f"# hf_{secret}\n"),
    Case("billion-laughs", F, SPEC_NAME, text=billion_laughs),
    Case("alias-of-itself", F, SPEC_NAME, text=lambda folder, secret: "version: 1\nhosts: &loop [*loop]\n"),
    Case("deep-nesting", F, SPEC_NAME, text=lambda folder, secret: "version: 1\nhosts: " + "[" * 50_000 + "]" * 50_000),
    Case("deep-mappings", F, SPEC_NAME, text=lambda folder, secret: "version: 1\nhosts: " + "{a: " * 20_000 + "1" + "}" * 20_000),
    Case("huge-file", F, "hosts[0].name",
         text=lambda folder, secret: f"# {'x' * 1000}\n" * 20_000 + "version: 1\nhosts: [{name: WS, address: 192.0.2.20}]\n"),
    Case("duplicate-key", F, SPEC_NAME, text=lambda folder, secret: "version: 1\nversion: 1\nhosts: []\n"),
    Case("not-utf8", F, SPEC_NAME, text=lambda folder, secret: "version: 1\nhosts:\n  - name: caf\udce9\n"),
    Case("control-character", F, SPEC_NAME, text=lambda folder, secret: f"version: 1\nhosts: \x07hf_{secret}\n"),
    Case("nul-byte", F, SPEC_NAME, text=lambda folder, secret: "version: 1\x00\nhosts: []\n"),
    Case("python-tag", F, SPEC_NAME,
         text=lambda folder, secret: "version: 1\nhosts: !!python/object/apply:os.system ['touch pwned']\n"),
    Case("unclosed-bracket", F, SPEC_NAME, text=lambda folder, secret: f"version: 1\nhosts: [{{name: hf_{secret}\n"),
    Case("tab-indent", F, SPEC_NAME, text=lambda folder, secret: "version: 1\nhosts:\n\t- name: ws4070\n"),
    Case("secret-in-a-bad-line", F, SPEC_NAME,
         text=lambda folder, secret: f"version: 1\nhosts:\n  - name: ws4070\n    address: 'hf_{secret}\n"),
]

CORPUS: list[Case] = HOSTS + GROUPS + INSTANCES + GATEWAYS + MONITORING + FILE
SECTIONS = (H, G, I, W, M, F)


# --------------------------------------------------------------------------- command-line arguments


@dataclass(frozen=True)
class ArgumentCase:
    """A valid spec (`base_spec`) and a hostile argument: `args` (the spec appended as --spec FILE), refused
    naming `option`, before any file is written or any host reached."""

    name: str
    args: list[str]
    option: str

    @property
    def id(self) -> str:
        return f"arguments/{self.name}"


def slo(name: str, term: str) -> ArgumentCase:
    return ArgumentCase(f"slo-{name}", ["tune", "chat", "--slo", term], "--slo")


def min_serving(name: str, value: str) -> ArgumentCase:
    return ArgumentCase(f"min-serving-{name}", ["apply", "--rolling", "--min-serving", value], "--min-serving")


ARGUMENTS = [
    slo("400-digits", "ttft_p99<=" + "9" * 400 + "ms"),
    slo("nan", "ttft_p99<=nanms"),
    slo("infinite", "ttft_p99<=infms"),
    slo("negative", "ttft_p99<=-5ms"),
    slo("zero", "ttft_p99<=0ms"),
    slo("above-an-hour", "ttft_p99<=2h"),
    slo("unknown-metric", "ttft_p42<=200ms"),
    slo("unknown-unit", "ttft_p99<=200parsecs"),
    slo("no-limit", "ttft_p99<="),
    slo("newline", "ttft_p99<=200ms\nINJECTED LINE"),
    slo("escape", "\x1b[2Jttft_p99<=200ms"),
    slo("goodput-above-100", "goodput>=150%"),
    slo("goodput-nan", "goodput>=nan%"),
    min_serving("above-100", "150%"),
    min_serving("negative", "-1"),
    min_serving("a-word", "all"),
    min_serving("40-digits", "9" * 40),
    min_serving("newline", "1\nINJECTED LINE"),
    ArgumentCase("batch-zero", ["apply", "--rolling", "--batch", "0"], "--batch"),
    ArgumentCase("batch-a-word", ["apply", "--rolling", "--batch", "many"], "--batch"),
    ArgumentCase("max-fail-above-100", ["apply", "--rolling", "--max-fail", "101%"], "--max-fail"),
    ArgumentCase("space-unknown-flag", ["tune", "chat", "--slo", "ttft_p99<=200ms", "--space", "no-such-flag=1,2"],
                 "--space"),
    ArgumentCase("space-no-values", ["tune", "chat", "--slo", "ttft_p99<=200ms", "--space", "max-num-seqs="],
                 "--space"),
    ArgumentCase("load-unknown", ["bench", "run", "chat", "--load", "no-such-load"], "--load"),
    ArgumentCase("sweep-newline", ["bench", "run", "chat", "--sweep", "max-num-seqs=8\nINJECTED"], "--sweep"),
    ArgumentCase("host-newline", ["plan", "ws4070\nINJECTED LINE"], "ws4070\\nINJECTED LINE"),
    ArgumentCase("host-escape", ["apply", "\x1b[2Jws4070"], "\\x1b[2Jws4070"),
    ArgumentCase("host-unknown", ["audit", "spec", "ws9999"], "ws9999"),
]
