"""Kernel parameters as systemd-sysctl will apply them at boot, on one applied lab host (real systemd 252):
a sysctl.d file read after ours fails exactly `sysctl at boot: KEY`, naming the file that wins; check
mode predicts the neutralisation and writes nothing; apply comments the line out (the file's other
lines kept; a vendor file through a same-named copy in /etc; /etc/sysctl.conf through Debian's
99-sysctl.conf link); a second apply changes nothing; the audit passes again.

The tests share the host and run in file order; each leaves it converged. The repairs run the role
sysctl alone (apply --tags sysctl), as the drift matrix does: the rest of the site is not involved.
Live values are n/a here (nspawn shares the machine's kernel): tests/integration/test_kernel_vm.py.
"""

from __future__ import annotations

import pytest

from provisioner.apply.controls import Controls
from provisioner.apply.events import TaskResult
from provisioner.apply.hosts import apply_spec
from provisioner.audit.runner import disconnect
from tests.integration.conftest import disk_state
from tests.integration.test_audit import applied_spec, audit_one, lab_connection, not_passed

OURS = "/etc/sysctl.d/60-vllm-provision.conf"
SYSCTL = Controls(tags=("sysctl",))
MARK = f"  # disabled by vllm-provision: {OURS} sets"


@pytest.fixture(scope="module")
def applied(lab, tmp_path_factory):
    (host,) = lab.boot_many([f"sb{lab.boot_count}"])
    spec = applied_spec([host], tmp_path_factory.mktemp("sysctl-effective") / "spec.yml")
    assert not_passed(audit_one(spec)) == {}
    yield host, spec
    disconnect([lab_connection(host)])
    lab.destroy(host)


def run(spec, **options):
    """apply (the role sysctl) and what its debug tasks said."""
    results: list[TaskResult] = []
    applied = apply_spec(spec, controls=options.pop("controls", SYSCTL), on_result=results.append, **options)
    return applied, [note for result in results for note in result.notes]


def converges(host, spec, drift: dict[str, tuple[str, str]], neutralised: str) -> None:
    """The planted drift fails exactly `drift`; check mode predicts `neutralised` and writes nothing;
    apply does it; a second apply changes nothing; the audit passes."""
    assert not_passed(audit_one(spec)) == drift

    before = disk_state(host)
    check, said = run(spec, check=True)
    assert check.succeeded, check.problems
    assert check.stats[host.name].changed > 0
    assert f"would neutralise: {neutralised}" in said, said
    assert disk_state(host) == before, "check mode wrote to the disk"

    applied, said = run(spec)
    assert applied.succeeded, applied.problems
    assert f"neutralised: {neutralised}" in said, said
    again, said = run(spec)
    assert again.succeeded and again.stats[host.name].changed == 0, said
    assert not_passed(audit_one(spec)) == {}


def test_an_override_in_etc_fails_its_row_and_apply_comments_out_only_its_line(applied):
    host, spec = applied
    override = "/etc/sysctl.d/99-zz-override.conf"
    host.ssh(f"printf '# tuning\\nkernel.pid_max = 4194304\\nvm.swappiness = 60\\n' > {override}")

    converges(host, spec, {"sysctl at boot: vm.swappiness": (f"1 ({OURS})", f"60 ({override})")},
              f"{override}:3 'vm.swappiness = 60' (vm.swappiness): edited in place")
    assert host.ssh(f"cat {override}").stdout == (
        f"# tuning\nkernel.pid_max = 4194304\n# vm.swappiness = 60{MARK} vm.swappiness\n")
    # systemd itself now takes ours: its own listing of what it parses and overwrites
    parsed = host.ssh("SYSTEMD_LOG_LEVEL=debug /lib/systemd/systemd-sysctl 2>&1 | grep -i 'swappiness' || true").stdout
    assert "Overwriting earlier assignment of vm/swappiness" not in parsed, parsed


def test_apply_stops_with_the_fix_where_neutralising_is_turned_off(applied):
    host, spec = applied
    override = "/etc/sysctl.d/99-zz-override.conf"
    host.ssh(f"printf 'vm.swappiness = 60\\n' > {override}")
    before = disk_state(host)

    refused, _ = run(spec, controls=Controls(tags=("sysctl",), extra_vars=('{"sysctl_neutralise_overrides": false}',)))
    assert not refused.succeeded
    said = " ".join(problem.message for problem in refused.problems)
    assert f"{override}:1 'vm.swappiness = 60'" in said and "comment them out" in said, said
    assert disk_state(host) == before

    applied_, _ = run(spec)
    assert applied_.succeeded and not_passed(audit_one(spec)) == {}


def test_a_vendor_file_is_overridden_by_a_same_named_copy_in_etc(applied):
    host, spec = applied
    vendor = "/usr/lib/sysctl.d/99-vendor-tuning.conf"
    host.ssh(f"printf 'vm.max_map_count = 65530\\nnet.core.somaxconn = 4096\\n' > {vendor}")

    converges(host, spec, {"sysctl at boot: vm.max_map_count": (f"262144 ({OURS})", f"65530 ({vendor})")},
              f"{vendor}:1 'vm.max_map_count = 65530' (vm.max_map_count): overridden by a same-named copy "
              "/etc/sysctl.d/99-vendor-tuning.conf (the vendor file is not edited)")
    assert host.ssh(f"cat {vendor}").stdout == "vm.max_map_count = 65530\nnet.core.somaxconn = 4096\n"
    copy = host.ssh("cat /etc/sysctl.d/99-vendor-tuning.conf").stdout
    assert copy.endswith(f"# vm.max_map_count = 65530{MARK} vm.max_map_count\nnet.core.somaxconn = 4096\n"), copy
    assert "Skipping overridden file '/usr/lib/sysctl.d/99-vendor-tuning.conf'" in host.ssh(
        "SYSTEMD_LOG_LEVEL=debug /lib/systemd/systemd-sysctl 2>&1 || true").stdout


def test_etc_sysctl_conf_is_edited_through_debians_99_sysctl_conf_link(applied):
    host, spec = applied
    host.ssh("echo 'vm.swappiness = 60' >> /etc/sysctl.conf")

    converges(host, spec,
              {"sysctl at boot: vm.swappiness": (f"1 ({OURS})", "60 (/etc/sysctl.d/99-sysctl.conf -> /etc/sysctl.conf)")},
              "/etc/sysctl.d/99-sysctl.conf:69 'vm.swappiness = 60' (vm.swappiness): edited /etc/sysctl.conf in place "
              "(the link /etc/sysctl.d/99-sysctl.conf stays)")
    assert host.ssh("readlink /etc/sysctl.d/99-sysctl.conf").stdout.strip() == "../sysctl.conf"
    assert host.ssh("tail -n 1 /etc/sysctl.conf").stdout == f"# vm.swappiness = 60{MARK} vm.swappiness\n"


def test_our_own_file_edited_is_the_same_row_with_our_file_winning(applied):
    host, spec = applied
    host.ssh(f"sed -i 's/^vm.swappiness = 1$/vm.swappiness = 60/' {OURS}")
    assert not_passed(audit_one(spec)) == {"sysctl at boot: vm.swappiness": (f"1 ({OURS})", f"60 ({OURS})")}
    applied_, _ = run(spec)
    assert applied_.succeeded and not_passed(audit_one(spec)) == {}
