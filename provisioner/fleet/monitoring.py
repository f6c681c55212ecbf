"""The spec's monitoring, computed once: the scrape targets (file_sd, labelled host, instance, model, gpu_uuid),
the Prometheus configuration that reads them, and the alert rules with their thresholds.

Used by the inventory (role prometheus writes exactly these files on the monitoring host; role node_exporter
gets the timer's settings), by `provision monitoring export` (the same files for your own Prometheus), by
the audit (the targets that must be up) and by the tests. docs/monitoring.md lists every metric and rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from provisioner.base.files import write_folder
from provisioner.base.module_utils import value_rules
from provisioner.fleet.dashboards import dashboard_files
from provisioner.spec import Host, Instance, Spec
from provisioner.spec.gateways import replica_address
from provisioner.spec.models import Monitoring

host_port = value_rules.host_port
CONFIG_FILE = "prometheus.yml"
TARGETS_DIR = "targets"  # file_sd files, beside the configuration (Prometheus resolves them from its folder)
RULES_FILE = "rules/vllm-provision.yml"
NODE_JOB, VLLM_JOB, DCGM_JOB = "node", "vllm", "dcgm"
TEXTFILE_PREFIX = "nvsmi_"  # the metrics of the GPU timer (roles/node_exporter/files/nvsmi-textfile)
# clocks_event_reasons that mean the card slows down for heat or an external power brake (not its own
# power limit, sw_power_cap, which a loaded card hits by design): GpuThrottled
THROTTLE_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown")
# Xid codes that need a GPU reset, a reboot or service, not only a restart of the application (GpuXidNeedsAction):
# 46 (GPU stopped processing) and 48 (double bit ECC error): CRITICAL, "drain: reset_gpu → service_required" in
# NVIDIA's Health Validation Xid checks (docs.nvidia.com/health-validation/reference/checks/xid.md); 48, 63, 64:
# the double bit error and the page retirement/row remapping events of NVIDIA's dynamic page retirement
# (docs.nvidia.com/deploy/dynamic-page-retirement/visibility.html: "reload the driver to activate", "unable to
# retire page"); 79: the GPU has fallen off the bus; 154: the driver's own "GPU recovery action changed ...
# (GPU Reset Required)" (github.com/NVIDIA/open-gpu-kernel-modules issues 1045, 1151); 74 (NVLink error), 92
# (high single-bit ECC rate), 94 and 95 (contained and uncontained ECC errors): from issue 20's list, whose
# resolution buckets are in NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html)
XID_NEEDS_ACTION = (46, 48, 63, 64, 74, 79, 92, 94, 95, 154)


@dataclass(frozen=True)
class Target:
    """One scrape target: its job, the address Prometheus scrapes and its labels."""

    job: str
    address: str
    labels: dict[str, str]

    @property
    def name(self) -> str:
        """The target's `instance` label: the spec's instance or host name."""
        return self.labels["instance"]


def settings(spec: Spec) -> Monitoring:
    return spec.monitoring or Monitoring()


def targets(spec: Spec) -> list[Target]:
    """Every target of the spec: node_exporter (and dcgm-exporter) on each host, each instance's /metrics."""
    monitoring = settings(spec)
    found = [Target(NODE_JOB, host_port(host.address, monitoring.node_exporter_port), host_labels(host))
             for host in spec.hosts]
    if monitoring.gpu_metrics == "dcgm":
        found += [Target(DCGM_JOB, host_port(host.address, monitoring.dcgm_exporter_port), host_labels(host))
                  for host in spec.hosts if host.gpus.devices]
    for instance in spec.instances:
        host = spec.host(instance.host)
        address = "127.0.0.1" if host.name == monitoring.host and instance.bind in ("127.0.0.1", "localhost") \
            else replica_address(instance, host)
        found.append(Target(VLLM_JOB, host_port(address, instance.port), instance_labels(host, instance)))
    return found


def host_labels(host: Host) -> dict[str, str]:
    return {"host": host.name, "instance": host.name}


def instance_labels(host: Host, instance: Instance) -> dict[str, str]:
    """An instance's labels; its GPUs' UUIDs comma-joined (index-only GPUs of the spec: their index)."""
    uuids = [host.gpu_uuid(ref) or str(ref) for ref in instance.gpus]
    return {"host": host.name, "instance": instance.name, "model": instance.served_names[0],
            "gpu_uuid": ",".join(uuids)}


def target_files(spec: Spec) -> dict[str, list[dict[str, Any]]]:
    """The file_sd files: targets/<job>.yml → [{targets: [address], labels}], one entry per target."""
    files: dict[str, list[dict[str, Any]]] = {}
    for target in targets(spec):
        files.setdefault(f"{TARGETS_DIR}/{target.job}.yml", []).append(
            {"targets": [target.address], "labels": dict(target.labels)})
    return files


def prometheus_config(spec: Spec) -> dict[str, Any]:
    """prometheus.yml: the global intervals, the rules file, one scrape job per file_sd file."""
    monitoring = settings(spec)
    jobs = sorted({target.job for target in targets(spec)}, key=[NODE_JOB, DCGM_JOB, VLLM_JOB].index)
    return {
        "global": {"scrape_interval": monitoring.scrape_interval, "evaluation_interval": monitoring.scrape_interval},
        "rule_files": [RULES_FILE],
        "scrape_configs": [{"job_name": job, "file_sd_configs": [{"files": [f"{TARGETS_DIR}/{job}.yml"]}]}
                           for job in jobs],
    }


# --------------------------------------------------------------------------- alert rules


DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def duration_seconds(duration: str) -> float:
    """A Prometheus duration of the spec (15s, 5m, 500ms) in seconds."""
    number = duration.rstrip("smhd")
    unit = duration[len(number):]
    return int(number) * DURATION_UNITS[unit]


def _seconds(milliseconds: int) -> str:
    return f"{milliseconds / 1000:g}"


def _selector(**labels: str) -> str:
    return "{" + ",".join(f'{name}="{value}"' for name, value in labels.items()) + "}"


def _rule(name: str, expr: str, pending: str, severity: str, summary: str, **labels: str) -> dict[str, Any]:
    return {"alert": name, "expr": expr, "for": pending, "labels": {"severity": severity, **labels},
            "annotations": {"summary": summary}}


SLO_METRICS = {  # slo field → (alert, histogram, what it measures)
    "ttft_p99_ms": ("VllmTtftOverSlo", "vllm:time_to_first_token_seconds", "time to first token"),
    "itl_p99_ms": ("VllmItlOverSlo", "vllm:inter_token_latency_seconds", "inter-token latency"),
    "tpot_p99_ms": ("VllmTpotOverSlo", "vllm:request_time_per_output_token_seconds", "time per output token"),
}


def instance_rules(spec: Spec) -> list[dict[str, Any]]:
    alerts = settings(spec).alerts
    vllm = _selector(job=VLLM_JOB)
    rules = [
        _rule("VllmInstanceDown", f"up{vllm} == 0", alerts.down_for, "critical",
              "a vLLM instance does not answer /metrics: stopped, failed or not ready"),
        _rule("VllmKvCacheHigh", f"vllm:kv_cache_usage_perc{vllm} > {alerts.kv_cache_usage:g}", alerts.pending_for,
              "warning", f"an instance's KV cache is over {alerts.kv_cache_usage:.0%} full: requests will wait or be "
                         "preempted"),
        _rule("VllmRequestsQueueing", f"vllm:num_requests_waiting{vllm} > {alerts.requests_waiting}",
              alerts.pending_for, "warning", f"more than {alerts.requests_waiting} requests wait for an instance"),
    ]
    for instance in spec.instances:
        for field, (alert, histogram, what) in SLO_METRICS.items():
            limit = getattr(instance.slo, field, None) if instance.slo else None
            if limit is None:
                continue
            selector = _selector(job=VLLM_JOB, instance=instance.name)
            expr = (f"histogram_quantile(0.99, sum by (le, host, instance, model) "
                    f"(rate({histogram}_bucket{selector}[{alerts.rate_window}]))) > {_seconds(limit)}")
            rules.append(_rule(alert, expr, alerts.pending_for, "warning",
                               f"{instance.name}: p99 {what} over its SLO of {limit} ms", slo_ms=str(limit)))
    return rules


def gpu_rules(spec: Spec) -> list[dict[str, Any]]:
    alerts = settings(spec).alerts
    rules = []
    for host in spec.hosts:
        for device in host.gpus.devices:
            selector = _selector(job=NODE_JOB, host=host.name, gpu=str(device.index))
            limit = f"{TEXTFILE_PREFIX}power_limit_watts{selector}"
            target = device.power_limit
            bound = str(target) if isinstance(target, int) else \
                f"{TEXTFILE_PREFIX}power_{'max' if target == 'max' else 'default'}_limit_watts{selector}"
            rules.append(_rule("GpuPowerLimitBelowTarget", f"{limit} < {bound}", alerts.down_for, "critical",
                               f"{host.name} GPU {device.index}: power limit below the spec's {target}",
                               target=str(target)))
    for host, index, shares in _shared_gpus(spec):
        selector = _selector(job=NODE_JOB, host=host.name, gpu=str(index))
        most = round(shares + alerts.memory_share_slack, 4)
        rules.append(_rule(
            "GpuMemorySharesExceeded",
            f"{TEXTFILE_PREFIX}memory_used_bytes{selector} / {TEXTFILE_PREFIX}memory_total_bytes{selector} > {most:g}",
            alerts.pending_for, "warning",
            f"{host.name} GPU {index}: more memory used than the spec's instances' shares ({shares:g}) allow",
            shares=f"{shares:g}"))
    reasons = "|".join(THROTTLE_REASONS)
    rules += [
        _rule("GpuThrottled", f'{TEXTFILE_PREFIX}clocks_event_active{{job="{NODE_JOB}",reason=~"{reasons}"}} == 1',
              alerts.pending_for, "warning", "a GPU slows its clocks for heat or a hardware power brake"),
        _rule("GpuMetricsFailing", f"{TEXTFILE_PREFIX}up{_selector(job=NODE_JOB)} == 0", alerts.down_for, "warning",
              "nvidia-smi does not answer the GPU metrics timer"),
        # counted since boot: it fires at the first such line and until the host reboots
        _rule("GpuXidNeedsAction",
              f'{TEXTFILE_PREFIX}xid_errors_total{{job="{NODE_JOB}",xid=~"{"|".join(map(str, XID_NEEDS_ACTION))}"}} > 0',
              "0s", "critical", "a GPU logged an Xid error that needs a GPU reset, a reboot or service (NVIDIA's Xid "
                                "catalog); counted since boot, it fires until the host reboots"),
    ]
    return rules


def _shared_gpus(spec: Spec) -> list[tuple[Host, int, float]]:
    """(host, GPU index, the instances' shares added up) for each GPU of the spec that instances use."""
    found = []
    for host in spec.hosts:
        for device in host.gpus.devices:
            shares = sum(instance.gpu_memory_utilization for instance in spec.instances_on(host.name)
                         if device.index in instance.gpus or (device.uuid and device.uuid in instance.gpus))
            if shares:
                found.append((host, device.index, round(shares, 4)))
    return found


def host_rules(spec: Spec) -> list[dict[str, Any]]:
    alerts = settings(spec).alerts
    node, window = _selector(job=NODE_JOB), alerts.rate_window
    return [
        _rule("NodeExporterDown", f"up{node} == 0", alerts.down_for, "critical",
              "a host's node_exporter does not answer: no host or GPU metrics from it"),
        _rule("HostSwappingWhileVllmRuns",
              f"(rate(node_vmstat_pswpin{node}[{window}]) + rate(node_vmstat_pswpout{node}[{window}])) > 0 "
              f'and on (host) (count by (host) (up{_selector(job=VLLM_JOB)} == 1) > 0)',
              alerts.pending_for, "warning", "a host swaps while vLLM instances run on it"),
    ]


def alert_rules(spec: Spec) -> dict[str, Any]:
    """The rules file: one group each for instances, GPUs and hosts."""
    return {"groups": [{"name": "vllm-provision-instances", "rules": instance_rules(spec)},
                       {"name": "vllm-provision-gpus", "rules": gpu_rules(spec)},
                       {"name": "vllm-provision-hosts", "rules": host_rules(spec)}]}


def alert_names(spec: Spec) -> list[str]:
    return list(dict.fromkeys(rule["alert"] for group in alert_rules(spec)["groups"] for rule in group["rules"]))


# --------------------------------------------------------------------------- files


def prometheus_files(spec: Spec) -> dict[str, str]:
    """Every file of the configuration, relative to Prometheus's folder → its text (role prometheus writes
    them under /etc/prometheus; `provision monitoring export` under its --out)."""
    files = {CONFIG_FILE: dump(prometheus_config(spec)), RULES_FILE: dump(alert_rules(spec))}
    files.update({name: dump(entries) for name, entries in target_files(spec).items()})
    return files


def dump(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=1000)


def export(spec: Spec, out_dir: str | Path) -> list[Path]:
    """Write the configuration for your own Prometheus, and the Grafana dashboards (dashboards/): all files or none."""
    return write_folder(out_dir, {**prometheus_files(spec), **dashboard_files()})


def expected_targets(spec: Spec) -> list[dict[str, str]]:
    """What the audit and the tests expect Prometheus to scrape: {job, instance} per target, in spec order."""
    return [{"job": target.job, "instance": target.name} for target in targets(spec)]


def exporter_vars(spec: Spec, host: Host) -> dict[str, Any]:
    """What role node_exporter applies on a host (nothing without a monitoring: section)."""
    if spec.monitoring is None:
        return {}
    monitoring = spec.monitoring
    return {
        "node_exporter_enabled": True,
        "node_exporter_port": monitoring.node_exporter_port,
        "node_exporter_gpu_timer": bool(host.gpus.devices),
        "node_exporter_gpu_interval": monitoring.gpu_metrics_interval,
        "node_exporter_dcgm": monitoring.gpu_metrics == "dcgm" and bool(host.gpus.devices),
        "node_exporter_dcgm_port": monitoring.dcgm_exporter_port,
    }


def prometheus_vars(spec: Spec, host: Host) -> dict[str, Any]:
    """What role prometheus applies on the monitoring host (none on the others)."""
    if spec.monitoring is None or spec.monitoring.host != host.name:
        return {}
    return {"prometheus_port": spec.monitoring.prometheus_port, "prometheus_files": prometheus_files(spec)}
