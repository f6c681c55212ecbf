"""Specs for the lab's test hosts, and the TEST DOUBLEs they run (no GPU here): `nvidia-smi`, and a
stand-in vLLM wheel that the role vllm_install installs from a wheelhouse, as it would the real one."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.doubles import nvidia_smi_standin
from tests.doubles.vllm_wheel import build_standin_wheel, shared_folder
from tests.lab.hosts import TestHost
from tests.lab.rootfs import cache_dir

GPU_FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "gpu"
VLLM_INSTALL_PATH = "/opt/vllm"
MODEL = "Qwen/Qwen3-1.7B"  # small enough for the planner to fit three instances on the (stand-in) RTX 3090
VLLM_BIN = f"{VLLM_INSTALL_PATH}/venvs/0.25.0/bin/vllm"  # what role vllm_install installs (0.25.0)
HAND_VLLM_BIN = f"{VLLM_INSTALL_PATH}/venv/bin/vllm"  # install_vllm_by_hand's


def fake_gpu_uuid(host: TestHost) -> str:
    """No GPU here: an invented, well-formed UUID, one per test host (every GPU has its own)."""
    last = int(host.address.rsplit(".", 1)[1])
    return f"GPU-00000000-1111-2222-3333-{last:012d}"


def install_gpu_standin(host: TestHost) -> None:
    """The TEST DOUBLE `nvidia-smi`, answering for one RTX 3090 (the card host_entry lists)."""
    nvidia_smi_standin.install(host, GPU_FIXTURES / "rtx3090", uuids=[fake_gpu_uuid(host)])


def install_standin(host: TestHost) -> None:
    """The TEST DOUBLE for what needs a GPU on the host itself: `nvidia-smi`. (vLLM comes from the
    spec's wheelhouse: `standin_wheelhouse`.)"""
    install_gpu_standin(host)


def install_vllm_by_hand(host: TestHost, version: str = "0.25.0") -> None:
    """The TEST DOUBLE vllm installed as someone did by hand on a server we did not build: a venv
    at /opt/vllm/venv, pip from the wheel."""
    wheel = build_standin_wheel(version, cache_dir() / shared_folder(version))
    host.put(wheel, f"/root/{wheel.name}", mode="0644")
    host.ssh(f"python3 -m venv {VLLM_INSTALL_PATH}/venv && {VLLM_INSTALL_PATH}/venv/bin/pip install -q "
             f"--no-index /root/{wheel.name}")


def standin_wheelhouse(version: str = "0.25.0", fails_at_start: str | None = None) -> Path:
    """A wheelhouse holding the TEST DOUBLE vllm==version wheel (rebuilt each time: cheap); with
    `fails_at_start`, the broken one whose `vllm serve` dies with that message (a failed upgrade), in
    standin-wheelhouse-<version>-<key>-broken (`shared_folder`: a folder of this checkout's stand-in)."""
    folder = shared_folder(version, broken=fails_at_start is not None)
    return build_standin_wheel(version, cache_dir() / folder, fails_at_start=fails_at_start).parent


def host_entry(host: TestHost, wheelhouse: Path | None = None, **settings) -> dict:
    """The host's spec entry; its vLLM from `wheelhouse`, else the shared cache's stand-in wheelhouse."""
    return {
        "name": host.name,
        "address": host.address,
        "ssh": {"user": "root", "port": host.ssh_port, "key": str(host.ssh_key), "known_hosts": str(host.known_hosts)},
        "settings": {
            "swappiness": 1,
            "sysctls": {"vm.max_map_count": 262144},
            "shm_size": "1G",
            "nouveau_blacklist": True,
            **settings,
        },
        "gpus": {
            "expected_count": 1,
            "devices": [{"index": 0, "uuid": fake_gpu_uuid(host), "model": "NVIDIA GeForce RTX 3090", "power_limit": "max"}],
        },
        "vllm": {"version": "0.25.0", "install_path": VLLM_INSTALL_PATH, "wheelhouse": str(wheelhouse or standin_wheelhouse())},
    }


def instance_entry(host: TestHost, name: str, port: int, share: float = 0.45, **extra) -> dict:
    return {
        "name": name,
        "host": host.name,
        "model": MODEL,
        "port": port,
        "bind": host.address,  # so the bastion can reach it
        "gpus": [0],
        "gpu_memory_utilization": share,
        "options": {"max-model-len": 4096, "block-size": 16},
        **extra,
    }


def write_spec(path: Path, hosts: list[dict], instances: list[dict]) -> Path:
    path.write_text(yaml.safe_dump({"version": 1, "hosts": hosts, "instances": instances}, sort_keys=False))
    return path
