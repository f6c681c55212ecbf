"""Fleet changes on real systemd test hosts (bookworm, systemd-nspawn, over SSH): three hosts each serve the
same model (the stand-in vLLM, TEST DOUBLE; it takes STARTUP_S to load, as a real model takes its time), a
fourth runs the gateway (Debian's haproxy 2.6, role gateway) balancing the three.

While a steady load runs from the bastion (tests/lab/load.py: half chat, half completions, half of each
streamed, every answer checked), one module-scoped fleet goes through, in order:
  - an instance option changed fleet-wide with `apply --rolling --batch 1`, then the same without --rolling
    (what the rollout buys: the failures it would have cost);
  - an upgrade whose new vLLM never gets ready (TEST DOUBLE wheel that exits at start): the canary rolled
    back, the others untouched; then vLLM upgraded fleet-wide, 0.25.0 -> 0.33.0, with --rolling;
  - the failure paths (issue 32): (a) a setting that stops vLLM at start on the canary (its config rolled
    back, back in rotation), fixed forward, then a wide batch; (b) a batch that would empty the route,
    refused before any drain; (c) Ctrl-C mid-batch, and haproxy killed mid-batch; (d) a host powered off
    mid-batch; and an operator's drain across haproxy's reload and restart, an apply and the audit.
Each prints its timeline with request counts; a rolling run loses no request, and ends with every replica
in rotation and the audit clean.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from provisioner.apply.controls import Controls
from provisioner.apply.events import TaskResult
from provisioner.apply.hosts import apply_spec
from provisioner.apply.playbook import ApplyResult
from provisioner.audit.expectations import spec_targets
from provisioner.audit.runner import audit_hosts
from provisioner.base.rollout import Rollout
from provisioner.cli.apply_view import rollout_rows
from provisioner.spec import load_spec
from tests.lab.containers import AptRepo
from tests.lab.haproxy import GatewayHost, haproxy_repo
from tests.lab.load import Load
from tests.lab.specs import MODEL, host_entry, install_standin, instance_entry, standin_wheelhouse
from tests.lab.terminal import as_from_a_terminal

KEY = "sk-lab-rollout-5b2e71"
PORT = 8080
STARTUP_S = 3  # the stand-in's model load: a fleet restarted at once has no replica for this long
RATE = 20  # requests a second, from the bastion
STREAMED = 0.5  # of them streamed (the rest answered whole); half of each chat, half completions (Load's mix)
BROKEN = "RuntimeError: CUDA driver version is insufficient for CUDA runtime version"


@dataclass
class Fleet:
    serving: list  # the three hosts with an instance each, in the spec's (and the rollout's) order
    edge: object  # the gateway's host
    folder: object
    spec: dict = field(default_factory=dict)  # the spec as last written

    def write(self, spec: dict) -> object:
        self.spec = spec
        path = self.folder / "spec.yml"
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        return path

    def url(self) -> str:
        return f"http://{self.edge.address}:{PORT}"

    def instance(self, host) -> str:
        """The instance `host` serves (fleet_spec names them in the hosts' order)."""
        return f"chat-{self.serving.index(host)}"


def fleet_spec(serving, edge, version: str = "0.25.0", fails_at_start: str | None = None, env: dict | None = None,
               **options) -> dict:
    hosts = []
    for host in [*serving, edge]:
        entry = host_entry(host)
        entry["vllm"] = {**entry["vllm"], "version": version,
                         "wheelhouse": str(standin_wheelhouse(version, fails_at_start=fails_at_start))}
        hosts.append(entry)
    instances = [instance_entry(host, f"chat-{index}", 8000, bind="0.0.0.0", api_key_file="chat.key",
                                env={"STANDIN_STARTUP_DELAY": str(STARTUP_S), **(env or {})},
                                options={"max-model-len": 4096, "block-size": 16, **options})
                 for index, host in enumerate(serving)]
    return {"version": 1, "hosts": hosts, "instances": instances,
            "gateways": [{"name": "public", "host": edge.name, "port": PORT}]}


@pytest.fixture(scope="module")
def fleet(lab, tmp_path_factory):
    repo = AptRepo(haproxy_repo(), lab.gateway)
    start = lab.boot_count
    serving = lab.boot_many([f"ro{start}", f"ro{start + 1}", f"ro{start + 2}"])
    (edge,) = lab.boot_many([f"ro{start + 3}"], kind=GatewayHost(repo))
    for host in [*serving, edge]:
        install_standin(host)
    folder = tmp_path_factory.mktemp("rollout")
    (folder / "chat.key").write_text(KEY + "\n")
    built = Fleet(serving, edge, folder)
    deployed = apply_spec(load_spec(built.write(fleet_spec(serving, edge))))
    assert deployed.succeeded, [(p.host, p.label, p.message) for p in deployed.problems]
    yield built
    for host in [*serving, edge]:
        lab.destroy(host)
    repo.close()


@dataclass
class Run:
    """One apply under load: its result, the load's report, and when each unit (re)started."""

    result: ApplyResult
    report: object
    started: float  # the wall clock when the apply began
    seconds: float
    starts: dict[str, list[float]]  # host -> its unit's starts, seconds after the apply began

    @property
    def offset(self) -> float:
        """Seconds from the apply's start to the playbook's, which the turns count from (the preflight between)."""
        return (self.result.turns_since or self.started) - self.started

    def timeline(self, fleet: Fleet) -> str:
        """The turns and the unit starts on one clock: seconds after the apply began."""
        lines = [f"apply: {self.seconds:.1f} s, {self.report.summary()}"]
        for host in fleet.serving:
            turn = self.result.turns.get(host.name)
            window = (f"batch {turn.batch}, {turn.started + self.offset:5.1f}-{turn.ended + self.offset:5.1f} s"
                      if turn else "untouched")
            starts = ", ".join(f"{start:.1f} s" for start in self.starts[host.name]) or "none"
            lines.append(f"  {host.name}: {window}; unit started at {starts}")
        return "\n".join([*lines, self.report.text()])


def unit_starts(host, instance: str, since: float, outcome: str = "Started") -> list[float]:
    """When the instance's unit started (`Failed to start`: failed to) since `since` (the wall clock), in
    seconds after it, from systemd's lines in the host's journal."""
    unit = f"vllm-{instance}.service"
    text = host.ssh(f"journalctl --unit {unit} --since @{int(since)} --output short-unix --no-pager "
                    f"| grep -F '{outcome} {unit}' || true").stdout
    return [float(line.split()[0]) - since for line in text.splitlines() if line.strip()]


def run_under_load(fleet: Fleet, spec: dict, rollout: Rollout | None) -> Run:
    """Apply `spec` while the load runs through the gateway; mark each host's drain, restart and return."""
    path = fleet.write(spec)
    with Load(fleet.url(), MODEL, KEY, rate=RATE, duration=900, max_tokens=16, stream=STREAMED) as load:
        time.sleep(2)  # the load steady before the change

        def mark(task: TaskResult) -> None:
            if task.status in ("changed", "failed") or "gateways" in task.task:
                load.mark(f"{task.host}: {task.task[:40]} ({task.status})")

        started = time.time()
        result = apply_spec(load_spec(path), controls=Controls(rollout=rollout), on_result=mark)
        seconds = time.time() - started
        time.sleep(STARTUP_S + 3)  # the last restarted replica back in, requests in flight ended
        report = load.stop()
    return Run(result, report, started, seconds,
               {host.name: unit_starts(host, fleet.instance(host), started - 1) for host in fleet.serving})


def audit_failures(fleet: Fleet) -> dict[str, dict[str, tuple[str, str]]]:
    """Per host of the fleet, the audit's failed rows against the spec as last written."""
    reports = audit_hosts(spec_targets(load_spec(fleet.folder / "spec.yml")))
    return {name: {check.check: (check.expected, check.actual) for check in report.checks if check.status == "failed"}
            for name, report in reports.items()}


def clean(fleet: Fleet) -> dict[str, dict]:
    return {host.name: {} for host in [*fleet.serving, fleet.edge]}


def assert_rolled_without_a_failed_request(run: Run, fleet: Fleet) -> None:
    """The run succeeded, no client request failed, the hosts took their turns one a batch (the canary
    first), each restarted once, during its own turn, the turns one after another."""
    assert run.result.succeeded, [(p.host, p.label, p.message) for p in run.result.problems]
    assert run.report.failed_total == 0, run.timeline(fleet)
    assert run.report.sent >= RATE * run.seconds * 0.9
    assert [run.result.turns[host.name].batch for host in fleet.serving] == [1, 2, 3], run.timeline(fleet)
    windows = []
    offset = run.offset
    for host in fleet.serving:
        turn = run.result.turns[host.name]
        (start,) = run.starts[host.name]  # restarted once
        assert turn.started + offset <= start + 1 and start <= turn.ended + offset + 1, run.timeline(fleet)  # in its turn
        windows.append((turn.started, turn.ended))
    assert all(earlier[1] <= later[0] for earlier, later in zip(windows, windows[1:])), run.timeline(fleet)


@pytest.fixture(scope="module")
def option_change(fleet):
    run = run_under_load(fleet, fleet_spec(fleet.serving, fleet.edge, **{"max-num-seqs": 64}), Rollout(batch="1"))
    print(f"\n(a) an instance option, fleet-wide, --rolling --batch 1\n{run.timeline(fleet)}")
    return run


def test_a_rolling_option_change_costs_no_request(fleet, option_change):
    assert_rolled_without_a_failed_request(option_change, fleet)
    assert audit_failures(fleet) == clean(fleet)


def test_the_same_change_at_once_costs_requests(fleet, option_change):
    run = run_under_load(fleet, fleet_spec(fleet.serving, fleet.edge, **{"max-num-seqs": 96}), None)
    print(f"\n(a') the same kind of change, without --rolling\n{run.timeline(fleet)}")
    assert run.result.succeeded
    assert all(len(run.starts[host.name]) == 1 for host in fleet.serving), run.timeline(fleet)
    assert run.report.failed_total > 0, run.timeline(fleet)  # what the rollout saved


@pytest.fixture(scope="module")
def failed_upgrade(fleet, option_change):
    spec = fleet_spec(fleet.serving, fleet.edge, version="0.33.0", fails_at_start=BROKEN, **{"max-num-seqs": 96})
    run = run_under_load(fleet, spec, Rollout(batch="1"))
    print(f"\n(c) an upgrade whose new vLLM never gets ready\n{run.timeline(fleet)}")
    return run


def test_a_failed_upgrade_rolls_the_canary_back_and_leaves_the_others_untouched(fleet, failed_upgrade):
    run = failed_upgrade
    canary, *others = fleet.serving
    assert not run.result.succeeded
    (problem,) = [p for p in run.result.problems if p.host == canary.name]
    chat = fleet.instance(canary)
    assert problem.message.startswith(f"vLLM 0.33.0 did not get ready on {chat} ({chat}: {BROKEN}): rolled back "
                                      f"{chat} to the vLLM in /opt/vllm/venvs/0.25.0 and restored the previous unit of "
                                      f"{chat} (ready again)"), problem.message
    assert run.report.failed_total == 0, run.timeline(fleet)
    # onto 0.33.0 it failed to start, then it started again on 0.25.0
    assert unit_starts(canary, chat, run.started - 1, "Failed to start"), run.timeline(fleet)
    assert len(run.starts[canary.name]) == 1, run.timeline(fleet)
    assert canary.ssh("readlink /opt/vllm/current; ls /opt/vllm/venvs").stdout.split() == [
        "/opt/vllm/venvs/0.25.0", "0.25.0"]  # 0.33.0 removed: the next try installs it afresh
    for host in others:
        assert run.starts[host.name] == [] and host.name not in run.result.turns, run.timeline(fleet)
        assert host.ssh("ls /opt/vllm/venvs").stdout.split() == ["0.25.0"]  # untouched
    # the operator goes back to the version that runs: the fleet is as the spec says
    fleet.write(fleet_spec(fleet.serving, fleet.edge, **{"max-num-seqs": 96}))
    assert audit_failures(fleet) == clean(fleet)


@pytest.fixture(scope="module")
def upgrade(fleet, failed_upgrade):
    run = run_under_load(fleet, fleet_spec(fleet.serving, fleet.edge, version="0.33.0", **{"max-num-seqs": 96}),
                         Rollout(batch="1"))
    print(f"\n(b) vLLM 0.25.0 -> 0.33.0, fleet-wide, --rolling --batch 1\n{run.timeline(fleet)}")
    return run


def test_a_rolling_upgrade_costs_no_request_and_keeps_the_previous_version(fleet, upgrade):
    run = upgrade
    assert_rolled_without_a_failed_request(run, fleet)
    for host in fleet.serving:
        assert host.ssh("readlink /opt/vllm/current /opt/vllm/previous").stdout.split() == [
            "/opt/vllm/venvs/0.33.0", "/opt/vllm/venvs/0.25.0"]
    reports = audit_hosts(spec_targets(load_spec(fleet.folder / "spec.yml")))
    for host in fleet.serving:
        checks = {check.check: check for check in reports[host.name].checks}
        assert checks["vLLM versions in /opt/vllm"].actual == "0.33.0 running, 0.25.0 previous"
        assert reports[host.name].status == "passed", [(c.check, c.actual) for c in reports[host.name].checks
                                                       if c.status == "failed"]
    per_host = [run.result.turns[host.name].seconds for host in fleet.serving]
    print(f"time per host (a rolling upgrade): {', '.join(f'{seconds:.1f} s' for seconds in per_host)}")


# an instance setting that stops it at start: the stand-in's own switch (TEST DOUBLE), as a bad
# VLLM_ATTENTION_BACKEND stops the real vLLM
BAD_SETTING = {"STANDIN_FAILS_AT_START": "ValueError: Invalid attention backend: 'NO_SUCH_BACKEND'"}


def test_a_bad_setting_on_the_canary_is_rolled_back_then_fixed_forward_then_a_wide_batch(fleet, upgrade):
    """(a) A setting that stops vLLM at start, fleet-wide with --rolling: the canary's config goes back, it
    serves again and is back in rotation, the run fails naming what was restored, the others are untouched;
    the spec fixed forward rolls through; then a wide batch (--batch 2): no request lost, every replica in
    rotation, the audit clean."""
    canary, *others = fleet.serving
    bad = run_under_load(fleet, fleet_spec(fleet.serving, fleet.edge, version="0.33.0", env=BAD_SETTING,
                                           **{"max-num-seqs": 40}), Rollout(batch="1"))
    print(f"\n(a) a bad setting on the canary\n{bad.timeline(fleet)}")
    assert not bad.result.succeeded
    outcomes = {row["host"]: row["outcome"] for row in rollout_rows(bad.result, [host.name for host in fleet.serving])}
    assert outcomes[canary.name].startswith("rolled back: ") and "restored" in outcomes[canary.name], outcomes
    assert "Invalid attention backend" in outcomes[canary.name], outcomes
    assert all(outcomes[host.name] == "not reached: the rollout stopped before its batch" for host in others), outcomes
    assert bad.report.failed_total == 0, bad.timeline(fleet)
    assert all(bad.starts[host.name] == [] for host in others), bad.timeline(fleet)
    assert gateway_admin(fleet) == {f"chat-{index}": "ready" for index in range(3)}  # the canary serves again

    fixed = run_under_load(fleet, fleet_spec(fleet.serving, fleet.edge, version="0.33.0", **{"max-num-seqs": 40}),
                           Rollout(batch="1"))
    print(f"\n(a) fixed forward\n{fixed.timeline(fleet)}")
    assert_rolled_without_a_failed_request(fixed, fleet)

    wide = run_under_load(fleet, fleet_spec(fleet.serving, fleet.edge, version="0.33.0", **{"max-num-seqs": 56}),
                          Rollout(batch="2"))
    print(f"\n(a) then a wide batch: --batch 2\n{wide.timeline(fleet)}")
    assert wide.result.succeeded, [(p.host, p.label, p.message) for p in wide.result.problems]
    assert wide.report.failed_total == 0, wide.timeline(fleet)
    assert [wide.result.turns[host.name].batch for host in fleet.serving] == [1, 2, 2], wide.timeline(fleet)
    every_replica_serves(fleet)


RECORDS = "/var/lib/vllm-provision/gateway-drains"  # role rollout's rollout_record_dir on the gateway host


def gateway_admin(fleet: Fleet) -> dict[str, str]:
    """Each replica's administrative state at the gateway (HAProxy's `show servers state`), by server."""
    text = fleet.edge.ssh("python3 -c \"import socket; s = socket.socket(socket.AF_UNIX); "
                          "s.connect('/run/haproxy/admin.sock'); s.sendall(b'show servers state\\n'); "
                          "print(b''.join(iter(lambda: s.recv(65536), b'')).decode())\"").stdout
    rows = [line.split() for line in text.splitlines()[2:] if line.strip() and not line.startswith("#")]
    bits = {"0": "ready", "8": "drain", "1": "maint"}
    return {row[3]: bits.get(row[6], row[6]) for row in rows if row[1].startswith("public-")}


def every_replica_serves(fleet: Fleet) -> None:
    """Every replica in rotation at the gateway, and the audit clean on every host."""
    assert gateway_admin(fleet) == {f"chat-{index}": "ready" for index in range(len(fleet.serving))}
    assert audit_failures(fleet) == clean(fleet)


def the_next_rolling_apply_converges(fleet: Fleet, spec: dict, title: str) -> None:
    """After a rollout that did not finish: `spec` again with --rolling --batch 1 succeeds, no request lost,
    every replica serves."""
    rerun = run_under_load(fleet, spec, Rollout(batch="1"))
    print(f"\n{title}\n{rerun.timeline(fleet)}")
    assert rerun.result.succeeded, [(p.host, p.label, p.message) for p in rerun.result.problems]
    assert rerun.report.failed_total == 0, rerun.timeline(fleet)
    every_replica_serves(fleet)


def wait_recorded(fleet: Fleet, server: str, timeout: float = 300) -> None:
    """Until the rollout has recorded its drain of `server` on the gateway host (its turn has begun)."""
    deadline = time.monotonic() + timeout
    while f"public-0.{server}.json" not in fleet.edge.ssh(f"ls {RECORDS}").stdout.split():
        assert time.monotonic() < deadline, f"no drain of {server} recorded within {timeout} s"
        time.sleep(0.2)


def test_a_batch_that_would_empty_a_route_is_refused_before_any_drain(fleet, upgrade):
    """All three replicas in one batch (canary 3): the route would keep none serving; refused, nothing drained."""
    spec = fleet.spec
    with Load(fleet.url(), MODEL, KEY, rate=RATE, duration=300, max_tokens=16, stream=STREAMED) as load:
        time.sleep(2)
        result = apply_spec(load_spec(fleet.write(spec)), controls=Controls(rollout=Rollout(canary=3)))
        time.sleep(2)
        report = load.stop()
    print(f"\n(refused) a batch holding every replica of the route\n{report.text()}")
    assert not result.succeeded
    refusals = {problem.host: problem.message for problem in result.problems}
    assert set(refusals) == {host.name for host in fleet.serving}, refusals
    assert all(message.startswith(f"{fleet.edge.name}: route public-0 (")  # the gateway's loop item, then why
               and "would keep 0 of its 3 replicas serving" in message
               and "--min-serving 0" in message for message in refusals.values()), refusals
    assert report.failed_total == 0 and report.ok > 0, report.text()
    assert gateway_admin(fleet) == {f"chat-{index}": "ready" for index in range(3)}  # nothing was drained
    assert fleet.edge.ssh(f"ls {RECORDS}").stdout.split() == []


def test_an_interrupted_rollout_puts_its_drain_back_and_says_so(fleet, upgrade, tmp_path):
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) once the canary is drained: apply exits 130,
    the gateway puts the drained replica back (it still serves its old config) and the run says so; the
    next rolling apply converges, and the audit has every replica in rotation."""
    spec = fleet_spec(fleet.serving, fleet.edge, version="0.33.0", **{"max-num-seqs": 80})
    path = fleet.write(spec)
    provision = Path(sys.executable).with_name("provision")
    with Load(fleet.url(), MODEL, KEY, rate=RATE, duration=300, max_tokens=16, stream=STREAMED) as load:
        time.sleep(2)
        process = subprocess.Popen([str(provision), "apply", "--rolling", "--spec", str(path)],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                   preexec_fn=as_from_a_terminal)
        wait_recorded(fleet, "chat-0", timeout=120)
        while gateway_admin(fleet)["chat-0"] != "drain":  # recorded first, then drained
            assert process.poll() is None, process.communicate()[0]
            time.sleep(0.1)
        load.mark("SIGINT")
        os.killpg(process.pid, signal.SIGINT)
        output = process.communicate(timeout=300)[0]
        load.mark("apply exited")
        time.sleep(STARTUP_S + 3)
        report = load.stop()
    print(f"\n(interrupted) SIGINT once the canary was drained: exit {process.returncode}\n{output[-3000:]}\n"
          f"{report.text()}")
    assert process.returncode == 130, output
    assert "gateway " in output and ("put back public-0/chat-0" in output or "kept out: public-0/chat-0" in output), output
    assert report.failed_total == 0, report.text()
    if "kept out: public-0/chat-0" in output:  # interrupted while it restarted: the next run puts it back
        assert gateway_admin(fleet)["chat-0"] == "drain"
    else:
        assert gateway_admin(fleet) == {f"chat-{index}": "ready" for index in range(3)}
        assert fleet.edge.ssh(f"ls {RECORDS}").stdout.split() == []

    the_next_rolling_apply_converges(fleet, spec, "(interrupted) the next rolling apply")


def admin_command(fleet: Fleet, command: str) -> None:
    """One command on the gateway's admin socket, as an operator types it there."""
    fleet.edge.ssh("python3 -c \"import socket; s = socket.socket(socket.AF_UNIX); s.connect('/run/haproxy/admin.sock');"
                   f" s.sendall(b'{command}\\n'); s.recv(100)\"")


def test_an_operators_drain_is_kept_across_reloads_and_restarts_named_by_apply_and_failed_by_the_audit(fleet, upgrade):
    """A drain an operator made at the gateway: haproxy's reload and restart keep it (the saved server state);
    an apply keeps it and names it; the audit fails the replica's row with expected vs actual."""
    admin_command(fleet, "set server public-0/chat-1 state drain")
    try:
        for action in ("reload", "restart"):
            fleet.edge.ssh(f"systemctl {action} haproxy.service")
            time.sleep(2)  # the new process has taken the admin socket over
            assert gateway_admin(fleet)["chat-1"] == "drain", action
        notes = []
        result = apply_spec(load_spec(fleet.folder / "spec.yml"), hosts=[fleet.edge.name],
                            on_result=lambda task: notes.extend(task.notes))
        assert result.succeeded, [(p.host, p.label, p.message) for p in result.problems]
        assert "not ours, kept: public-0/chat-1 (drain)" in notes, notes
        assert gateway_admin(fleet)["chat-1"] == "drain"
        failures = audit_failures(fleet)
        assert failures[fleet.edge.name] == {
            f"gateway public-0/chat-1 ({MODEL})": ("ready, UP", "drain (not by vllm-provision), DRAIN")}, failures
    finally:
        admin_command(fleet, "set server public-0/chat-1 state ready")


class GatewayWatch:
    """The gateway's view of the replicas (gateway_admin), read every POLL_S from the bastion in a thread of
    its own: [(wall clock, {server: admin state})], to say what the gateway did at each moment of a run."""

    POLL_S = 0.3

    def __init__(self, fleet: Fleet):
        self.fleet, self.samples, self._stop = fleet, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append((time.time(), gateway_admin(self.fleet)))
            except Exception:  # noqa: BLE001 (haproxy restarting: no answer for a moment)
                self.samples.append((time.time(), {}))
            self._stop.wait(self.POLL_S)

    def __enter__(self) -> GatewayWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def at(self, moment: float) -> dict[str, str]:
        """The last complete view read before `moment`."""
        views = [view for at, view in self.samples if at <= moment and view]
        return views[-1] if views else {}

    def wait(self, server: str, state: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not (self.samples and self.samples[-1][1].get(server) == state):
            assert time.monotonic() < deadline, f"{server} not {state} within {timeout} s: {self.samples[-3:]}"
            time.sleep(0.1)


def unit_stops(host, instance: str, since: float) -> list[float]:
    """The wall clock of each `Stopping vllm-INSTANCE.service` in the host's journal since `since`."""
    unit = f"vllm-{instance}.service"
    text = host.ssh(f"journalctl --unit {unit} --since @{int(since)} --output short-unix --no-pager "
                    f"| grep -F 'Stopping {unit}' || true").stdout
    return [float(line.split()[0]) for line in text.splitlines() if line.strip()]


@dataclass
class Background:
    """A rolling apply running in a thread of its own while the test acts on the fleet (rolling_in_background)."""

    watch: GatewayWatch
    load: Load
    started: float = 0.0  # the wall clock when the apply began, and when it returned
    ended: float = 0.0
    result: ApplyResult | None = None
    report: object = None  # the load's, once it stopped


@contextmanager
def rolling_in_background(fleet: Fleet, spec: dict, settle_s: float = STARTUP_S + 3):
    """Apply `spec` with --rolling --batch 1 in a thread, under the load and a GatewayWatch; the block acts
    meanwhile; on leaving, the apply's end is waited for, then `settle_s`, then the load stops."""
    with GatewayWatch(fleet) as watch, \
            Load(fleet.url(), MODEL, KEY, rate=RATE, duration=600, max_tokens=16, stream=STREAMED) as load:
        time.sleep(2)  # the load steady before the change
        run = Background(watch, load)

        def apply() -> None:
            run.result = apply_spec(load_spec(fleet.write(spec)), controls=Controls(rollout=Rollout(batch="1")))

        worker = threading.Thread(target=apply)
        run.started = time.time()
        worker.start()
        yield run
        worker.join(timeout=600)
        run.ended = time.time()
        load.mark("apply returned")
        time.sleep(settle_s)
        run.report = load.stop()


def test_a_gateway_that_restarts_mid_batch_gets_the_drain_back_before_the_replica_restarts(fleet, upgrade):
    """haproxy killed (a crash: nothing saved) once the canary is drained; systemd starts it again with every
    server in rotation, and the recorded drain is set again: the canary's unit stops only while drained."""
    canary = fleet.serving[0]
    with rolling_in_background(fleet, fleet_spec(fleet.serving, fleet.edge, version="0.33.0",
                                                 **{"max-num-seqs": 72})) as run:
        wait_recorded(fleet, "chat-0")
        run.watch.wait("chat-0", "drain")
        run.load.mark("gateway crash")
        fleet.edge.ssh("systemctl kill --signal=SIGKILL haproxy.service")
    stops = unit_stops(canary, "chat-0", run.started - 1)
    print(f"\n(gateway crash) haproxy killed once chat-0 was drained\n{run.report.text()}\n"
          + "\n".join(f"  chat-0 stopping at {stop - run.started:.1f} s: the gateway had {run.watch.at(stop)}"
                      for stop in stops))
    assert run.result.succeeded, [(p.host, p.label, p.message) for p in run.result.problems]
    assert stops, "the canary's unit was not restarted"
    assert all(run.watch.at(stop).get("chat-0") == "drain" for stop in stops), [run.watch.at(stop) for stop in stops]
    restarts = fleet.edge.ssh("systemctl show haproxy.service -p NRestarts --value").stdout.strip()
    assert restarts != "0", "haproxy was not restarted by systemd"
    every_replica_serves(fleet)


def test_a_host_lost_mid_batch_is_named_and_taken_out_and_the_others_keep_serving(lab, fleet, upgrade):
    """The second host powered off once drained (its turn): the run stops within bounds naming it lost, the
    others serve on, its server goes to maintenance; back on, the next rolling apply puts it back."""
    spec = fleet_spec(fleet.serving, fleet.edge, version="0.33.0", **{"max-num-seqs": 64})
    lost = fleet.serving[1]
    with rolling_in_background(fleet, spec, settle_s=3) as run:
        wait_recorded(fleet, "chat-1")
        run.watch.wait("chat-1", "drain", timeout=60)
        run.load.mark(f"{lost.name} powered off")
        lab.power_off(lost)
        cut = time.time()
    result = run.result
    print(f"\n(lost host) {lost.name} powered off mid-batch; the apply ended {run.ended - cut:.1f} s later\n"
          f"{run.report.text()}")
    assert not result.succeeded
    assert result.lost == [lost.name], (result.stats, [(problem.host, problem.label, problem.status, problem.message)
                                                       for problem in result.problems])
    assert run.ended - cut < 120, "the lost host held the run"
    assert run.report.failed_total == 0, run.report.text()  # drained before the power went
    outcomes = {row["host"]: row["outcome"] for row in rollout_rows(result, [host.name for host in fleet.serving])}
    print(f"{lost.name}: {outcomes[lost.name]}")  # unreachable at its task, or its task failed as it went down
    assert outcomes[lost.name].startswith("lost mid-batch (unreachable at "), outcomes
    assert outcomes[fleet.serving[2].name] == "not reached: the rollout stopped before its batch", outcomes
    said = " ".join(note for task in result.recovery for note in task.notes)
    assert "maintenance for public-0/chat-1 (host lost)" in said, [
        (task.host, task.label, task.status, task.message, task.notes) for task in result.recovery]
    assert gateway_admin(fleet)["chat-1"] == "maint"

    lab.power_on(lost)
    the_next_rolling_apply_converges(fleet, spec, "(lost host) back on; the next rolling apply")
