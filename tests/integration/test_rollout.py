"""Zero-downtime fleet changes on real systemd test hosts (bookworm, systemd-nspawn, over SSH): three hosts
each serve the same model (the stand-in vLLM, TEST DOUBLE; it takes STARTUP_S to load, as a real model
takes its time), a fourth runs the gateway (Debian's haproxy 2.6, role gateway) balancing the three.

While a steady load runs from the bastion (tests/lab/load.py: completions through the gateway, counted),
one module-scoped fleet goes through, in order:
  (a) an instance option changed fleet-wide with `apply --rolling --batch 1`;
  (a') the same kind of change without --rolling (what the rollout buys: the failures it would have cost);
  (c) an upgrade whose new vLLM never gets ready (TEST DOUBLE wheel that exits at start): the canary is
      rolled back, the run fails naming the version and the error, the other hosts are untouched;
  (b) vLLM upgraded fleet-wide, 0.25.0 -> 0.33.0, with --rolling.
Each rolling run: 0 failed client requests, each host restarted once, in its own window (the timeline is
printed), the audit clean after.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pytest
import yaml

from provisioner.apply import ApplyResult, Controls, TaskResult, apply_spec
from provisioner.audit.expectations import spec_targets
from provisioner.audit.runner import audit_hosts
from provisioner.rollout import Rollout
from provisioner.spec import load_spec
from tests.lab.containers import AptRepo
from tests.lab.haproxy import GatewayHost, haproxy_repo
from tests.lab.load import Load
from tests.lab.specs import MODEL, host_entry, install_standin, instance_entry, standin_wheelhouse

KEY = "sk-lab-rollout-5b2e71"
PORT = 8080
STARTUP_S = 3  # the stand-in's model load: a fleet restarted at once has no replica for this long
RATE = 20  # requests a second, from the bastion
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


def fleet_spec(serving, edge, version: str = "0.25.0", fails_at_start: str | None = None, **options) -> dict:
    hosts = []
    for host in [*serving, edge]:
        entry = host_entry(host)
        entry["vllm"] = {**entry["vllm"], "version": version,
                         "wheelhouse": str(standin_wheelhouse(version, fails_at_start=fails_at_start))}
        hosts.append(entry)
    instances = [instance_entry(host, f"chat-{index}", 8000, bind="0.0.0.0", api_key_file="chat.key",
                                env={"STANDIN_STARTUP_DELAY": str(STARTUP_S)},
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
    with Load(fleet.url(), MODEL, KEY, rate=RATE, duration=900, max_tokens=16) as load:
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
                                      f"{chat} to the vLLM in /opt/vllm/venvs/0.25.0 (ready again)"), problem.message
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
