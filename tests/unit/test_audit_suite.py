"""The audit suite's parts that need no host: reading command output, discovery, the check helper, the plugin."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from provisioner.audit.checks import Audit, Drift
from provisioner.audit.discovery import gpu_indexes, vllm_containers, vllm_units
from provisioner.audit.expectations import is_vllm_command
from provisioner.audit.text import modprobe_dry_run
from provisioner.audit.suite.facts import (
    HTTP_PROBE,
    HTTPS_PROBE,
    Output,
    host_commands,
    http_answers,
    parse_gpu,
    parse_outputs,
    parse_unit,
)
from provisioner.audit.text import environment_words, show_blocks, shown_argv, shown_command, sysctl_settings

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
    assert container == {"name": "llm", "tool": "docker", "image": "vllm/vllm-openai:v0.25.0",
                         "ports": ["0.0.0.0:8000->8000/tcp"], "shm_bytes": 67108864,
                         "argv": ["vllm", "serve", "m", "--port", "8000"],
                         "environment": {"CUDA_VISIBLE_DEVICES": "0", "PATH": "/bin"}}
    assert vllm_containers("podman", "") == []


class FakeItem:
    def __init__(self):
        self.user_properties = []


def test_expect_records_expected_and_actual_and_raises_drift():
    item = FakeItem()
    Audit(item).expect("sysctl file: vm.swappiness", "1", "1")
    assert item.user_properties == [("check", "sysctl file: vm.swappiness"), ("expected", "1"), ("actual", "1")]
    with pytest.raises(Drift) as drift:
        Audit(item).expect("User", {"expected": "not root", "pattern": "^(?!root$)"}, "root")
    assert (drift.value.check, drift.value.expected, drift.value.actual) == ("User", "not root", "root")
    assert isinstance(drift.value, AssertionError)
    Audit(item).expect("flags", ["a", "b"], ["a", "b"])
    assert dict(item.user_properties)["actual"] == "a, b"


PLUGIN_CHECKS = '''
import pytest
from provisioner.audit.checks import Audit

@pytest.fixture
def audit(request):
    return Audit(request.node)

def test_same(audit):
    audit.expect("same", "1", "1")

def test_drifted(audit):
    audit.expect("drifted", "1", "60")

def test_in_a_container(audit):
    audit.not_applicable("live", "1", "a container shares its host's kernel")

def test_broken(audit):
    raise RuntimeError("ssh: connection closed")
'''


def test_plugin_reports_passed_failed_na_and_error(tmp_path):
    (tmp_path / "test_checks.py").write_text(PLUGIN_CHECKS)
    results = tmp_path / "results.json"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", str(tmp_path), "-p", "provisioner.audit.plugin", "-p", "no:cacheprovider",
         "-q", "--rootdir", str(tmp_path), "--audit-results", str(results)],
        capture_output=True, text=True, cwd=tmp_path,
    )
    reported = {result["check"]: result for result in json.loads(results.read_text())}
    assert {check: result["status"] for check, result in reported.items()} == {
        "same": "passed", "drifted": "failed", "live": "n/a", "test_broken": "error"}, run.stdout
    assert (reported["drifted"]["expected"], reported["drifted"]["actual"]) == ("1", "60")
    assert reported["live"]["message"] == "a container shares its host's kernel"
    assert "ssh: connection closed" in reported["test_broken"]["message"]
    assert run.stderr.count("@@audit ") == 5  # collected, then one line per check


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


PROBES = {"http": ["bash", "-c", HTTP_PROBE.read_text()], "https": [sys.executable, "-c", HTTPS_PROBE.read_text()]}


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
