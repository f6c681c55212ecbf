"""`provision apply` against real systemd test hosts (systemd-nspawn, systemd as PID 1, over SSH)."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from provisioner.apply import apply_spec
from provisioner.spec import load_spec
from tests.integration.conftest import disk_state
from tests.lab.specs import MODEL, fake_gpu_uuid, host_entry, install_standin, instance_entry, write_spec

PROVISION = [sys.executable, "-m", "provisioner.cli.main"]


def provision(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*PROVISION, *args], capture_output=True, text=True, timeout=600)


def get_json(url: str, key: str | None = None) -> dict:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.load(response)


def test_apply_converges_then_second_apply_changes_nothing(boot, tmp_path):
    (host,) = boot(1)
    install_standin(host)
    key_file = tmp_path / "chat.key"
    key_file.write_text("sk-test-secret-123\n")
    spec = write_spec(
        tmp_path / "spec.yml",
        [host_entry(host)],
        [instance_entry(host, "chat", 8000, share=0.9, api_key_file=str(key_file))],
    )

    first = provision("apply", "--spec", str(spec))
    assert first.returncode == 0, first.stdout + first.stderr
    assert f"{host.name}" in first.stdout and "changed" in first.stdout

    second = apply_spec(load_spec(spec))
    assert second.succeeded, second.problems
    assert second.stats[host.name].changed == 0, "second apply must report changed=0"
    assert second.stats[host.name].ok > 10

    # sysctl: the file holds both settings (live values are not applicable in a container)
    sysctl = host.ssh("cat /etc/sysctl.d/60-vllm-provision.conf").stdout
    assert "vm.swappiness = 1" in sysctl and "vm.max_map_count = 262144" in sysctl
    # nouveau blacklist
    modprobe = host.ssh("cat /etc/modprobe.d/blacklist-nouveau.conf").stdout
    assert "blacklist nouveau" in modprobe and "options nouveau modeset=0" in modprobe
    assert "nouveau.modeset=0" in host.ssh("cat /etc/default/grub.d/*nouveau*.cfg").stdout
    # /dev/shm: in fstab and live
    assert "size=1G" in host.ssh("grep ' /dev/shm ' /etc/fstab").stdout
    assert host.ssh("findmnt -n -b -o SIZE /dev/shm").stdout.strip() == str(1024**3)

    # the unit: valid, enabled, active, pinned to the GPU by UUID, run as its own user
    unit = "vllm-chat.service"
    host.ssh(f"systemd-analyze verify /etc/systemd/system/{unit}")
    assert host.ssh(f"systemctl is-enabled {unit}").stdout.strip() == "enabled"
    assert host.ssh(f"systemctl is-active {unit}").stdout.strip() == "active"
    process = get_json(f"http://{host.address}:8000/standin/process")
    assert process["env"]["CUDA_VISIBLE_DEVICES"] == fake_gpu_uuid(host)
    assert process["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert process["env"]["VLLM_API_KEY"] == "<set>"
    assert process["user"] != 0
    assert process["argv"][1:] == ["serve", "--config", "/etc/vllm/chat.yaml"]
    assert process["options"]["gpu_memory_utilization"] == 0.9  # as the server parsed its config file
    # like vLLM, the server guards /v1 with the key
    with pytest.raises(urllib.error.HTTPError, match="401"):
        get_json(f"http://{host.address}:8000/v1/models")
    models = get_json(f"http://{host.address}:8000/v1/models", key="sk-test-secret-123")
    assert models["data"][0]["id"] == MODEL

    # the secret lives only in a 0600 root-owned environment file, never on a command line
    assert host.ssh("stat -c '%a %U' /etc/vllm/chat.env").stdout.strip() == "600 root"
    assert "VLLM_API_KEY=sk-test-secret-123" in host.ssh("cat /etc/vllm/chat.env").stdout
    assert "sk-test-secret" not in host.ssh(f"systemctl cat {unit}; ps -eo args").stdout
    hardening = host.ssh(f"systemctl show {unit} -p NoNewPrivileges -p ProtectSystem -p PrivateTmp -p Restart").stdout
    assert set(hardening.split()) == {"NoNewPrivileges=yes", "ProtectSystem=strict", "PrivateTmp=yes", "Restart=on-failure"}


def test_check_mode_on_a_fresh_host_changes_nothing(boot, tmp_path):
    (host,) = boot(1)
    install_standin(host)
    spec = write_spec(tmp_path / "spec.yml", [host_entry(host)], [instance_entry(host, "chat", 8000)])
    before = disk_state(host)

    result = apply_spec(load_spec(spec), check=True)

    assert result.succeeded, result.problems
    assert result.stats[host.name].changed > 0, "check mode must report what would change"
    after = disk_state(host)
    assert after == before, {k: (before.get(k), after.get(k)) for k in set(before) | set(after) if before.get(k) != after.get(k)}
    assert host.ssh("test -e /etc/systemd/system/vllm-chat.service", check=False).returncode == 1
    assert host.ssh("getent passwd vllm", check=False).returncode == 2


def test_two_hosts_in_one_run(boot, tmp_path):
    hosts = boot(2)
    for host in hosts:
        install_standin(host)
    spec = write_spec(
        tmp_path / "spec.yml",
        [host_entry(h) for h in hosts],
        [instance_entry(h, f"chat-{h.name}", 8000) for h in hosts],
    )
    result = apply_spec(load_spec(spec))
    assert result.succeeded, result.problems
    assert sorted(result.stats) == sorted(h.name for h in hosts)
    for host in hosts:
        assert result.stats[host.name].changed > 0
        assert get_json(f"http://{host.address}:8000/v1/models")["data"][0]["id"] == MODEL


def test_instances_sharing_a_gpu_start_one_after_another(boot, tmp_path):
    (host,) = boot(1)
    install_standin(host)
    slow = {"env": {"STANDIN_STARTUP_DELAY": "2"}}
    spec = write_spec(
        tmp_path / "spec.yml",
        [host_entry(host)],
        [
            instance_entry(host, "reranker", 8001, share=0.2, **slow),
            instance_entry(host, "embedder", 8002, share=0.2, **slow),
            instance_entry(host, "chat", 8003, share=0.45, **slow),
        ],
    )
    result = apply_spec(load_spec(spec))
    assert result.succeeded, result.problems

    after = host.ssh("systemctl show -p After vllm-chat.service").stdout
    assert "vllm-reranker.service" in after and "vllm-embedder.service" in after
    # after a reboot systemd starts all three itself: each must start only once the previous is ready
    host.reboot()
    times = {}
    for name in ("reranker", "embedder", "chat"):
        shown = host.ssh(
            f"systemctl show -p ExecMainStartTimestampMonotonic -p ActiveEnterTimestampMonotonic vllm-{name}.service"
        ).stdout
        times[name] = dict(line.split("=", 1) for line in shown.split())
    assert int(times["embedder"]["ExecMainStartTimestampMonotonic"]) >= int(times["reranker"]["ActiveEnterTimestampMonotonic"])
    assert int(times["chat"]["ExecMainStartTimestampMonotonic"]) >= int(times["embedder"]["ActiveEnterTimestampMonotonic"])


def test_state_survives_a_reboot(boot, tmp_path):
    (host,) = boot(1)
    install_standin(host)
    spec = write_spec(tmp_path / "spec.yml", [host_entry(host)], [instance_entry(host, "chat", 8000)])
    assert apply_spec(load_spec(spec)).succeeded

    host.reboot()

    assert host.ssh("systemctl is-active vllm-chat.service").stdout.strip() == "active"
    assert host.ssh("findmnt -n -b -o SIZE /dev/shm").stdout.strip() == str(1024**3)
    assert "vm.swappiness = 1" in host.ssh("cat /etc/sysctl.d/60-vllm-provision.conf").stdout
    assert get_json(f"http://{host.address}:8000/health") == {}
    assert apply_spec(load_spec(spec)).stats[host.name].changed == 0


def test_invalid_spec_touches_no_host(boot, tmp_path):
    (host,) = boot(1)
    install_standin(host)
    spec = write_spec(
        tmp_path / "spec.yml",
        [host_entry(host)],
        [instance_entry(host, "a", 8000, share=0.6), instance_entry(host, "b", 8001, share=0.6)],
    )
    before = disk_state(host)

    result = provision("apply", "--spec", str(spec))

    assert result.returncode == 1
    assert "instances[1].gpu_memory_utilization" in result.stdout + result.stderr
    assert disk_state(host) == before


def test_unreachable_host_fails_the_run_and_the_other_host_is_still_applied(boot, lab, tmp_path):
    (host,) = boot(1)
    install_standin(host)
    ghost = host_entry(host)
    ghost.update(name="ghost", address=str(lab.network.broadcast_address - 1))  # in our lab, nothing booted there
    ghost["gpus"]["devices"][0]["uuid"] = "GPU-00000000-1111-2222-3333-999999999999"
    spec = write_spec(tmp_path / "spec.yml", [host_entry(host), ghost], [instance_entry(host, "chat", 8000)])

    result = provision("apply", "--spec", str(spec))

    assert result.returncode == 1
    assert "ghost" in result.stdout and "unreachable" in result.stdout.lower()
    assert host.ssh("systemctl is-active vllm-chat.service").stdout.strip() == "active"
