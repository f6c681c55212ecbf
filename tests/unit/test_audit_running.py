"""What a vLLM server runs, beside what its files say (issue 35): the pure functions of
provisioner/audit/processes.py (run on the host) and provisioner/audit/running.py (the rows' words), fed by
/proc-shaped text and the recording of two real vLLM 0.25.0 servers on an H200
(tests/fixtures/gpu/h200-processes/record.json: its venv /opt/torch/.venv, pids 492 and 493, each with its
`VLLM::EngineCore` child); the rows of checks/vllm_service.py and checks/discovered.py that read them; the
spec's API key given to the probes on the session's standard input. The maps below are shaped as a real
vLLM server's (its compiled extensions in site-packages/vllm); the stand-in vLLM of the lab is pure Python
and maps none of them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import testinfra

from provisioner.audit import processes, running
from provisioner.audit.checks import discovered, vllm_service
from provisioner.audit.checks.vllm_service import UnitFacts
from provisioner.audit.discovery import compute_apps, process_scan, supervision
from provisioner.audit.engine import Facts, Output, host_secrets, run_commands
from provisioner.audit.instance_files import HTTP_PROBE, http_answers, key_source
from tests.unit.audit_rows import run_check
from tests.unit.standin import free_port
from tests.unit.standin import running as standin_running
from tests.unit.test_audit_discovery import (
    CATALOG,
    RECORD,
    STANDIN_PACKAGE,
    own_network,
    recorded_processes,
    recorded_scan,
)
from tests.unit.test_audit_sockets import PROC_NET_TCP

VENV = "/opt/torch/.venv/lib/python3.12/site-packages"
MAPS = f"""\
55d0c3a00000-55d0c3a2e000 r--p 00000000 00:2f 1311                       /usr/bin/python3.12
7f2a10000000-7f2a10200000 r--p 00000000 00:2f 88231                      {VENV}/torch/lib/libtorch_cuda.so
7f2a20000000-7f2a20400000 r-xp 00012000 00:2f 90412                      {VENV}/vllm/_C.abi3.so
7f2a20400000-7f2a20600000 r--p 00412000 00:2f 90412                      {VENV}/vllm/_C.abi3.so
7f2a30000000-7f2a30100000 r-xp 00000000 00:2f 90420                      {VENV}/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so
7f2a40000000-7f2a40021000 rw-p 00000000 00:00 0 
7ffd5b7e1000-7ffd5b802000 rw-p 00000000 00:00 0                          [stack]
"""


# --------------------------------------------------------------------------- the vLLM a server runs


def test_the_vllm_a_process_imported_is_read_from_its_maps_and_the_dist_info_beside():
    assert processes.vllm_objects(MAPS) == {"package": f"{VENV}/vllm", "deleted": False,
                                            "objects": ["_C.abi3.so", "vllm_flash_attn/_vllm_fa2_C.abi3.so"]}
    replaced = MAPS.replace("_C.abi3.so\n", "_C.abi3.so (deleted)\n", 1)
    assert processes.vllm_objects(replaced)["deleted"] is True
    assert processes.vllm_objects(MAPS.replace("/vllm/", "/not_vllm/")) is None  # torch alone is no vLLM
    names = ["torch-2.9.0.dist-info", "vllm", "vllm-0.25.0.dist-info", "triton"]
    assert processes.dist_version(names) == "0.25.0" and processes.dist_version(["vllm"]) is None
    imported = {**processes.vllm_objects(replaced), "version": "0.25.0"}
    assert running.running_version({"imported": imported}) == ("0.25.0 (deleted)", f"mapped from {VENV}/vllm (deleted)")
    assert running.running_version({"imported": None, "api_version": "0.25.0"}) == ("0.25.0", "its API's /version")
    assert running.running_version({}) == (None, "no vLLM object in its maps, no /version answer")
    # maps another user's process keeps from a non-root scan: not read, never "no vLLM object"
    assert running.running_version({"imported": {"problem": "/proc/492/maps not read"}}) == (
        None, "/proc/492/maps not read, no /version answer")


def test_a_process_tree_listens_on_the_sockets_among_its_open_files():
    links = ["/dev/null", "socket:[52211]", "pipe:[77]", "anon_inode:[eventfd]", "socket:[53001]"]
    assert processes.socket_inodes(links) == {52211, 53001}
    assert processes.listening_sockets(PROC_NET_TCP) == {52211: "0.0.0.0:8000", 52307: "127.0.0.1:8001"}


def test_a_port_answers_as_vllms_api_or_not():
    version = {"status": 200, "json": {"version": "0.25.0"}}
    assert processes.vllm_api_shape(version, {"status": 200, "json": {"object": "list", "data": []}})
    assert processes.vllm_api_shape(version, {"status": 401, "json": {"error": "Unauthorized"}})
    assert not processes.vllm_api_shape(version, {"status": 404, "json": {"detail": "Not Found"}})
    assert not processes.vllm_api_shape({"status": 404, "json": None}, {"status": 200, "json": {"object": "list"}})
    assert not processes.vllm_api_shape(None, None)


def test_a_launcher_script_found_by_its_maps_is_the_server_with_its_engine_core():
    """The recording's server 492 as a launcher script had run it (`python3 /root/launch.py`): no vLLM command
    line, found by its maps; the other server (a `vllm` command line) as before."""
    found = recorded_processes()
    found[492] = {**found[492], "cmdline": ["/opt/torch/.venv/bin/python3", "/root/launch.py"], "serves": "maps"}
    servers = processes.group_servers(found)
    assert [(server["pid"], server["tree"]) for server in servers] == [(492, [492, 730, 731]), (493, [493, 723, 724])]
    assert processes.script_of(found[492]["cmdline"]) == "/root/launch.py"
    assert processes.script_of(found[493]["cmdline"]) is None  # python -m: no script
    assert processes.script_of(["/opt/vllm/venv/bin/python3", "/opt/vllm/venv/bin/vllm", "serve", "m"]) == (
        "/opt/vllm/venv/bin/vllm")


# --------------------------------------------------------------------------- how it was started


CRONTABS = {
    "/var/spool/cron/crontabs/root": "# m h dom mon dow command\nMAILTO=\"\"\n@reboot /opt/vllm/venv/bin/vllm serve m"
                                     " --host 0.0.0.0 --port 8002 > /var/log/x 2>&1\n",
    "/etc/cron.d/llm": "SHELL=/bin/sh\n*/5 * * * * alice /usr/local/bin/llm-launch --port 8004\n",
}


def test_the_crontab_line_that_started_a_server_is_found_by_its_command():
    shell = "/opt/vllm/venv/bin/vllm serve m --host 0.0.0.0 --port 8002 > /var/log/x 2>&1"
    root = {"user": "root", "schedule": "@reboot", "file": "/var/spool/cron/crontabs/root"}
    assert processes.crontab_entry(CRONTABS, command=shell) == root
    # dash exec'd the command in place of `sh -c`: matched by the server's command line
    argv = ["/opt/vllm/venv/bin/python3", "/opt/vllm/venv/bin/vllm", "serve", "m", "--host", "0.0.0.0", "--port",
            "8002"]
    assert processes.crontab_entry(CRONTABS, argv=argv) == root
    assert processes.crontab_entry(CRONTABS, argv=argv[:-1] + ["8003"]) is None
    launcher = ["/usr/bin/python3", "/usr/local/bin/llm-launch", "--port", "8004"]
    assert processes.crontab_entry(CRONTABS, argv=launcher) == {
        "user": "alice", "schedule": "*/5 * * * *", "file": "/etc/cron.d/llm"}
    assert running.cron_words(root) == "root's crontab (@reboot)"
    assert running.cron_words({"user": "alice", "schedule": "@reboot", "file": "/etc/cron.d/llm"}) == (
        "/etc/cron.d/llm (@reboot, as alice)")


def test_how_a_server_was_started_in_words():
    cron = {"user": "root", "schedule": "@reboot", "file": "/var/spool/cron/crontabs/root"}
    cases = [
        ({"via": ["sh -c (pid 901)", "cron"], "cron": cron}, "0::/system.slice/cron.service", "",
         "root's crontab (@reboot)"),
        ({"via": [], "user": "llmuser"}, "0::/user.slice/user-1001.slice/user@1001.service/app.slice/llm.service", "",
         "user unit llm.service of llmuser"),
        ({"via": []}, "0::/system.slice/adhoc-llm.service", "/run/systemd/transient/adhoc-llm.service",
         "transient unit adhoc-llm.service"),
        ({"via": []}, "0::/system.slice/my-llm.service", "/etc/systemd/system/my-llm.service",
         "systemd unit my-llm.service"),
        ({"via": ["nohup"], "script": "/usr/local/bin/llm-launch"}, "0::/system.slice/ssh.service", "",
         "nohup, a script (/usr/local/bin/llm-launch)"),
        ({"via": ["bash -c (pid 12)", "tmux"]}, "0::/user.slice/user-0.slice/session-3.scope", "",
         "bash -c (pid 12), tmux, session-3.scope"),
        ({"via": []}, "0::/system.slice/docker-" + "ab12" * 16 + ".scope", "", "container ab12ab12ab12"),
    ]
    for server, cgroup, fragment, words in cases:
        assert running.started_by(server, supervision(cgroup.split("::", 1)[1]), fragment) == words, cgroup


# --------------------------------------------------------------------------- restart pending


STARTED = 1796509000.0


def test_a_file_changed_after_the_process_started_is_a_restart_pending():
    files = {"/etc/vllm/chat.yaml": STARTED + 600.5, "/etc/vllm/chat.env": STARTED - 30, "/gone": None}
    assert running.restart_pending(221, STARTED, files) == (
        False, "restart pending: /etc/vllm/chat.yaml (changed 2026-12-05 22:26:40 UTC), after pid 221 started "
               "2026-12-05 22:16:40 UTC")
    assert running.restart_pending(221, STARTED, {"/etc/vllm/chat.env": STARTED - 30}) == (
        True, "none: pid 221 started 2026-12-05 22:16:40 UTC, after its files changed")
    # a unit: its unit, env and config files as the host has them, the program, the `current` link it runs through
    server = {"pid": 221, "started": STARTED, "tree": [221], "files": {"/opt/vllm/current/bin/vllm": STARTED - 90}}
    scan = {"files": {"/etc/systemd/system/vllm-chat.service": STARTED - 100, "/opt/vllm/current": STARTED + 5}}
    passed, actual = running.unit_restart(server, ["/etc/systemd/system/vllm-chat.service"], scan)
    assert not passed and actual.startswith("restart pending: /opt/vllm/current (changed ")
    assert running.unit_restart(None, [], scan) == (False, "no running server to compare with its files")


def test_a_file_whose_time_could_not_be_read_leaves_the_restart_unknown():
    files = {"/etc/vllm/chat.yaml": "not read: Permission denied", "/opt/vllm/venv/bin/vllm": STARTED - 30}
    assert running.restart_pending(221, STARTED, files) == (
        None, "/etc/vllm/chat.yaml not read: Permission denied; pid 221 started 2026-12-05 22:16:40 UTC")
    # another file changed since: the restart is pending whatever the unread one says
    assert running.restart_pending(221, STARTED, {**files, "/etc/vllm/chat.env": STARTED + 1})[0] is False
    server = {"name": "process 221", "restart": {"passed": None, "actual": "/etc/vllm/chat.yaml not read: …"}}
    assert run_check(discovered.server_restart_pending, server, Facts(problems={}))[0] == "error"


def test_the_file_times_say_absent_or_not_read(tmp_path):
    present = tmp_path / "chat.yaml"
    present.write_text("")
    assert processes.modified(str(present)) == present.stat().st_mtime
    assert processes.modified(str(tmp_path / "gone")) is None
    assert processes.modified(str(present / "below")) is None  # a file is no folder: nothing there

    def refused(path):
        raise PermissionError(13, "Permission denied", path)

    assert processes.modified(str(present), refused) == "not read: Permission denied"


# --------------------------------------------------------------------------- the spec's rows of what runs


def spec_facts(scan: dict | None, apps: list | None = None, **more) -> Facts:
    units = {"vllm-local.service": UnitFacts({"LoadState": "loaded", "MainPID": "493"}, {}, None, None, {})}
    return Facts(problems={}, units=units, containers={}, processes=scan, compute_apps=apps, **{
        "processes_problem": None, "compute_apps_problem": None, **more})


def test_the_recorded_servers_on_a_spec_host_that_declares_one_the_other_is_a_stray():
    scan = recorded_scan()
    scan["servers"][0]["listening"] = ["0.0.0.0:8000"]
    apps = compute_apps(RECORD["smi"]["compute_apps_noheader"]["stdout"]) + [
        {"pid": 488, "mib": 512, "uuid": "GPU-339c9e06-67b2-4e5c-d342-d4e3ce0c1b7b"}]  # record.py, say
    found = running.strays(scan, {"vllm-local.service": 493}, [], apps,
                           lambda server: supervision(server["cgroup"]), lambda server: True)
    assert found == [
        "stray vLLM server: pid 492 on 0.0.0.0:8000, started by cgroup /process_api/ac7e42800e7dbef947ba372532b3ef7e,"
        " API key set",
        "stray GPU process: pid 488 (python3) holds 512 MiB on GPU-339c9e06-67b2-4e5c-d342-d4e3ce0c1b7b"]
    assert running.strays(scan, {"a.service": 492, "b.service": 493}, [], apps[:2], supervision, bool) == []
    assert running.server_of(scan, 731)["pid"] == 492  # its engine core: the same server
    assert running.server_of(scan, 0) is None
    scan["servers"][0]["listening"] = None  # the tables not read: its ports unknown, not "no TCP port"
    assert running.stray_server(scan["servers"][0], "cron", False) == (
        "stray vLLM server: pid 492 on ports not read, started by cron, no API key")


def test_the_strays_row_lists_them_and_is_unknown_where_the_scan_missed_something():
    target = {"units": [{"name": "vllm-local.service"}], "running": True}
    both = {**recorded_scan(), "problems": []}
    for server in both["servers"]:
        server["listening"] = []
    scan = {**both, "servers": both["servers"][1:]}  # 493 alone: the unit's
    apps = compute_apps(RECORD["smi"]["compute_apps_noheader"]["stdout"])
    assert run_check(vllm_service.strays, target, spec_facts(scan, apps[:1]))[0] == "passed"  # 724: 493's
    status, row = run_check(vllm_service.strays, target, spec_facts(both, apps))
    assert status == "failed" and row["actual"].startswith("stray vLLM server: pid 492 on no TCP port, started by ")
    unread_apps = spec_facts(scan, None, compute_apps_problem="exit 9: NVIDIA-SMI has failed")
    status, row = run_check(vllm_service.strays, target, unread_apps)
    assert (status, row["actual"]) == ("error", "unknown: GPU processes not read (exit 9: NVIDIA-SMI has failed)")
    status, row = run_check(vllm_service.strays, target, spec_facts(None, processes_problem="no python3 on the host"))
    assert (status, row["actual"]) == ("error", "unknown: the processes not read: no python3 on the host")


def test_the_unit_rows_compare_its_process_with_its_files_and_the_spec_version():
    scan = {**recorded_scan(), "files": {"/etc/vllm/local.yaml": STARTED - 60}}
    server = scan["servers"][1]
    server.update(started=STARTED, files={"/opt/torch/.venv/bin/vllm": STARTED + 3600.0},
                  imported={"package": f"{VENV}/vllm", "objects": ["_C.abi3.so"], "deleted": True, "version": "0.25.0"})
    unit = {"name": "vllm-local.service", "started_from": ["/etc/vllm/local.yaml"], "vllm_version": "0.25.0"}
    status, row = run_check(vllm_service.restart_pending, unit, spec_facts(scan))
    assert (status, row["actual"]) == ("failed", "restart pending: /opt/torch/.venv/bin/vllm (changed 2026-12-05"
                                                 " 23:16:40 UTC), after pid 493 started 2026-12-05 22:16:40 UTC")
    status, row = run_check(vllm_service.running_vllm, unit, spec_facts(scan))
    assert (status, row["actual"]) == ("failed", f"0.25.0 (deleted) (pid 493, mapped from {VENV}/vllm (deleted))")
    server["imported"] = {"problem": "/proc/493/maps not read"}
    assert run_check(vllm_service.running_vllm, unit, spec_facts(scan))[0] == "error"


# --------------------------------------------------------------------------- the scan on this machine


def test_the_scan_finds_a_launcher_script_by_its_api_and_reads_its_start_and_files(tmp_path):
    """processes.py on this machine's /proc, in a network namespace of its own (a scan asks the API of every server it
    finds: none of this machine's): the TEST DOUBLE vLLM run by a launcher script (its command line no
    `vllm serve`; pure Python: no vLLM object in its maps) is found by its listening socket's API answers."""
    port = 18000
    launcher = tmp_path / "llm-launch.py"
    launcher.write_text("import sys\n"
                        f"sys.argv = ['vllm', 'serve', 'org/model', '--host', '127.0.0.1', '--port', '{port}']\n"
                        "from vllm.entrypoints.cli.main import main\nmain()\n")
    script = ('{ exec "$1" "$2" >/dev/null 2>&1; } & launcher=$!; echo "$launcher"\n'
              'trap \'kill -9 "$launcher"\' EXIT\n'  # whatever happens next: its engine core ends with it
              'for i in $(seq 200); do (exec 3<>"/dev/tcp/127.0.0.1/$3") 2>/dev/null && break; sleep 0.05; done\n'
              '"$1" "$4" "$5"')
    request = json.dumps({"files": ["/nonexistent", str(launcher)]})
    arguments = [sys.executable, str(launcher), str(port), str(Path(processes.__file__)), request]
    run = subprocess.run(own_network(["bash", "-c", "ip link set lo up && " + script, "bash", *arguments]),
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(STANDIN_PACKAGE), "VLLM_STANDIN_CATALOG": str(CATALOG)})
    pid, _, answer = run.stdout.partition("\n")
    scan, problem = process_scan(Output(answer, run.returncode))
    assert problem is None, run.stderr
    (found,) = [found for found in scan["servers"] if found["pid"] == int(pid)]
    assert (found["found_by"], found["script"], found["listening"]) == ("api", str(launcher), [f"127.0.0.1:{port}"])
    assert found["api_version"] == "0.0.0" and found["imported"] is None  # the stand-in's source tree
    assert abs(found["started"] - launcher.stat().st_mtime) < 120
    assert found["files"] == {str(launcher): launcher.stat().st_mtime}
    assert scan["files"] == {"/nonexistent": None, str(launcher): launcher.stat().st_mtime}


# --------------------------------------------------------------------------- the spec's key, given to the probes


def test_the_secrets_reach_the_commands_on_stdin_and_no_command_line(tmp_path):
    key = "sk-given-on-stdin-41"
    marker = tmp_path / "argv"
    commands = {"seen": 'printf "%s|%s" "$vp_api_key0" "$vp_api_key1"',
                "argv": f"ps -eo args > {marker}; true", "input": "cat"}  # a command reads no secret from stdin
    found = run_commands(testinfra.get_host("local://"), commands, {"vp_api_key0": key, "vp_api_key1": ""})
    assert found["seen"] == Output("sk-given-on-stdin-41|", 0) and found["input"] == Output("", 0)
    assert key not in marker.read_text()


def test_spec_mode_gives_each_unit_the_spec_key_and_profile_mode_none(tmp_path):
    key_file = tmp_path / "chat.key"
    key_file.write_text("sk-spec-key-9  \n")
    units = [{"name": "a.service", "api_key": {"file": str(key_file)}},
             {"name": "b.service", "api_key": {"file": None}},
             {"name": "c.service"}]  # profile mode: no spec, no key of its own to give
    assert vllm_service.secrets({"units": units}) == {"vp_api_key0": "sk-spec-key-9", "vp_api_key1": ""}
    assert host_secrets({"units": units}) == {"vp_api_key0": "sk-spec-key-9", "vp_api_key1": ""}
    unit = {"name": "a.service", "url": "http://127.0.0.1:8000", "served_names": ["m"], "properties": {},
            "environment": {}, "api_key": {"file": "k"}}
    commands = vllm_service.unit_commands(0, unit)
    assert commands["http0"].startswith('VP_PROBE_KEY="$vp_api_key0" timeout ')
    assert commands["ready0"].startswith('VLLM_API_KEY="$vp_api_key0" timeout ')
    assert commands["ready0"].endswith(" --once")  # no --key-from-unit: the process's own key is not asked for
    profile = vllm_service.unit_commands(0, {key: value for key, value in unit.items() if key != "api_key"})
    assert not profile["http0"].startswith("VP_PROBE_KEY") and profile["ready0"].endswith("--key-from-unit a.service")


def probe_with(port: int, **env: str) -> str:
    run = subprocess.run(["bash", "-c", HTTP_PROBE.read_text(), "127.0.0.1", "vllm-x.service", "127.0.0.1", str(port)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=10, env={**os.environ, **env})
    return run.stdout.decode()


def test_the_probe_asks_with_the_key_given_and_says_where_it_came_from(tmp_path):
    port = free_port()
    with standin_running(port, tmp_path / "standin.log", "--api-key", "sk-right-key-3"):
        given = probe_with(port, VP_PROBE_KEY="sk-right-key-3")
        assert key_source(given) == {"key": "given"} and http_answers(given)["/v1/models"]["status"] == 200
        refused = probe_with(port, VP_PROBE_KEY="")  # the spec declares no key: none sent, whatever the server has
        assert key_source(refused) == {"key": "given"} and http_answers(refused)["/v1/models"]["status"] == 401
        own = probe_with(port)  # profile mode: the unit's process (none here) is asked
        assert key_source(own)["key"].startswith("none: pid ") and "sk-right-key-3" not in given + refused + own


def models_row(unit: dict, answer: dict, key: str | None = None) -> tuple[str, dict[str, str]]:
    http = {"/v1/models": answer, **({"key": key} if key else {})}
    facts = Facts(problems={}, units={unit["name"]: UnitFacts({"LoadState": "loaded"}, {}, None, None, http)})
    return run_check(vllm_service.served_models, unit, facts)


def test_the_models_row_says_which_key_it_asked_with():
    unit = {"name": "vllm-chat.service", "url": "http://10.0.0.5:8000", "served_names": ["m"],
            "api_key": {"file": "/etc/keys/chat"}}
    listed = {"status": 200, "body": json.dumps({"data": [{"id": "m"}]})}
    assert models_row(unit, listed, "given") == ("passed", {
        "check": "vllm-chat.service: GET http://10.0.0.5:8000/v1/models", "expected": "m",
        "actual": "m (key: the spec's api_key_file)"})
    assert models_row(unit, {"status": 401, "body": '{"error": "Unauthorized"}'}, "given")[1]["actual"] == (
        "HTTP 401: refuses the spec's API key (the spec's api_key_file) (key: the spec's api_key_file)")
    keyless = {**unit, "api_key": {"file": None}}
    assert models_row(keyless, {"status": 401, "body": ""}, "given") == ("failed", {
        "check": "vllm-chat.service: GET http://10.0.0.5:8000/v1/models", "expected": "m",
        "actual": "HTTP 401: refuses the spec's API key (none: the spec declares no API key)"
                  " (key: none: the spec declares no API key)"})
    profile = {key: value for key, value in unit.items() if key != "api_key"}
    assert models_row(profile, listed, "VLLM_API_KEY of pid 221")[1]["actual"] == "m (key: VLLM_API_KEY of pid 221)"
    assert models_row(profile, {"status": 401, "body": ""}, "VLLM_API_KEY of pid 221")[1]["actual"] == (
        "HTTP 401 (key: VLLM_API_KEY of pid 221)")


def test_a_server_whose_process_the_scan_could_not_read_has_unknown_ports_and_vllm():
    server = {"pid": 9, "listening": None, "imported": {"problem": "/proc/9/maps not read"}}
    assert running.listening_words(server) == "ports not read"
    assert running.running_version(server) == (None, "/proc/9/maps not read, no /version answer")
    assert running.listening_words({"listening": []}) == "no TCP port"


def test_the_boot_time_is_read_to_a_hundredth_not_cut_to_the_second():
    """/proc/stat's btime is whole seconds, cut short: a unit restarted a moment after its file was written read as
    started before the file changed (a false restart pending, seen in CI's drift matrix)."""
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    assert abs(processes.boot_time() - (time.time() - uptime)) < 0.05
    # a file within the start's precision (20 ms after the start as read) is no pending restart; a second after it is
    assert running.changed_files(1000.0, {"/etc/vllm/chat.yaml": 1000.02}) == []
    assert running.changed_files(1000.0, {"/etc/vllm/chat.yaml": 1001.0}) == [("/etc/vllm/chat.yaml", 1001.0)]


def test_the_api_probe_asks_the_servers_own_port_first_and_a_silent_socket_once(monkeypatch):
    """A vLLM server also listens on its engine's sockets, which take a connection and never answer HTTP: on the
    lent H100 a server listened on six of them besides its port, and asking each /version and /v1/models in
    address order made one discovery take 48 s. Its own port (command line, else config, else 8000) goes first;
    a socket that does not answer /version is not asked /v1/models."""
    import socket
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class VllmApi(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            body = {"/version": {"version": "0.25.0"}, "/v1/models": {"object": "list", "data": []}}[self.path]
            self.send_response(200)
            self.end_headers()
            self.wfile.write(json.dumps(body).encode())

        def log_message(self, *args):
            pass

    api = ThreadingHTTPServer(("127.0.0.1", 0), VllmApi)
    threading.Thread(target=api.serve_forever, daemon=True).start()
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # takes connections (the kernel's backlog), never answers
    monkeypatch.setattr(processes, "API_PROBE_TIMEOUT_S", 0.5)
    port, quiet = api.server_address[1], silent.getsockname()[1]
    addresses = [f"127.0.0.1:{quiet}", f"127.0.0.1:{port}"]  # the engine's socket first, as sorted addresses were
    try:
        begin = time.monotonic()
        assert processes.api_facts(addresses, port) == {"address": f"127.0.0.1:{port}", "version": "0.25.0",
                                                         "vllm_api": True}
        assert time.monotonic() - begin < 0.5  # the silent socket, listed first, was not asked
        begin = time.monotonic()
        assert processes.api_facts(addresses)["version"] == "0.25.0"  # port unknown: in order
        assert 0.5 <= time.monotonic() - begin < 1.0  # the silent socket asked once (/version), not twice
    finally:
        api.shutdown()
        silent.close()


def test_a_servers_port_is_its_command_lines_then_its_configs_then_vllms_default():
    assert processes.serving_port(["vllm", "serve", "m", "--port", "8001"], "port: 9000\n") == 8001
    assert processes.serving_port(["vllm", "serve", "--port=8002"], None) == 8002
    assert processes.serving_port(["vllm", "serve", "--config", "c.yaml"], 'model: m\nport: "8003"  # ours\n') == 8003
    assert processes.serving_port(["vllm", "serve", "m"], "model: m\n") == 8000
