"""Pass 2 for ports: one port map per host, built from every listener the spec implies, and a port two
listeners of a host share refused, naming both (their fields), before any host is touched.

The listeners of a host, in the order that decides which of two keeps a port (the later one is reported):
- node_exporter (monitoring.node_exporter_port) on every host, dcgm-exporter (monitoring.dcgm_exporter_port) on
  every host with GPUs when monitoring.gpu_metrics is dcgm, Prometheus (monitoring.prometheus_port) on the
  monitoring host: ports every host (or the spec) shares, so the per-host listener is the one to move;
- each instance's API (instances[].port) on its host; the followers of a multi-node instance run headless;
- each gateway's frontend (gateways[].port) on its host; HAProxy's stats are its admin socket, no port;
- each multi-node instance's rendezvous (instances[].multinode.master_port) on its leader's host.

Addresses are not told apart: node_exporter and the exporters listen on every address, and one port of a host
for one listener is what the audit and the gateways' health checks expect.
"""

from __future__ import annotations

from typing import NamedTuple

from provisioner.spec.errors import Problem
from provisioner.spec.parts import SpecParts, present


class Listener(NamedTuple):
    """One port a host listens on, whose it is and where the spec sets it."""

    port: int
    field: str  # where the spec sets the port: instances[2].port, monitoring.node_exporter_port
    owner: str  # instance 'chat', gateway 'edge', node_exporter
    kind: str  # instance, gateway, rendezvous, node_exporter, dcgm-exporter, Prometheus
    fix: str  # what to do when it is the one reported


def port_map(parts: SpecParts) -> dict[str, list[Listener]]:
    """Each host's listeners, in the order of the module's docstring."""
    ports: dict[str, list[Listener]] = {}
    monitoring = parts.monitoring
    if monitoring is not None:
        for _, host in present(parts.hosts):
            ports.setdefault(host.name, []).append(Listener(
                monitoring.node_exporter_port, "monitoring.node_exporter_port", "node_exporter", "node_exporter",
                "give node_exporter another port"))
            if monitoring.gpu_metrics == "dcgm" and host.gpus.devices:
                ports[host.name].append(Listener(
                    monitoring.dcgm_exporter_port, "monitoring.dcgm_exporter_port", "dcgm-exporter", "dcgm-exporter",
                    "give dcgm-exporter another port"))
        if monitoring.host is not None:
            ports.setdefault(monitoring.host, []).append(Listener(
                monitoring.prometheus_port, "monitoring.prometheus_port", "Prometheus", "Prometheus",
                "give Prometheus another port"))
    for index, instance in present(parts.instances):
        ports.setdefault(instance.host, []).append(Listener(
            instance.port, f"instances[{index}].port", f"instance '{instance.name}'", "instance",
            "give the instance another port"))
    for index, gateway in present(parts.gateways):
        ports.setdefault(gateway.host, []).append(Listener(
            gateway.port, f"gateways[{index}].port", f"gateway '{gateway.name}'", "gateway",
            "give the gateway another port"))
    for index, instance in present(parts.instances):
        if instance.multinode is not None:
            ports.setdefault(instance.host, []).append(Listener(
                instance.multinode.master_port, f"instances[{index}].multinode.master_port",
                f"the rendezvous of instance '{instance.name}'", "rendezvous",
                "give the rendezvous a port of its own (vLLM's default: 29501)"))
    return ports


def port_problems(parts: SpecParts) -> list[Problem]:
    """Each listener whose port an earlier listener of its host has, once per pair of fields (a port of
    monitoring: that collides on every host is one problem)."""
    problems: list[Problem] = []
    reported: set[tuple[str, str]] = set()
    for host, listeners in port_map(parts).items():
        first: dict[int, Listener] = {}
        for listener in listeners:
            owner = first.setdefault(listener.port, listener)
            if owner is listener or (listener.field, owner.field) in reported:
                continue
            reported.add((listener.field, owner.field))
            fix = f"give each {listener.kind} on a host its own port" if listener.kind == owner.kind else listener.fix
            problems.append(Problem(listener.field, f"port {listener.port} on host {host} is already used by "
                                                    f"{owner.owner} ({owner.field}) — {fix}"))
    return problems
