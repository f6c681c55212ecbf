"""The module haproxy_server: its reading of HAProxy's answers, against the answers a real HAProxy 2.6 gave
(tests/fixtures/haproxy/, recorded by record.py there), then the module as Ansible runs it (ad hoc, on this
machine) against a real haproxy started here with its own socket, in front of TEST DOUBLE replicas on
127.0.0.1 (tests/doubles/haproxy_gateway.py): drains with a request in flight, waits for checks, fails
with the messages it promises. Skipped, saying so, where the haproxy binary is missing (.ci/setup installs it)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from provisioner.base.module_utils import haproxy_runtime
from provisioner.base.paths import COLLECTION, collections_dir
from tests.doubles.haproxy_gateway import HAPROXY, Gateway
from tests.unit.adhoc import run_module

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "haproxy"

needs_haproxy = pytest.mark.skipif(
    HAPROXY is None, reason="the haproxy binary is missing: apt-get install haproxy (.ci/setup installs it)")


def recorded(state: str, server: str) -> dict:
    stat = haproxy_runtime.parse_stat((FIXTURES / f"{state}.show-stat.csv").read_text())
    servers = haproxy_runtime.parse_servers_state((FIXTURES / f"{state}.show-servers-state.txt").read_text())
    return haproxy_runtime.server_state(stat, servers, "public-0", server)


def brief(state: dict) -> tuple:
    return state["admin"], state["status"], state["sessions"], state["queue"], haproxy_runtime.last_check(state)


# ------------------------------------------------------------------ HAProxy 2.6's answers, recorded


@pytest.mark.parametrize("state, chat1, chat2", [
    ("ready", ("ready", "UP", 0, 0, "L7OK 200"), ("ready", "UP", 0, 0, "L7OK 200")),
    ("in-flight", ("ready", "UP", 1, 0, "L7OK 200"), ("ready", "UP", 0, 0, "L7OK 200")),
    ("drain-in-flight", ("drain", "DRAIN", 1, 0, "L7OK 200"), ("ready", "UP", 0, 0, "L7OK 200")),
    ("drain", ("drain", "DRAIN", 0, 0, "L7OK 200"), ("ready", "UP", 0, 0, "L7OK 200")),
    ("maint", ("maint", "MAINT", 0, 0, "no check result"), ("ready", "UP", 0, 0, "L7OK 200")),
    ("ready-after-maint", ("ready", "UP 1/2", 0, 0, "L7OK 200"), ("ready", "UP", 0, 0, "L7OK 200")),
    ("down-503", ("ready", "UP", 0, 0, "L7OK 200"), ("ready", "DOWN", 0, 0, "L7STS 503: Service Unavailable")),
    ("down-drain", ("ready", "UP", 0, 0, "L7OK 200"), ("drain", "DOWN", 0, 0, "L7STS 503: Service Unavailable")),
    ("down-refused", ("ready", "UP", 0, 0, "L7OK 200"), ("drain", "DOWN", 0, 0, "L4CON: Connection refused")),
])
def test_each_recorded_state_reads_as_haproxy_showed_it(state, chat1, chat2):
    assert (brief(recorded(state, "chat-1")), brief(recorded(state, "chat-2"))) == (chat1, chat2)


def test_the_admin_state_comes_from_srv_admin_state_because_status_hides_a_drain_while_down():
    stat = haproxy_runtime.parse_stat((FIXTURES / "down-drain.show-stat.csv").read_text())
    (row,) = [row for row in stat if row["pxname"] == "public-0" and row["svname"] == "chat-2"]
    assert row["status"] == "DOWN"  # nothing in show stat says drained
    assert recorded("down-drain", "chat-2")["admin"] == "drain"  # srv_admin_state 8 (FDRAIN) does
    assert [haproxy_runtime.admin_state(bits) for bits in (0, 0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x09)] == [
        "ready", "maint", "maint", "maint", "drain", "drain", "maint", "ready", "maint"]


def test_up_means_full_health_not_up_just_after_maint():
    assert haproxy_runtime.is_up(recorded("ready", "chat-1"))
    assert not haproxy_runtime.is_up(recorded("ready-after-maint", "chat-1"))  # UP 1/2: no check yet
    assert not haproxy_runtime.is_up(recorded("down-503", "chat-2"))
    assert haproxy_runtime.is_drained(recorded("drain", "chat-1"))
    assert not haproxy_runtime.is_drained(recorded("drain-in-flight", "chat-1"))


def test_a_check_under_way_has_a_star_and_no_code():
    stat = haproxy_runtime.parse_stat((FIXTURES / "down-503-checking.show-stat.csv").read_text())
    servers = haproxy_runtime.parse_servers_state((FIXTURES / "down-503.show-servers-state.txt").read_text())
    state = haproxy_runtime.server_state(stat, servers, "public-0", "chat-2")
    assert (state["check_status"], state["check_code"], state["last_check"]) == ("* L7STS", "0", "")


def test_unknown_backend_and_server_from_the_recorded_answers():
    answers = json.loads((FIXTURES / "answers.json").read_text())
    assert answers["show servers state public-9"].startswith("Can't find backend")  # what read_server looks for
    assert answers["set server public-0/chat-1 state drain"].strip() == ""  # success: an empty line
    stat = haproxy_runtime.parse_stat((FIXTURES / "ready.show-stat.csv").read_text())
    servers = haproxy_runtime.parse_servers_state((FIXTURES / "ready.show-servers-state.txt").read_text())
    with pytest.raises(haproxy_runtime.Failure) as backend:
        haproxy_runtime.server_state(stat, [], "public-9", "chat-1")
    assert str(backend.value) == UNKNOWN_BACKEND
    with pytest.raises(haproxy_runtime.Failure) as server:
        haproxy_runtime.server_state(stat, servers, "public-0", "chat-9")
    assert str(server.value) == UNKNOWN_SERVER


UNKNOWN_BACKEND = ("HAProxy has no backend 'public-9' (its backends: public-0, public-1) - fix the backend option (role"
                   " gateway names a gateway's routes <gateway>-<index>: see /etc/haproxy/haproxy.cfg)")
UNKNOWN_SERVER = ("HAProxy's backend 'public-0' has no server 'chat-9' (its servers: chat-1, chat-2) - fix the server"
                  " option (role gateway names each server after its instance)")


# ------------------------------------------------------------------ the module, against a real haproxy


class Runner:
    """The module as Ansible runs it: `ansible localhost -m vllm_provision.gpu_host.haproxy_server`."""

    def __init__(self, gateway: Gateway, work: Path, name: str = "haproxy_server"):
        self.gateway, self.work, self.name = gateway, work, name

    def __call__(self, *options: str, **args) -> dict:
        defaults = {"backend": "public-0", "poll_interval": 0.1} if self.name == "haproxy_server" else {}
        args = {"socket": str(self.gateway.socket), **defaults, **args}
        started = time.monotonic()
        result, done = run_module(self.work, self.name, args, *options)
        return {**result, "failed": done.returncode != 0,
                "stdout": done.stdout + done.stderr, "ended": time.monotonic(), "seconds": time.monotonic() - started}


@pytest.fixture
def gateway(tmp_path):
    folder = tmp_path / "gateway"
    folder.mkdir()
    gateway = Gateway(folder, {"Qwen/Qwen3-1.7B-FP8": ["chat-1", "chat-2"], "Qwen/Qwen3-8B": ["big-1"]})
    try:
        gateway.start()
        for name in ("chat-1", "chat-2"):
            gateway.wait_status("public-0", name, "UP")
        yield gateway
    finally:
        gateway.stop()


@pytest.fixture
def module(gateway, tmp_path) -> Runner:
    return Runner(gateway, tmp_path)


def admin(gateway: Gateway, server: str) -> str:
    (row,) = [row for row in haproxy_runtime.parse_servers_state(gateway.query("show servers state public-0"))
              if row["srv_name"] == server]
    return haproxy_runtime.admin_state(int(row["srv_admin_state"]))


@needs_haproxy
def test_drain_waits_for_the_request_in_flight_then_new_ones_go_to_the_other_replica(gateway, module):
    slow = gateway.request("Qwen/Qwen3-1.7B-FP8", sleep=20)  # Ansible takes 3-4 s (more under load) to start a task
    while not any(gateway.server_line("public-0", name)["scur"] == "1" for name in ("chat-1", "chat-2")):
        time.sleep(0.02)
    busy, other = ("chat-1", "chat-2") if gateway.server_line("public-0", "chat-1")["scur"] == "1" else ("chat-2", "chat-1")

    early = module(server=busy, state="drain", timeout=1)  # the caller decides: no failure
    assert not early["failed"] and early["changed"] is True and early["drained"] is False, early
    assert early["after"]["sessions"] == 1 and early["after"]["admin"] == "drain"
    assert early["msg"] == f"public-0/{busy}: ready -> drain; 1 session(s) and 0 queued left"
    assert f"[WARNING]: public-0/{busy} is not drained after 1 s: 1 session(s) and 0 queued left" in " ".join(
        early["stdout"].split()), early["stdout"]

    drained = module(server=busy, state="drain")
    slow.join()
    assert not drained["failed"] and drained["changed"] is False and drained["drained"] is True, drained
    assert drained["before"]["sessions"] == 1 and drained["after"]["sessions"] == 0
    assert slow.status == 200  # it finished, it was not cut
    assert drained["ended"] >= slow.ended and drained["waited"] > 0
    print(f"\ndrain: waited {drained['waited']} s for the request in flight; the task ended "
          f"{drained['ended'] - slow.ended:.2f} s after it (Ansible's own exit included; task {drained['seconds']:.1f} s)")

    served_before = int(gateway.server_line("public-0", busy)["stot"])
    new = gateway.request("Qwen/Qwen3-1.7B-FP8")
    new.join()
    assert new.status == 200 and int(gateway.server_line("public-0", busy)["stot"]) == served_before
    assert int(gateway.server_line("public-0", other)["stot"]) >= 1


@needs_haproxy
def test_the_drain_wait_ends_within_a_poll_of_the_last_request(gateway):
    """The module's own wait, in this process (no Ansible start or exit around it): a 3 s request in flight."""
    gateway.query("set server public-0/chat-2 state drain")  # leastconn then picks chat-1
    slow = gateway.request("Qwen/Qwen3-1.7B-FP8", sleep=3)
    while gateway.server_line("public-0", "chat-1")["scur"] != "1":
        time.sleep(0.01)
    gateway.query("set server public-0/chat-1 state drain")
    drained_at = time.monotonic()

    def read():
        return haproxy_runtime.read_server(str(gateway.socket), "public-0", "chat-1")

    state, drained, waited = haproxy_runtime.wait_for(haproxy_runtime.is_drained, read, 10, 0.1)
    ended = time.monotonic()
    slow.join()
    assert drained and state["sessions"] == 0 and slow.status == 200
    assert 0 <= ended - slow.ended < 1, ended - slow.ended  # a poll is 0.1 s: 1 s leaves room for a loaded machine
    print(f"\ndrain (in process): a 3 s request in flight, waited {waited} s from the drain; the wait ended "
          f"{ended - slow.ended:.3f} s after the request (poll 0.1 s); drained {ended - drained_at:.2f} s after the drain")


@needs_haproxy
def test_ready_waits_until_the_health_check_passes(gateway, module):
    gateway.query("set server public-0/chat-1 state drain")
    gateway.stop_replica("chat-1")  # the instance restarts: HAProxy's check sees it DOWN
    gateway.wait_status("public-0", "chat-1", "DOWN")
    listening = []
    later = threading.Timer(8, lambda: (gateway.start_replica("chat-1"), listening.append(time.monotonic())))
    later.start()  # after the module has read it DOWN (Ansible takes 3-4 s to start it)

    result = module(server="chat-1", state="ready")
    later.join()
    assert not result["failed"] and result["changed"] is True, result
    assert result["before"]["status"] == "DOWN" and result["after"]["status"] == "UP"
    assert result["ended"] >= listening[0] and result["waited"] > 0
    assert result["msg"] == f"public-0/chat-1: drain -> ready; UP after {result['waited']:g} s"
    print(f"\nready: waited {result['waited']} s; the task ended {result['ended'] - listening[0]:.2f} s after the "
          f"replica listened (checks every 200 ms; Ansible's own exit included)")


@needs_haproxy
def test_a_replica_that_stays_down_fails_naming_its_status_and_last_check(gateway, module):
    gateway.query("set server public-0/chat-2 state drain")
    gateway.start_replica("chat-2", status=503)
    gateway.wait_status("public-0", "chat-2", "DOWN")

    result = module(server="chat-2", state="ready", timeout=2)
    assert result["failed"] and result["changed"] is True and result["waited"] >= 2, result
    assert result["msg"] == "public-0/chat-2 is not UP after 2 s (DOWN, L7STS 503: Service Unavailable)"
    assert admin(gateway, "chat-2") == "ready"  # set as asked: HAProxy puts it back when its checks pass


@needs_haproxy
def test_check_mode_changes_nothing_and_predicts_changed_then_apply_is_idempotent(gateway, module):
    predicted = module("--check", "--diff", server="chat-1", state="drain")
    assert not predicted["failed"] and predicted["changed"] is True, predicted
    assert predicted["msg"] == "public-0/chat-1: would set drain" and predicted["waited"] == 0
    assert "-public-0/chat-1: ready\n+public-0/chat-1: drain" in predicted["stdout"], predicted["stdout"]
    assert admin(gateway, "chat-1") == "ready"

    applied = module("--diff", server="chat-1", state="drain")
    assert applied["changed"] is True and applied["after"]["admin"] == "drain" and applied["drained"] is True, applied
    assert admin(gateway, "chat-1") == "drain"
    assert module(server="chat-1", state="drain")["changed"] is False
    assert module("--check", server="chat-1", state="drain")["changed"] is False

    maint = module(server="chat-1", state="maint")
    assert maint["changed"] is True and maint["after"]["status"] == "MAINT" and maint["msg"] == (
        "public-0/chat-1: drain -> maint; drained")
    back = module(server="chat-1", state="ready")  # out of maint HAProxy says UP 1/2 at once: the wait takes a check
    assert back["changed"] is True and back["after"]["status"] == "UP", back
    assert module(server="chat-1", state="ready")["changed"] is False


@needs_haproxy
def test_unknown_backend_server_and_unreachable_socket_fail_with_one_message(gateway, module, tmp_path):
    assert module(server="chat-9", state="drain")["msg"] == UNKNOWN_SERVER
    assert module(backend="public-9", server="chat-1", state="drain")["msg"] == UNKNOWN_BACKEND

    missing = tmp_path / "missing.sock"
    result = module(socket=str(missing), server="chat-1", state="drain")
    assert result["failed"] and result["msg"] == (
        f"HAProxy's admin socket {missing} does not exist: haproxy is not running, or its configuration has no"
        f" 'stats socket {missing} level admin' - start haproxy (systemctl start haproxy), or set the module's"
        " socket option to its stats socket")
    left = tmp_path / "left.sock"  # a socket file haproxy left behind: nothing listens
    with socket.socket(socket.AF_UNIX) as stale:
        stale.bind(str(left))
    result = module(socket=str(left), server="chat-1", state="drain")
    assert result["failed"] and result["msg"] == (
        f"HAProxy's admin socket {left} refuses connections: haproxy is not running (the socket file is left over)"
        " - start haproxy (systemctl start haproxy), or set the module's socket option to its stats socket")
    assert "Traceback" not in result["stdout"]
    assert admin(gateway, "chat-1") == "ready"


@needs_haproxy
def test_with_missing_ignore_a_server_haproxy_lacks_or_a_haproxy_not_running_is_nothing_to_do(gateway, module, tmp_path):
    """A rolling change drains each replica at its gateway: one a gateway does not have yet (a new instance,
    whose route the gateway's play writes later) or a gateway not running yet has nothing to drain."""
    for options in ({"server": "chat-9"}, {"backend": "public-9", "server": "chat-1"},
                    {"socket": str(tmp_path / "missing.sock"), "server": "chat-1"}):
        result = module(**options, state="drain", missing="ignore")
        assert (result.get("failed", False), result["changed"], result["found"]) == (False, False, False), result
        assert result["msg"].startswith("nothing to do: ")
    found = module(server="chat-1", state="ready", missing="ignore")
    assert found["found"] is True and found["changed"] is False


# ------------------------------------------------------------------ the drains vllm-provision records


@pytest.fixture
def records(tmp_path) -> Path:
    return tmp_path / "drains"


@needs_haproxy
def test_a_recorded_drain_is_owned_and_an_operators_drain_is_kept_and_named(gateway, module, records):
    drained = module(server="chat-1", state="drain", record_dir=str(records), host="gpu1", reason="rollout: gpu1")
    assert drained["owned"] is True and admin(gateway, "chat-1") == "drain", drained
    (record,) = haproxy_runtime.read_records(str(records)).values()
    assert {key: record[key] for key in ("backend", "server", "host", "state", "reason")} == {
        "backend": "public-0", "server": "chat-1", "host": "gpu1", "state": "drain", "reason": "rollout: gpu1"}
    again = module(server="chat-1", state="drain", record_dir=str(records))  # an earlier run's drain: still ours
    assert again["owned"] is True and again["changed"] is False

    gateway.query("set server public-0/chat-2 state drain")  # an operator's, outside the tool
    kept = module(server="chat-2", state="maint", record_dir=str(records))
    assert kept["owned"] is False and kept["changed"] is False and admin(gateway, "chat-2") == "drain", kept
    assert kept["msg"] == "public-0/chat-2: drain, kept: not taken out by vllm-provision (an operator's?)"
    assert list(haproxy_runtime.read_records(str(records))) == ["public-0/chat-1"]  # not recorded as ours

    back = module(server="chat-1", state="ready", record_dir=str(records))
    assert back["changed"] is True and admin(gateway, "chat-1") == "ready"
    assert haproxy_runtime.read_records(str(records)) == {}


@needs_haproxy
def test_a_drain_is_bounded_the_sessions_left_at_its_timeout_are_shut_down(gateway, module, records):
    gateway.query("set server public-0/chat-2 state drain")  # leastconn then picks chat-1
    slow = gateway.request("Qwen/Qwen3-1.7B-FP8", sleep=60)
    while gateway.server_line("public-0", "chat-1")["scur"] != "1":
        time.sleep(0.02)
    result = module(server="chat-1", state="drain", timeout=1, shutdown_sessions=True, record_dir=str(records))
    slow.join(timeout=10)
    assert not result["failed"] and result["drained"] is True and result["shutdown"] == 1, result
    assert result["after"]["sessions"] == 0 and result["msg"] == "public-0/chat-1: ready -> drain; 1 session(s) shut down after " + f"{result['waited']:g} s"
    assert slow.ended is not None and slow.status != 200  # cut by the gateway, not left hanging for 60 s


@needs_haproxy
def test_a_batch_that_would_empty_a_route_is_refused_naming_the_route_and_the_fix(gateway, tmp_path, records):
    routes = Runner(gateway, tmp_path, "haproxy_routes")
    both = [{"backend": "public-0", "server": name, "model": "Qwen/Qwen3-1.7B-FP8"} for name in ("chat-1", "chat-2")]
    refused = routes(out=both, record_dir=str(records))
    assert refused["failed"] and refused["routes"]["public-0"]["serving"] == [], refused
    assert refused["msg"] == (
        "route public-0 (Qwen/Qwen3-1.7B-FP8) would keep 0 of its 2 replicas serving while chat-1, chat-2 change, "
        "fewer than --min-serving 1 (1) - drain fewer at once (a smaller --batch), bring the others back first, or "
        "accept the outage with --min-serving 0 (rollout_min_serving)")
    assert routes("--check", out=both, record_dir=str(records))["failed"]  # check mode refuses as the real run
    assert not routes(out=both, min_serving="0", record_dir=str(records))["failed"]  # an outage, accepted
    one = routes(out=both[:1], record_dir=str(records))
    assert not one["failed"] and one["routes"]["public-0"]["serving"] == ["chat-2"], one

    gateway.query("set server public-0/chat-2 state drain")  # an operator's drain counts as not serving
    operator = routes(out=both[:1], record_dir=str(records))
    assert operator["failed"] and operator["others"] == {"public-0/chat-2": "drain"}, operator
    assert "(the others: chat-2: drain not by vllm-provision: an operator's?)" in operator["msg"]
    assert routes(out=both[:1], min_serving="50%", record_dir=str(records))["failed"]  # 50% of 2 replicas: 1
    assert admin(gateway, "chat-1") == "ready"  # nothing changed


@needs_haproxy
def test_recovery_puts_back_ready_replicas_keeps_failing_ones_and_takes_out_lost_hosts(gateway, module, tmp_path, records):
    drains = Runner(gateway, tmp_path, "haproxy_drains")
    for server, host in (("chat-1", "gpu1"), ("chat-2", "gpu2"), ("big-1", "gpu3")):
        backend = "public-1" if server == "big-1" else "public-0"
        assert module(backend=backend, server=server, state="drain", record_dir=str(records), host=host)["owned"]
    gateway.stop_replica("chat-2")  # not ready: its check fails
    gateway.wait_status("public-0", "chat-2", "DOWN")

    predicted = drains("--check", record_dir=str(records), lost=["gpu3"])
    assert predicted["restored"] == ["public-0/chat-1"] and list(predicted["maintained"]) == ["public-1/big-1"]
    assert admin(gateway, "chat-1") == "drain"  # check mode sets nothing

    done = drains(record_dir=str(records), lost=["gpu3"])
    assert done["changed"] and done["restored"] == ["public-0/chat-1"], done
    assert done["kept"] == {"public-0/chat-2": "drain: its check fails (DOWN, L4CON: Connection refused)"}, done
    assert list(done["maintained"]) == ["public-1/big-1"]
    assert [admin(gateway, name) for name in ("chat-1", "chat-2")] == ["ready", "drain"]
    assert sorted(haproxy_runtime.read_records(str(records))) == ["public-0/chat-2", "public-1/big-1"]

    gateway.start_replica("chat-2")  # ready again; the lost host answers again
    gateway.wait_status("public-0", "chat-2", "DRAIN")
    later = drains(record_dir=str(records))
    assert later["restored"] == ["public-0/chat-2"] and later["kept"] == {
        "public-1/big-1": "drain: its host answers again: health-checked, no traffic yet"}, later
    assert drains(record_dir=str(records))["restored"] == ["public-1/big-1"]  # its check passes: back
    assert haproxy_runtime.read_records(str(records)) == {}
    assert not drains(record_dir=str(records))["changed"]

    # a record whose server someone put back already: only the record goes, nothing is said to be put back
    haproxy_runtime.write_record(str(records), "public-0", "chat-1", "drain", "rollout: gpu1", "gpu1")
    stale = drains(record_dir=str(records))
    assert stale["changed"] and stale["restored"] == [] and stale["forgotten"] == ["public-0/chat-1"], stale
    assert stale["msg"] == "forgot the drain records of public-0/chat-1 (back in rotation already)"
    assert haproxy_runtime.read_records(str(records)) == {} and admin(gateway, "chat-1") == "ready"


KEEPER = [sys.executable, str(ROOT / "plugins" / "module_utils" / "haproxy_runtime.py")]  # role gateway's drop-in


def restart_after_a_crash(gateway: Gateway) -> None:
    gateway.haproxy.kill()  # a crash: nothing saved
    gateway.haproxy.wait()
    gateway.haproxy = subprocess.Popen([HAPROXY, "-db", "-f", str(gateway.folder / "haproxy.cfg")],
                                       stdout=(gateway.folder / "haproxy.log").open("a"), stderr=subprocess.STDOUT)
    while admin_or_none(gateway, "chat-1") is None:
        time.sleep(0.02)


@needs_haproxy
def test_recorded_drains_are_set_again_when_haproxy_starts_afresh(gateway, module, records, tmp_path):
    module(server="chat-1", state="drain", record_dir=str(records), host="gpu1")
    restart_after_a_crash(gateway)
    assert admin(gateway, "chat-1") == "ready"  # haproxy forgot
    said = subprocess.run([*KEEPER, "settle", str(records), str(gateway.socket), str(tmp_path / "server-state")],
                          capture_output=True, text=True, timeout=30)
    assert said.returncode == 0 and said.stdout.startswith("public-0/chat-1: drain again"), said
    assert admin(gateway, "chat-1") == "drain"


@needs_haproxy
def test_the_server_state_is_saved_whole_then_forgotten_once_loaded(gateway, tmp_path, records):
    """Role gateway's drop-in saves `show servers state` before a reload or a stop (haproxy loads it at its
    next start or reload); `settle`, after that start or reload, forgets it: a later crash, which saves
    nothing, cannot bring an older state back (an operator's drain undone since would come back)."""
    state_file = tmp_path / "server-state"
    gateway.query("set server public-0/chat-2 state drain")
    saved = subprocess.run([*KEEPER, "save", str(state_file), str(gateway.socket)], capture_output=True, text=True,
                           timeout=30)
    assert saved.returncode == 0 and saved.stdout == "", saved
    rows = {row["srv_name"]: haproxy_runtime.admin_state(int(row["srv_admin_state"]))
            for row in haproxy_runtime.parse_servers_state(state_file.read_text())}
    assert rows == {"chat-1": "ready", "chat-2": "drain", "big-1": "ready"}
    assert (tmp_path / "server-state.pid").read_text() == haproxy_runtime.worker_pid(str(gateway.socket))

    restart_after_a_crash(gateway)  # another process: settle does not wait for one
    settled = subprocess.run([*KEEPER, "settle", str(records), str(gateway.socket), str(state_file)],
                             capture_output=True, text=True, timeout=30)
    assert settled.returncode == 0 and not state_file.exists() and not (tmp_path / "server-state.pid").exists()

    gone = subprocess.run([*KEEPER, "save", str(state_file), str(tmp_path / "no.sock")], capture_output=True,
                          text=True, timeout=30)
    assert gone.returncode == 0 and "server state not saved" in gone.stdout and not state_file.exists(), gone


def admin_or_none(gateway: Gateway, server: str) -> str | None:
    try:
        return admin(gateway, server)
    except (OSError, haproxy_runtime.Failure, ValueError):
        return None


def test_the_module_documentation_renders(tmp_path):
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(collections_dir(tmp_path / "collections"))}
    name = f"{COLLECTION}.haproxy_server"
    doc = subprocess.run([str(Path(sys.executable).parent / "ansible-doc"), "--type", "module", "--json", name],
                         env=env, capture_output=True, text=True, timeout=120)
    assert doc.returncode == 0, doc.stderr
    entry = json.loads(doc.stdout)[name]
    assert entry["doc"]["attributes"]["check_mode"]["support"] == "full"
    assert set(entry["doc"]["options"]) == {"socket", "backend", "server", "state", "wait", "timeout", "poll_interval",
                                            "missing", "shutdown_sessions", "record_dir", "reason", "host"}
    assert set(entry["return"]) == {"before", "after", "found", "drained", "waited", "owned", "shutdown", "msg"} and entry["examples"].strip()
