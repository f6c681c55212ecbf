"""Profile mode's discovery of vLLM servers among a host's processes, fed by the recording of two real
vLLM 0.25.0 servers on an H200 (tests/fixtures/gpu/h200-processes/record.json): one server per
process tree, its cgroup read as what supervises it, nvidia-smi's compute processes mapped to their
servers through the parent chain, and the memory shares on each card added up. Also the host-side
scan on this machine's real /proc, and the TEST DOUBLE nvidia-smi's compute processes against the
recorded format."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from provisioner.audit import processes
from provisioner.audit.discovery import (
    Output,
    attach_gpu_use,
    compute_apps,
    gpu_cards,
    owner_of,
    place_servers,
    process_scan,
    supervision,
)
from provisioner.audit.expectations import (
    bind_verdict,
    gpu_card_shares,
    load_profile,
    profile_expectations,
)
from provisioner.audit.processes import group_servers, is_vllm_command, launched_via
from provisioner.vllm.serve_args import command_options, config_options, memory_share
from tests.doubles import nvidia_smi_standin

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gpu"
RECORD = json.loads((FIXTURES / "h200-processes" / "record.json").read_text())
RECORDED_KEY = "sk-recorded-not-a-secret"
STANDIN_PACKAGE = Path(__file__).resolve().parents[1] / "doubles" / "vllm_package"
CATALOG = Path(__file__).resolve().parents[2] / "provisioner" / "vllm" / "catalogs" / "vllm-0.25.0.json"
STANDIN_NVIDIA_SMI = Path(nvidia_smi_standin.__file__)
UUID = "GPU-339c9e06-67b2-4e5c-d342-d4e3ce0c1b7b"


def recorded_processes() -> dict[int, dict]:
    """The recording's process trees as processes.read_processes gives them, under record.py's own process."""
    found = {488: {"ppid": 475, "comm": "python3", "cmdline": ["python3", "record.py", "--out", "/root/out"], "uid": 0}}
    for tree in RECORD["processes"].values():
        for process in tree:
            found[process["pid"]] = {**{key: process[key] for key in ("ppid", "comm", "uid", "cgroup")},
                                     "cmdline": processes.command_words("\0".join(process["cmdline"]).encode() + b"\0")}
    return found


def recorded_scan() -> dict:
    """What processes.scan() would have printed on the H200 (the facts it reads beyond the recording: none)."""
    found = recorded_processes()
    servers = []
    for server in group_servers(found):
        main = found[server["pid"]]
        servers.append({**server, "uid": main["uid"], "user": "root", "cmdline": main["cmdline"],
                        "cgroup": processes.cgroup_path(main["cgroup"]), "via": launched_via(server, found),
                        "environment": {}, "api_key_in_environment": False, "shm_bytes": 137438953472,
                        "host_ipc": True, "host_shm": True, "config": None})
    return {"parents": {str(pid): p["ppid"] for pid, p in found.items()},
            "comm": {str(pid): p["comm"] for pid, p in found.items()}, "servers": servers}


def test_the_recorded_servers_are_two_each_counted_once_with_their_engine_core():
    found = recorded_processes()
    assert [process["cmdline"] for process in found.values() if process["comm"] == "VLLM::EngineCor"] == [
        ["VLLM::EngineCore"], ["VLLM::EngineCore"]]  # its title rewritten: trailing empty words dropped
    assert group_servers(found) == [
        {"pid": 492, "wrappers": [], "tree": [492, 730, 731]},
        {"pid": 493, "wrappers": [], "tree": [493, 723, 724]},
    ]
    assert is_vllm_command(found[492]["cmdline"])  # python3 -m vllm.entrypoints.cli.main serve …
    assert not is_vllm_command(found[731]["cmdline"]) and not is_vllm_command(found[730]["cmdline"])


def test_a_wrapper_is_part_of_its_server_and_a_shell_is_no_server():
    found = {
        10: {"ppid": 1, "comm": "bash", "cmdline": ["bash", "-c", "vllm serve a --port 1; echo done"], "dash_c": True},
        11: {"ppid": 10, "comm": "vllm", "cmdline": ["/usr/bin/python3", "/v/bin/vllm", "serve", "a"]},
        20: {"ppid": 1, "comm": "sudo", "cmdline": ["sudo", "-u", "vllm", "/v/bin/vllm", "serve", "b"]},
        21: {"ppid": 20, "comm": "timeout", "cmdline": ["timeout", "1d", "/v/bin/vllm", "serve", "b"]},
        22: {"ppid": 21, "comm": "vllm", "cmdline": ["/usr/bin/python3", "/v/bin/vllm", "serve", "b"]},
        23: {"ppid": 22, "comm": "VLLM::EngineCor", "cmdline": ["VLLM::EngineCore"]},
    }
    assert group_servers(found) == [{"pid": 11, "wrappers": [], "tree": [11]},
                                    {"pid": 22, "wrappers": [21, 20], "tree": [22, 23]}]
    shell, wrapped = group_servers(found)
    assert launched_via(shell, found) == ["bash -c (pid 10)"]
    assert launched_via(wrapped, found) == ["timeout (pid 21)", "sudo (pid 20)"]


@pytest.mark.parametrize("ancestors, sighup_ignored, via", [
    ([], True, ["nohup"]),
    ([("bash", True)], False, ["bash -c (pid 101)"]),
    ([("bash", False), ("tmux: server", False)], False, ["bash (pid 101)", "tmux"]),
    ([("bash", False), ("SCREEN", False)], True, ["nohup", "bash (pid 101)", "screen"]),
    ([("sh", True), ("cron", False), ("cron", False)], False, ["sh -c (pid 101)", "cron"]),
    ([("bash", False), ("sshd", False), ("bash", False)], False, ["bash (pid 101)"]),  # the walk stops at sshd
])
def test_how_a_server_was_started_is_read_from_its_ancestors(ancestors, sighup_ignored, via):
    found = {100: {"ppid": 101 if ancestors else 1, "comm": "python3", "cmdline": ["vllm", "serve", "m"],
                   "sighup_ignored": sighup_ignored}}
    for offset, (comm, dash_c) in enumerate(ancestors):
        pid = 101 + offset
        found[pid] = {"ppid": pid + 1 if offset + 1 < len(ancestors) else 1, "comm": comm, "cmdline": [comm],
                      "dash_c": dash_c}
    (server,) = group_servers(found)
    assert launched_via(server, found) == via


@pytest.mark.parametrize("cgroup, kind, name", [
    ("/system.slice/my-llm.service", "unit", "my-llm.service"),
    ("/system.slice/system-vllm.slice/vllm@a.service", "unit", "vllm@a.service"),
    ("/system.slice/cron.service", "unit", "cron.service"),
    ("/user.slice/user-0.slice/session-3.scope", "session", "session-3.scope"),
    ("/user.slice/user-1000.slice/user@1000.service/app.slice/llm.service", "user unit", "llm.service"),
    ("/user.slice/user-1000.slice/user@1000.service/init.scope", "scope", "init.scope"),
    ("/system.slice/run-r3c1f.scope", "scope", "run-r3c1f.scope"),
    ("/system.slice/docker-" + "a" * 64 + ".scope", "container", "a" * 64),
    ("/machine.slice/libpod-" + "b" * 64 + ".scope/container", "container", "b" * 64),
    ("/system.slice/vllm-x.service/libpod-payload-" + "c" * 64, "container", "c" * 64),
    ("/docker/" + "d" * 64, "container", "d" * 64),
    ("/process_api/ac7e42800e7dbef947ba372532b3ef7e", "none", "/process_api/ac7e42800e7dbef947ba372532b3ef7e"),
])
def test_a_cgroup_says_what_supervises_a_process(cgroup, kind, name):
    placed = supervision(cgroup)
    assert (placed["kind"], placed["name"], placed["cgroup"]) == (kind, name, cgroup)


def test_cgroup_files_give_the_unified_path_or_systemds_named_one():
    assert processes.cgroup_path("0::/system.slice/a.service\n") == "/system.slice/a.service"
    assert processes.cgroup_path("12:cpu:/x\n1:name=systemd:/system.slice/b.service\n0::/\n") == "/"
    assert processes.cgroup_path("12:cpu:/x\n1:name=systemd:/system.slice/b.service\n") == "/system.slice/b.service"


def test_compute_processes_are_mapped_to_the_server_whose_engine_core_holds_them():
    apps = compute_apps(RECORD["smi"]["compute_apps_noheader"]["stdout"])
    assert apps == [{"pid": 724, "mib": 27790, "uuid": UUID}, {"pid": 731, "mib": 19758, "uuid": UUID}]
    scan = recorded_scan()
    servers = place_servers(scan["servers"], [], [], [])
    assert [server["name"] for server in servers] == ["process 492", "process 493"]
    assert owner_of(724, scan["parents"], servers)["pid"] == 493  # EngineCore 724 is 493's child
    assert owner_of(731, scan["parents"], servers)["pid"] == 492
    assert owner_of(488, scan["parents"], servers) is None  # record.py itself: no server's
    # the recorded --query-gpu=index,uuid,pci.bus_id,memory.total,memory.used,… as discovery queries it
    index, uuid, _, total, used, _ = RECORD["smi"]["gpus"]["stdout"].split(", ")
    cards = attach_gpu_use(gpu_cards(Output(", ".join([index, uuid, total, used]), 0)), apps, servers, scan)
    assert servers[0]["gpus"] == [{"index": 0, "uuid": UUID, "mib": 19758}]
    assert cards == [{"index": 0, "uuid": UUID, "total_mib": 143771, "used_mib": 47563, "apps": [
        {"pid": 724, "mib": 27790, "server": "process 493", "comm": "VLLM::EngineCor"},
        {"pid": 731, "mib": 19758, "server": "process 492", "comm": "VLLM::EngineCor"}]}]


def recorded_expectations() -> dict:
    scan = recorded_scan()
    servers = place_servers(scan["servers"], [], [], [])
    cards = gpu_cards(Output("0, " + UUID + ", 143771, 47563\n", 0))
    discovered = {"units": [], "gpus": {"indexes": [0], "problem": None}, "container_tools": [], "containers": [],
                  "servers": servers, "processes_problem": None,
                  "gpu_cards": attach_gpu_use(cards, compute_apps(RECORD["smi"]["compute_apps_noheader"]["stdout"]),
                                              servers, scan)}
    return profile_expectations(load_profile("recommended"), discovered)


def test_the_recorded_servers_rows_say_what_is_wrong_and_never_the_key():
    expected = recorded_expectations()
    assert RECORDED_KEY not in json.dumps(expected)
    opened, local = expected["servers"]
    where = "cgroup /process_api/ac7e42800e7dbef947ba372532b3ef7e"
    assert expected["processes"]["bare"] == [f"process 492 ({where})", f"process 493 ({where})"]
    assert opened["supervised"] == {"passed": False, "actual": f"bare process 492 ({where}): nothing restarts it "
                                                                "after a crash or a reboot — run it as a unit"}
    assert opened["user"] == {"actual": "root (uid 0)", "passed": False}
    assert opened["bind"] == {"passed": True, "actual": "0.0.0.0:8000: every interface, /v1 needs the API key"}
    assert local["bind"] == {"passed": True, "actual": "127.0.0.1:8001"}
    assert opened["command_line"].endswith("--host 0.0.0.0 --port 8000 --api-key <redacted>")
    assert (opened["share"], opened["share_source"]) == (0.3, "--gpu-memory-utilization")
    assert opened["ipc"] == "the host's IPC namespace" and opened["listen"] == "0.0.0.0:8000"
    (card,) = expected["gpu_cards"]
    # started at the same moment, each took 0.30 of the card but their KV caches differ: the held MiB do too
    assert card == {"index": 0, "uuid": UUID, "sum": 0.6, "passed": True, "actual":
                    "process 493 0.30 (27790 MiB) + process 492 0.30 (19758 MiB) = 0.60; 47563 of 143771 MiB used"}


def test_memory_shares_above_one_fail_naming_each_server_and_its_share():
    scan = recorded_scan()
    scan["servers"][0]["cmdline"] = [word.replace("0.30", "0.75") for word in scan["servers"][0]["cmdline"]]
    servers = place_servers(scan["servers"], [], [], [])
    cards = attach_gpu_use([{"index": 0, "uuid": UUID, "total_mib": 143771, "used_mib": 140000}],
                           compute_apps(RECORD["smi"]["compute_apps_noheader"]["stdout"]) + [
                               {"pid": 488, "mib": 500, "uuid": UUID}], servers, scan)
    discovered = {"units": [], "gpus": {"indexes": [0], "problem": None}, "container_tools": [], "containers": [],
                  "servers": servers, "processes_problem": None, "gpu_cards": cards}
    (card,) = profile_expectations(load_profile("recommended"), discovered)["gpu_cards"]
    assert card["passed"] is False and card["sum"] == 1.05
    assert card["actual"] == ("process 493 0.30 (27790 MiB) + process 492 0.75 (19758 MiB) = 1.05; "
                              "140000 of 143771 MiB used; pid 488 (python3) 500 MiB, no vLLM server's")


def test_a_unit_or_container_holds_its_own_processes_and_a_wrapper_unit_joins_the_units():
    base = {"wrappers": [], "tree": [5], "uid": 0, "user": "root", "via": [], "environment": {}, "config": None,
            "cmdline": ["/v/bin/vllm", "serve", "m", "--port", "8100"]}
    found = [
        {**base, "pid": 5, "cgroup": "/system.slice/llm.service"},
        {**base, "pid": 6, "tree": [6], "cgroup": "/system.slice/docker-" + "e" * 64 + ".scope"},
        {**base, "pid": 7, "tree": [7], "cgroup": "/system.slice/start-llm.service"},
        {**base, "pid": 8, "tree": [8], "cgroup": "/system.slice/cron.service", "via": ["sh -c (pid 4)", "cron"]},
    ]
    units = [{"name": "llm.service", "fragment": "/etc/systemd/system/llm.service", "argv": base["cmdline"]}]
    containers = [{"name": "v", "id": "e" * 64, "tool": "docker", "restart": "no", "ipc": "private",
                   "ports": ["0.0.0.0:8100->8000/tcp"]}]
    blocks = [{"Id": "start-llm.service", "FragmentPath": "/etc/systemd/system/start-llm.service",
               "ExecStart": "{ path=/usr/local/bin/start-llm ; argv[]=/usr/local/bin/start-llm ; ignore_errors=no ; }"}]
    servers = place_servers(found, units, containers, blocks)
    assert [(server["kind"], server["name"]) for server in servers] == [
        ("unit", "llm.service"), ("container", "container v"), ("unit", "start-llm.service"), ("process", "process 8")]
    assert units[1] == {"name": "start-llm.service", "fragment": "/etc/systemd/system/start-llm.service",
                        "argv": base["cmdline"], "wrapper": ["/usr/local/bin/start-llm"]}
    expected = profile_expectations(load_profile("recommended"), {
        "units": units, "gpus": {"indexes": [], "problem": "no nvidia-smi on the PATH"}, "container_tools": ["docker"],
        "containers": [{**containers[0], "image": "vllm/vllm-openai", "shm_bytes": 67108864, "argv": base["cmdline"],
                        "environment": {}}],
        "servers": servers, "processes_problem": None, "gpu_cards": []})
    verdicts = {server["name"]: server["supervised"] for server in expected["servers"]}
    assert verdicts["llm.service"] == {"passed": True, "actual": "systemd unit llm.service"}
    assert verdicts["container v"] == {"passed": False, "actual": "docker container v, restart policy no: it comes back "
                                                                  "neither after a crash nor at boot — --restart "
                                                                  "unless-stopped, or run it from a unit"}
    assert verdicts["process 8"]["actual"] == ("bare process 8 (sh -c (pid 4), cron, started by cron.service): "
                                               "nothing restarts it after a crash or a reboot — run it as a unit")
    binds = {server["name"]: server["bind"]["actual"] for server in expected["servers"]}
    assert binds["container v"] == "0.0.0.0:8100: every interface and no API key — anyone who reaches port 8100 can use it"
    # no --host: every interface (the unit); published on 0.0.0.0 (the container); no key in either
    assert binds["llm.service"] == binds["container v"]
    assert expected["processes"]["bare"] == ["process 8 (sh -c (pid 4), cron, started by cron.service)"]


def test_the_scan_reads_a_real_process_tree_and_only_the_cuda_variables(tmp_path):
    """processes.scan() on this machine's /proc: a `vllm serve` command line under nohup with a child,
    its CUDA variables read, VLLM_API_KEY only as set/not set, no other variable of its environment."""
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
    environment = {**os.environ, "CUDA_VISIBLE_DEVICES": "GPU-1234", "VLLM_API_KEY": "sk-env-secret-77",
                   "DATABASE_PASSWORD": "hunter2-secret"}
    server = subprocess.Popen(["nohup", sys.executable, "-c", code, "vllm", "serve", "m", "--api-key", "sk-argv-5"],
                              env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            run = subprocess.run(own_network([sys.executable, str(Path(processes.__file__))]), capture_output=True,
                                 text=True, timeout=30)
            scan, problem = process_scan(Output(run.stdout, run.returncode))
            mine = [found for found in scan["servers"] if found["pid"] == server.pid]
            if mine and len(mine[0]["tree"]) == 2:
                break
            time.sleep(0.1)
        assert problem is None
        (found,) = mine
        assert found["cmdline"][-5:] == ["vllm", "serve", "m", "--api-key", "sk-argv-5"]
        assert found["environment"] == {"CUDA_VISIBLE_DEVICES": "GPU-1234"}
        assert found["api_key_in_environment"] is True
        assert found["via"][0] == "nohup" and found["uid"] == os.getuid()
        assert found["host_ipc"] == same_namespace_as_pid_1("ipc")  # None where /proc/1 is not ours to read
        assert found["shm_bytes"] == os.statvfs("/dev/shm").f_blocks * os.statvfs("/dev/shm").f_frsize
        assert found["cgroup"] == processes.cgroup_path(Path(f"/proc/{server.pid}/cgroup").read_text())
        assert "sk-env-secret-77" not in run.stdout and "hunter2-secret" not in run.stdout
        assert scan["parents"][str(found["tree"][1])] == server.pid
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def own_network(command: list[str]) -> list[str]:
    """`command` in a network namespace of its own: the scan asks the API of each server it finds listening,
    and must ask none of this machine's (a namespace sees only its own sockets). Skips where none can be made."""
    prefix = ["unshare", "--net"] if os.geteuid() == 0 else ["unshare", "--net", "--map-root-user"]
    if shutil.which("unshare") is None or shutil.which("ip") is None or subprocess.run(
            [*prefix, "ip", "link", "set", "lo", "up"], capture_output=True).returncode != 0:
        pytest.skip("no network namespace of its own for the scan here (unshare, ip)")
    return [*prefix, *command]


def same_namespace_as_pid_1(kind: str):
    try:
        return os.readlink(f"/proc/self/ns/{kind}") == os.readlink(f"/proc/1/ns/{kind}")
    except OSError:
        return None


def test_no_python3_or_a_broken_scan_is_said_so():
    assert process_scan(Output("", 3))[1] == "no python3 on the host to read its processes"
    assert process_scan(Output("Traceback…\nOSError: boom\n", 1))[1] == "reading the processes failed (exit 1: OSError: boom)"


# --------------------------------------------------------------------------- the TEST DOUBLEs


def standin_smi(tmp_path: Path, *arguments: str) -> str:
    """The TEST DOUBLE nvidia-smi run here, on a copy of the H200 fixture with the recorded card's UUID."""
    fixture = tmp_path / "fixture"
    fixture.mkdir(exist_ok=True)
    text = (FIXTURES / "h200x1" / "query-gpu.csv").read_text()
    (fixture / "query-gpu.csv").write_text(nvidia_smi_standin._with_uuids(text, [UUID]))
    environment = {**os.environ, "NVIDIA_SMI_STANDIN_FIXTURE": str(fixture),
                   "NVIDIA_SMI_STANDIN_STATE": str(tmp_path / "state.json"),
                   "NVIDIA_SMI_STANDIN_LOG": str(tmp_path / "calls.jsonl")}
    run = subprocess.run([sys.executable, str(STANDIN_NVIDIA_SMI), *arguments], capture_output=True, text=True,
                         env=environment, timeout=30)
    assert run.returncode == 0, run.stderr
    return run.stdout


@pytest.fixture
def standin_vllm():
    """The TEST DOUBLE vllm server, run from its source tree, with its `VLLM::EngineCore` child."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", "org/model", "--host",
                               "127.0.0.1", "--port", str(port), "--gpu-memory-utilization", "0.30"],
                              stdout=subprocess.DEVNULL,
                              env={**os.environ, "PYTHONPATH": str(STANDIN_PACKAGE), "VLLM_STANDIN_CATALOG": str(CATALOG),
                                   "CUDA_VISIBLE_DEVICES": UUID})
    for _ in range(200):
        children = Path(f"/proc/{server.pid}/task/{server.pid}/children").read_text().split()
        if children and Path(f"/proc/{children[0]}/cmdline").read_bytes().startswith(b"VLLM::EngineCore\0"):
            break
        time.sleep(0.05)
    yield server.pid, int(children[0])
    server.kill()
    server.wait()


def test_the_standin_lists_the_standin_servers_engine_core_as_nvidia_smi_does(tmp_path, standin_vllm):
    """Same columns and format as the recording, read by the same parser; the memory held by the engine
    core (the server's child), 0.30 of the card's; memory.used counts it."""
    server_pid, engine_core = standin_vllm
    share_mib = int(0.30 * 143771)
    noheader = standin_smi(tmp_path, "--query-compute-apps=pid,used_memory,gpu_uuid", "--format=csv,noheader,nounits")
    # other stand-in servers on this machine (a lab's hosts share its /proc) may be listed too: this one's row
    (row,) = [line for line in noheader.splitlines() if line.startswith(f"{engine_core}, ")]
    assert row == f"{engine_core}, {share_mib}, {UUID}"
    recorded = RECORD["smi"]["compute_apps_noheader"]["stdout"].splitlines()[0]
    assert [len(line.split(", ")) for line in (row, recorded)] == [3, 3]
    assert compute_apps(row) == [{"pid": engine_core, "mib": share_mib, "uuid": UUID}]
    with_header = standin_smi(tmp_path, "--query-compute-apps=pid,process_name,used_memory,gpu_uuid,gpu_bus_id",
                              "--format=csv")
    recorded_lines = RECORD["smi"]["compute_apps_csv"]["stdout"].splitlines()
    assert with_header.splitlines()[0] == recorded_lines[0]  # pid, process_name, used_gpu_memory [MiB], …
    (full,) = [line for line in with_header.splitlines() if line.startswith(f"{engine_core}, ")]
    assert full == f"{engine_core}, VLLM::EngineCore, {share_mib} MiB, {UUID}, 00000000:00:06.0"
    assert recorded_lines[1].split(", ")[1:] == ["VLLM::EngineCore", "27790 MiB", UUID, "00000000:00:06.0"]
    # walking up from the engine core finds the server
    assert int(Path(f"/proc/{engine_core}/stat").read_text().rsplit(")", 1)[1].split()[1]) == server_pid
    gpus = standin_smi(tmp_path, "--query-gpu=index,uuid,memory.total,memory.used", "--format=csv,noheader,nounits")
    used = int(gpus.split(", ")[3])
    assert used >= share_mib  # what the fixture's card used, plus what the engine cores hold


def test_the_engine_core_ends_with_its_server(standin_vllm):
    server_pid, engine_core = standin_vllm
    os.kill(server_pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{engine_core}").exists() and time.monotonic() < deadline:
        try:
            os.waitpid(engine_core, os.WNOHANG)
        except ChildProcessError:
            pass
        if Path(f"/proc/{engine_core}/stat").exists() and ") Z " in Path(f"/proc/{engine_core}/stat").read_text():
            break  # a zombie waiting for its reaper: it has ended
        time.sleep(0.05)
    assert not Path(f"/proc/{engine_core}").exists() or ") Z " in Path(f"/proc/{engine_core}/stat").read_text()


@pytest.mark.parametrize("listen, published, has_key, passed, actual", [
    ("127.0.0.1:8000", None, False, True, "127.0.0.1:8000"),
    ("10.0.0.5:8000", None, False, True, "10.0.0.5:8000"),
    ("0.0.0.0:8000", None, True, True, "0.0.0.0:8000: every interface, /v1 needs the API key"),
    ("[::]:8000", None, False, False, "[::]:8000: every interface and no API key — anyone who reaches port 8000 can use it"),
    ("0.0.0.0:8000", ["127.0.0.1:9000->8000/tcp"], False, True, "127.0.0.1:9000"),  # a container: where docker publishes
    ("0.0.0.0:8000", [], False, True, "no port published"),
])
def test_every_interface_fails_only_without_an_api_key(listen, published, has_key, passed, actual):
    assert bind_verdict(listen, published, has_key) == {"passed": passed, "actual": actual}


def test_the_memory_share_comes_from_the_command_line_then_the_config_file_then_vllms_default():
    assert memory_share(command_options(["vllm", "serve", "m", "--gpu-memory-utilization", "0.45"])) == (
        0.45, "--gpu-memory-utilization")
    assert memory_share({**config_options({"gpu-memory-utilization": 0.6}), **command_options(["vllm", "serve"])}) == (
        0.6, "--gpu-memory-utilization")
    assert memory_share(command_options(["vllm", "serve", "m"])) == (0.9, "vLLM's default")


def test_a_card_whose_compute_processes_could_not_be_read_fails_saying_so():
    card = {"index": 1, "uuid": UUID, "total_mib": 100, "used_mib": 50, "apps": [],
            "apps_problem": "nvidia-smi --query-compute-apps exited 6: Not Supported"}
    assert gpu_card_shares(card, {}) == {"index": 1, "uuid": UUID, "passed": False, "sum": None, "actual":
                                         "not read: nvidia-smi --query-compute-apps exited 6: Not Supported; "
                                         "50 of 100 MiB used"}


def test_a_config_file_is_read_as_the_process_reads_it(tmp_path, monkeypatch):
    """--config FILE through /proc/PID/root (absolute) or /proc/PID/cwd (relative), on a stand-in /proc."""
    monkeypatch.setattr(processes, "PROC", str(tmp_path))
    (tmp_path / "7" / "root" / "etc").mkdir(parents=True)
    (tmp_path / "7" / "root" / "etc" / "a.yaml").write_text("gpu-memory-utilization: 0.5\n")
    (tmp_path / "7" / "cwd").mkdir()
    (tmp_path / "7" / "cwd" / "b.yaml").write_text("port: 9000\n")
    assert processes.config_text(7, ["vllm", "serve", "--config", "/etc/a.yaml"]) == "gpu-memory-utilization: 0.5\n"
    assert processes.config_text(7, ["vllm", "serve", "--config=b.yaml"]) == "port: 9000\n"
    assert processes.config_text(7, ["vllm", "serve", "m"]) is None
