"""Apply a spec to its hosts: the gates first (controls, host keys, the drivers read), the inventory, the run, then
the locks given back and, after a failed rolling apply, the gateways' drains put back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from provisioner.apply.controls import Controls, check_controls
from provisioner.apply.events import HostStats, TaskResult
from provisioner.apply.playbook import ApplyResult, run_playbook
from provisioner.base import module_utils, paths
from provisioner.base.ansible_config import ansible_environment
from provisioner.base.hostkeys import Endpoint, check_hosts, trust_command
from provisioner.base.signals import signals_held
from provisioner.base.spec_lock import spec_lock
from provisioner.base.unreachable import CONNECT_TIMEOUT_S
from provisioner.fleet.inventory import host_units, write_inventory
from provisioner.fleet.remote import ANSWERS_AGAIN, HostShell
from provisioner.fleet.selection import select_hosts
from provisioner.spec import Host, Spec
from provisioner.validation.preflight import (
    DriverReader,
    check_preflight,
    check_readings,
    driver_checks,
    hosts_to_read,
    read_driver,
    read_drivers,
)


def check_apply(spec: Spec, hosts: Sequence[str], controls: Controls) -> list[Host]:
    """The hosts `hosts` stand for, once the names, the controls, the user's Ansible configuration and
    the preflight (provisioner.validation.preflight: memory, and the drivers the spec names) allow a run: else
    SelectionError, ControlError, AnsibleConfigError or PreflightError, and no host is touched."""
    chosen = select_hosts(spec, hosts)
    check_controls(controls)
    check_preflight(spec, chosen)  # vLLM would refuse to start: before Ansible is loaded (it makes ~/.ansible/tmp)
    ansible_environment()  # the user's configuration is usable, before any host is contacted
    return chosen


def apply_spec(
    spec: Spec,
    *,
    hosts: Sequence[str] = (),
    check: bool = False,
    diff: bool = False,
    controls: Controls = Controls(),
    on_result: Callable[[TaskResult], None] | None = None,
    on_output: Callable[[str], None] | None = None,
    on_notice: Callable[[str], None] | None = None,
    read_driver: DriverReader = read_driver,
) -> ApplyResult:
    """Generate the spec's inventory into a private folder and run the playbook on `hosts` (host or
    group names, `all`; none: every host of the spec).

    First `check_apply` (nothing touched when it raises); then the spec's lock on this controller, for the
    whole run (provisioner/base/spec_lock.py: SpecBusy when another apply of it runs here, after
    `controls.wait_lock` seconds; each host's lock is the playbook's, role apply_lock); then every chosen host's
    key (all at once):
    a host whose key is unknown or changed is not run on; it is reported unreachable, with the
    fingerprints and the fix, and the others go on. Then the NVIDIA driver of each host whose driver the
    spec does not name (`read_driver`, one command each, all at once): one that cannot be read is
    reported unreachable, as a refused key; one too old (or none) raises PreflightError before the
    playbook runs on any host."""
    chosen = check_apply(spec, hosts, controls)
    with spec_lock(spec.source_path, check=check, wait_s=controls.wait_lock) if spec.source_path \
            else contextlib.nullcontext():
        return _apply_hosts(spec, chosen, check=check, diff=diff, controls=controls, on_result=on_result,
                            on_output=on_output, on_notice=on_notice, read_driver=read_driver)


def _apply_hosts(spec: Spec, chosen: list[Host], *, check: bool, diff: bool, controls: Controls,
                 on_result: Callable[[TaskResult], None] | None, on_output: Callable[[str], None] | None,
                 on_notice: Callable[[str], None] | None, read_driver: DriverReader) -> ApplyResult:
    checks = check_hosts([Endpoint(host.name, host.address, host.ssh.port, host.ssh.known_hosts,
                                   trust_command(spec.source_path, host.name)) for host in chosen])
    refusals = [TaskResult(name, "", f"connect to {module_utils.value_rules.host_port(check.address, check.port)}",
                           "unreachable", check.reason())
                for name, check in checks.items() if check.refused]
    for refusal in refusals:
        if on_result is not None:
            on_result(refusal)
    allowed = [host.name for host in chosen if not checks[host.name].refused]
    refusals += read_host_drivers(spec, [host for host in chosen if host.name in allowed], read_driver, on_result)
    allowed = [name for name in allowed if name not in {refusal.host for refusal in refusals}]
    if not allowed:
        result = ApplyResult(rc=1)
    else:
        with tempfile.TemporaryDirectory(prefix="provision-inventory-") as inventory_dir:
            write_inventory(spec, Path(inventory_dir))
            limit = None if len(allowed) == len(spec.hosts) else ",".join(allowed)
            if controls.rollout is not None:  # a multi-node instance's hosts change in one batch
                units = tuple(len(unit) for unit in host_units(spec, allowed))
                controls = dataclasses.replace(controls, rollout=dataclasses.replace(controls.rollout, units=units))
            result = run_playbook(Path(inventory_dir), limit=limit, check=check, diff=diff, controls=controls,
                                  on_result=on_result, on_output=on_output, on_notice=on_notice)
            if not check:  # the hosts that failed ran no later play: their locks too
                give_back_locks(spec, allowed, result.lock_run)
            ask_hosts_that_did_not_finish(spec, result)
            if controls.rollout is not None and not check and not result.succeeded and spec.gateways:
                result.recovery = recover_gateways(Path(inventory_dir), result.lost, controls, on_result)
    refused_stats = {refusal.host: HostStats(unreachable=1) for refusal in refusals}
    result.stats = {host.name: refused_stats.get(host.name) or result.stats[host.name]
                    for host in chosen if host.name in refused_stats or host.name in result.stats}
    result.problems[:0] = refusals
    return result


APPLY_LOCK = "/var/lib/vllm-provision/apply.lock"  # role apply_lock's apply_lock_path


def give_back_locks(spec: Spec, names: list[str], run_id: str) -> None:
    """The host locks run `run_id` still holds, given back (all hosts at once): those of hosts that failed, whose
    later plays did not run, or of a run interrupted. A host that does not answer keeps it: the next run from here
    takes it over (its run is gone). Never raises."""
    source = paths.module_utils_file("apply_lock_run").read_text()
    program = f"{source}\nrelease_if_ours({APPLY_LOCK!r}, {run_id!r})\n"

    def give_back(host: Host) -> None:
        try:
            HostShell.for_host(host, spec.source_path).run("sudo -n python3 -" if host.ssh.become else "python3 -",
                                                           stdin=program, check=False, timeout=CONNECT_TIMEOUT_S + 10)
        except Exception:  # noqa: BLE001 - lost, refused: the lock stays for the next run to take over
            pass

    hosts = [host for host in spec.hosts if host.name in names]
    with signals_held(), ThreadPoolExecutor(max_workers=max(len(hosts), 1)) as pool:
        list(pool.map(give_back, hosts))


def ask_hosts_that_did_not_finish(spec: Spec, result: ApplyResult) -> None:
    """The hosts lost during the run, and those a task failed on, connected to once more (all at once, each
    within ssh's connect timeout). A lost host's reason gets what the network says now. A failed host that
    does not answer now is lost too: a shutdown stops the task's process before it closes ssh, so a host that
    went down mid-task can fail its task instead of going unreachable; it is reported, and recovered, as lost."""
    failed = {problem.host: problem for problem in result.problems if problem.status == "failed" and not problem.ignored
              and problem.host in result.stats and not result.stats[problem.host].unreachable}  # its last failure
    asked = [host for host in spec.hosts if host.name in result.lost or host.name in failed]
    if not asked:
        return
    with ThreadPoolExecutor(max_workers=len(asked)) as pool:
        now = dict(zip([host.name for host in asked],
                       pool.map(lambda host: HostShell.for_host(host, spec.source_path).answers(), asked)))
    for problem in result.problems:
        if problem.status == "unreachable" and problem.host in now and now[problem.host] != problem.message:
            problem.message += f"; connected to again: {now[problem.host]}"
    for host, problem in failed.items():
        if now[host] != ANSWERS_AGAIN:
            problem.status, problem.message = "unreachable", \
                f"its task failed ({problem.message}), then it stopped answering: connected to again: {now[host]}"
            stats = result.stats[host]
            stats.failed, stats.unreachable = stats.failed - 1, stats.unreachable + 1


RECOVER_PLAYBOOK = f"{paths.COLLECTION}.rollout_recover"


def recover_gateways(inventory_dir: Path, lost: list[str], controls: Controls,
                     on_result: Callable[[TaskResult], None] | None) -> list[TaskResult]:
    """After a rolling apply that failed, was interrupted or lost hosts: on every gateway host, put back the
    drains the rollout recorded where the replica is ready, keep the others (said why), take the servers of
    the `lost` hosts out (maintenance, sessions shut down): playbooks/rollout_recover.yml. What each gateway
    said, as task results (its debug notes and its failures)."""
    said: list[TaskResult] = []

    def keep(task: TaskResult) -> None:
        if task.notes or task.status in ("failed", "unreachable"):
            said.append(task)
        if on_result is not None:
            on_result(task)

    extra = json.dumps({"rollout_lost_hosts": lost})
    recovery_controls = dataclasses.replace(controls, rollout=None, tags=(), skip_tags=(),
                                            extra_vars=(*controls.extra_vars, extra))
    result = run_playbook(inventory_dir, playbook=RECOVER_PLAYBOOK, controls=recovery_controls, on_result=keep)
    if result.interrupted:
        said.append(TaskResult("(gateways)", "rollout", "put back the drains", "failed",
                               "interrupted again: the drains stay recorded; the next apply puts them back"))
    return said


READ_DRIVER_TASK = "read the NVIDIA driver"


def read_host_drivers(spec: Spec, hosts: list[Host], read: DriverReader,
                      on_result: Callable[[TaskResult], None] | None) -> list[TaskResult]:
    """Read the driver of the `hosts` whose driver the spec does not name, say what was read (and its
    warnings) per host, and refuse (PreflightError) when one is too old or missing. Returns the hosts
    whose driver could not be read, as unreachable."""
    to_read = hosts_to_read(spec, hosts)
    readings = read_drivers(spec, to_read, read)
    refusals = [TaskResult(name, "", READ_DRIVER_TASK, "unreachable", why) for name, why in readings.failed.items()]
    read_hosts = [host for host in to_read if host.name in readings.found]
    said = [TaskResult(check.host, "", READ_DRIVER_TASK, "ok",
                       notes=[*check.notes, *(f"warning: {warning}" for warning in check.warnings)])
            for check in driver_checks(spec, read_hosts, readings)]
    for result in [*said, *refusals] if on_result is not None else []:
        on_result(result)
    check_readings(spec, read_hosts, readings)
    return refusals
