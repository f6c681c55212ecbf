"""What the monitoring hosts of the lab need: Debian's prometheus and prometheus-node-exporter (roles prometheus
and node_exporter install them with apt-get, no recommends) and what they need beyond the lab's rootfs, as a
cached flat apt repository built like haproxy's (tests/lab/haproxy.py) and served on the lab's bridge; and the
spec both tests/integration/test_monitoring.py and benchmarks/render_dashboards.py apply to two such hosts."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from tests.lab.haproxy import debian_repo
from tests.lab.hosts import TestHost
from tests.lab.specs import MODEL, host_entry, instance_entry

MONITORING_PACKAGES = ("prometheus", "prometheus-node-exporter")  # what roles prometheus and node_exporter install
PROMETHEUS_PORT = 9090
# short intervals: alerts fire within seconds
MONITORING = {"scrape_interval": "2s", "gpu_metrics_interval": "2s",
              "alerts": {"down_for": "4s", "pending_for": "4s", "rate_window": "30s"}}


def monitoring_repo() -> Path:
    return debian_repo("monitoring", MONITORING_PACKAGES)


def monitoring_spec(one: TestHost, two: TestHost, wheelhouse: Path) -> dict:
    """Two hosts, an instance on each (qwen-a's first tokens take 300 ms against an SLO of 200 ms at p99), Prometheus
    on host one; the stand-in vLLM from `wheelhouse`."""
    return {
        "version": 1,
        "hosts": [host_entry(one, wheelhouse), host_entry(two, wheelhouse)],
        "instances": [instance_entry(one, "qwen-a", 8000, slo={"ttft_p99_ms": 200}, env={"STANDIN_TTFT_MS": "300"}),
                      instance_entry(two, "qwen-b", 8000)],
        "monitoring": {"host": one.name, **MONITORING},
    }


def stream_completion(address: str, tokens: int, port: int = 8000, timeout: float = 60) -> None:
    """One streamed completion of `tokens` tokens from the instance at address:port, read to its end."""
    body = json.dumps({"model": MODEL, "prompt": "one two three", "max_tokens": tokens, "stream": True}).encode()
    request = urllib.request.Request(f"http://{address}:{port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        answer.read()
