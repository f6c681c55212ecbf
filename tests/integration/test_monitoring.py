"""Monitoring on real systemd test hosts (bookworm, systemd-nspawn, over SSH): two hosts each run an instance
(the stand-in vLLM, whose /metrics writes vLLM 0.25.0's names) and the TEST DOUBLE nvidia-smi; both get
Debian's node_exporter with the GPU timer (role node_exporter), host one also Debian's Prometheus (role
prometheus), both from the lab's apt repository (tests/lab/monitoring.py). The spec's short intervals let
alerts fire within seconds.

One module-scoped pair of hosts, shared by the tests in order: check mode on the fresh hosts, apply twice,
every target up in Prometheus's HTTP API, the stand-in's and the GPU timer's metrics in Prometheus, a
stopped instance, a 300 W power cap and an Xid 79 line in the journal each firing their alert, the audit and
its drift, a reboot of the monitoring host.
"""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request

import pytest
import yaml

from provisioner.apply.controls import Controls
from provisioner.apply.hosts import apply_spec
from provisioner.fleet import monitoring
from provisioner.fleet.dashboards import dashboards, expressions, with_variables
from provisioner.plan import build_plan
from provisioner.spec import load_spec
from tests.doubles.vllm_wheel import build_standin_wheel
from tests.integration.conftest import audit_failures, check_then_apply_twice
from tests.lab.haproxy import repo_hosts
from tests.lab.monitoring import PROMETHEUS_PORT, monitoring_repo, monitoring_spec, stream_completion
from tests.lab.specs import MODEL, fake_gpu_uuid


@pytest.fixture(scope="module")
def hosts(lab):
    with repo_hosts(lab, monitoring_repo(), "mon") as booted:
        yield booted


@pytest.fixture(scope="module")
def spec_path(hosts, tmp_path_factory):
    one, two = hosts
    folder = tmp_path_factory.mktemp("monitoring")
    # a wheelhouse of this module's own: the shared cache's stand-in wheel is rebuilt by every lab that starts,
    # from its own checkout (another checkout's stand-in may have no /metrics)
    wheelhouse = build_standin_wheel("0.25.0", folder / "standin-wheelhouse").parent
    path = folder / "spec.yml"
    path.write_text(yaml.safe_dump(monitoring_spec(one, two, wheelhouse), sort_keys=False))
    return path


def api(hosts, path: str, **query: str) -> dict:
    """Prometheus's HTTP API on the monitoring host, from the bastion: its `data`."""
    url = f"http://{hosts[0].address}:{PROMETHEUS_PORT}/api/v1/{path}"
    if query:
        url += "?" + urllib.parse.urlencode(query)
    with urllib.request.urlopen(url, timeout=10) as answer:
        body = json.loads(answer.read())
    assert body["status"] == "success", body
    return body["data"]


def values(hosts, expr: str) -> dict[tuple, float]:
    """An instant query: {the series' labels (sorted pairs, without its name): value}."""
    return {tuple(sorted((name, value) for name, value in sample["metric"].items() if name != "__name__")):
            float(sample["value"][1])
            for sample in api(hosts, "query", query=expr)["result"]}


def targets_up(hosts) -> dict[tuple[str, str], str]:
    """Every active target: (job, instance label) → health (up, down, unknown)."""
    return {(target["labels"]["job"], target["labels"]["instance"]): target["health"]
            for target in api(hosts, "targets", state="active")["activeTargets"]}


def firing(hosts, alert: str) -> list[dict[str, str]]:
    """The labels of the firing alerts of that name."""
    return sorted((found["labels"] for found in api(hosts, "alerts")["alerts"]
                   if found["labels"]["alertname"] == alert and found["state"] == "firing"),
                  key=lambda labels: sorted(labels.items()))


def wait_for(predicate, timeout: float = 60.0, step: float = 1.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except OSError:  # Prometheus not listening yet (a restart, a reboot)
            value = None
        if value or time.monotonic() > deadline:
            return value
        time.sleep(step)


def monitoring_changes(events, host) -> list[str]:
    return [event.task for event in events if event.role.endswith(("node_exporter", "prometheus"))
            and event.status == "changed" and event.host == host.name]


@pytest.fixture(scope="module")
def runs(hosts, spec_path):
    """Check mode on the fresh hosts, then the first and second apply, each with its task results."""
    return check_then_apply_twice(spec_path, hosts[0], "command -v prometheus")


EXPORTER_CHECK = ["Say what would be installed (check mode)", "Write the exporter's arguments",
                  "Install the GPU metrics script", "Write the GPU metrics service", "Write the GPU metrics timer",
                  "Say the GPU metrics timer would be started (check mode)",
                  "Say the exporter would be restarted (check mode)",
                  "Say the GPU metrics timer would be restarted (check mode)"]
EXPORTER_FIRST = ["Install the exporters", "Write the exporter's arguments", "Install the GPU metrics script",
                  "Write the GPU metrics service", "Write the GPU metrics timer", "Enable and start the GPU metrics timer",
                  "Restart the exporter",
                  "Restart the GPU metrics timer"]


def test_check_mode_on_fresh_hosts_changes_nothing_and_predicts_the_run(hosts, runs):
    one, two = hosts
    assert runs["check"].succeeded, runs["check"].problems
    assert runs["disk after check"] == runs["disk before"], "check mode changed files on the monitoring host"
    assert runs["installed after check"] != 0, "check mode installed prometheus"
    check, first = runs["events"]["check"], runs["events"]["first"]
    # each change of the real run, said beforehand by its check-mode counterpart
    assert monitoring_changes(check, two) == EXPORTER_CHECK
    assert monitoring_changes(first, two) == EXPORTER_FIRST
    assert monitoring_changes(check, one) == EXPORTER_CHECK + [
        "Say prometheus would be installed (check mode)",
        "Say what check mode would write (prometheus would be installed first)",
        "Say prometheus would be restarted (check mode)"]
    assert monitoring_changes(first, one) == EXPORTER_FIRST + [
        "Install prometheus", "Make the configuration's folders", "Write the scrape targets", "Write the alert rules",
        "Write prometheus.yml", "Write prometheus's arguments", "Reload prometheus", "Restart prometheus"]
    notes = [note for event in check if event.role.endswith("prometheus") for note in event.notes]
    assert "would write /etc/prometheus/prometheus.yml, /etc/prometheus/rules/vllm-provision.yml, " \
           "/etc/prometheus/targets/node.yml, /etc/prometheus/targets/vllm.yml and /etc/default/prometheus" in notes


def test_apply_converges_then_changes_nothing(hosts, runs, spec_path):
    one, two = hosts
    assert runs["first"].succeeded, runs["first"].problems
    assert runs["second"].succeeded, runs["second"].problems
    assert {name: stats.changed for name, stats in runs["second"].stats.items()} == {one.name: 0, two.name: 0}
    for host in hosts:
        assert host.ssh("systemctl is-active prometheus-node-exporter.service nvsmi-textfile.timer; "
                        "systemctl is-enabled prometheus-node-exporter.service nvsmi-textfile.timer").stdout.split() \
            == ["active"] * 2 + ["enabled"] * 2
    assert one.ssh("systemctl is-active prometheus.service; systemctl is-enabled prometheus.service").stdout.split() == \
        ["active", "enabled"]
    assert two.ssh("command -v prometheus", check=False).returncode != 0, "prometheus on a host that is not the spec's"
    # the files on each host are the ones `provision plan` shows (on the monitoring host: the ones
    # `provision monitoring export` writes, under /etc/prometheus)
    plans = {plan.host: plan for plan in build_plan(load_spec(spec_path))}
    assert [file.path for file in plans[one.name].monitoring_files if file.role == "prometheus"][:-1] == [
        f"/etc/prometheus/{name}" for name in sorted(monitoring.prometheus_files(load_spec(spec_path)))]
    for host in hosts:
        for file in plans[host.name].monitoring_files:
            assert host.ssh(f"stat -c %a {file.path}; cat {file.path}").stdout == f"{file.mode[1:]}\n{file.content}", \
                file.path


def test_prometheus_scrapes_every_target_of_the_spec(hosts, runs, spec_path):
    one, two = hosts
    expected = {(target["job"], target["instance"]): "up" for target in monitoring.expected_targets(load_spec(spec_path))}
    assert expected == {("node", one.name): "up", ("node", two.name): "up", ("vllm", "qwen-a"): "up",
                        ("vllm", "qwen-b"): "up"}
    assert wait_for(lambda: targets_up(hosts) == expected, timeout=60), targets_up(hosts)
    assert values(hosts, 'up{job="vllm"}') == {
        (("gpu_uuid", fake_gpu_uuid(host)), ("host", host.name), ("instance", name), ("job", "vllm"), ("model", MODEL)): 1.0
        for host, name in ((one, "qwen-a"), (two, "qwen-b"))}
    # the GPU timer's metrics, through node_exporter's textfile collector: the limit role nvidia_gpu set ('max')
    limits = values(hosts, "nvsmi_power_limit_watts")
    assert {labels[3][1]: value for labels, value in limits.items()} == {one.name: 400.0, two.name: 400.0}
    assert values(hosts, "nvsmi_up") == {(("host", h.name), ("instance", h.name), ("job", "node")): 1.0 for h in hosts}
    # journalctl answers the timer, in its unit's sandbox (the Xid counters' source)
    assert values(hosts, "nvsmi_kernel_log_up") == {(("host", h.name), ("instance", h.name), ("job", "node")): 1.0
                                                    for h in hosts}


def stream(host, tokens: int) -> None:
    stream_completion(host.address, tokens, timeout=30)


def test_the_stand_in_s_metrics_and_a_missed_slo_reach_prometheus(hosts, runs):
    """qwen-a's first tokens take 300 ms (STANDIN_TTFT_MS), its SLO says 200 ms at p99: VllmTtftOverSlo fires.
    (The counts are taken against those before: the unit's readiness probe sent a completion of its own.)"""
    one, _ = hosts
    assert firing(hosts, "VllmTtftOverSlo") == []
    queries = {"tokens": 'vllm:generation_tokens_total{job="vllm",instance="qwen-a"}',
               "first tokens": 'vllm:time_to_first_token_seconds_count{job="vllm",instance="qwen-a"}',
               "first tokens within 0.25 s": 'vllm:time_to_first_token_seconds_bucket{instance="qwen-a",le="0.25"}',
               "first tokens within 0.5 s": 'vllm:time_to_first_token_seconds_bucket{instance="qwen-a",le="0.5"}'}

    def counts() -> dict[str, float]:
        return {name: sum(values(hosts, query).values()) for name, query in queries.items()}
    before = counts()
    for _ in range(6):
        stream(one, 8)
    grown = wait_for(lambda: (lambda now: now if now["tokens"] - before["tokens"] == 48 else None)(counts()),
                     timeout=30)
    assert grown, (before, counts())
    assert {name: grown[name] - before[name] for name in queries} == {
        "tokens": 48.0, "first tokens": 6.0, "first tokens within 0.25 s": 0.0, "first tokens within 0.5 s": 6.0}
    labels = list(values(hosts, queries["tokens"]))
    assert labels == [(("engine", "0"), ("gpu_uuid", fake_gpu_uuid(one)), ("host", one.name), ("instance", "qwen-a"),
                       ("job", "vllm"), ("model", MODEL), ("model_name", MODEL))]

    def slo_alert():
        stream(one, 2)  # keep the rate over the 30 s window above zero
        return firing(hosts, "VllmTtftOverSlo")
    assert wait_for(slo_alert, timeout=60) == [{
        "alertname": "VllmTtftOverSlo", "severity": "warning", "slo_ms": "200", "host": one.name,
        "instance": "qwen-a", "model": MODEL}]


def test_every_dashboard_query_returns_series_from_the_real_prometheus(hosts, runs):
    """Each panel's and variable's PromQL, its variables set as Grafana would (qwen-a, its host), run against the
    lab's Prometheus right after the load above (so the latency quantiles have rates, and VllmTtftOverSlo fires:
    ALERTS has a series): every one parses and returns series from the real exporters."""
    one, _ = hosts
    empty = [(board["uid"], title, query)
             for board in dashboards().values() for title, expr in expressions(board)
             for query in [with_variables(expr, "qwen-a", one.name)]
             if not api(hosts, "query", query=query)["result"]]
    assert empty == []


def test_a_stopped_instance_fires_vllm_instance_down(hosts, runs):
    _, two = hosts
    assert firing(hosts, "VllmInstanceDown") == []
    two.ssh("systemctl stop vllm-qwen-b.service")
    try:
        assert wait_for(lambda: firing(hosts, "VllmInstanceDown"), timeout=60) == [{
            "alertname": "VllmInstanceDown", "severity": "critical", "job": "vllm", "host": two.name,
            "instance": "qwen-b", "model": MODEL, "gpu_uuid": fake_gpu_uuid(two)}]
    finally:
        two.ssh("systemctl start vllm-qwen-b.service")
    assert wait_for(lambda: firing(hosts, "VllmInstanceDown") == [], timeout=60)


def test_a_300_w_power_cap_fires_gpu_power_limit_below_target(hosts, runs, spec_path):
    """The drift seed 3 lost a third of its throughput to: a card capped below the spec's limit ('max', 400 W)."""
    _, two = hosts
    assert firing(hosts, "GpuPowerLimitBelowTarget") == []
    two.ssh("nvidia-smi -pl 300")  # the TEST DOUBLE nvidia-smi keeps it (its state, until the next boot)
    assert wait_for(lambda: firing(hosts, "GpuPowerLimitBelowTarget"), timeout=60) == [{
        "alertname": "GpuPowerLimitBelowTarget", "severity": "critical", "target": "max", "job": "node",
        "host": two.name, "instance": two.name, "gpu": "0", "gpu_uuid": fake_gpu_uuid(two),
        "gpu_name": "NVIDIA GeForce RTX 3090"}]
    # role nvidia_gpu sets 'max' again (its tag only, on that host: the rest is proven unchanged above)
    repaired = apply_spec(load_spec(spec_path), hosts=[two.name], controls=Controls(tags=("nvidia_gpu",)))
    assert repaired.succeeded, repaired.problems
    assert wait_for(lambda: firing(hosts, "GpuPowerLimitBelowTarget") == [], timeout=60)


GPU_TIMER_UNIT = "/etc/systemd/system/nvsmi-textfile.timer"
XID_79 = "NVRM: Xid (PCI:0000:01:00): 79, pid=1234, name=python, GPU has fallen off the bus."
# the GPU timer's test seam (roles/node_exporter/files/nvsmi-textfile): its journal match, for a line logger wrote
XID_SEAM = "/etc/systemd/system/nvsmi-textfile.service.d/lab-xid-seam.conf"


def test_an_xid_79_in_the_journal_fires_gpu_xid_needs_action(hosts, runs):
    """The containers have no kernel log of their own: the Xid line goes into host two's journal with `logger -t
    kernel`, which `journalctl -k` does not read (it is _TRANSPORT=syslog), so the timer reads it through its test
    seam (SYSLOG_IDENTIFIER=kernel, which the kernel's own lines have too). Its labels: the GPU's, joined from the
    TEST DOUBLE's pci.bus_id (00000000:01:00.0)."""
    _, two = hosts
    assert firing(hosts, "GpuXidNeedsAction") == []
    two.ssh(f"mkdir -p {XID_SEAM.rsplit('/', 1)[0]} && printf '[Service]\\nEnvironment="
            f"NVSMI_TEXTFILE_KERNEL_MATCH=SYSLOG_IDENTIFIER=kernel\\n' > {XID_SEAM} && systemctl daemon-reload")
    try:
        two.ssh(f"logger -t kernel -p kern.err '{XID_79}'")
        assert two.ssh("journalctl -k -b 0 -o cat | grep -c 'NVRM: Xid'", check=False).stdout.strip() == "0"
        assert wait_for(lambda: firing(hosts, "GpuXidNeedsAction"), timeout=60) == [{
            "alertname": "GpuXidNeedsAction", "severity": "critical", "job": "node", "host": two.name,
            "instance": two.name, "gpu": "0", "gpu_uuid": fake_gpu_uuid(two), "gpu_name": "NVIDIA GeForce RTX 3090",
            "pci_bus_id": "0000:01:00", "xid": "79"}]
        assert values(hosts, f'nvsmi_xid_errors_total{{host="{two.name}"}}') == {
            (("gpu", "0"), ("gpu_name", "NVIDIA GeForce RTX 3090"), ("gpu_uuid", fake_gpu_uuid(two)),
             ("host", two.name), ("instance", two.name), ("job", "node"), ("pci_bus_id", "0000:01:00"),
             ("xid", "79")): 1.0}
    finally:  # the seam gone and the counts since boot forgotten: the series goes, the alert clears
        two.ssh(f"systemctl stop nvsmi-textfile.timer nvsmi-textfile.service; rm -f {XID_SEAM} "
                "/var/lib/nvsmi-textfile/xid.json; systemctl daemon-reload; systemctl start nvsmi-textfile.timer")
    assert wait_for(lambda: firing(hosts, "GpuXidNeedsAction") == [], timeout=60)


def test_the_audit_passes_then_names_a_stopped_exporter(hosts, runs, spec_path):
    one, two = hosts
    assert audit_failures(spec_path) == {one.name: {}, two.name: {}}
    two.ssh("systemctl stop prometheus-node-exporter.service")
    # and a rendered file drifted (systemd reads the timer again only at a daemon-reload: harmless meanwhile)
    two.ssh(f"echo '# local change' >> {GPU_TIMER_UNIT}")
    try:
        assert wait_for(lambda: targets_up(hosts)[("node", two.name)] == "down", timeout=30)
        drifted = audit_failures(spec_path)
        assert drifted[two.name] == {
            "node_exporter: answers": ("answers on http://127.0.0.1:9100/metrics", "[Errno 111] Connection refused"),
            "node_exporter: GPU metrics": ("nvsmi_up 1, at most 16 s old", "[Errno 111] Connection refused"),
            f"file {GPU_TIMER_UNIT}": ("as rendered (11 lines, root:root 0644)",
                                       "line 12: '# local change' added (root:root 0644)")}
        assert list(drifted[one.name]) == [f"prometheus: node/{two.name} up"]
        expected, actual = drifted[one.name][f"prometheus: node/{two.name} up"]
        assert expected == "up"
        assert actual.startswith(f'down: Get "http://{two.address}:9100/metrics": dial tcp {two.address}:9100: connect: '
                                 "connection refused"), actual
    finally:  # role node_exporter starts it again, and writes the timer again
        events: list = []
        repaired = apply_spec(load_spec(spec_path), hosts=[two.name], controls=Controls(tags=("node_exporter",)),
                              on_result=events.append)
    assert repaired.succeeded, repaired.problems
    assert monitoring_changes(events, two) == ["Write the GPU metrics timer", "Enable and start the exporter",
                                               "Restart the GPU metrics timer"]
    assert wait_for(lambda: targets_up(hosts)[("node", two.name)] == "up", timeout=30)
    assert audit_failures(spec_path) == {one.name: {}, two.name: {}}


def test_prometheus_scrapes_again_after_a_reboot_of_the_monitoring_host(hosts, runs, spec_path):
    one, _ = hosts
    one.reboot(timeout=180)
    expected = {(target["job"], target["instance"]): "up" for target in monitoring.expected_targets(load_spec(spec_path))}
    assert wait_for(lambda: targets_up(hosts) == expected, timeout=90), targets_up(hosts)
    assert one.ssh("systemctl is-active prometheus.service nvsmi-textfile.timer").stdout.split() == ["active", "active"]
    assert wait_for(lambda: audit_failures(spec_path) == {name: {} for name in (one.name, hosts[1].name)}, timeout=30)
