"""The audit's parts that need no host: reading command output, discovery, the check helper, the engine."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from provisioner.audit.checks.gpu import parse_gpu
from provisioner.audit.checks.vllm_service import parse_unit
from provisioner.audit.discovery import gpu_indexes, vllm_containers, vllm_units
from provisioner.audit.engine import Facts, HostLost, Output, audit_facts, host_commands, parse_outputs, run_case
from provisioner.audit.instance_files import HTTP_PROBE, HTTPS_PROBE, http_answers
from provisioner.audit.processes import is_vllm_command
from provisioner.audit.registry import Audit, Case, Drift, make_check
from provisioner.audit.text import environment_words, modprobe_dry_run, show_blocks, shown_argv, shown_command
from provisioner.base.file_formats import sysctl_settings

GPU_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gpu"
STANDIN_PACKAGE = Path(__file__).resolve().parents[1] / "doubles" / "vllm_package"
CATALOG = Path(__file__).resolve().parents[2] / "provisioner" / "vllm" / "catalogs" / "vllm-0.25.0.json"
READY_PROBE = Path(__file__).resolve().parents[2] / "roles" / "vllm_service" / "files" / "wait-ready"
EXEC_START = ("{ path=/opt/vllm/venv/bin/vllm ; argv[]=/opt/vllm/venv/bin/vllm serve m --port 8000 ; "
              "ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }")


def test_framed_outputs_keep_each_commands_text_and_exit_status():
    marker = "@@vp-audit-1234"
    stdout = (f"{marker} virt\nsystemd-nspawn\n\n{marker} rc 0\n"
              f"{marker} file0\n\n{marker} rc 1\n"
              f"{marker} fstab\nno newline at the end\n{marker} rc 0\n")
    assert parse_outputs(stdout, marker) == {
        "virt": Output("systemd-nspawn\n", 0), "file0": Output("", 1), "fstab": Output("no newline at the end", 0)}


def test_a_unit_is_read_from_systemctl_show_its_env_files_and_stat():
    outputs = {
        "unit0": Output(f"ActiveState=active\nEnvironment=A=1 \"B=two words\"\nExecStart={EXEC_START}\n", 0),
        "unit_env0": Output("CUDA_DEVICE_ORDER=PCI_BUS_ID\n", 0),
        "env_file0": Output("600 root:root\n" + "ab" * 32 + "  /etc/vllm/chat.env\n", 0),
        "http0": Output("\n@@ /health\nHTTP/1.0 200 OK\r\nServer: x\r\n\r\n{}\n@@ /v1/models\n"
                        "10.0.0.1: connect: Connection refused\nbash: line 1: /dev/tcp/10.0.0.1/8000: Connection refused\n", 0),
    }
    unit = parse_unit(0, outputs)
    assert unit.shown["ActiveState"] == "active"
    assert unit.environment == {"A": "1", "B": "two words", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert unit.argv == ["/opt/vllm/venv/bin/vllm", "serve", "m", "--port", "8000"]
    assert unit.env_file == ("0600", "root:root") and unit.env_file_sha256 == "ab" * 32
    assert unit.http == {"/health": {"status": 200, "body": "{}\n"},
                         "/v1/models": {"error": "10.0.0.1: connect: Connection refused"}}


def test_text_formats():
    assert sysctl_settings("# c\n; c\nvm.swappiness = 1\n-net.core.somaxconn=4096\nvm.swappiness=5\n") == {
        "vm.swappiness": "5", "net.core.somaxconn": "4096"}
    assert environment_words('A=1 "B=x y"') == {"A": "1", "B": "x y"}
    assert shown_argv("") == []
    assert show_blocks("Id=a\nX=1\n\nId=b\n") == [{"Id": "a", "X": "1"}, {"Id": "b"}]
    assert shown_command(["vllm", "serve", "m", "--api-key", "sk-1", "--api-key=sk-2", "--port", "1"]) == (
        "vllm serve m --api-key <redacted> --api-key=<redacted> --port 1")


@pytest.mark.parametrize("argv, is_vllm", [
    (["/opt/vllm/venv/bin/vllm", "serve", "m"], True),
    (["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"], True),
    (["/usr/bin/vllm-exporter", "serve"], False),
    (["/usr/sbin/sshd", "-D"], False),
])
def test_which_commands_are_vllm_servers(argv, is_vllm):
    assert is_vllm_command(argv) is is_vllm


def test_discovery_finds_vllm_units_by_their_command_whatever_their_name():
    output = (f"Id=my-llm.service\nFragmentPath=/etc/systemd/system/my-llm.service\nExecStart={EXEC_START}\n\n"
              "Id=ssh.service\nFragmentPath=/lib/systemd/system/ssh.service\n"
              "ExecStart={ path=/usr/sbin/sshd ; argv[]=/usr/sbin/sshd -D ; ignore_errors=no ; }\n\n"
              "Id=gone.service\nFragmentPath=\nExecStart=\n")
    assert vllm_units(output) == [{"name": "my-llm.service", "fragment": "/etc/systemd/system/my-llm.service",
                                   "argv": ["/opt/vllm/venv/bin/vllm", "serve", "m", "--port", "8000"]}]


def test_discovery_reads_vllm_containers_from_docker_inspect():
    inspect = [
        {"Name": "/llm", "Config": {"Image": "vllm/vllm-openai:v0.25.0", "Entrypoint": ["vllm", "serve"],
                                    "Cmd": ["m", "--port", "8000"], "Env": ["CUDA_VISIBLE_DEVICES=0", "PATH=/bin"]},
         "HostConfig": {"ShmSize": 67108864},
         "NetworkSettings": {"Ports": {"8000/tcp": [{"HostIp": "", "HostPort": "8000"}], "9000/tcp": None}}},
        {"Name": "/db", "Config": {"Image": "postgres:16", "Cmd": ["postgres"]}, "HostConfig": {}},
    ]
    (container,) = vllm_containers("docker", json.dumps(inspect))
    assert container == {"name": "llm", "id": "", "pid": None, "restart": "no", "ipc": "", "tool": "docker",
                         "image": "vllm/vllm-openai:v0.25.0", "ports": ["0.0.0.0:8000->8000/tcp"], "shm_bytes": 67108864,
                         "argv": ["vllm", "serve", "m", "--port", "8000"],
                         "environment": {"CUDA_VISIBLE_DEVICES": "0", "PATH": "/bin"}}
    assert vllm_containers("podman", "") == []


def test_expect_records_expected_and_actual_and_raises_drift():
    audit = Audit()
    audit.expect("sysctl file: vm.swappiness", "1", "1")
    assert audit.row == {"check": "sysctl file: vm.swappiness", "expected": "1", "actual": "1"}
    with pytest.raises(Drift) as drift:
        audit.expect("User", {"expected": "not root", "pattern": "^(?!root$)"}, "root")
    assert (drift.value.check, drift.value.expected, drift.value.actual) == ("User", "not root", "root")
    assert isinstance(drift.value, AssertionError)
    audit.expect("flags", ["a", "b"], ["a", "b"])
    assert audit.row["actual"] == "a, b"


def same(audit):
    audit.expect("same", "1", "1")


def drifted(audit):
    audit.expect("drifted", "1", "60")


def in_a_container(audit):
    audit.not_applicable("live", "1", "a container shares its host's kernel")


def broken(facts):
    facts.units["vllm-x.service"]  # a check's own bug: an error row, never a traceback


def halfway(audit):
    audit.expect("recorded", "1", "1")
    raise RuntimeError("then it broke")


def test_the_engine_reports_passed_failed_na_and_error():
    facts = Facts(problems={}, units={})
    results = [run_case(make_check(function), Case("h", {}), f"t::{function.__name__}[h]", facts)
               for function in (same, drifted, in_a_container, broken, halfway)]
    assert [(result.check, result.status, result.expected, result.actual) for result in results] == [
        ("same", "passed", "1", "1"), ("drifted", "failed", "1", "60"),
        ("live", "n/a", "1", "n/a: a container shares its host's kernel"),
        ("broken[h]", "error", "", "KeyError: 'vllm-x.service'"), ("recorded", "error", "1", "1")]
    assert results[2].message == "a container shares its host's kernel"
    assert results[1].message == "drifted: expected 1, actual 60" and results[4].message == "then it broke"
    assert results[3].id == "t::broken[h]"


def test_a_concern_whose_facts_could_not_be_read_errs_its_own_checks_alone():
    facts = Facts(problems={"test_audit_suite": "its facts could not be read: ValueError: bad"}, units={})
    result = run_case(make_check(same), Case("h", {}), "t::same[h]", facts)
    assert (result.status, result.actual) == ("error", "its facts could not be read: ValueError: bad")


def test_a_host_lost_while_read_errs_every_check_with_the_lost_reason():
    def lost():
        raise HostLost("lost: the host stopped answering")

    cases = [(make_check(function), Case("h", {}), f"t::{function.__name__}[h]") for function in (same, drifted)]
    results = list(audit_facts("h", {}, lost, cases))
    assert [(result.status, result.message) for result in results] == [("error", "lost: the host stopped answering")] * 2


def test_every_concern_reads_its_facts_in_the_one_script_and_parses_them():
    spec = load_spec(EXAMPLES_DIR / "seed1-3090.yml")
    (target,) = spec_targets(spec)
    commands = host_commands(target.expected)
    assert {"virt", "sysctl", "boot_files", "mountinfo", "shm_statfs", "tcp_table", "tcp6_table", "unit0", "gpu",
            "gpu_boot_unit", "managed0"} <= set(commands)
    facts = parse_facts(target.expected, {name: Output("", 1) for name in commands} | {
        "sysctl": Output("[]", 0), "page_size": Output("4096", 0)})
    assert facts.problems == {} and facts.container is None and facts.units["vllm-qwen7b.service"].shown == {}


@pytest.fixture
def standin_server(tmp_path):
    """The TEST DOUBLE vllm server on a free local port (plain http)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # the TEST DOUBLE vllm, run from its source tree
    server = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", "org/model", "--host",
                               "127.0.0.1", "--port", str(port)], stdout=subprocess.DEVNULL,
                              env={**os.environ, "PYTHONPATH": str(STANDIN_PACKAGE), "VLLM_STANDIN_CATALOG": str(CATALOG)})
    for _ in range(100):
        with socket.socket() as attempt:
            if attempt.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.05)
    yield port
    server.kill()
    server.wait()


PROBES = {"http": ["bash", "-c", HTTP_PROBE.read_text(), "127.0.0.1"], "https": [sys.executable, "-c", HTTPS_PROBE.read_text()]}


def probe(scheme: str, port: int) -> dict[str, dict]:
    """Run a probe here as the fact read runs it on a host (stderr with stdout; no newline translation)."""
    run = subprocess.run([*PROBES[scheme], "vllm-x.service", "127.0.0.1", str(port)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=10)
    return http_answers(run.stdout.decode())


def test_the_http_probe_gets_health_and_models_from_a_server(standin_server):
    answers = probe("http", standin_server)
    assert answers["/health"]["status"] == 200
    assert json.loads(answers["/v1/models"]["body"])["data"][0]["id"] == "org/model"


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_the_probes_say_why_when_nothing_answers(standin_server, scheme):
    closed = standin_server + 1 if standin_server < 65535 else 1
    answers = probe(scheme, closed)
    assert "Connection refused" in answers["/health"]["error"]
    assert "Connection refused" in answers["/v1/models"]["error"]
    assert answers["/health"]["error"].startswith("127.0.0.1: ")  # the server's host, not the unit's name


def test_gpu_facts_come_from_the_recorded_h200_query_as_the_module_reads_it():
    recorded = (GPU_FIXTURES / "h200x2" / "query-gpu.csv").read_text()
    facts, problem = parse_gpu(Output(recorded, 0), "nvidia-smi")
    assert problem is None and facts.source == "nvidia-smi" and facts.driver_version == "580.159.04"
    assert [(gpu.index, gpu.name, gpu.power_limit_w, gpu.persistence_mode) for gpu in facts.gpus] == [
        (0, "NVIDIA H200", 700.0, True), (1, "NVIDIA H200", 700.0, True)]
    assert facts.gpus[0].uuid == "GPU-4b0b4056-7044-6b7c-5c07-ac8934fd439c"
    assert facts.links == (facts.link(0, 1),) and facts.link(0, 1).p2p is None  # the audit reads no topology


@pytest.mark.parametrize("out, problem", [
    (Output("bash: line 9: nvidia-smi: command not found", 127), "nvidia-smi not on the PATH"),
    (Output("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", 9),
     "nvidia-smi exited 9: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."),
    (Output("index, uuid\n0, GPU-1, extra", 0), "nvidia-smi: "),
])
def test_unreadable_gpu_facts_say_why(out, problem):
    facts, why = parse_gpu(out, "nvidia-smi")
    assert facts is None and why.startswith(problem)


def test_gpu_facts_are_read_only_where_gpus_are_expected():
    expected = {"sysctl": {"file": None, "settings": {}}, "nouveau": {"enabled": False}, "shm": {}, "units": [],
                "gpu": None}
    assert "gpu" not in host_commands(expected)
    expected["gpu"] = {"nvidia_smi": "/opt/nv/bin/nvidia-smi", "devices": [{"index": 0}]}
    assert host_commands(expected)["gpu"].startswith("/opt/nv/bin/nvidia-smi --query-gpu=index,uuid,name,")


@pytest.mark.parametrize("out, found", [
    (Output("0\n1\n", 0), {"indexes": [0, 1], "problem": None}),
    (Output("", 3), {"indexes": [], "problem": "no nvidia-smi on the PATH"}),
    (Output("", 0), {"indexes": [], "problem": "nvidia-smi lists no GPU"}),
    (Output("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n", 9),
     {"indexes": [], "problem": "nvidia-smi exited 9: NVIDIA-SMI has failed because it couldn't communicate "
                                "with the NVIDIA driver."}),
])
def test_discovery_lists_the_gpus_nvidia_smi_sees(out, found):
    assert gpu_indexes(out, "nvidia-smi") == found


def ready(port: int, model: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(READY_PROBE), "--base-url", f"http://127.0.0.1:{port}", "--model", model,
                           "--timeout", "5", "--once"], capture_output=True, text=True, timeout=20)


def test_the_readiness_probe_needs_one_real_request_served(standin_server):
    served = ready(standin_server, "org/model")
    assert served.returncode == 0, served.stderr
    assert served.stdout.strip() == (f"wait-ready: ready: http://127.0.0.1:{standin_server}/health answered 200, "
                                     "POST /v1/completions answered 200 with choices")
    wrong = ready(standin_server, "other/model")
    assert wrong.returncode == 1
    assert "POST /v1/completions answered 404: " in wrong.stderr and "The model `other/model` does not exist" in wrong.stderr


def test_the_readiness_probe_says_why_when_nothing_listens():
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    refused = ready(port, "org/model")
    assert refused.returncode == 1 and "Connection refused" in refused.stderr


KERNEL_FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "kernel"


def test_modprobe_dry_run_recorded_on_debian_kernel_is_refused():
    """Recorded in the qemu VM (Debian 6.1 kernel, kmod 30) with our blacklist-nouveau.conf."""
    output = (KERNEL_FIXTURES / "modprobe-dry-run-nouveau.txt").read_text()
    assert modprobe_dry_run("nouveau", output) == (True, "install /bin/false modeset=0")


def test_modprobe_dry_run_without_the_install_line_would_load_the_module():
    output = (KERNEL_FIXTURES / "modprobe-dry-run-nouveau.txt").read_text().replace(
        "install /bin/false modeset=0", "insmod /lib/modules/6.1.0-57-amd64/kernel/drivers/gpu/drm/nouveau/nouveau.ko modeset=0")
    refused, actual = modprobe_dry_run("nouveau", output)
    assert not refused
    assert actual == "would load: insmod /lib/modules/6.1.0-57-amd64/kernel/drivers/gpu/drm/nouveau/nouveau.ko modeset=0"


def test_modprobe_dry_run_with_nothing_printed_is_not_refused():
    assert modprobe_dry_run("nouveau", "") == (False, "no output")


# --------------------------------------------------------------------------- the boot unit, the venv's vLLM, managed files

import base64  # noqa: E402
from types import SimpleNamespace  # noqa: E402

from provisioner.audit.checks import gpu_boot_unit, managed_files, vllm_install  # noqa: E402
from provisioner.audit.engine import parse_facts  # noqa: E402
from provisioner.audit.expectations import spec_targets  # noqa: E402
from provisioner.base.paths import EXAMPLES_DIR  # noqa: E402
from provisioner.spec import load_spec  # noqa: E402
from tests.unit.audit_rows import run_row  # noqa: E402

BOOT_UNIT = {"name": "nvidia-gpu-limits.service", "fragment": "/etc/systemd/system/nvidia-gpu-limits.service",
             "enabled": "enabled", "type": "oneshot", "active_after_success": "active"}
RAN = {"LoadState": "loaded", "UnitFileState": "enabled", "ActiveState": "active", "SubState": "exited",
       "Result": "success", "ExecMainStatus": "0", "ExecMainExitTimestamp": "Wed 2026-12-02 06:04:43 UTC"}


def row(check, item, **facts) -> tuple[str, str, str, str]:
    """(status, check, expected, actual) of one check run on `item` with these facts."""
    status, shown = run_row(check, Case("h", {}, item), SimpleNamespace(**facts))
    return status, shown["check"], shown["expected"], shown["actual"]


@pytest.mark.parametrize("state, status, actual", [
    ({}, "passed", "success"),
    ({"Result": "exit-code", "ExecMainStatus": "1", "ActiveState": "failed", "SubState": "failed"}, "failed",
     "exit-code (status 1 at Wed 2026-12-02 06:04:43 UTC); failed (failed)"),
    ({"ActiveState": "inactive", "SubState": "dead", "ExecMainExitTimestamp": ""}, "failed",
     "not run since boot; inactive (dead)"),
    ({"ActiveState": "inactive", "SubState": "dead"}, "failed",
     "success at Wed 2026-12-02 06:04:43 UTC, not active since: inactive (dead)"),
    ({"ActiveState": "activating", "SubState": "auto-restart", "Result": "exit-code", "ExecMainStatus": "1"}, "failed",
     "exit-code (status 1 at Wed 2026-12-02 06:04:43 UTC); activating (auto-restart)"),
    ({"LoadState": "not-found"}, "n/a",
     "n/a: the unit file is missing: see file /etc/systemd/system/nvidia-gpu-limits.service"),
])
def test_the_boot_units_last_run_is_a_success_that_left_it_active(state, status, actual):
    assert row(gpu_boot_unit.boot_unit_last_run, BOOT_UNIT, gpu_boot_unit={**RAN, **state}) == (
        status, "nvidia-gpu-limits.service: last run", "success", actual)


@pytest.mark.parametrize("state, status, actual", [
    ("enabled", "passed", "enabled"), ("disabled", "failed", "disabled"), ("masked", "failed", "masked")])
def test_the_boot_unit_is_enabled(state, status, actual):
    shown = {**RAN, "UnitFileState": state, **({"LoadState": "masked"} if state == "masked" else {})}
    assert row(gpu_boot_unit.boot_unit_enabled, BOOT_UNIT, gpu_boot_unit=shown) == (
        status, "nvidia-gpu-limits.service: enabled", "enabled", actual)


@pytest.mark.parametrize("out, status, actual", [
    (Output("0.25.0\n", 0), "passed", "0.25.0"),
    (Output("0.33.0\n", 0), "failed", "0.33.0"),
    (Output("(not installed)\n", 3), "failed", "((not installed))"),
    (Output("no /opt/vllm/venv/bin/python\n", 4), "failed", "(no /opt/vllm/venv/bin/python)"),
])
def test_the_venvs_vllm_is_the_pinned_version(out, status, actual):
    install = {"venv": "/opt/vllm/venv", "version": "0.25.0"}
    assert row(vllm_install.vllm_version, install, vllm_version=out) == (
        status, "vLLM in /opt/vllm/venv", "0.25.0", actual)


def install_paths(path: Path, version: str = "0.25.0") -> dict[str, str]:
    """vllm_install's expectations for an install folder `path` (as expectations.vllm_install_expectations)."""
    return {"venv": f"{path}/venvs/{version}", "version": version, "path": str(path), "venvs": f"{path}/venvs",
            "current": f"{path}/current", "previous": f"{path}/previous", "unversioned": f"{path}/venv"}


def install_commands(install: dict[str, str]) -> dict[str, str]:
    return host_commands({"sysctl": {"file": None, "settings": {}}, "nouveau": {"enabled": False}, "shm": {},
                          "units": [], "vllm_install": install})


def test_the_venvs_vllm_version_is_read_without_importing_vllm(tmp_path):
    command = install_commands({**install_paths(tmp_path), "venv": str(tmp_path)})["vllm_version"]
    missing = subprocess.run(["bash", "-c", command], capture_output=True, text=True)
    assert (missing.returncode, missing.stdout.strip()) == (4, f"no {tmp_path}/bin/python")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").symlink_to(sys.executable)  # this Python has no vllm distribution
    absent = subprocess.run(["bash", "-c", command], capture_output=True, text=True)
    assert (absent.returncode, absent.stdout.strip(), absent.stderr) == (3, "(not installed)", "")


UNIT_TEXT = """[Unit]
Description=vLLM chat
[Service]
User=vllm
Environment=CUDA_VISIBLE_DEVICES=GPU-1
EnvironmentFile=/etc/vllm/chat.env
ExecStart=/opt/vllm/venvs/0.25.0/bin/vllm serve --config /etc/vllm/chat.yaml
"""
UNIT_FILE = {"path": "/etc/systemd/system/vllm-chat.service", "role": "vllm_service", "owner": "root:root",
             "mode": "0644", "content": UNIT_TEXT,
             "skip": {"section": "Service", "keys": ["ExecStart", "User"], "environment": ["CUDA_VISIBLE_DEVICES"]}}


@pytest.mark.parametrize("found, status, actual", [
    ((("0644", "root:root"), UNIT_TEXT), "passed", "as rendered (7 lines, root:root 0644)"),
    ((("0600", "root:root"), UNIT_TEXT), "failed", "as rendered (7 lines, root:root 0600)"),
    ((("0644", "vllm:vllm"), UNIT_TEXT), "failed", "as rendered (7 lines, vllm:vllm 0644)"),
    (None, "failed", "(absent)"),
    # rows of their own read these as systemd runs them: not this row's
    ((("0644", "root:root"), UNIT_TEXT.replace("User=vllm", "User=root").replace("GPU-1", "0")), "passed",
     "as rendered (7 lines, root:root 0644)"),
    ((("0644", "root:root"), UNIT_TEXT.replace("Description=vLLM chat", "Description=mine")), "failed",
     "line 2: 'Description=mine' instead of 'Description=vLLM chat' (root:root 0644)"),
    ((("0644", "root:root"), UNIT_TEXT.replace("User=vllm\n", "User=vllm\nEnvironment=LD_PRELOAD=/x.so\n")), "failed",
     "line 5: 'Environment=LD_PRELOAD=/x.so' instead of 'EnvironmentFile=/etc/vllm/chat.env' (root:root 0644)"),
    ((("0644", "root:root"), UNIT_TEXT + "Nice=5\n"), "failed", "line 8: 'Nice=5' added (root:root 0644)"),
    ((("0644", "root:root"), UNIT_TEXT.replace("EnvironmentFile=/etc/vllm/chat.env\n", "")), "failed",
     "ends at line 6; missing 'EnvironmentFile=/etc/vllm/chat.env' (root:root 0644)"),  # ExecStart=: its own row
])
def test_a_managed_file_is_present_as_rendered_with_its_owner_and_mode(found, status, actual):
    assert row(managed_files.managed_file, UNIT_FILE, managed_files={UNIT_FILE["path"]: found}) == (
        status, "file /etc/systemd/system/vllm-chat.service", "as rendered (7 lines, root:root 0644)", actual)


def test_a_copied_file_is_compared_whole():
    script = {**UNIT_FILE, "path": "/usr/local/lib/x", "mode": "0755", "skip": None, "content": "a\nb\n"}
    assert row(managed_files.managed_file, script,
               managed_files={"/usr/local/lib/x": (("0755", "root:root"), "a\nc\n")})[3] == "line 2: 'c' instead of 'b' (root:root 0755)"
    assert row(managed_files.managed_file, script,
               managed_files={"/usr/local/lib/x": (("0755", "root:root"), "a\nb")})[3] == (
        "differs in line endings or a final newline (root:root 0755)")


def test_the_gpu_settings_file_is_rendered_from_the_gpus_read_with_the_modules_targets():
    spec = load_spec(EXAMPLES_DIR / "seed1-3090.yml")
    (target,) = spec_targets(spec)
    settings = next(file for file in target.expected["managed_files"] if file["path"].endswith(".conf"))
    gpus, _ = parse_gpu(Output((GPU_FIXTURES / "rtx3090" / "query-gpu.csv").read_text(), 0), "nvidia-smi")
    written = ("# Managed by vllm-provision (role nvidia_gpu): change the spec and apply again.\n"
               "# Applied at every boot by nvidia-gpu-limits.service (/usr/local/lib/vllm-provision/nvidia-gpu-limits).\n"
               "# persistence mode on every GPU\npersistence_mode on\n# one GPU per line: <UUID> <power limit in watts>\n"
               "GPU-5e3c1a2b-7d4f-4c1e-9a8b-3f2e1d0c9b8a 350  # GPU 0, power_limit default\n")
    found = {settings["path"]: (("0644", "root:root"), written)}
    assert row(managed_files.managed_file, settings, gpu=gpus, gpu_problem=None, managed_files=found) == (
        "passed", "file /etc/vllm-provision/nvidia-gpu-limits.conf", "as rendered (6 lines, root:root 0644)",
        "as rendered (6 lines, root:root 0644)")
    lowered = {settings["path"]: (("0644", "root:root"), written.replace(" 350 ", " 300 "))}
    assert row(managed_files.managed_file, settings, gpu=gpus, gpu_problem=None, managed_files=lowered)[3] == (
        "line 6: 'GPU-5e3c1a2b-7d4f-4c1e-9a8b-3f2e1d0c9b8a 300  # GPU 0, power_limit default' instead of "
        "'GPU-5e3c1a2b-7d4f-4c1e-9a8b-3f2e1d0c9b8a 350  # GPU 0, power_limit default' (root:root 0644)")
    assert row(managed_files.managed_file, settings, gpu=None, gpu_problem="nvidia-smi not on the PATH",
               managed_files=found)[::3] == ("n/a", "n/a: the GPUs could not be read (nvidia-smi not on the PATH): see GPU count")


def test_managed_files_boot_unit_and_vllm_are_read_in_the_one_round_trip():
    spec = load_spec(EXAMPLES_DIR / "seed1-3090.yml")
    (target,) = spec_targets(spec)
    commands = host_commands(target.expected)
    assert commands["gpu_boot_unit"] == ("systemctl show nvidia-gpu-limits.service --property=LoadState,UnitFileState,"
                                         "ActiveState,SubState,Result,ExecMainStatus,ExecMainExitTimestamp")
    files = target.expected["managed_files"]
    assert [commands[f"managed{index}"] for index in range(len(files))][0] == (
        "stat -c '%a %U:%G' /usr/local/lib/vllm-provision/nvidia-gpu-limits && "
        "base64 -w0 /usr/local/lib/vllm-provision/nvidia-gpu-limits")
    outputs = {name: Output("", 1) for name in commands}
    outputs.update({"virt": Output("systemd-nspawn", 0), "sysctl": Output("[]", 0), "page_size": Output("4096", 0),
                    "shm": Output("", 1), "gpu": Output("", 127)})
    outputs["gpu_boot_unit"] = Output("".join(f"{key}={value}\n" for key, value in RAN.items()), 0)
    outputs["managed0"] = Output("755 root:root\n" + base64.b64encode(b"#!/usr/bin/python3\n").decode() + "\n", 0)
    outputs["vllm_version"] = Output("0.25.0\n", 0)
    facts = parse_facts(target.expected, outputs)
    assert facts.gpu_boot_unit == RAN and facts.vllm_version == Output("0.25.0\n", 0)
    assert facts.managed_files[files[0]["path"]] == (("0755", "root:root"), "#!/usr/bin/python3\n")
    assert facts.managed_files[files[1]["path"]] is None  # absent


def test_a_unit_file_systemd_did_not_load_is_left_to_the_units_own_row():
    unit_file = {**UNIT_FILE, "unit": "vllm-chat.service"}
    masked = {"vllm-chat.service": SimpleNamespace(shown={"LoadState": "masked"})}
    linked = {unit_file["path"]: (("0777", "root:root"), "")}  # the mask: a link to /dev/null
    assert row(managed_files.managed_file, unit_file, units=masked, managed_files=linked)[::3] == (
        "n/a", "n/a: systemd did not load vllm-chat.service (masked): see vllm-chat.service: unit file")
    loaded = {"vllm-chat.service": SimpleNamespace(shown={"LoadState": "loaded"})}
    assert row(managed_files.managed_file, unit_file, units=loaded, managed_files=linked)[0] == "failed"
    boot = {**UNIT_FILE, "path": BOOT_UNIT["fragment"], "unit": BOOT_UNIT["name"], "skip": None}
    assert row(managed_files.managed_file, boot, units={}, gpu_boot_unit={**RAN, "LoadState": "masked"},
               managed_files={boot["path"]: (("0777", "root:root"), "")})[::3] == (
        "n/a", "n/a: nvidia-gpu-limits.service is masked: see nvidia-gpu-limits.service: enabled")


def venvs_read(path: Path, install: dict[str, str]) -> dict[str, str]:
    """What the audit's VLLM_VENVS command reads on a real folder tree, as parse_facts keeps it."""
    out = subprocess.run(["bash", "-c", install_commands(install)["vllm_venvs"]], capture_output=True, text=True,
                         check=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


@pytest.mark.parametrize("pinned, venvs, current, previous, unversioned, status, actual", [
    ("0.25.0", ["0.25.0"], "0.25.0", None, False, "passed", "0.25.0 running"),
    ("0.33.0", ["0.25.0", "0.33.0"], "0.33.0", "0.25.0", False, "passed", "0.33.0 running, 0.25.0 previous"),
    ("0.33.0", ["0.25.0", "0.33.0"], "0.25.0", None, False, "failed", "0.25.0 running, 0.33.0 left over"),  # rolled back
    ("0.25.0", ["0.20.0", "0.25.0", "0.33.0"], "0.25.0", "0.33.0", False, "failed",
     "0.25.0 running, 0.33.0 previous, 0.20.0 left over"),
    ("0.25.0", ["0.25.0"], "0.25.0", None, True, "failed", "0.25.0 running, {root}/venv left over"),
    ("0.25.0", ["0.25.0"], None, None, True, "failed", "none running (no current link), 0.25.0 left over, {root}/venv left over"),
])
def test_the_venvs_are_the_running_version_and_at_most_one_previous(tmp_path, pinned, venvs, current, previous,
                                                                    unversioned, status, actual):
    for version in venvs:
        (tmp_path / "venvs" / version).mkdir(parents=True)
    for link, version in (("current", current), ("previous", previous)):
        if version:
            (tmp_path / link).symlink_to(tmp_path / "venvs" / version)
    if unversioned:
        (tmp_path / "venv").mkdir()
    install = install_paths(tmp_path, pinned)
    assert row(vllm_install.vllm_versions, install, vllm_venvs=venvs_read(tmp_path, install)) == (
        status, f"vLLM versions in {tmp_path}", f"{pinned} running, at most one previous", actual.format(root=tmp_path))


class LocalShell:
    """Runs the read's script here, with bash, as a host's ssh runs it (stdout and stderr apart)."""

    def run(self, script: str) -> SimpleNamespace:
        done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
        return SimpleNamespace(rc=done.returncode, stdout=done.stdout, stderr=done.stderr)


def test_the_read_runs_every_command_in_one_script_and_frames_each_in_order():
    from provisioner.audit.engine import run_commands

    commands = {"plain": "echo plain", "fails": "echo why >&2; exit 3", "none": "true", "lines": "printf 'a\\nb'",
                "marker": "echo '@@vp-audit-0 plain'"}
    assert run_commands(LocalShell(), commands) == {
        "plain": Output("plain\n", 0), "fails": Output("why\n", 3), "none": Output("", 0), "lines": Output("a\nb", 0),
        "marker": Output("@@vp-audit-0 plain\n", 0)}


def test_the_in_process_audit_imports_no_pytest():
    code = ("import sys; import provisioner.cli.audit_cmd, provisioner.audit.runner, provisioner.audit.check_docs; "
            "from provisioner.audit.registry import all_checks; all_checks(); print('pytest' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"
