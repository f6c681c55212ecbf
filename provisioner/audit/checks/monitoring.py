"""The spec's monitoring (docs/monitoring.md): node_exporter answers on every host, with fresh GPU metrics where
the timer runs, and Prometheus on the monitoring host scrapes every target of the spec.

Spec mode, where the spec has `monitoring:`. The host is asked from itself (monitoring_probe.py, run on the
host: node_exporter's /metrics, Prometheus's /api/v1/targets); the targets expected are those
provisioner/fleet/monitoring.py writes into the scrape configuration.
"""

import shlex

from provisioner.audit.engine import json_answer
from provisioner.audit.instance_files import PROBE_TIMEOUT_S, PROBES
from provisioner.audit.registry import each

MONITORING_PROBE = PROBES / "monitoring_probe.py"  # node_exporter's and Prometheus's answers


def commands(expected):
    monitoring = expected.get("monitoring")
    if not monitoring:
        return {}
    urls = [monitoring["exporter"]["url"]] + ([monitoring["prometheus"]["url"]] if monitoring.get("prometheus") else [])
    return {"monitoring": f"timeout {2 * PROBE_TIMEOUT_S} python3 -c {shlex.quote(MONITORING_PROBE.read_text())} "
                          + " ".join(map(shlex.quote, urls))}


def read(expected, out):
    """MONITORING_PROBE's answer: {exporter: {answers, nvsmi_up, nvsmi_age_s} or {error}, prometheus: {targets}
    or {error}}, and why the probe gave none."""
    answer, problem = json_answer(out["monitoring"], dict) if "monitoring" in out else (None, None)
    return {"monitoring": answer, "monitoring_problem": problem}

exporter = each(lambda expected: [expected["monitoring"]["exporter"]] if expected.get("monitoring") else [],
                ids=lambda item: "node_exporter")
gpu_timer = each(lambda expected: [expected["monitoring"]["exporter"]]
                 if expected.get("monitoring") and expected["monitoring"]["exporter"]["gpu_timer"] else [],
                 ids=lambda item: "nvsmi")
targets = each(lambda expected: expected["monitoring"]["prometheus"]["targets"]
               if expected.get("monitoring") and expected["monitoring"]["prometheus"] else [],
               ids=lambda target: f"{target['job']}/{target['instance']}")


def answer(facts, part: str) -> dict:
    """The probe's answer for `part` (exporter, prometheus), or {error} saying why there is none."""
    if facts.monitoring is None:
        return {"error": f"the probe failed ({facts.monitoring_problem})"}
    return facts.monitoring.get(part) or {"error": "not asked"}


@exporter
def node_exporter_answers(case, facts, audit):
    """`node_exporter: answers` — node_exporter's /metrics asked from the host itself (its port from the spec): without it Prometheus has no host or GPU metrics from this host.

    Modes: spec.
    """
    shown = answer(facts, "exporter")
    audit.expect("node_exporter: answers", f"answers on {case.item['url']}",
                 f"answers on {case.item['url']}" if shown.get("answers") else shown.get("error", "no answer"))


@gpu_timer
def gpu_metrics_fresh(case, facts, audit):
    """`node_exporter: GPU metrics` — the GPU timer's `nvsmi_up` and the age of `nvsmi_timestamp_seconds` in node_exporter's answer: nvidia-smi answered within three of the timer's intervals (and 10 s).

    Modes: spec.

    Stale metrics mean the timer stopped (`systemctl status nvsmi-textfile.timer`); `nvsmi_up 0` that
    nvidia-smi failed (`journalctl -u nvsmi-textfile`).
    """
    item, shown = case.item, answer(facts, "exporter")
    expected = f"nvsmi_up 1, at most {item['max_age_s']:g} s old"
    if "error" in shown:
        audit.expect("node_exporter: GPU metrics", expected, shown["error"], passed=False)
    if "nvsmi_up" not in shown:
        audit.expect("node_exporter: GPU metrics", expected, "no nvsmi_up: the timer never wrote", passed=False)
    age = shown.get("nvsmi_age_s")
    actual = f"nvsmi_up {shown['nvsmi_up']:g}, {age:g} s old" if age is not None else f"nvsmi_up {shown['nvsmi_up']:g}"
    audit.expect("node_exporter: GPU metrics", expected, actual,
                 passed=shown["nvsmi_up"] == 1 and age is not None and age <= item["max_age_s"])


@targets
def prometheus_target_up(case, facts, audit):
    """`prometheus: JOB/INSTANCE up` — the target's health in Prometheus's /api/v1/targets on the monitoring host (`up == 1`), for every target of the spec: node_exporter of each host, each instance's /metrics.

    Modes: spec.

    A target that is down shows Prometheus's last scrape error; one Prometheus does not have says so (its
    configuration is not the spec's: apply again).
    """
    target, shown = case.item, answer(facts, "prometheus")
    check = f"prometheus: {target['job']}/{target['instance']} up"
    if "error" in shown:
        audit.expect(check, "up", f"Prometheus does not answer: {shown['error']}", passed=False)
    health = {(job, instance): (state, error) for job, instance, state, error in shown["targets"]}
    state, error = health.get((target["job"], target["instance"]), ("not a target of Prometheus", ""))
    audit.expect(check, "up", f"{state}: {error}" if error else state, passed=state == "up")
