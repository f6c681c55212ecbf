"""What the servers RUN, beside what their files say (issue 35): drifts planted on a converged lab host.

One host for the module, the spec applied (the instance `chat`, its API key from a file), with the TEST
DOUBLEs of tests/lab/specs.py (nvidia-smi, the stand-in vLLM) and of tests/doubles/cron_standin.py (the
rootfs has no cron). The stand-in vLLM maps its placeholder of vLLM's kernels as real vLLM maps
vllm/_C.abi3.so (tests/doubles/vllm_package/vllm/platforms), so the version a unit runs is read from its
maps and the dist-info beside them; the launcher script's server is pure Python (STANDIN_PURE_PYTHON=1):
it maps no vLLM object and is found, and its version read, by its API's answers. Each test plants one drift,
checks the exact rows of spec mode (and of profile mode where they differ), repairs it, and the spec audit
passes again; the tests run in file order.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from provisioner.audit.running import NO_RESTART_PENDING, NO_STRAYS
from tests.doubles import cron_standin
from tests.integration.test_audit import UNIT, chat_host, failing_rows, main_pid
from tests.lab.specs import MODEL, VLLM_BIN

PROVISION = [sys.executable, "-m", "provisioner.cli.main"]
KEY = "sk-running-audit-5c1e"
OTHER_KEY = "sk-another-key-77d0"
CONFIG = "/etc/vllm/chat.yaml"
ENV_FILE = "/etc/vllm/chat.env"
STRAYS = "vLLM servers and GPU processes not in the spec"
# where the rows each test saw are written (what the issue quotes), if set
ROWS_FILE = Path(os.environ["VP_RUNNING_ROWS"]) if os.environ.get("VP_RUNNING_ROWS") else None


@pytest.fixture(scope="module")
def converged(lab, tmp_path_factory):
    folder = tmp_path_factory.mktemp("running")
    with chat_host(lab, folder, "ar", KEY) as (host, spec):
        yield host, spec, folder


def profile_rows(host, json_file: Path) -> dict[str, dict]:
    result = subprocess.run(
        [*PROVISION, "audit", "host", f"ssh://root@{host.address}", "--key", str(host.ssh_key),
         "--known-hosts", str(host.known_hosts), "--json", str(json_file)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "250"})
    assert KEY not in result.stdout + result.stderr and OTHER_KEY not in result.stdout + result.stderr
    report = json.loads(json_file.read_text())
    return {check["check"]: check for check in report["hosts"][host.address]["checks"]}


def record(title: str, rows: dict) -> None:
    """Append the rows to ROWS_FILE (what the issue quotes), where one is set."""
    if ROWS_FILE is None:
        return
    ROWS_FILE.parent.mkdir(parents=True, exist_ok=True)
    with ROWS_FILE.open("a") as handle:
        handle.write(f"## {title}\n")
        for name, row in rows.items():
            expected, actual = (row["expected"], row["actual"]) if isinstance(row, dict) else row
            handle.write(f"{name}\n  expected: {expected}\n  actual:   {actual}\n")


def wait_listening(host, port: int) -> None:
    host.ssh(f"for i in $(seq 150); do ss -Hltn | grep -q ':{port} ' && exit 0; sleep 0.1; done; exit 1")


def listener_pid(host, port: int) -> int:
    """The pid of the process listening on `port` (its socket's inode among the processes' fds)."""
    inode = host.ssh(f"awk 'NR > 1 && $4 == \"0A\" && $2 ~ /:{port:04X}$/ {{print $10}}' /proc/net/tcp /proc/net/tcp6"
                     " | head -1").stdout.strip()
    return int(host.ssh(f"for fd in /proc/[0-9]*/fd/*; do [ \"$(readlink $fd)\" = 'socket:[{inode}]' ] && "
                        "echo ${fd#/proc/} && break; done | cut -d/ -f1").stdout.strip())


def test_a_converged_host_passes_and_says_what_runs(converged, tmp_path):
    host, spec, _ = converged
    if ROWS_FILE is not None:
        ROWS_FILE.write_text("")
    assert failing_rows(spec) == {}
    pid = main_pid(host)
    found = profile_rows(host, tmp_path / "profile.json")
    record("converged: profile mode", {name: found[name] for name in found if name.startswith(UNIT)})
    assert found[f"{UNIT}: started by"]["actual"] == f"systemd unit {UNIT}"
    assert found[f"{UNIT}: vLLM running"]["actual"] == (
        f"0.25.0 (mapped from {VLLM_BIN.rsplit('/bin/', 1)[0]}/lib/python3.11/site-packages/vllm)")
    assert found[f"{UNIT}: restart pending"]["status"] == "passed"
    models = f"{UNIT}: GET http://{host.address}:8000/v1/models"
    assert found[models]["actual"] == f"{MODEL} (key: VLLM_API_KEY of pid {pid})"


def test_a_config_file_edited_without_a_restart(converged, tmp_path):
    host, spec, _ = converged
    pid = main_pid(host)
    host.ssh(f"cp -p {CONFIG} /root/chat.yaml.kept && sed -i 's/^max-model-len: 4096$/max-model-len: 2048/' {CONFIG}"
             f" && grep -q '^max-model-len: 2048$' {CONFIG}")

    failed = failing_rows(spec)
    record("config file edited, no restart: spec mode", failed)
    assert set(failed) == {f"{UNIT}: config file {CONFIG}", f"{UNIT}: restart pending"}
    expected, actual = failed[f"{UNIT}: restart pending"]
    assert expected == NO_RESTART_PENDING
    assert actual.startswith(f"restart pending: {CONFIG} (changed ") and f"after pid {pid} started " in actual
    found = profile_rows(host, tmp_path / "profile.json")
    record("config file edited, no restart: profile mode",
           {f"{UNIT}: restart pending": found[f"{UNIT}: restart pending"]})
    assert found[f"{UNIT}: restart pending"]["status"] == "failed"
    assert found[f"{UNIT}: restart pending"]["actual"].startswith(f"restart pending: {CONFIG} (changed ")

    host.ssh(f"cp -p /root/chat.yaml.kept {CONFIG} && systemctl restart {UNIT}")
    wait_listening(host, 8000)
    assert failing_rows(spec) == {}


def test_a_server_running_with_another_key_than_its_env_file(converged, tmp_path):
    host, spec, _ = converged
    host.ssh(f"cp -p {ENV_FILE} /root/chat.env.kept && sed -i 's/^VLLM_API_KEY=.*/VLLM_API_KEY={OTHER_KEY}/' {ENV_FILE}"
             f" && systemctl restart {UNIT} && cp -p /root/chat.env.kept {ENV_FILE}")  # the file as it was, its time
    wait_listening(host, 8000)
    pid = main_pid(host)

    failed = failing_rows(spec)
    record("another key than the env file's: spec mode", failed)
    models = f"{UNIT}: GET http://{host.address}:8000/v1/models"
    assert failed[models] == (MODEL, "HTTP 401: refuses the spec's API key (the spec's api_key_file)"
                                     " (key: the spec's api_key_file)")
    assert set(failed) == {models, f"{UNIT}: ready (one request served)"}
    found = profile_rows(host, tmp_path / "profile.json")  # no spec: the server's own key, and where it came from
    record("another key than the env file's: profile mode", {models: found[models]})
    assert (found[models]["status"], found[models]["actual"]) == ("passed", f"{MODEL} (key: VLLM_API_KEY of pid {pid})")

    host.ssh(f"systemctl restart {UNIT}")
    wait_listening(host, 8000)
    assert failing_rows(spec) == {}


def assert_stray(host, spec, json_file: Path, port: int, title: str, how: str) -> tuple[int, dict[str, dict]]:
    """The server listening on `port` is the one row that fails in spec mode, a stray started by `how`; profile mode
    says the same of it. (its pid, the profile's rows)"""
    wait_listening(host, port)
    pid = listener_pid(host, port)
    failed = failing_rows(spec)
    record(f"{title}: spec mode", failed)
    stray = f"stray vLLM server: pid {pid} on 0.0.0.0:{port}, started by {how}, no API key"
    assert failed == {STRAYS: (NO_STRAYS, stray)}
    found = profile_rows(host, json_file)
    record(f"{title}: profile mode", {name: found[name] for name in found
                                      if name.startswith(f"process {pid}:") or name == "vLLM processes"})
    assert found[f"process {pid}: started by"]["actual"] == how
    assert found[f"process {pid}: bind address"]["status"] == "failed"  # every interface, no key
    return pid, found


def test_a_stray_server_started_by_roots_crontab_at_boot(converged, tmp_path):
    host, spec, _ = converged
    cron_standin.install(host, f"@reboot {VLLM_BIN} serve {MODEL} --host 0.0.0.0 --port 8002"
                               " --gpu-memory-utilization 0.05 > /var/log/stray.log 2>&1\n")
    host.ssh("systemctl start cron.service")  # what boot does: cron starts and runs the @reboot lines
    pid, _ = assert_stray(host, spec, tmp_path / "profile.json", 8002, "a stray from root's crontab (@reboot)",
                          "root's crontab (@reboot)")

    host.ssh(f"rm /var/spool/cron/crontabs/root && systemctl disable --now cron.service && kill {pid}")
    host.ssh(f"while kill -0 {pid} 2>/dev/null; do sleep 0.1; done")
    assert failing_rows(spec) == {}


USER_UNIT = f"""[Unit]
Description=someone's own LLM server

[Service]
ExecStart={VLLM_BIN} serve {MODEL} --host 0.0.0.0 --port 8003 --gpu-memory-utilization 0.05

[Install]
WantedBy=default.target
"""


def test_a_stray_server_in_a_user_unit_of_a_lingering_user(converged, tmp_path):
    host, spec, _ = converged
    # lingering: logind starts the user's manager (started here too, not to wait on logind). The lab's rootfs has
    # no pam_systemd, which sets the manager's XDG_RUNTIME_DIR on a real host: a drop-in sets it here
    host.ssh("mkdir -p /etc/systemd/system/user@.service.d"
             " && printf '[Service]\\nEnvironment=XDG_RUNTIME_DIR=/run/user/%i\\n'"
             " > /etc/systemd/system/user@.service.d/lab-runtime-dir.conf && systemctl daemon-reload")
    started = host.ssh("useradd -m -s /bin/bash llmuser && loginctl enable-linger llmuser && uid=$(id -u llmuser)"
                       " && systemctl start user@$uid.service; systemctl status --no-pager user@$uid.service",
                       check=False)
    if started.returncode != 0:  # systemd 252's manager fails there: "Failed to allocate manager object"
        host.ssh("loginctl disable-linger llmuser; userdel -r llmuser", check=False)
        pytest.skip("the lab's rootfs (no libpam-systemd) cannot start a user manager; the words of a user unit's "
                    "server are tested in tests/unit/test_audit_running.py")
    unit = tmp_path / "llm.service"
    unit.write_text(USER_UNIT)
    host.put(unit, "/home/llmuser/.config/systemd/user/llm.service", mode="0644")
    host.ssh("chown -R llmuser: /home/llmuser/.config"
             " && runuser -u llmuser -- env XDG_RUNTIME_DIR=/run/user/$(id -u llmuser)"
             " systemctl --user enable --now llm.service")
    pid, _ = assert_stray(host, spec, tmp_path / "profile.json", 8003, "a stray in a user unit of a lingering user",
                          "user unit llm.service of llmuser")

    host.ssh("loginctl disable-linger llmuser && uid=$(id -u llmuser) && "
             "for i in $(seq 100); do systemctl is-active -q user@$uid.service || exit 0; sleep 0.1; done; exit 1")
    host.ssh(f"while kill -0 {pid} 2>/dev/null; do sleep 0.1; done; userdel -r llmuser")
    assert failing_rows(spec) == {}


LAUNCHER = f"""#!{VLLM_BIN.rsplit('/', 1)[0]}/python3
# someone's launcher: vLLM's CLI run in-process, its command line no `vllm serve`
import os
import sys

os.environ["STANDIN_PURE_PYTHON"] = "1"  # TEST DOUBLE's switch: no vLLM object mapped, only its API tells

sys.argv = ["vllm", "serve", "{MODEL}", "--host", "0.0.0.0", "--port", "8004", "--gpu-memory-utilization", "0.05"]
from vllm.entrypoints.cli.main import main

main()
"""


def test_a_stray_server_run_by_a_launcher_script(converged, tmp_path):
    host, spec, _ = converged
    script = tmp_path / "llm-launch"
    script.write_text(LAUNCHER)
    host.put(script, "/usr/local/bin/llm-launch", mode="0755")
    started = int(host.ssh("nohup /usr/local/bin/llm-launch > /root/launch.log 2>&1 < /dev/null & echo $!").stdout)
    pid, found = assert_stray(host, spec, tmp_path / "profile.json", 8004, "a stray run by a launcher script",
                              "nohup, a script (/usr/local/bin/llm-launch)")
    assert pid == started and found["vLLM processes"]["actual"] == f"process {pid} (nohup, started by ssh.service)"
    assert found[f"process {pid}: vLLM running"]["actual"] == "0.25.0 (its API's /version)"

    host.ssh(f"kill {pid}; while kill -0 {pid} 2>/dev/null; do sleep 0.1; done")
    assert failing_rows(spec) == {}
