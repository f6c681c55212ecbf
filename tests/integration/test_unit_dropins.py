"""A unit as systemd runs it, on one applied lab host (real systemd), beyond what the drift matrix asserts
(tests/integration/drift_matrix.py holds these drifts and the shared drop-in that stops apply): a drop-in
that sets only what our unit does not is kept and listed; the removal is the task check mode names and
restarts the server; a masked unit's other rows are all n/a. Applies run the vllm_service role alone
(--tags), as the matrix's repairs do. The tests run in file order on the same host; each one leaves it
converged.
"""

from __future__ import annotations

import pytest

from provisioner.apply.controls import Controls
from provisioner.apply.hosts import apply_spec
from provisioner.audit.expectations import spec_targets
from provisioner.audit.runner import audit_hosts
from tests.integration.drift_matrix import DRIFTS
from tests.integration.test_audit import chat_host, main_pid
from tests.lab.specs import fake_gpu_uuid

UNIT = "vllm-chat.service"
OWN_DIR = f"/etc/systemd/system/{UNIT}.d"
OVERRIDE = f"{OWN_DIR}/override.conf"
LIMITS = f"{OWN_DIR}/limits.conf"
RELOAD_AND_RESTART = f"systemctl daemon-reload && systemctl restart {UNIT}"
SERVICE = Controls(tags=("vllm_service",))
DROPIN_TASK = "Remove the drop-ins that change what the units set, and their masks"


def rows(spec) -> dict[str, tuple[str, str, str]]:
    """{check: (expected, actual, status)} of every row of the host's spec-mode audit."""
    (report,) = audit_hosts(spec_targets(spec)).values()
    assert report.error is None, report.error
    return {check.check: (check.expected, check.actual, check.status) for check in report.checks}


def failing(found: dict[str, tuple[str, str, str]]) -> dict[str, tuple[str, str]]:
    return {check: (expected, actual) for check, (expected, actual, status) in found.items()
            if status not in ("passed", "n/a")}


def changed_tasks(tasks) -> list[str]:
    return [task.label for task in tasks if task.status == "changed"]


def exists(host, path: str) -> bool:
    return host.ssh(f"test -e {path} || test -L {path}", check=False).returncode == 0


@pytest.fixture(scope="module")
def applied(lab, tmp_path_factory):
    with chat_host(lab, tmp_path_factory.mktemp("unit-dropins"), "uc", "sk-dropins-secret-3") as (host, spec):
        assert failing(rows(spec)) == {}
        yield host, spec


def test_our_own_dropin_fails_its_rows_check_mode_predicts_its_removal_apply_removes_it(applied):
    host, spec = applied
    host.ssh(f"mkdir -p {OWN_DIR} && printf '[Service]\\nEnvironment=CUDA_VISIBLE_DEVICES=1\\n' > {OVERRIDE}"
             f" && printf '[Service]\\nLimitNOFILE=65536\\n' > {LIMITS} && {RELOAD_AND_RESTART}")
    found = rows(spec)
    assert failing(found) == {
        f"{UNIT}: drop-ins": ("none that change a managed setting",
                              f"{LIMITS} sets LimitNOFILE (not managed); {OVERRIDE} sets Environment CUDA_VISIBLE_DEVICES"),
        f"{UNIT}: Environment CUDA_VISIBLE_DEVICES": (fake_gpu_uuid(host), f"1 (from {OVERRIDE})"),
    }
    pid = main_pid(host)

    tasks = []
    predicted = apply_spec(spec, check=True, controls=SERVICE, on_result=tasks.append)
    assert predicted.succeeded, predicted.problems
    (removal,) = [task for task in tasks if task.task.startswith(DROPIN_TASK)]
    assert removal.status == "changed"
    assert exists(host, OVERRIDE) and main_pid(host) == pid  # check mode changed nothing

    done = []
    repaired = apply_spec(spec, controls=SERVICE, on_result=done.append)
    assert repaired.succeeded, repaired.problems
    assert changed_tasks(tasks) == changed_tasks(done)  # check mode predicted exactly
    assert not exists(host, OVERRIDE) and exists(host, LIMITS)  # the unmanaged one stays
    assert main_pid(host) != pid  # restarted

    assert apply_spec(spec, controls=SERVICE).changed == 0
    found = rows(spec)
    assert failing(found) == {}
    assert found[f"{UNIT}: drop-ins"] == ("none that change a managed setting", f"{LIMITS} sets LimitNOFILE (not managed)",
                                          "passed")
    host.ssh(f"rm {LIMITS} && {RELOAD_AND_RESTART}")
    assert found[f"{UNIT}: Environment CUDA_VISIBLE_DEVICES"][1] == fake_gpu_uuid(host)


def test_a_masked_unit_is_one_failed_row_the_others_na_apply_unmasks_it(applied):
    host, spec = applied
    unit_file = f"/etc/systemd/system/{UNIT}"
    # `systemctl mask` refuses while the unit file is there: someone removes it first (the drift matrix's entry)
    (drift,) = [drift for drift in DRIFTS if drift.name == "unit masked (and stopped)"]
    host.ssh(drift.plant)
    found = rows(spec)
    # one row (our unit file's own row, test_managed_files.py, is n/a too)
    assert failing(found) == drift.expected_rows(address=host.address, uuid=fake_gpu_uuid(host), unit=UNIT)
    assert found[f"{UNIT}: unit file"][1] == (f"masked ({unit_file} -> /dev/null): provision apply unmasks it"
                                              f" (by hand: systemctl unmask {UNIT}, then provision apply)")
    of_unit = {check: row for check, row in found.items() if check.startswith(f"{UNIT}: ") and check != f"{UNIT}: unit file"}
    assert len(of_unit) > 25
    assert {(status, actual) for _, actual, status in of_unit.values()} == {
        ("n/a", f"n/a: the unit is masked: see {UNIT}: unit file")}

    tasks, done = [], []
    predicted = apply_spec(spec, check=True, controls=SERVICE, on_result=tasks.append)
    assert predicted.succeeded, predicted.problems
    assert [task.status for task in tasks if task.task.startswith(DROPIN_TASK)] == ["changed"]
    assert host.ssh(f"readlink {unit_file}").stdout.strip() == "/dev/null"  # check mode changed nothing

    repaired = apply_spec(spec, controls=SERVICE, on_result=done.append)
    assert repaired.succeeded, repaired.problems
    # check mode predicted exactly (it says "would start" where the real run restarts: the unit was not ours then)
    assert predicted.changed == repaired.changed, " | ".join(changed_tasks(tasks)) + " <> " + " | ".join(changed_tasks(done))
    assert host.ssh(f"test -f {unit_file} && ! test -L {unit_file}", check=False).returncode == 0
    assert apply_spec(spec, controls=SERVICE).changed == 0
    assert failing(rows(spec)) == {}

