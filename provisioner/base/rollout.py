"""A rolling apply (`provision apply --rolling`, docs/rollout.md): the hosts in batches, a canary batch
first, each host out of the gateways while it changes (role rollout), the next batch once it is back.

`Rollout` is what the site playbook gets (`rollout_batches`, `rollout_max_fail`); `Timeline` reads the
run's events into each host's turn: its batch and when it started and ended. Importable without Ansible.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field

HOSTS_PLAY = "Provision vLLM hosts"  # playbooks/site.yml's play that runs in batches
COUNT = re.compile(r"^([0-9]{1,6})(%?)$")  # hosts or replicas: at most 999,999 (a 40-digit count is a typo)


@dataclass(frozen=True)
class Rollout:
    """Batches of `batch` hosts (N or N%) after a canary batch of `canary` hosts; the rollout stops before
    the next batch once more than `max_fail` hosts (N or N% of the hosts) failed; a batch is drained only
    while each route it touches keeps `min_serving` replicas serving outside it."""

    batch: str = "1"
    max_fail: str = "0"
    canary: int = 1
    # replicas each route keeps serving outside a batch (N or N% of the route's), checked before its drain
    min_serving: str = "1"
    # the hosts that change together, by size, in the inventory's order (a multi-node instance's hosts: one
    # unit); none: each host its own
    units: tuple[int, ...] = ()

    def problems(self) -> list[str]:
        """What is wrong with the options, each with its fix (none: usable)."""
        found = []
        batch = COUNT.match(self.batch)
        if not batch or int(batch[1]) < 1 or (batch[2] and int(batch[1]) > 100):
            found.append(f"--batch {self.batch}: give a number of hosts (1 or more) or a percentage of them "
                         "(1%-100%)")
        max_fail = COUNT.match(self.max_fail)
        if not max_fail or (max_fail[2] and int(max_fail[1]) > 100):
            found.append(f"--max-fail {self.max_fail}: give a number of hosts (0 or more) or a percentage of "
                         "them (0%-100%)")
        min_serving = COUNT.match(self.min_serving)
        if not min_serving or (min_serving[2] and int(min_serving[1]) > 100):
            found.append(f"--min-serving {self.min_serving}: give a number of replicas (0 or more) or a percentage "
                         "of a route's replicas (0%-100%)")
        if self.canary < 1:
            found.append(f"--canary {self.canary}: give 1 or more hosts")
        return found

    def extra_vars(self) -> str:
        """The site playbook's rollout variables, as one -e JSON value (Ansible's `serial` takes N or "N%", or a
        list of batch sizes: with units of several hosts, each batch holds whole units)."""
        batch = self.batch if self.batch.endswith("%") else int(self.batch)
        max_fail = self.max_fail if self.max_fail.endswith("%") else int(self.max_fail)
        batches = self.unit_batches() if any(size > 1 for size in self.units) else [self.canary, batch]
        min_serving = self.min_serving if self.min_serving.endswith("%") else int(self.min_serving)
        return json.dumps({"rollout_batches": batches, "rollout_max_fail": max_fail, "rollout_min_serving": min_serving})

    def unit_batches(self) -> list[int]:
        """The batch sizes that keep each unit in one batch: the canary, then batches of `batch` hosts (N, or N%
        of them as Ansible counts it, at least 1), each grown to the end of the unit it would cut."""
        hosts = sum(self.units)
        per_batch = max(1, hosts * int(self.batch[:-1]) // 100) if self.batch.endswith("%") else int(self.batch)
        batches, taken, wanted = [], 0, self.canary
        for size in self.units:
            taken += size
            if taken >= wanted:
                batches.append(taken)
                taken, wanted = 0, per_batch
        return batches + ([taken] if taken else [])


@dataclass
class HostTurn:
    """A host's turn in the run: the batch it ran in (1: the canary) and its first and last event, in
    seconds since the run started."""

    batch: int
    started: float
    ended: float

    @property
    def seconds(self) -> float:
        return self.ended - self.started


@dataclass
class Timeline:
    """Each host's turn, read from the run's events as they arrive."""

    turns: dict[str, HostTurn] = field(default_factory=dict)
    batch: int = 0
    in_hosts_play: bool = False
    started_at: float = field(default_factory=time.time)  # the wall clock the turns count from (to match logs)
    _start: float = field(default_factory=time.monotonic)

    def read(self, event: dict) -> None:
        data = event.get("event_data") or {}
        if event.get("event") == "playbook_on_play_start":
            self.in_hosts_play = data.get("play") == HOSTS_PLAY
            self.batch += self.in_hosts_play  # one play start per batch
        host = data.get("host")
        if not host or not self.in_hosts_play:  # the gateways' play, after the batches, is not a host's turn
            return
        now = time.monotonic() - self._start
        turn = self.turns.setdefault(host, HostTurn(self.batch, now, now))
        turn.ended = now
