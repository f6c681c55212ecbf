"""Monitoring from the spec: its checks word for word, the scrape targets and their labels, the inventory's
variables, and the generated Prometheus configuration and alert rules run through the real promtool
(Debian's prometheus package, .ci/setup): `promtool check config`, and `promtool test rules` on
tests/fixtures/monitoring/rules-test.yml, which holds a test for every alert the rules have."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from provisioner.fleet import monitoring
from provisioner.fleet.dashboards import dashboard_files
from provisioner.fleet.inventory import build_inventory
from provisioner.plan import build_plan
from provisioner.spec import load_spec, validate_spec
from tests.unit.conftest import host, instance, problems_of, spec_data

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "monitoring"
SPEC = FIXTURES / "spec.yml"


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    binary = shutil.which("promtool")
    assert binary, "promtool is missing: bash .ci/setup installs Debian's prometheus package, which ships it"
    return subprocess.run([binary, *args], cwd=cwd, capture_output=True, text=True)


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("prometheus") / "out"
    monitoring.export(load_spec(SPEC), out)
    shutil.copy(FIXTURES / "rules-test.yml", out / "rules-test.yml")
    return out


def test_the_exported_configuration_passes_promtool_check_config(exported):
    checked = promtool("check", "config", "prometheus.yml", cwd=exported)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 13 rules found" in checked.stdout


def test_the_alert_rules_pass_their_promtool_tests(exported):
    tested = promtool("test", "rules", "rules-test.yml", cwd=exported)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert tested.stdout.strip().splitlines()[-1].strip() == "SUCCESS"


def test_every_alert_has_a_test_that_sees_it_fire():
    tests = yaml.safe_load((FIXTURES / "rules-test.yml").read_text())["tests"]
    fired = {case["alertname"] for test in tests for case in test["alert_rule_test"] if case["exp_alerts"]}
    assert sorted(fired) == sorted(monitoring.alert_names(load_spec(SPEC)))
    assert monitoring.alert_names(load_spec(SPEC)) == [
        "VllmInstanceDown", "VllmKvCacheHigh", "VllmRequestsQueueing", "VllmTtftOverSlo", "VllmItlOverSlo",
        "GpuPowerLimitBelowTarget", "GpuMemorySharesExceeded", "GpuThrottled", "GpuMetricsFailing", "GpuXidNeedsAction",
        "NodeExporterDown", "HostSwappingWhileVllmRuns"]


def test_targets_are_labelled_host_instance_model_gpu_uuid():
    files = monitoring.target_files(load_spec(SPEC))
    assert files == {
        "targets/node.yml": [{"targets": ["10.0.0.11:9100"], "labels": {"host": "gpu1", "instance": "gpu1"}},
                             {"targets": ["10.0.0.12:9100"], "labels": {"host": "mon", "instance": "mon"}}],
        "targets/vllm.yml": [
            {"targets": ["10.0.0.11:8000"], "labels": {"host": "gpu1", "instance": "qwen-a", "model":
                                                       "Qwen/Qwen2.5-7B-Instruct",
                                                       "gpu_uuid": "GPU-6f1d2c3b-4a59-4e87-9b1a-0c2d3e4f5a6b"}},
            {"targets": ["10.0.0.11:8001"], "labels": {"host": "gpu1", "instance": "qwen-b", "model":
                                                       "Qwen/Qwen2.5-7B-Instruct",
                                                       "gpu_uuid": "GPU-6f1d2c3b-4a59-4e87-9b1a-0c2d3e4f5a6b"}}],
    }


def test_dcgm_adds_a_target_per_gpu_host():
    data = yaml.safe_load(SPEC.read_text())
    data["monitoring"]["gpu_metrics"] = "dcgm"
    spec = validate_spec(data)
    assert [(target.job, target.address, target.name) for target in monitoring.targets(spec)
            if target.job == "dcgm"] == [("dcgm", "10.0.0.11:9400", "gpu1")]
    assert [job["job_name"] for job in monitoring.prometheus_config(spec)["scrape_configs"]] == ["node", "dcgm", "vllm"]


def test_the_inventory_gives_every_host_its_exporter_and_the_monitoring_host_prometheus():
    spec = load_spec(SPEC)
    files = build_inventory(spec)
    assert files["hosts.yml"]["all"]["children"]["vllm_hosts"]["children"] == {"gateway": {},
                                                                               "monitoring": {"hosts": {"mon": {}}}}
    gpu1, mon = files["host_vars/gpu1.yml"], files["host_vars/mon.yml"]
    assert {name: gpu1[name] for name in gpu1 if name.startswith("node_exporter_")} == {
        "node_exporter_enabled": True, "node_exporter_port": 9100, "node_exporter_gpu_timer": True,
        "node_exporter_gpu_interval": "15s", "node_exporter_dcgm": False, "node_exporter_dcgm_port": 9400}
    assert mon["node_exporter_gpu_timer"] is False
    assert "prometheus_files" not in gpu1
    assert mon["prometheus_port"] == 9090
    assert mon["prometheus_files"] == monitoring.prometheus_files(spec)
    assert sorted(mon["prometheus_files"]) == ["prometheus.yml", "rules/vllm-provision.yml", "targets/node.yml",
                                               "targets/vllm.yml"]


def test_without_monitoring_the_inventory_has_none_of_it():
    files = build_inventory(validate_spec(spec_data()))
    assert not [name for name in files["host_vars/ws4070.yml"] if name.startswith(("node_exporter_", "prometheus_"))]


def test_a_power_limit_in_watts_or_default_is_the_rule_s_target():
    data = spec_data(hosts=[host(gpus={"devices": [{"index": 0, "uuid": "GPU-00000000-0000-4000-8000-000000000000",
                                                    "power_limit": "default"}]})],
                     instances=[instance("chat", 8000, bind="0.0.0.0")])
    data["monitoring"] = {}
    rules = monitoring.gpu_rules(validate_spec(data))
    assert rules[0]["expr"] == ('nvsmi_power_limit_watts{job="node",host="ws4070",gpu="0"} < '
                                'nvsmi_power_default_limit_watts{job="node",host="ws4070",gpu="0"}')
    assert rules[1]["expr"] == ('nvsmi_memory_used_bytes{job="node",host="ws4070",gpu="0"} / '
                                'nvsmi_memory_total_bytes{job="node",host="ws4070",gpu="0"} > 0.33')


def test_the_checks_name_an_unknown_monitoring_host_and_an_instance_prometheus_cannot_reach():
    data = spec_data(instances=[instance("chat", 8000)])
    data["monitoring"] = {"host": "ws4071"}
    assert problems_of(data) == [
        "instances[0].bind: '127.0.0.1' answers only on 'ws4070' itself: Prometheus on 'ws4071' cannot scrape its "
        "/metrics — bind it to 0.0.0.0 or the host's address",
        "monitoring.host: unknown host 'ws4071' — did you mean 'ws4070'? hosts in this spec: ws4070",
    ]
    data["monitoring"] = {"host": "ws4070"}  # Prometheus beside it scrapes it on loopback
    assert monitoring.targets(validate_spec(data))[-1].address == "127.0.0.1:8000"
    data["monitoring"] = {"scrape_interval": "15 s"}
    assert problems_of(data) == [
        "monitoring.scrape_interval: '15 s' is not a duration — write a whole number and a unit, larger units "
        "first, as Prometheus does (e.g. 15s, 5m, 1m30s)"]


def test_monitoring_is_not_a_group_name():
    data = spec_data(hosts=[host(groups=["monitoring"])])
    assert problems_of(data) == ["hosts[0].groups[0]: 'monitoring' is the group of the host that runs Prometheus "
                                 "(the inventory makes it) — choose another name"]


def test_provision_monitoring_export_writes_the_files_role_prometheus_writes(tmp_path):
    from typer.testing import CliRunner

    from provisioner.cli.main import app

    result = CliRunner().invoke(app, ["monitoring", "export", "--out", str(tmp_path / "out"), "--spec", str(SPEC)],
                                env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    written = {path.relative_to(tmp_path / "out").as_posix(): path.read_text()
               for path in (tmp_path / "out").rglob("*") if path.is_file()}
    assert written == {**build_inventory(load_spec(SPEC))["host_vars/mon.yml"]["prometheus_files"],
                       **dashboard_files()}
    assert sorted(name for name in written if name.startswith("dashboards/")) == [
        "dashboards/vllm-provision-fleet.json", "dashboards/vllm-provision-instance.json"]
    fits = instance("chat", 8000, options={"max-model-len": 4096})  # the gate refuses one that does not fit
    (tmp_path / "plain.yml").write_text(yaml.safe_dump(spec_data(instances=[fits])))
    refused = CliRunner().invoke(app, ["monitoring", "export", "--out", str(tmp_path / "none"),
                                       "--spec", str(tmp_path / "plain.yml")], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert refused.exit_code == 1
    assert "the spec has no monitoring: section" in refused.output
    assert not (tmp_path / "none").exists()


def test_provision_plan_shows_the_files_the_monitoring_roles_write():
    spec = load_spec(SPEC)
    plans = {plan.host: plan for plan in build_plan(spec)}
    gpu1, mon = plans["gpu1"].monitoring_files, plans["mon"].monitoring_files
    assert [(file.path, file.mode, file.role) for file in gpu1] == [
        ("/etc/default/prometheus-node-exporter", "0644", "node_exporter"),
        ("/etc/systemd/system/nvsmi-textfile.service", "0644", "node_exporter"),
        ("/etc/systemd/system/nvsmi-textfile.timer", "0644", "node_exporter")]
    assert 'ARGS="--web.listen-address=:9100 --collector.textfile.directory=/var/lib/prometheus/node-exporter"' in \
        gpu1[0].content.splitlines()
    assert "OnUnitActiveSec=15s" in gpu1[2].content.splitlines()
    assert [file.path for file in mon] == [
        "/etc/default/prometheus-node-exporter",  # mon lists no GPU: no timer
        "/etc/prometheus/prometheus.yml", "/etc/prometheus/rules/vllm-provision.yml",
        "/etc/prometheus/targets/node.yml", "/etc/prometheus/targets/vllm.yml", "/etc/default/prometheus"]
    assert {file.path.removeprefix("/etc/prometheus/"): file.content for file in mon[1:5]} == \
        monitoring.prometheus_files(spec)
    assert mon[5].content.splitlines()[-1] == ('ARGS="--config.file=/etc/prometheus/prometheus.yml '
                                               '--web.listen-address=:9090 --storage.tsdb.retention.time=15d"')
    assert build_plan(validate_spec(spec_data()))[0].monitoring_files == []


def test_the_audit_compares_every_file_the_monitoring_roles_write():
    """`file PATH` rows for the files `provision plan` shows (and the GPU timer's script), with the roles' owners
    and modes: drift in any of them is a failed row with its first differing line."""
    from provisioner.audit.expectations import spec_targets
    from provisioner.base.paths import role_dir

    spec = load_spec(SPEC)
    plans = {plan.host: plan for plan in build_plan(spec)}
    for target in spec_targets(spec):
        monitored = [file for file in target.expected["managed_files"] if file["role"] in ("node_exporter", "prometheus")]
        planned = plans[target.name].monitoring_files
        script = [file for file in monitored if file["path"] == "/usr/local/lib/vllm-provision/nvsmi-textfile"]
        assert [(file["path"], file["mode"], file["role"], file["content"]) for file in monitored if file not in script] \
            == [(file.path, file.mode, file.role, file.content) for file in planned]
        assert {file["owner"] for file in monitored} == {"root:root"}
        assert [monitored.index(file) for file in script] == ([1] if target.name == "gpu1" else [])
        for file in script:
            assert (file["mode"], file["content"]) == (
                "0755", (role_dir("node_exporter") / "files" / "nvsmi-textfile").read_text())
