"""Profile mode finds every vLLM server on a host we did not build, however it runs (issue 15).

One booted host for the module (boots cost), with the TEST DOUBLEs: nvidia-smi (an RTX 3090, whose
compute processes are the stand-in vLLM's `VLLM::EngineCore` children, as on a real card) and the
stand-in vLLM installed by hand into /opt/vllm/venv. Servers are started as people start them: from
an ssh shell as root with nohup, under a `bash -c` wrapper, under `timeout` (a vLLM command line
above the server: the same server), in a `systemd-run` transient unit and scope, beside one run by a
hand-written unit. The rootfs has no tmux, screen or cron (tests/lab/rootfs.py): those launchers are
covered by the unit tests of how a server's ancestors are read (tests/unit/test_audit_discovery.py). The tests run in file order: the
first sees the shell-started server alone, the second adds the others.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from provisioner.audit.expectations import BIND, NOT_ROOT, SHARES, SUPERVISED
from provisioner.audit.runner import disconnect
from provisioner.fleet.remote import Connection
from tests.lab.specs import HAND_VLLM_BIN, fake_gpu_uuid, install_standin, install_vllm_by_hand

PROVISION = [sys.executable, "-m", "provisioner.cli.main"]
KEY = "sk-shell-started-9f3e1c"
SHELL_TABLE = Path("/work/notes/i15-profile-shell.txt")  # quoted by the closing note (what failed)
SHELL_TABLE_ALL = SHELL_TABLE.with_name("i15-profile-shell-all.txt")  # the same audit with --all
CARD_MIB = 24576  # the RTX 3090 fixture's memory.total
UNIT = "my-llm.service"
TRANSIENT = "adhoc-llm.service"  # systemd-run's
HAND_WRITTEN_UNIT = """\
[Unit]
Description=LLM server someone set up by hand

[Service]
ExecStart=/opt/vllm/venv/bin/vllm serve facebook/opt-125m --port 8000 --gpu-memory-utilization 0.4
Restart=always

[Install]
WantedBy=multi-user.target
"""


def provision_audit(host, json_file: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    result = subprocess.run(
        [*PROVISION, "audit", "host", f"ssh://root@{host.address}", "--key", str(host.ssh_key),
         "--known-hosts", str(host.known_hosts), "--json", str(json_file), *extra],
        capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})
    return result, json.loads(json_file.read_text())


def rows(report: dict, host) -> dict[str, dict]:
    return {check["check"]: check for check in report["hosts"][host.address]["checks"]}


def wait_listening(host, port: int) -> None:
    host.ssh(f"for i in $(seq 100); do ss -Hltn | grep -q ':{port} ' && exit 0; sleep 0.1; done; exit 1")


def engine_core_mib(share: float) -> int:
    return int(share * CARD_MIB)


@pytest.fixture(scope="module")
def host(lab):
    (booted,) = lab.boot_many([f"pa{lab.boot_count}"])
    install_standin(booted)
    install_vllm_by_hand(booted)
    yield booted
    disconnect([Connection(booted.address, "root", 22, str(booted.ssh_key), str(booted.known_hosts))])
    lab.destroy(booted)


@pytest.fixture(scope="module")
def shell_pid(host) -> int:
    """As the seed-3 write-up ran it: nohup from an ssh shell as root, on every interface, the key on the command line."""
    pid = int(host.ssh(f"nohup {HAND_VLLM_BIN} serve facebook/opt-125m --host 0.0.0.0 --port 8001 --api-key {KEY}"
                       " --gpu-memory-utilization 0.3 > /root/shell.log 2>&1 < /dev/null & echo $!").stdout)
    wait_listening(host, 8001)
    return pid


def test_a_server_started_from_a_shell_is_named_with_what_is_wrong(host, shell_pid, tmp_path):
    result, report = provision_audit(host, tmp_path / "profile.json")

    assert result.returncode == 1, result.stdout + result.stderr
    SHELL_TABLE.parent.mkdir(parents=True, exist_ok=True)
    SHELL_TABLE.write_text(result.stdout)
    assert KEY not in result.stdout + result.stderr + json.dumps(report)
    found = rows(report, host)
    server = f"process {shell_pid}"
    assert found["vLLM units"]["actual"] == "none found"
    assert found["vLLM processes"]["actual"] == f"{server} (nohup, started by ssh.service)"
    # the lab's rootfs has no pam_systemd: an ssh session's processes stay in ssh.service's cgroup
    expected = {
        f"{server}: supervised": (SUPERVISED, f"bare process {shell_pid} (nohup, started by ssh.service): nothing "
                                              "restarts it after a crash or a reboot — run it as a unit", "failed"),
        f"{server}: user": (NOT_ROOT, "root (uid 0)", "failed"),
        f"{server}: bind address": (BIND, "0.0.0.0:8001: every interface, /v1 needs the API key", "passed"),
        f"{server}: command line": (
            "no --api-key (it shows in ps); put VLLM_API_KEY in an EnvironmentFile",
            f"/opt/vllm/venv/bin/python3 {HAND_VLLM_BIN} serve facebook/opt-125m --host 0.0.0.0 --port 8001 "
            "--api-key <redacted> --gpu-memory-utilization 0.3", "failed"),
        f"{server}: Environment CUDA_VISIBLE_DEVICES": (
            "GPU UUIDs (GPU-…/MIG-…), not indexes that change with the PCI order", "(unset)", "failed"),
        f"{server}: Environment CUDA_DEVICE_ORDER": (
            "PCI_BUS_ID (GPU indexes as nvidia-smi numbers them)", "(unset)", "failed"),
        f"{server}: listening": ("0.0.0.0:8001", "0.0.0.0:8001", "passed"),
        f"{server}: IPC": ("(reported)", "the host's IPC namespace", "passed"),
        f"{server}: GPUs": ("(reported)", f"GPU 0 ({fake_gpu_uuid(host)}): {engine_core_mib(0.3)} MiB, "
                                          "share 0.30 (--gpu-memory-utilization)", "passed"),
        "GPU 0: memory shares": (SHARES, f"{server} 0.30 ({engine_core_mib(0.3)} MiB) = 0.30; "
                                         f"{1 + engine_core_mib(0.3)} of {CARD_MIB} MiB used", "passed"),
    }
    for name, (want, actual, status) in expected.items():
        assert (found[name]["expected"], found[name]["actual"], found[name]["status"]) == (want, actual, status), name
    shm = found[f"{server}: /dev/shm size"]
    assert shm["status"] == "passed" and shm["actual"].endswith(" bytes (the host's /dev/shm)")
    # what failed is in the table as printed, every row with --all; the key in neither
    for name in (f"{server}: supervised", f"{server}: user", f"{server}: command line"):
        assert name in result.stdout
    assert "--api-key <redacted>" in result.stdout and "nothing restarts it" in result.stdout
    every, _ = provision_audit(host, tmp_path / "all.json", "--all")
    SHELL_TABLE_ALL.write_text(every.stdout)
    assert KEY not in every.stdout + every.stderr
    for name in expected:
        assert name in every.stdout, name


def test_every_server_counts_once_whatever_runs_it(host, shell_pid, tmp_path):
    """Beside the shell-started one: a unit's server (its processes are the unit's, not bare ones), one
    under a `bash -c` wrapper (the shell is no second server), one under `timeout` (a vLLM command line
    above the server: its wrapper), a transient unit of `systemd-run` (a unit of any name) and one in a
    `systemd-run --scope` scope (a scope restarts nothing). Their memory shares on the one card add up
    to more than 1.0."""
    unit_file = tmp_path / UNIT
    unit_file.write_text(HAND_WRITTEN_UNIT)
    host.put(unit_file, f"/etc/systemd/system/{UNIT}", mode="0644")
    host.ssh(f"systemctl daemon-reload && systemctl enable --now {UNIT}")
    wait_listening(host, 8000)
    uuid = fake_gpu_uuid(host)
    wrapper = int(host.ssh(
        f"CUDA_VISIBLE_DEVICES={uuid} CUDA_DEVICE_ORDER=PCI_BUS_ID setsid bash -c '{HAND_VLLM_BIN} serve facebook/opt-125m"
        " --host 127.0.0.1 --port 8002 --gpu-memory-utilization 0.25; echo stopped' > /root/wrapped.log 2>&1"
        " < /dev/null & echo $!").stdout)
    timeout = int(host.ssh(f"nohup timeout 1d {HAND_VLLM_BIN} serve facebook/opt-125m --host 127.0.0.1 --port 8003"
                           " --gpu-memory-utilization 0.2 > /root/timeout.log 2>&1 < /dev/null & echo $!").stdout)
    host.ssh(f"systemd-run --unit={TRANSIENT} {HAND_VLLM_BIN} serve facebook/opt-125m --host 127.0.0.1 --port 8004"
             " --gpu-memory-utilization 0.1")
    scoped = int(host.ssh(f"nohup systemd-run --scope --unit=llm-adhoc {HAND_VLLM_BIN} serve facebook/opt-125m --host"
                          " 127.0.0.1 --port 8005 --gpu-memory-utilization 0.1 > /root/scope.log 2>&1 < /dev/null & echo $!")
                 .stdout)
    for port in (8002, 8003, 8004, 8005):
        wait_listening(host, port)
    wrapped = int(host.ssh(f"pgrep -P {wrapper}").stdout)
    timed = int(host.ssh(f"pgrep -P {timeout}").stdout)

    result, report = provision_audit(host, tmp_path / "profile.json")

    assert result.returncode == 1, result.stdout + result.stderr
    assert KEY not in result.stdout + result.stderr + json.dumps(report)
    found = rows(report, host)
    assert found["vLLM units"]["actual"] == f"{TRANSIENT}, {UNIT}"
    assert found["vLLM processes"]["actual"] == ", ".join([
        f"process {pid} ({where})" for pid, where in sorted([
            (shell_pid, "nohup, started by ssh.service"),
            (wrapped, f"bash -c (pid {wrapper}), started by ssh.service"),
            # timeout catches SIGHUP (to pass it on): what nohup set does not reach the server
            (timed, f"timeout (pid {timeout}), started by ssh.service"),
            (scoped, "nohup, llm-adhoc.scope")])])
    servers = {name.split(": ")[0] for name in found if name.endswith(": supervised")}
    assert servers == {UNIT, TRANSIENT, f"process {shell_pid}", f"process {wrapped}", f"process {timed}",
                       f"process {scoped}"}
    assert found[f"{TRANSIENT}: supervised"]["status"] == "passed"
    assert (found[f"{TRANSIENT}: Restart"]["actual"], found[f"{TRANSIENT}: Restart"]["status"]) == ("no", "failed")
    assert found[f"process {scoped}: supervised"]["actual"] == (
        f"bare process {scoped} (nohup, llm-adhoc.scope): nothing restarts it after a crash or a reboot — run it as a unit")
    assert found[f"{UNIT}: supervised"]["actual"] == f"systemd unit {UNIT}"
    assert found[f"{UNIT}: supervised"]["status"] == "passed"
    assert found[f"{UNIT}: bind address"]["actual"] == (
        "0.0.0.0:8000: every interface and no API key — anyone who reaches port 8000 can use it")
    assert found[f"{UNIT}: bind address"]["status"] == "failed"
    assert found[f"process {wrapped}: supervised"]["actual"] == (
        f"bare process {wrapped} (bash -c (pid {wrapper}), started by ssh.service): nothing restarts it after a crash "
        "or a reboot — run it as a unit")
    assert found[f"process {wrapped}: Environment CUDA_VISIBLE_DEVICES"]["status"] == "passed"
    assert found[f"process {wrapped}: Environment CUDA_DEVICE_ORDER"]["status"] == "passed"
    assert found[f"process {wrapped}: bind address"] == {
        **found[f"process {wrapped}: bind address"], "actual": "127.0.0.1:8002", "status": "passed"}
    # the engine cores took their shares in the order they started (by pid), the last what was left
    shares = {UNIT: 0.4, f"process {shell_pid}": 0.3, f"process {wrapped}": 0.25, f"process {timed}": 0.2,
              TRANSIENT: 0.1, f"process {scoped}": 0.1}
    order = sorted(shares, key=lambda name: engine_core_pid(host, name))
    held, free = {}, CARD_MIB - 1
    for name in order:
        held[name] = min(engine_core_mib(shares[name]), free)
        free -= held[name]
    for name in order:
        assert found[f"{name}: GPUs"]["actual"] == (
            f"GPU 0 ({uuid}): {held[name]} MiB, share {shares[name]:.2f} (--gpu-memory-utilization)"), name
    card = found["GPU 0: memory shares"]
    assert card["status"] == "failed"
    assert card["actual"] == (" + ".join(f"{name} {shares[name]:.2f} ({held[name]} MiB)" for name in order)
                              + f" = 1.35; {CARD_MIB} of {CARD_MIB} MiB used")
    # the wrappers are no servers of their own
    assert not any(name.startswith((f"process {wrapper}:", f"process {timeout}:")) for name in found)


def engine_core_pid(host, name: str) -> int:
    """The pid of the server's `VLLM::EngineCore` child (a unit's: its MainPID's)."""
    main = int(name.split()[1]) if name.startswith("process ") else int(
        host.ssh(f"systemctl show -p MainPID --value {name}").stdout)
    return int(host.ssh(f"pgrep -P {main} -x VLLM::EngineCor").stdout)
