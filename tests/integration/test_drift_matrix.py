"""The drift matrix (tests/integration/drift_matrix.py) on one applied lab host: each drift planted
alone is failed by exactly its rows, with its expected and actual; check mode of the roles that repair
it changes nothing and predicts as many changes as the real run makes; that run repairs it (or stops
with the fix, which the user then runs); the audit passes again before the next drift is planted.

One host for the whole table (a boot and a first apply cost about two minutes); each repair runs only
the roles that the drift's entry names (apply --tags), as a user fixing that one thing would.
"""

from __future__ import annotations

import re
import time

import pytest

from provisioner.apply.controls import Controls
from provisioner.apply.hosts import apply_spec
from provisioner.apply.playbook import ApplyResult
from tests.integration.drift_matrix import DRIFTS, GPU_BOOT_UNIT, OTHER_VLLM_VERSION, OTHER_VLLM_WHEEL, UNIT, Drift
from tests.integration.test_audit import chat_host, failing_rows, main_pid
from tests.lab.specs import fake_gpu_uuid, standin_wheelhouse


def wait_until_clean(spec, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while failing_rows(spec):
        if time.monotonic() > deadline:
            return False
        time.sleep(3)
    return True


def said(result: ApplyResult) -> str:
    return " ".join(problem.message for problem in result.problems) + result.output_tail


def put_other_vllm_wheel(host) -> None:
    """The TEST DOUBLE vLLM of another version, for the entry that installs it by hand."""
    host.put(standin_wheelhouse(OTHER_VLLM_VERSION) / f"vllm-{OTHER_VLLM_VERSION}-py3-none-any.whl", OTHER_VLLM_WHEEL,
             mode="0644")


@pytest.fixture(scope="module")
def applied_host(lab, tmp_path_factory):
    folder = tmp_path_factory.mktemp("drift-matrix")
    with chat_host(lab, folder, "dm", "sk-drift-matrix-secret-7", before_apply=put_other_vllm_wheel) as (host, spec):
        assert failing_rows(spec) == {}, "the audit fails right after the first apply"
        yield host, spec


@pytest.mark.parametrize("drift", DRIFTS, ids=[drift.name.replace(" ", "-") for drift in DRIFTS])
def test_a_drift_alone_fails_exactly_its_rows_check_mode_predicts_the_repair_and_apply_makes_it(applied_host,
                                                                                              drift: Drift):
    host, spec = applied_host
    if failing_rows(spec):  # an earlier entry's failure left the host drifted: converge it, so that this one stands alone
        assert apply_spec(spec).succeeded
        assert failing_rows(spec) == {}, "the host does not converge: the entries after a broken one cannot run"

    host.ssh(drift.plant)
    exited = host.ssh(f"systemctl show -p ExecMainExitTimestamp --value {GPU_BOOT_UNIT}").stdout.strip()
    expected = drift.expected_rows(address=host.address, uuid=fake_gpu_uuid(host), unit=UNIT, exited=exited)
    assert timeless(failing_rows(spec)) == expected

    tags = Controls(tags=drift.tags)
    if drift.heals_by_itself:
        assert wait_until_clean(spec, 60), "systemd did not repair it"
        assert apply_spec(spec, controls=tags).changed == 0
        return
    predicted = apply_spec(spec, check=True, controls=tags)
    assert timeless(failing_rows(spec)) == expected, "check mode changed the host"
    if drift.refused is not None:
        assert not predicted.succeeded and drift.refused in said(predicted), said(predicted)
        server = main_pid(host)
        refused = apply_spec(spec, controls=tags)
        assert not refused.succeeded, "apply went on where it must stop"
        assert drift.refused in said(refused), said(refused)
        assert refused.changed == 0 and main_pid(host) == server, "apply stopped, but changed the host"
        assert timeless(failing_rows(spec)) == expected
        host.ssh(drift.fix)
        predicted = apply_spec(spec, check=True, controls=tags)
    assert predicted.succeeded, predicted.problems
    repair = apply_spec(spec, controls=tags)
    assert repair.succeeded, repair.problems
    assert predicted.changed == repair.changed, (predicted.changed, repair.changed)
    assert failing_rows(spec) == {}
    if drift.twice:
        assert apply_spec(spec, controls=tags).changed == 0, "the second apply changed the host"


def timeless(rows: dict[str, tuple[str, str]]) -> dict[str, tuple[str, str]]:
    """The rows with the times and pids of `restart pending` rows as the matrix writes them (TIME, PID)."""
    def shown(text: str) -> str:
        return re.sub(r"pid \d+", "pid PID", re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", "TIME", text))

    return {check: (expected, shown(actual) if check.endswith(": restart pending") else actual)
            for check, (expected, actual) in rows.items()}
