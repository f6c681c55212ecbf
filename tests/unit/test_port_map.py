"""One port map per host (provisioner/spec/port_checks.py): every listener the spec implies, and each port two
of them share on a host refused, naming both by their fields."""

from __future__ import annotations

import pytest

from provisioner.spec import validate_spec
from provisioner.spec.parts import parts_of
from provisioner.spec.port_checks import port_map
from tests.unit.conftest import UUID0, UUID1, host, instance, problems_of, spec_data

UUID_B = "GPU-22222222-2222-4222-8222-222222222222"


def fleet(*, small_port: int = 8001, gateway: dict | None = None,
          multinode: dict | None = None, monitoring: dict | None = None) -> dict:
    """gpu-a runs the leader of 'big' (its follower on gpu-b), 'small', the gateway 'edge' and Prometheus;
    monitoring with dcgm-exporter: every listener kind, each on a port of its own."""
    data = spec_data(
        hosts=[host("gpu-a", "10.0.0.1", gpus={"devices": [
                   {"index": 0, "uuid": UUID0, "model": "NVIDIA H200"},
                   {"index": 1, "uuid": UUID1, "model": "NVIDIA H200"}]}),
               host("gpu-b", "10.0.0.2", gpus={"devices": [{"index": 0, "uuid": UUID_B, "model": "NVIDIA H200"}]})],
        instances=[instance("big", 8000, 0.4, on="gpu-a", bind="0.0.0.0", options={"pipeline-parallel-size": 2},
                            multinode={"followers": [{"host": "gpu-b", "gpus": [0]}], **(multinode or {})}),
                   instance("small", small_port, 0.4, on="gpu-a", gpus=[1], bind="0.0.0.0")])
    data["gateways"] = [{"name": "edge", "host": "gpu-a", **(gateway or {})}]
    data["monitoring"] = {"host": "gpu-a", "gpu_metrics": "dcgm", **(monitoring or {})}
    return data


def test_the_fleet_is_valid_and_its_port_map_holds_every_listener():
    """Only the listeners a host runs: a follower runs headless (no port 8000 of 'big' on gpu-b), dcgm-exporter
    only with gpu_metrics: dcgm and on a host with GPUs, Prometheus only on the monitoring host."""
    spec = validate_spec(fleet())
    ports = {host: [(listener.port, listener.field) for listener in listeners]
             for host, listeners in port_map(parts_of(spec)).items()}
    assert ports == {
        "gpu-a": [(9100, "monitoring.node_exporter_port"), (9400, "monitoring.dcgm_exporter_port"),
                  (9090, "monitoring.prometheus_port"), (8000, "instances[0].port"), (8001, "instances[1].port"),
                  (8080, "gateways[0].port"), (29501, "instances[0].multinode.master_port")],
        "gpu-b": [(9100, "monitoring.node_exporter_port"), (9400, "monitoring.dcgm_exporter_port")],
    }
    data = fleet(monitoring={"gpu_metrics": "textfile", "dcgm_exporter_port": 8001})
    data["instances"] += [instance("solo", 8000, 0.3, on="gpu-b", bind="0.0.0.0"),
                          instance("other", 9090, 0.2, on="gpu-b", bind="0.0.0.0")]
    ports = port_map(parts_of(validate_spec(data)))
    assert [listener.field for listener in ports["gpu-b"]] == [
        "monitoring.node_exporter_port", "instances[2].port", "instances[3].port"]


NODE_EXPORTER = "node_exporter (monitoring.node_exporter_port)"
DCGM = "dcgm-exporter (monitoring.dcgm_exporter_port)"
PROMETHEUS = "Prometheus (monitoring.prometheus_port)"


@pytest.mark.parametrize(("changes", "problem"), [
    ({"small_port": 9100},
     f"instances[1].port: port 9100 on host gpu-a is already used by {NODE_EXPORTER} — give the instance another "
     "port"),
    ({"small_port": 9400},
     f"instances[1].port: port 9400 on host gpu-a is already used by {DCGM} — give the instance another port"),
    ({"small_port": 9090},
     f"instances[1].port: port 9090 on host gpu-a is already used by {PROMETHEUS} — give the instance another port"),
    ({"small_port": 8000},
     "instances[1].port: port 8000 on host gpu-a is already used by instance 'big' (instances[0].port) — give each "
     "instance on a host its own port"),
    ({"gateway": {"port": 9100}},
     f"gateways[0].port: port 9100 on host gpu-a is already used by {NODE_EXPORTER} — give the gateway another port"),
    ({"gateway": {"port": 9400}},
     f"gateways[0].port: port 9400 on host gpu-a is already used by {DCGM} — give the gateway another port"),
    ({"gateway": {"port": 9090}},
     f"gateways[0].port: port 9090 on host gpu-a is already used by {PROMETHEUS} — give the gateway another port"),
    ({"gateway": {"port": 8001}},
     "gateways[0].port: port 8001 on host gpu-a is already used by instance 'small' (instances[1].port) — give the "
     "gateway another port"),
    ({"multinode": {"master_port": 9100}},
     f"instances[0].multinode.master_port: port 9100 on host gpu-a is already used by {NODE_EXPORTER} — give the "
     "rendezvous a port of its own (vLLM's default: 29501)"),
    ({"multinode": {"master_port": 9400}},
     f"instances[0].multinode.master_port: port 9400 on host gpu-a is already used by {DCGM} — give the "
     "rendezvous a port of its own (vLLM's default: 29501)"),
    ({"multinode": {"master_port": 9090}},
     f"instances[0].multinode.master_port: port 9090 on host gpu-a is already used by {PROMETHEUS} — give the "
     "rendezvous a port of its own (vLLM's default: 29501)"),
    ({"multinode": {"master_port": 8001}},
     "instances[0].multinode.master_port: port 8001 on host gpu-a is already used by instance 'small' "
     "(instances[1].port) — give the rendezvous a port of its own (vLLM's default: 29501)"),
    ({"multinode": {"master_port": 8080}},
     "instances[0].multinode.master_port: port 8080 on host gpu-a is already used by gateway 'edge' "
     "(gateways[0].port) — give the rendezvous a port of its own (vLLM's default: 29501)"),
    ({"monitoring": {"dcgm_exporter_port": 9100}},
     f"monitoring.dcgm_exporter_port: port 9100 on host gpu-a is already used by {NODE_EXPORTER} — give "
     "dcgm-exporter another port"),
    ({"monitoring": {"prometheus_port": 9100}},
     f"monitoring.prometheus_port: port 9100 on host gpu-a is already used by {NODE_EXPORTER} — give Prometheus "
     "another port"),
    ({"monitoring": {"prometheus_port": 9400}},
     f"monitoring.prometheus_port: port 9400 on host gpu-a is already used by {DCGM} — give Prometheus another port"),
])
def test_two_listeners_on_one_port_of_a_host_are_refused_naming_both(changes, problem):
    assert problems_of(fleet(**changes)) == [problem]


def test_a_port_of_monitoring_that_collides_on_every_host_is_one_problem():
    assert problems_of(fleet(monitoring={"dcgm_exporter_port": 9100})) == [
        f"monitoring.dcgm_exporter_port: port 9100 on host gpu-a is already used by {NODE_EXPORTER} — give "
        "dcgm-exporter another port"]


def test_two_rendezvous_on_one_leader_are_refused():
    data = fleet()
    data["hosts"][1]["gpus"]["devices"].append({"index": 1, "uuid": "GPU-33333333-3333-4333-8333-333333333333",
                                                "model": "NVIDIA H200"})
    data["instances"][1] = instance("pair", 8001, 0.4, on="gpu-a", gpus=[1], bind="0.0.0.0",
                                    options={"pipeline-parallel-size": 2},
                                    multinode={"followers": [{"host": "gpu-b", "gpus": [1]}]})
    assert problems_of(data) == [
        "instances[1].multinode.master_port: port 29501 on host gpu-a is already used by the rendezvous of instance "
        "'big' (instances[0].multinode.master_port) — give each rendezvous on a host its own port"]
