"""Grafana dashboards for the spec's monitoring, as files for Grafana's file provisioning: a fleet view and a
per-instance view, over the metric names vLLM 0.25.0 exports (recorded on the H200), the GPU timer's and
node_exporter's (docs/monitoring.md lists them). `provision monitoring export` writes them under dashboards/.

Their PromQL is checked by promtool (tests/unit/test_dashboards.py) and run against the lab's real Prometheus
(tests/integration/test_monitoring.py): every expression returns series there.
"""

from __future__ import annotations

import json
from typing import Any

RATE = "$__rate_interval"  # Grafana's rate window (at least four scrape intervals)
DASHBOARDS_DIR = "dashboards"


def _panel(title: str, exprs: dict[str, str], unit: str = "short", kind: str = "timeseries",
           maximum: float | None = None) -> dict[str, Any]:
    """One panel: its queries ({legend: expr}), its unit; placed by `_laid_out`."""
    defaults: dict[str, Any] = {"unit": unit}
    if maximum is not None:
        defaults["max"] = maximum
    return {"type": kind, "title": title, "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "targets": [{"refId": chr(ord("A") + index), "expr": expr, "legendFormat": legend,
                         "datasource": {"type": "prometheus", "uid": "${datasource}"}}
                        for index, (legend, expr) in enumerate(exprs.items())]}


def _laid_out(panels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Two panels a row, 12 wide and 8 high, numbered from 1."""
    return [{**panel, "id": index + 1, "gridPos": {"h": 8, "w": 12, "x": 12 * (index % 2), "y": 8 * (index // 2)}}
            for index, panel in enumerate(panels)]


def _quantile(q: float, histogram: str, selector: str, by: str) -> str:
    return f"histogram_quantile({q}, sum by (le, {by}) (rate({histogram}_bucket{selector}[{RATE}])))"


def _variable(name: str, query: str, label: str) -> dict[str, Any]:
    return {"name": name, "label": label, "type": "query", "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "query": {"query": query, "refId": name}, "definition": query, "refresh": 2, "sort": 1,
            "includeAll": False, "multi": False}


DATASOURCE = {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus"}


def _dashboard(uid: str, title: str, panels: list[dict[str, Any]], variables: list[dict[str, Any]]) -> dict[str, Any]:
    return {"uid": uid, "title": title, "tags": ["vllm-provision"], "timezone": "browser", "schemaVersion": 39,
            "version": 1, "editable": True, "refresh": "30s", "time": {"from": "now-3h", "to": "now"},
            "templating": {"list": [DATASOURCE, *variables]}, "annotations": {"list": []},
            "panels": _laid_out(panels)}


def fleet() -> dict[str, Any]:
    vllm, node = '{job="vllm"}', '{job="node"}'
    panels = [
        _panel("Instances up", {"{{instance}}": f"up{vllm}"}, kind="stat"),
        _panel("Alerts firing", {"{{alertname}} {{instance}}": 'ALERTS{alertstate="firing"}'}, kind="table"),
        _panel("Requests running", {"{{instance}}": f"sum by (instance) (vllm:num_requests_running{vllm})"}),
        _panel("Requests waiting", {"{{instance}}": f"sum by (instance) (vllm:num_requests_waiting{vllm})"}),
        _panel("KV cache use", {"{{instance}}": f"max by (instance) (vllm:kv_cache_usage_perc{vllm})"},
               unit="percentunit", maximum=1),
        _panel("Generated tokens/s",
               {"{{instance}}": f"sum by (instance) (rate(vllm:generation_tokens_total{vllm}[{RATE}]))"}),
        _panel("Time to first token, p99",
               {"{{instance}}": _quantile(0.99, "vllm:time_to_first_token_seconds", vllm, "instance")}, unit="s"),
        _panel("Inter-token latency, p99",
               {"{{instance}}": _quantile(0.99, "vllm:inter_token_latency_seconds", vllm, "instance")}, unit="s"),
        _panel("Preemptions/s", {"{{instance}}": f"sum by (instance) (rate(vllm:num_preemptions_total{vllm}[{RATE}]))"}),
        _panel("GPU power draw and limit", {"{{host}} GPU {{gpu}} draw": f"nvsmi_power_draw_watts{node}",
                                             "{{host}} GPU {{gpu}} limit": f"nvsmi_power_limit_watts{node}"},
               unit="watt"),
        _panel("GPU memory used", {"{{host}} GPU {{gpu}}": f"nvsmi_memory_used_bytes{node} / nvsmi_memory_total_bytes{node}"},
               unit="percentunit", maximum=1),
        _panel("GPU temperature", {"{{host}} GPU {{gpu}}": f"nvsmi_temperature_celsius{node}"}, unit="celsius"),
        _panel("GPU clock event reasons active", {"{{host}} GPU {{gpu}} {{reason}}": f"nvsmi_clocks_event_active{node} == 1"},
               kind="table"),
        _panel("GPU SM clock", {"{{host}} GPU {{gpu}}": f"nvsmi_clock_sm_hertz{node}"}, unit="hertz"),
        _panel("Host CPU busy",
               {"{{host}}": f'1 - avg by (host) (rate(node_cpu_seconds_total{{job="node",mode="idle"}}[{RATE}]))'},
               unit="percentunit", maximum=1),
        _panel("Host memory available, swapping",
               {"{{host}} available": f"node_memory_MemAvailable_bytes{node} / node_memory_MemTotal_bytes{node}",
                "{{host}} pages swapped/s": f"rate(node_vmstat_pswpin{node}[{RATE}]) + rate(node_vmstat_pswpout{node}[{RATE}])"}),
    ]
    return _dashboard("vllm-provision-fleet", "vLLM fleet (vllm-provision)", panels, [])


def instance() -> dict[str, Any]:
    one = '{job="vllm",instance="$instance"}'
    gpus = '{job="node",host="$host"}'
    panels = [
        _panel("Requests running, waiting", {"running": f"vllm:num_requests_running{one}",
                                              "waiting": f"vllm:num_requests_waiting{one}"}),
        _panel("KV cache use", {"KV cache": f"vllm:kv_cache_usage_perc{one}"}, unit="percentunit", maximum=1),
        _panel("Time to first token", {f"p{round(q * 100)}": _quantile(q, "vllm:time_to_first_token_seconds", one, "instance")
                                       for q in (0.5, 0.9, 0.99)}, unit="s"),
        _panel("Inter-token latency", {f"p{round(q * 100)}": _quantile(q, "vllm:inter_token_latency_seconds", one, "instance")
                                       for q in (0.5, 0.9, 0.99)}, unit="s"),
        _panel("Time per output token, end to end, queue, p99", {
            "time per output token": _quantile(0.99, "vllm:request_time_per_output_token_seconds", one, "instance"),
            "end to end": _quantile(0.99, "vllm:e2e_request_latency_seconds", one, "instance"),
            "queue": _quantile(0.99, "vllm:request_queue_time_seconds", one, "instance")}, unit="s"),
        _panel("Tokens/s", {"prompt": f"rate(vllm:prompt_tokens_total{one}[{RATE}])",
                            "generated": f"rate(vllm:generation_tokens_total{one}[{RATE}])"}),
        _panel("Requests finished/s, preemptions/s", {
            "{{finished_reason}}": f"sum by (finished_reason) (rate(vllm:request_success_total{one}[{RATE}]))",
            "preemptions": f"rate(vllm:num_preemptions_total{one}[{RATE}])"}),
        _panel("Its host's GPUs: power draw and limit", {"GPU {{gpu}} draw": f"nvsmi_power_draw_watts{gpus}",
                                                          "GPU {{gpu}} limit": f"nvsmi_power_limit_watts{gpus}"},
               unit="watt"),
        _panel("Its host's GPUs: memory used",
               {"GPU {{gpu}}": f"nvsmi_memory_used_bytes{gpus} / nvsmi_memory_total_bytes{gpus}"},
               unit="percentunit", maximum=1),
        _panel("Its host's GPUs: temperature", {"GPU {{gpu}}": f"nvsmi_temperature_celsius{gpus}"}, unit="celsius"),
    ]
    variables = [_variable("instance", 'label_values(up{job="vllm"}, instance)', "Instance"),
                 _variable("host", 'label_values(up{job="vllm",instance="$instance"}, host)', "Host")]
    return _dashboard("vllm-provision-instance", "vLLM instance (vllm-provision)", panels, variables)


def dashboards() -> dict[str, dict[str, Any]]:
    """dashboards/<uid>.json → the dashboard."""
    return {f"{DASHBOARDS_DIR}/{board['uid']}.json": board for board in (fleet(), instance())}


def dashboard_files() -> dict[str, str]:
    return {name: json.dumps(board, indent=2) + "\n" for name, board in dashboards().items()}


def expressions(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) of every query of the dashboard, and of its variables' label_values()."""
    found = [(panel["title"], target["expr"]) for panel in board["panels"] for target in panel["targets"]]
    for variable in board["templating"]["list"]:
        query = (variable.get("query") or {}) if isinstance(variable.get("query"), dict) else {}
        if query.get("query", "").startswith("label_values("):
            found.append((f"variable {variable['name']}", query["query"][len("label_values("):].rsplit(",", 1)[0]))
    return found


def with_variables(expr: str, instance: str, host: str, rate: str = "1m") -> str:
    """An expression as Grafana sends it: its variables replaced."""
    return expr.replace(RATE, rate).replace("$instance", instance).replace("$host", host)
