"""The gateway on real systemd test hosts (bookworm, systemd-nspawn, over SSH): two hosts each serve the
same model (the stand-in vLLM), host one also runs the gateway: Debian's haproxy 2.6, installed by the
role gateway from the lab's apt repository (tests/lab/haproxy.py), one route balancing both replicas.

One module-scoped pair of hosts, shared by the tests in order: check mode on the fresh hosts, apply
twice, requests through the gateway, a stopped replica, the audit and its drift, a reboot, TLS, then the install
(`--tags gateway_install`) while another process on the host holds apt's lists lock: for 20 s (it waits), then past
a bound of 4 s (it fails naming that process).
"""

from __future__ import annotations

import http.client
import json
import re
import shlex
import ssl
import subprocess
import time
import urllib.error
import urllib.request

import pytest
import yaml

from provisioner.apply.controls import Controls
from provisioner.apply.hosts import apply_spec
from provisioner.spec import load_spec
from tests.integration.conftest import audit_failures, check_then_apply_twice
from tests.lab.haproxy import haproxy_repo, repo_hosts
from tests.lab.specs import MODEL, host_entry, instance_entry

KEY = "sk-lab-gateway-4a1f9c"
PORT = 8080
CONFIG = "/etc/haproxy/haproxy.cfg"


@pytest.fixture(scope="module")
def hosts(lab):
    with repo_hosts(lab, haproxy_repo(), "gw") as booted:
        yield booted


@pytest.fixture(scope="module")
def spec_path(hosts, tmp_path_factory):
    one, two = hosts
    folder = tmp_path_factory.mktemp("gateway")
    (folder / "qwen.key").write_text(KEY + "\n")
    data = {
        "version": 1,
        "hosts": [host_entry(one), host_entry(two)],
        "instances": [instance_entry(one, "qwen-a", 8000, bind="0.0.0.0", api_key_file="qwen.key"),
                      instance_entry(two, "qwen-b", 8000, api_key_file="qwen.key")],
        "gateways": [{"name": "public", "host": one.name, "port": PORT}],
    }
    path = folder / "spec.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def url(hosts, path: str) -> str:
    return f"http://{hosts[0].address}:{PORT}{path}"


def ask(hosts, path: str, body: dict | None = None, key: str | None = KEY, method: str = "POST") -> tuple[int, dict]:
    """One request through the gateway, from the bastion: (status, JSON answer)."""
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url(hosts, path), data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def replica_of(hosts) -> str:
    """Which replica answered: the stand-in's /standin/process (routed by the body's model) names its config."""
    status, process = ask(hosts, "/standin/process", {"model": MODEL}, method="GET")
    assert status == 200, process
    return process["argv"][-1].rsplit("/", 1)[-1].removesuffix(".yaml")


def server_states(host) -> dict[str, str]:
    """HAProxy's own view (its admin socket, `show stat`): server → UP/DOWN, for the route's backend."""
    script = ("import socket; s = socket.socket(socket.AF_UNIX); s.connect('/run/haproxy/admin.sock'); "
              "s.sendall(b'show stat\\n'); d = b''\n"
              "while (c := s.recv(65536)): d += c\nprint(d.decode())")
    text = host.ssh(f"python3 -c {shlex.quote(script)}").stdout
    rows = [line.split(",") for line in text.splitlines() if line and not line.startswith("#")]
    return {row[1]: row[17] for row in rows if row[0] == "public-0" and row[1] not in ("FRONTEND", "BACKEND")}


def wait_for(predicate, timeout: float = 30.0, step: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(step)


def gateway_changes(result_events) -> list[str]:
    return [event.task for event in result_events if "gateway" in event.role and event.status == "changed"]


@pytest.fixture(scope="module")
def runs(hosts, spec_path):
    """Check mode on the fresh hosts, then the first and second apply, each with its task results."""
    return check_then_apply_twice(spec_path, hosts[0], "command -v haproxy")


def test_check_mode_on_fresh_hosts_changes_nothing_and_predicts_the_run(runs):
    assert runs["check"].succeeded, runs["check"].problems
    assert runs["disk after check"] == runs["disk before"], "check mode changed files on the gateway host"
    assert runs["installed after check"] != 0, "check mode installed haproxy"
    check, first = gateway_changes(runs["events"]["check"]), gateway_changes(runs["events"]["first"])
    state = ["Install the server state keeper", "Make the drain records' folder and haproxy.service's drop-in folder"]
    assert first == ["Install haproxy", *state, "Keep the servers' states across reloads and restarts (haproxy.service "
                     "drop-in)", "Write haproxy.cfg", "Reload haproxy"], (first, check)
    # each change of the real run, said beforehand by its check-mode counterpart
    assert check == ["Say haproxy would be installed (check mode)", *state, "Say the drop-in would be written (check "
                     "mode)", "Say what check mode would write (haproxy would be installed first)",
                     "Say haproxy would be reloaded (check mode)"], (first, check)
    notes = [note for event in runs["events"]["check"] if "gateway" in event.role for note in event.notes]
    assert any("would install haproxy" in note for note in notes), notes


def test_apply_converges_then_changes_nothing(hosts, runs):
    one, two = hosts
    assert runs["first"].succeeded, runs["first"].problems
    assert runs["second"].succeeded, runs["second"].problems
    assert {name: stats.changed for name, stats in runs["second"].stats.items()} == {one.name: 0, two.name: 0}
    assert one.ssh("systemctl is-active haproxy.service; systemctl is-enabled haproxy.service").stdout.split() == \
        ["active", "enabled"]
    assert one.ssh(f"stat -c '%a %U:%G' {CONFIG}").stdout.strip() == "640 root:haproxy"
    assert two.ssh("command -v haproxy", check=False).returncode != 0, "haproxy on a host without a gateway"
    # the key was sent to the host, never shown: not in any task's output
    shown = json.dumps([event.__dict__ for run in runs["events"].values() for event in run], default=str)
    assert KEY not in shown


def test_requests_through_the_gateway_reach_both_replicas(hosts, runs):
    assert wait_for(lambda: set(server_states(hosts[0]).values()) == {"UP"}), server_states(hosts[0])
    seen = {replica_of(hosts) for _ in range(8)}
    assert seen == {"qwen-a", "qwen-b"}
    status, answer = ask(hosts, "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2})
    assert (status, answer["choices"][0]["text"]) == (200, " pong")
    # the client's Authorization goes to the replica untouched: a wrong key is the replica's 401
    assert ask(hosts, "/v1/completions", {"model": MODEL, "prompt": "hi"}, key="sk-wrong")[0] == 401
    status, answer = ask(hosts, "/v1/completions", {"model": "no/such-model", "prompt": "hi"})
    assert status == 404 and answer["error"]["code"] == 404 and answer["error"]["type"] == "NotFoundError"
    status, models = ask(hosts, "/v1/models", method="GET")
    assert (status, [entry["id"] for entry in models["data"]]) == (200, [MODEL])


def test_a_stopped_replica_is_taken_out_and_requests_still_succeed(hosts, runs):
    one, two = hosts
    two.ssh("systemctl stop vllm-qwen-b.service")
    try:
        # retried on the other replica from the first request on; taken out after gateway_check_fall checks
        answers = [ask(hosts, "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 1})[0]
                   for _ in range(10)]
        assert answers == [200] * 10
        assert wait_for(lambda: server_states(one).get("qwen-b") == "DOWN"), server_states(one)
        assert {replica_of(hosts) for _ in range(6)} == {"qwen-a"}
    finally:
        two.ssh("systemctl start vllm-qwen-b.service")
    assert wait_for(lambda: server_states(one).get("qwen-b") == "UP", timeout=60), server_states(one)


def test_the_audit_passes_then_names_the_drifted_configuration(hosts, runs, spec_path):
    one, _ = hosts
    failures = audit_failures(spec_path)
    assert failures == {name: {} for name in failures}
    lines = len(one.ssh(f"cat {CONFIG}").stdout.splitlines())
    one.ssh(f"echo '    # edited by hand' >> {CONFIG}")
    drifted = audit_failures(spec_path)[one.name]
    assert drifted == {f"file {CONFIG}": (f"as rendered ({lines} lines, root:haproxy 0640)",
                                         f"line {lines + 1}: '    # edited by hand' added (root:haproxy 0640)")}
    one.ssh("systemctl disable --now haproxy.service 2>/dev/null")
    drifted = audit_failures(spec_path)[one.name]
    assert drifted["haproxy.service: enabled"] == ("enabled", "disabled")
    assert drifted["haproxy.service: active"] == ("active", "inactive")
    repaired = apply_spec(load_spec(spec_path))
    assert repaired.succeeded, repaired.problems
    assert audit_failures(spec_path)[one.name] == {}


def test_the_gateway_serves_again_after_a_reboot(hosts, runs, spec_path):
    one, _ = hosts
    one.reboot(timeout=180)
    assert wait_for(lambda: one.ssh("systemctl is-active haproxy.service", check=False).stdout.strip() == "active",
                    timeout=60)
    assert wait_for(lambda: set(server_states(one).values()) == {"UP"}, timeout=120), server_states(one)
    assert {replica_of(hosts) for _ in range(8)} == {"qwen-a", "qwen-b"}
    assert audit_failures(spec_path)[one.name] == {}


def test_with_a_certificate_the_gateway_serves_https_only(hosts, runs, spec_path, tmp_path):
    """TLS on the real HAProxy: a certificate made here for the gateway's address (openssl), the spec's
    tls_certificate; the bastion then trusts that certificate alone, and plain HTTP gets no answer."""
    one, _ = hosts
    pem, certificate = tmp_path / "edge.pem", tmp_path / "edge.crt"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=gateway",
                    "-addext", f"subjectAltName=IP:{one.address}", "-keyout", tmp_path / "edge.key",
                    "-out", certificate], check=True, capture_output=True)
    pem.write_text(certificate.read_text() + (tmp_path / "edge.key").read_text())
    data = yaml.safe_load(spec_path.read_text())
    data["gateways"][0]["tls_certificate"] = str(pem)
    tls_spec = spec_path.with_name("spec-tls.yml")
    tls_spec.write_text(yaml.safe_dump(data, sort_keys=False))
    try:
        applied = apply_spec(load_spec(tls_spec))
        assert applied.succeeded, applied.problems
        assert one.ssh("stat -c '%a %U:%G' /etc/haproxy/certs/public.pem").stdout.strip() == "640 root:haproxy"
        trusted = ssl.create_default_context(cafile=str(certificate))
        request = urllib.request.Request(f"https://{one.address}:{PORT}/v1/completions", method="POST",
                                         data=json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 2}).encode(),
                                         headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
        assert wait_for(lambda: set(server_states(one).values()) == {"UP"}, timeout=60), server_states(one)
        with urllib.request.urlopen(request, timeout=10, context=trusted) as answer:
            assert (answer.status, json.loads(answer.read())["choices"][0]["text"]) == (200, " pong")
        with pytest.raises((urllib.error.URLError, ConnectionError, http.client.HTTPException)):
            ask(hosts, "/v1/models", method="GET")  # plain HTTP on the TLS port: no answer
        assert audit_failures(tls_spec)[one.name] == {}
        assert apply_spec(load_spec(tls_spec)).changed == 0
    finally:
        assert apply_spec(load_spec(spec_path)).succeeded  # back to plain HTTP for the tests after


# Holds one of apt's locks as apt does (an fcntl lock: flock(1) is no stand-in), writes its pid once it holds
# it, and the time it let go.
LOCK_HOLDER = """
import fcntl, os, sys, time
lock = open(sys.argv[1], "w")
fcntl.lockf(lock, fcntl.LOCK_EX)
open("/run/vp-lock-holder", "w").write(str(os.getpid()))
time.sleep(float(sys.argv[2]))
open("/run/vp-lock-released", "w").write(repr(time.time()))
"""


def hold_lock(host, path: str, seconds: float) -> int:
    """Another process on `host` holds apt's lock `path` for `seconds`, from now on: its pid."""
    return int(host.ssh(f"rm -f /run/vp-lock-holder /run/vp-lock-released; "
                        f"setsid python3 -c {shlex.quote(LOCK_HOLDER)} {path} {seconds} >/dev/null 2>&1 </dev/null & "
                        "while [ ! -s /run/vp-lock-holder ]; do sleep 0.1; done; cat /run/vp-lock-holder").stdout)


def test_the_install_waits_for_apts_lock_and_past_its_bound_fails_naming_the_holder(hosts, runs, spec_path):
    """apt-get update never waits for /var/lib/apt/lists/lock (tests/fixtures/apt): the module apt_packages tries
    again until role gateway's bound; past it, one sentence with apt's line naming the holder."""
    one, _ = hosts
    install = Controls(tags=("gateway_install",))
    one.ssh("apt-get remove --yes -qq haproxy >/dev/null")  # its configuration stays: reinstalled, it serves again
    holder = hold_lock(one, "/var/lib/apt/lists/lock", 20)
    events: list = []
    output: list[str] = []  # -v: the module's result, on Ansible's output
    waited = apply_spec(load_spec(spec_path), hosts=[one.name], on_result=events.append, on_output=output.append,
                        controls=Controls(tags=("gateway_install",), verbosity=1))
    assert waited.succeeded, waited.problems
    assert "Install haproxy" in gateway_changes(events)
    released = float(one.ssh("cat /run/vp-lock-released").stdout)
    installed = float(one.ssh("stat -c %.3Y /var/lib/dpkg/info/haproxy.list").stdout)  # written by the install
    assert installed > released, f"haproxy installed {released - installed:.1f} s before process {holder} let go"
    (result,) = [line for line in output if '"held_by"' in line]
    held = f"Could not get lock /var/lib/apt/lists/lock. It is held by process {holder} (python3)"
    assert f'"held_by": "{held}"' in result, result
    seconds = int(re.search(r'"waited": (\d+)', result).group(1))
    print(f"the install waited {seconds} s for the lists' lock, held 20 s from before the run")
    assert seconds >= 5, result

    one.ssh("apt-get remove --yes -qq haproxy >/dev/null")
    holder = hold_lock(one, "/var/lib/apt/lists/lock", 120)
    try:
        started = time.monotonic()
        refused = apply_spec(load_spec(spec_path), hosts=[one.name],
                             controls=Controls(tags=("gateway_install",), extra_vars=("gateway_apt_lock_timeout=4",)))
        seconds = time.monotonic() - started
    finally:
        one.ssh(f"kill {holder}")
    (problem,) = refused.problems
    assert (problem.task, problem.status) == ("Install haproxy", "failed")
    assert re.fullmatch(
        r"The package manager is busy: `apt-get update` waited [45] s for apt's lock, and another process still holds "
        rf'it \("Could not get lock /var/lib/apt/lists/lock\. It is held by process {holder} \(python3\)"\) - let that '
        r"process finish \(often unattended-upgrades or apt-daily\), or stop it, then run again", problem.message), \
        problem.message
    assert seconds < 60
    assert apply_spec(load_spec(spec_path), hosts=[one.name], controls=install).succeeded  # haproxy back
    assert wait_for(lambda: set(server_states(one).values()) == {"UP"}, timeout=60), server_states(one)
