"""What a gateway routes: its served names, each with its replicas (the instances serving that name), and
the address a replica is reached at from the gateway's host. Read by the checks and the inventory."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple

from provisioner.base.addresses import is_loopback
from provisioner.spec.models import Gateway, Host, Instance
from provisioner.vllm.serve_args import ANY_ADDRESS

GATEWAY_GROUP = "gateway"  # the inventory group of the hosts that run a gateway


class Replica(NamedTuple):
    index: int  # in the spec's instances
    instance: Instance


def served_names(instances: Iterable[Instance | None]) -> list[str]:
    """Every served name of the instances, in spec order, once each."""
    return list(dict.fromkeys(name for instance in instances if instance for name in instance.served_names))


def routes(gateway: Gateway, instances: list[Instance | None]) -> dict[str, list[Replica]]:
    """Served name → its replicas, for the names the gateway routes (its models, else every served name)."""
    names = served_names(instances) if gateway.models is None else list(dict.fromkeys(gateway.models))
    return {name: [Replica(index, instance) for index, instance in enumerate(instances)
                   if instance and name in instance.served_names]
            for name in names}


def replica_address(instance: Instance, host: Host) -> str:
    """Where a gateway reaches the instance: the host's address when it listens on every address, 127.0.0.1
    when on loopback (from its own host only: the checks refuse a gateway elsewhere), else its bind address."""
    if instance.bind in ANY_ADDRESS:
        return host.address
    if is_loopback(instance.bind):
        return "127.0.0.1"
    return instance.bind


class RouteLoad(NamedTuple):
    """A route's rate (gateway.rates) against what its replicas were measured to carry (their `capacity`)."""

    model: str
    rate: float
    replicas: list[Instance]

    @property
    def unmeasured(self) -> list[str]:
        return [replica.name for replica in self.replicas if replica.capacity is None]

    @property
    def weakest(self) -> Instance | None:
        """The measured replica that carries least: the route is sized by replicas like it."""
        measured = [replica for replica in self.replicas if replica.capacity is not None]
        return min(measured, key=lambda replica: replica.capacity.rate) if measured else None

    @property
    def needed(self) -> int | None:
        """Replicas like the weakest measured one that carry the rate; None: none is measured."""
        weakest = self.weakest
        return None if weakest is None else max(1, math.ceil(self.rate / weakest.capacity.rate - 1e-9))


def route_loads(gateway: Gateway, instances: list[Instance | None]) -> list[RouteLoad]:
    """Each route the gateway states a rate for, with its replicas."""
    found = routes(gateway, instances)
    return [RouteLoad(model, rate, [replica.instance for replica in found.get(model, [])])
            for model, rate in gateway.rates.items()]
