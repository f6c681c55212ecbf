"""Pass 2 for `monitoring:`: the monitoring host is one of the spec's, and Prometheus can reach every
instance it scrapes (an instance on loopback answers only its own host)."""

from __future__ import annotations

import difflib

from provisioner.base.addresses import is_loopback
from provisioner.spec.errors import Problem
from provisioner.spec.parts import SpecParts, present

MONITORING_GROUP = "monitoring"  # the inventory group of the host that runs Prometheus


def monitoring_problems(parts: SpecParts) -> list[Problem]:
    monitoring = parts.monitoring
    if monitoring is None:
        return []
    problems: list[Problem] = []
    known = parts.host_names
    if monitoring.host is not None and known is not None and monitoring.host not in known:
        guess = difflib.get_close_matches(monitoring.host, known, n=1)
        hint = f"did you mean '{guess[0]}'? " if guess else ""
        problems.append(Problem("monitoring.host", f"unknown host '{monitoring.host}' — {hint}hosts in this spec: "
                                                   f"{', '.join(known) or 'none'}"))
    scraper = f"Prometheus on '{monitoring.host}'" if monitoring.host else "your Prometheus"
    for index, instance in present(parts.instances):
        if is_loopback(instance.bind) and instance.host != monitoring.host:
            problems.append(Problem(
                f"instances[{index}].bind",
                f"'{instance.bind}' answers only on '{instance.host}' itself: {scraper} cannot scrape its /metrics — "
                "bind it to 0.0.0.0 or the host's address"))
    return problems
