"""What the monitoring hosts of the lab need: Debian's prometheus and prometheus-node-exporter (roles prometheus
and node_exporter install them with apt-get, no recommends) and what they need beyond the lab's rootfs, as a
cached flat apt repository built like haproxy's (tests/lab/haproxy.py) and served on the lab's bridge."""

from __future__ import annotations

from pathlib import Path

from tests.lab.haproxy import debian_repo

MONITORING_PACKAGES = ("prometheus", "prometheus-node-exporter")  # what roles prometheus and node_exporter install


def monitoring_repo() -> Path:
    return debian_repo("monitoring", MONITORING_PACKAGES)
