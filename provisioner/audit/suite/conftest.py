"""The audit suite's fixtures: targets from --audit-targets, one case per host and item, one fact read per host.

The targets file (written by provisioner/audit/runner.py) holds, per host, how to reach it
(an ssh_config alias whose ControlMaster the runner has opened) and what to expect there
(provisioner/audit/expectations.py). A check marked `@each(items_of)` runs once per item of each
host's expectations; an unmarked check runs once per host. Facts are read once per host, all
hosts in parallel, from the start of the session.
"""

from __future__ import annotations

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import testinfra

from provisioner.audit.checks import Audit, Case
from provisioner.audit.suite.facts import HostFacts, read_facts

# Threads here start ssh processes at the same time; with vfork (CPython's default on Linux) an exec now and
# then failed with "[Errno 14] Bad address: '/bin/sh'" (Python 3.11.7). fork is safe: the documented switch.
subprocess._USE_VFORK = False
READ_AHEAD = 4  # hosts read at a time: enough to keep ahead of the checks, few enough to let them start early


@cache
def load_targets(path: str) -> dict[str, Any]:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "case" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("audit_each")
    items_of, item_id = marker.args if marker else (lambda expected: [None], lambda item: "")
    cases, ids = [], []
    for host, target in load_targets(metafunc.config.getoption("audit_targets"))["hosts"].items():
        for item in items_of(target["expected"]):
            cases.append(Case(host, target["expected"], item))
            ids.append(f"{host}-{item_id(item)}" if marker else host)
    if not cases:  # nothing to check here (e.g. no units): no test at all, not an "empty parameter set" skip
        cases, ids = [pytest.param(None, marks=pytest.mark.audit_no_cases)], ["none"]
    metafunc.parametrize("case", cases, ids=ids)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Drop the checks with nothing to check; run the rest host by host, in the order the hosts were read."""
    empty = [item for item in items if item.get_closest_marker("audit_no_cases")]
    if empty:
        config.hook.pytest_deselected(items=empty)
        items[:] = [item for item in items if item not in empty]
    hosts = list(load_targets(config.getoption("audit_targets"))["hosts"])
    items.sort(key=lambda item: hosts.index(item.callspec.params["case"].host))


@pytest.fixture
def audit(request: pytest.FixtureRequest) -> Audit:
    return Audit(request.node)


class FactsOfHosts:
    """Reads the facts of the hosts in the background from the start of the session (while pytest
    collects the checks), READ_AHEAD hosts at a time in host order: the checks, which run host by host,
    start on the first hosts while later ones are still being read. A check waits for its host's facts."""

    def __init__(self, targets: dict[str, Any]):
        self.pool = ThreadPoolExecutor(max_workers=READ_AHEAD)
        self.reads = {name: self.pool.submit(self._read, target) for name, target in targets.items()}

    def of(self, host: str) -> HostFacts:
        return self.reads[host].result()  # raises the read's error: the check is reported as an error

    @staticmethod
    def _read(target: dict[str, Any]) -> HostFacts:
        ssh = target["ssh"]
        # the ssh_config opens (or reuses) the host's ControlMaster; testinfra adds no ControlPersist of its own
        host = testinfra.get_host(f"ssh://{ssh['alias']}", ssh_config=ssh["config"], controlpersist=0, sudo=ssh["sudo"])
        return read_facts(host, target["expected"])


FACTS = pytest.StashKey[FactsOfHosts]()


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[FACTS] = FactsOfHosts(load_targets(session.config.getoption("audit_targets"))["hosts"])


def pytest_sessionfinish(session: pytest.Session) -> None:
    session.config.stash[FACTS].pool.shutdown(wait=False, cancel_futures=True)


@pytest.fixture
def facts(case: Case, pytestconfig: pytest.Config) -> HostFacts:
    return pytestconfig.stash[FACTS].of(case.host)
