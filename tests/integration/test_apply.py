"""`provision apply` against real systemd test hosts (systemd-nspawn, systemd as PID 1, over SSH).

Three hosts serve the module, each with one shared history the tests check a part of (in file order):
host one gets check mode, apply, apply again, an invalid spec and a reboot; hosts two and three get a
run with an unreachable host beside them, then one run on both."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from benchmarks.h200.drain import completion
from provisioner.apply.hosts import apply_spec
from provisioner.spec import load_spec
from tests.integration.conftest import disk_state
from tests.lab.load import first_token_seconds
from tests.lab.specs import MODEL, fake_gpu_uuid, host_entry, install_standin, instance_entry, write_spec

PROVISION = [sys.executable, "-m", "provisioner.cli.main"]


def provision(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*PROVISION, *args], capture_output=True, text=True, timeout=600)


def get_json(url: str, key: str | None = None) -> dict:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.load(response)


SLOW = {"env": {"STANDIN_STARTUP_DELAY": "2"}}
# the embedder's stand-in stalls 3 s at its first batch of 8 requests in the model's own sampling, as
# vLLM 0.25.0 did on the H200 for 7-9 s (tests/fixtures/vllm/h200-tune); each request takes 100 ms at least
SAMPLER_COMPILES = {"env": {**SLOW["env"], "STANDIN_SAMPLER_JIT_S": "3", "STANDIN_TTFT_MS": "100"}}
KEY = "sk-test-secret-123"


@pytest.fixture(scope="module")
def one(lab, tmp_path_factory):
    """Host one: three instances sharing its GPU (chat guarded by an API key), from a fresh host:
    check mode, the CLI's apply, apply again (the library), and an invalid spec refused."""
    (host,) = lab.boot_many([f"ap{lab.boot_count}"])
    install_standin(host)
    folder = tmp_path_factory.mktemp("one")
    key_file = folder / "chat.key"
    key_file.write_text(KEY + "\n")
    spec = write_spec(folder / "spec.yml", [host_entry(host)], [
        instance_entry(host, "reranker", 8001, share=0.2, **SLOW),
        instance_entry(host, "embedder", 8002, share=0.2, **SAMPLER_COMPILES),
        instance_entry(host, "chat", 8000, share=0.45, api_key_file=str(key_file), **SLOW),
    ])
    invalid = write_spec(folder / "invalid.yml", [host_entry(host)],
                         [instance_entry(host, "a", 8000, share=0.6), instance_entry(host, "b", 8001, share=0.6)])
    record = {"host": host, "spec": spec, "disk before": disk_state(host)}
    record["check"] = apply_spec(load_spec(spec), check=True)
    record["disk after check"] = disk_state(host)
    record["unit after check"] = host.ssh("test -e /etc/systemd/system/vllm-chat.service", check=False).returncode
    record["user after check"] = host.ssh("getent passwd vllm", check=False).returncode
    record["first"] = provision("apply", "--spec", str(spec))
    record["second"] = apply_spec(load_spec(spec))
    before = disk_state(host)
    record["invalid"] = provision("apply", "--spec", str(invalid))
    record["disk changed by the invalid spec"] = {
        path: (before.get(path), value) for path, value in disk_state(host).items() if before.get(path) != value}
    yield record
    lab.destroy(host)


@pytest.fixture(scope="module")
def one_rebooted(one):
    one["host"].reboot()
    return one


@pytest.fixture(scope="module")
def pair(lab, tmp_path_factory):
    """Hosts two and three: a run on two beside a host nobody answers, then one run on both."""
    hosts = lab.boot_many([f"ap{lab.boot_count}", f"ap{lab.boot_count + 1}"])
    for host in hosts:
        install_standin(host)
    folder = tmp_path_factory.mktemp("pair")
    instances = [instance_entry(host, f"chat-{host.name}", 8000) for host in hosts]
    ghost = host_entry(hosts[0])
    ghost.update(name="ghost", address=str(lab.network.broadcast_address - 1))  # in our lab, nothing booted there
    ghost["gpus"]["devices"][0]["uuid"] = "GPU-00000000-1111-2222-3333-999999999999"
    with_ghost = write_spec(folder / "ghost.yml", [host_entry(hosts[0]), ghost], instances[:1])
    both = write_spec(folder / "both.yml", [host_entry(host) for host in hosts], instances)
    record = {"hosts": hosts, "with ghost": provision("apply", "--spec", str(with_ghost))}
    record["active beside the ghost"] = hosts[0].ssh(f"systemctl is-active vllm-chat-{hosts[0].name}.service").stdout.strip()
    record["both"] = apply_spec(load_spec(both))
    yield record
    for host in hosts:
        lab.destroy(host)


# -- host one --------------------------------------------------------------------------------------


def test_check_mode_on_a_fresh_host_changes_nothing(one):
    assert one["check"].succeeded, one["check"].problems
    assert one["check"].stats[one["host"].name].changed > 0, "check mode must report what would change"
    before, after = one["disk before"], one["disk after check"]
    assert after == before, {k: (before.get(k), after.get(k)) for k in set(before) | set(after) if before.get(k) != after.get(k)}
    assert one["unit after check"] == 1
    assert one["user after check"] == 2


def test_apply_converges_then_second_apply_changes_nothing(one):
    host, first, second = one["host"], one["first"], one["second"]
    assert first.returncode == 0, first.stdout + first.stderr
    assert f"{host.name}" in first.stdout and "changed" in first.stdout
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
    assert process["options"]["gpu_memory_utilization"] == 0.45  # as the server parsed its config file
    # like vLLM, the server guards /v1 with the key
    with pytest.raises(urllib.error.HTTPError, match="401"):
        get_json(f"http://{host.address}:8000/v1/models")
    models = get_json(f"http://{host.address}:8000/v1/models", key=KEY)
    assert models["data"][0]["id"] == MODEL

    # the secret lives only in a 0600 root-owned environment file, never on a command line
    assert host.ssh("stat -c '%a %U' /etc/vllm/chat.env").stdout.strip() == "600 root"
    assert f"VLLM_API_KEY={KEY}" in host.ssh("cat /etc/vllm/chat.env").stdout
    assert "sk-test-secret" not in host.ssh(f"systemctl cat {unit}; ps -eo args").stdout
    hardening = host.ssh(f"systemctl show {unit} -p NoNewPrivileges -p ProtectSystem -p PrivateTmp -p Restart").stdout
    assert set(hardening.split()) == {"NoNewPrivileges=yes", "ProtectSystem=strict", "PrivateTmp=yes", "Restart=on-failure"}


def test_the_first_users_after_a_start_do_not_wait_for_the_sampler_to_compile(one):
    """The unit is active only after wait-ready's warm-up (ExecStartPost=), which took the stall."""
    host = one["host"]
    journal = host.ssh("journalctl -u vllm-embedder.service -o cat --no-pager").stdout
    assert "warmed up: 16 then 9 completions at once in the model's own sampling" in journal
    assert first_token_seconds(host.address, 8002, MODEL, 16)[-1] < 1.5


def test_a_restart_lets_the_request_in_flight_finish(one):
    """The role sets vLLM's --shutdown-timeout (vLLM's own default, 0, aborts every stream in flight:
    tests/fixtures/vllm/h200-drain): a stream in flight when its unit restarts gets all its tokens."""
    host, start, outcomes = one["host"], time.monotonic(), []
    stream = threading.Thread(target=lambda: outcomes.append(
        completion(8001, 4000, start, host=host.address, model=MODEL)))  # 4000 tokens at 1 ms each
    stream.start()
    time.sleep(1)
    host.ssh("systemctl restart vllm-reranker.service")
    stream.join(timeout=60)
    (outcome,) = outcomes
    assert (outcome["status"], outcome["error"], outcome["done"]) == (200, None, True)
    assert (outcome["finish_reason"], outcome["chunks"]) == ("length", 4000)
    assert host.ssh("systemctl show -p TimeoutStopUSec vllm-reranker.service").stdout.strip() == "TimeoutStopUSec=1min"


def test_invalid_spec_touches_no_host(one):
    result = one["invalid"]
    assert result.returncode == 1
    assert "instances[1].gpu_memory_utilization" in result.stdout + result.stderr
    assert one["disk changed by the invalid spec"] == {}


def test_instances_sharing_a_gpu_start_one_after_another(one_rebooted):
    host = one_rebooted["host"]
    after = host.ssh("systemctl show -p After vllm-chat.service").stdout
    assert "vllm-reranker.service" in after and "vllm-embedder.service" in after
    # after the reboot systemd started all three itself: each only once the previous was ready
    times = {}
    for name in ("reranker", "embedder", "chat"):
        shown = host.ssh(
            f"systemctl show -p ExecMainStartTimestampMonotonic -p ActiveEnterTimestampMonotonic vllm-{name}.service"
        ).stdout
        times[name] = dict(line.split("=", 1) for line in shown.split())
    assert int(times["embedder"]["ExecMainStartTimestampMonotonic"]) >= int(times["reranker"]["ActiveEnterTimestampMonotonic"])
    assert int(times["chat"]["ExecMainStartTimestampMonotonic"]) >= int(times["embedder"]["ActiveEnterTimestampMonotonic"])


def test_state_survives_a_reboot(one_rebooted):
    host = one_rebooted["host"]
    assert host.ssh("systemctl is-active vllm-chat.service").stdout.strip() == "active"
    assert host.ssh("findmnt -n -b -o SIZE /dev/shm").stdout.strip() == str(1024**3)
    assert "vm.swappiness = 1" in host.ssh("cat /etc/sysctl.d/60-vllm-provision.conf").stdout
    assert get_json(f"http://{host.address}:8000/health") == {}
    assert apply_spec(load_spec(one_rebooted["spec"])).stats[host.name].changed == 0


# -- hosts two and three ---------------------------------------------------------------------------


def test_unreachable_host_fails_the_run_and_the_other_host_is_still_applied(pair):
    result = pair["with ghost"]
    assert result.returncode == 1
    assert "ghost" in result.stdout and "unreachable" in result.stdout.lower()
    assert pair["active beside the ghost"] == "active"


def test_two_hosts_in_one_run(pair):
    """The second host is new; the first was applied beside the ghost, so only the second changes."""
    result, (first, second) = pair["both"], pair["hosts"]
    assert result.succeeded, result.problems
    assert sorted(result.stats) == sorted([first.name, second.name])
    assert result.stats[first.name].changed == 0
    assert result.stats[second.name].changed > 0
    for host in (first, second):
        assert get_json(f"http://{host.address}:8000/v1/models")["data"][0]["id"] == MODEL
