"""Host keys on real test hosts: apply, audit and bench verify them, `provision trust` records them.

Every command runs in a mount namespace where this user's ~/.ssh (the one ssh reads: its
passwd home, not $HOME) is an empty folder of the test's, and $HOME is another: whatever ssh or
Ansible would write to ~/.ssh/known_hosts shows up there, and nothing may.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import subprocess
import sys
from pathlib import Path

import pytest

from provisioner.audit.runner import disconnect
from provisioner.bench.target import bench_target
from provisioner.fleet.remote import Connection
from provisioner.spec import load_spec
from tests.lab.specs import host_entry, install_standin, instance_entry, write_spec

PROVISION = [sys.executable, "-m", "provisioner.cli.main"]
USERS_SSH = Path(pwd.getpwuid(os.getuid()).pw_dir) / ".ssh"


@pytest.fixture(scope="module")
def hosts(lab):
    """Two fresh hosts (the TEST DOUBLE nvidia-smi on each: a check-mode apply runs through)."""
    pair = lab.boot_many([f"hk{lab.boot_count}", f"hk{lab.boot_count + 1}"])
    for host in pair:
        install_standin(host)
    yield pair
    disconnect([Connection(host.address, "root", 22, str(host.ssh_key), known) for host in pair
                for known in (None, str(host.known_hosts))])
    for host in pair:
        lab.destroy(host)


@pytest.fixture
def home(tmp_path):
    """The test's $HOME and the folder that stands in for ~/.ssh."""
    folder = tmp_path / "home"
    (folder / ".ssh").mkdir(mode=0o700, parents=True)
    return folder


def provision(home: Path, *args, answer: str | None = None) -> subprocess.CompletedProcess:
    USERS_SSH.mkdir(mode=0o700, exist_ok=True)  # a mount point
    script = 'mount --bind "$1" "$2" && shift 2 && exec "$@"'
    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", str(home / ".ssh"),
            str(USERS_SSH), *PROVISION, *map(str, args)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, input=answer or "",
                          env={**os.environ, "HOME": str(home), "COLUMNS": "400"})


def nothing_written_to_ssh(home: Path) -> None:
    assert list((home / ".ssh").iterdir()) == []


def fingerprint_of(public: Path) -> str:
    return subprocess.run(["ssh-keygen", "-lf", str(public)], capture_output=True, text=True, check=True).stdout.split()[1]


def fingerprint(host) -> str:
    """The host's ED25519 key, read from its disk (as on its console)."""
    return fingerprint_of(host.root / "etc/ssh/ssh_host_ed25519_key.pub")


def public_key(host) -> list[str]:
    return (host.root / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()[:2]


def entry(host, known_hosts: Path | None) -> dict:
    data = host_entry(host)
    if known_hosts is None:
        del data["ssh"]["known_hosts"]
    else:
        data["ssh"]["known_hosts"] = str(known_hosts)
    return data


def audit(home: Path, spec: Path, folder: Path) -> tuple[subprocess.CompletedProcess, dict]:
    result = provision(home, "audit", "spec", "--spec", spec, "--json", folder / "audit.json")
    return result, json.loads((folder / "audit.json").read_text())


def bench(home: Path, spec: Path, folder: Path) -> subprocess.CompletedProcess:
    """The bench as far as its first connection (it never gets further here)."""
    return provision(home, "bench", "run", "chat", "--spec", spec, "--no-floor", "--load", "smoke", "--repeats", "1",
                     "--vllm", "/bin/true", "--results", folder / "bench")


def task_lines(output: str, host) -> list[str]:
    return re.findall(rf"^\s*(?:ok|changed|failed|unreachable) +{host.name}\s.*$", output, re.M)



def refused_by_apply_audit_and_bench(home, spec, tmp_path, host, parts: list[str]) -> None:
    """apply --check exits 1, the audit 2 (the host "could not run"), bench 1, each showing `parts`
    of the refusal (bench all of them; apply and the audit all but the first, the host's name line)."""
    applied = provision(home, "apply", "--spec", spec, "--check")
    assert applied.returncode == 1, applied.stdout + applied.stderr
    for part in parts[1:]:
        assert part in " ".join(applied.stdout.split())
    audited, report = audit(home, spec, tmp_path)
    assert audited.returncode == 2 and report["hosts"][host.name]["status"] == "could not run"
    for part in parts[1:]:
        assert part in report["hosts"][host.name]["error"]
    benched = bench(home, spec, tmp_path)
    assert benched.returncode == 1
    for part in parts:
        assert part in " ".join(benched.stdout.split())

def test_a_wrong_key_stops_that_host_and_the_other_is_applied_and_audited(hosts, home, tmp_path):
    bad, good = hosts
    impostor = tmp_path / "impostor"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(impostor)], check=True)
    impostor_fingerprint = fingerprint_of(impostor.with_suffix(".pub"))
    known = tmp_path / "known_hosts"
    impostor_key = impostor.with_suffix(".pub").read_text().split()[:2]
    known.write_text(f"{good.address} {' '.join(public_key(good))}\n{bad.address} {' '.join(impostor_key)}\n")
    line = len(known.read_text().splitlines())
    spec = write_spec(tmp_path / "spec.yml", [entry(bad, known), entry(good, known)], [instance_entry(bad, "chat", 8000)])
    changed = (f"{bad.name} ({bad.address}:22)", "HOST KEY CHANGED", f"ED25519 {fingerprint(bad)}",
               f"{known} line {line} (ED25519 {impostor_fingerprint})", "may be an attack",
               f"provision trust {bad.name} --spec {spec} --replace")

    applied = provision(home, "apply", "--spec", spec, "--check")
    assert applied.returncode == 1, applied.stdout + applied.stderr
    output = " ".join(applied.stdout.split())
    for part in changed[1:]:
        assert part in output
    (refusal,) = task_lines(applied.stdout, bad)  # no task ran there
    assert refusal.split()[:2] == ["unreachable", bad.name]
    assert len(task_lines(applied.stdout, good)) > 10  # applied (in check mode: it still connects)
    assert not any("unreachable" in line for line in task_lines(applied.stdout, good))

    audited, report = audit(home, spec, tmp_path)
    assert audited.returncode == 2, audited.stdout + audited.stderr
    assert report["hosts"][bad.name]["status"] == "could not run" and report["hosts"][bad.name]["checks"] == []
    for part in changed[1:]:
        assert part in report["hosts"][bad.name]["error"]
    assert report["hosts"][good.name]["status"] == "drift"  # audited: the check apply changed nothing
    assert len(report["hosts"][good.name]["checks"]) >= 20  # no instance on it: host and GPU checks

    benched = bench(home, spec, tmp_path)
    assert benched.returncode == 1, benched.stdout + benched.stderr
    for part in changed:
        assert part in " ".join(benched.stdout.split())
    nothing_written_to_ssh(home)


def test_an_unknown_host_is_refused_until_provision_trust_records_it(hosts, home, tmp_path):
    host = hosts[0]
    known = tmp_path / "known_hosts"
    known.write_text("")  # an empty file is a valid start
    spec = write_spec(tmp_path / "spec.yml", [entry(host, known)], [instance_entry(host, "chat", 8000)])
    unknown = (f"{host.name} ({host.address}:22)", "host key not trusted", f"ED25519 {fingerprint(host)}",
               f"{known} has no key for it", "ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub",
               f"provision trust {host.name} --spec {spec}",
               f"add this line to {known}: {host.address} ssh-ed25519 ")

    refused_by_apply_audit_and_bench(home, spec, tmp_path, host, unknown)
    profiled = provision(home, "audit", "host", f"ssh://root@{host.address}", "--key", host.ssh_key,
                         "--known-hosts", known, "--json", tmp_path / "profile.json")
    error = json.loads((tmp_path / "profile.json").read_text())["hosts"][host.address]["error"]
    assert profiled.returncode == 2 and "host key not trusted" in error and unknown[6] in error  # no spec: the line
    assert known.read_text() == ""

    declined = provision(home, "trust", host.name, "--spec", spec, answer="n\n")  # shown, asked, declined
    assert declined.returncode == 1 and f"ED25519 {fingerprint(host)}" in declined.stdout
    assert f"Record this key in {known}?" in declined.stdout and "nothing written" in declined.stdout
    assert known.read_text() == ""
    trusted = provision(home, "trust", host.name, "--spec", spec, "--yes")
    assert trusted.returncode == 0, trusted.stdout + trusted.stderr
    assert f"ED25519 {fingerprint(host)}" in trusted.stdout and f"recorded 1 key in {known}" in trusted.stdout
    recorded = known.read_text()
    assert recorded.split() == [host.address, *public_key(host)]
    again = provision(home, "trust", host.name, "--spec", spec, "--yes")
    assert again.returncode == 0 and "already trusted" in again.stdout and "nothing written" in again.stdout
    assert known.read_text() == recorded

    applied = provision(home, "apply", "--spec", spec, "--check")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert known.read_text() == recorded  # ssh added nothing (UpdateHostKeys no)
    nothing_written_to_ssh(home)


def test_without_a_known_hosts_file_in_the_spec_the_users_own_is_read_and_never_written(hosts, home, tmp_path):
    host = hosts[1]
    spec = write_spec(tmp_path / "spec.yml", [entry(host, None)], [])

    applied = provision(home, "apply", "--spec", spec, "--check")
    assert applied.returncode == 1, applied.stdout + applied.stderr
    assert f"none of {USERS_SSH}/known_hosts" in applied.stdout and f"ED25519 {fingerprint(host)}" in applied.stdout
    audited, report = audit(home, spec, tmp_path)
    assert audited.returncode == 2 and "host key not trusted" in report["hosts"][host.name]["error"]
    profiled = provision(home, "audit", "host", f"ssh://root@{host.address}", "--key", host.ssh_key,
                         "--json", tmp_path / "profile.json")
    error = json.loads((tmp_path / "profile.json").read_text())["hosts"][host.address]["error"]
    assert profiled.returncode == 2 and "host key not trusted" in error
    nothing_written_to_ssh(home)

    trusted = provision(home, "trust", host.name, "--spec", spec, "--yes")  # the user asked: their own file
    assert trusted.returncode == 0, trusted.stdout + trusted.stderr
    users_file = home / ".ssh" / "known_hosts"
    recorded = users_file.read_text()
    assert recorded.split()[:2] == [host.address, "ssh-ed25519"]
    audited, report = audit(home, spec, tmp_path)
    assert audited.returncode != 2, audited.stdout + audited.stderr
    assert len(report["hosts"][host.name]["checks"]) >= 20
    assert users_file.read_text() == recorded and [p.name for p in (home / ".ssh").iterdir()] == ["known_hosts"]


def test_a_changed_key_is_refused_until_trust_replaces_it(lab, hosts, home, tmp_path):
    host = hosts[0]
    known = tmp_path / "known_hosts"
    known.write_text(f"{host.address} {' '.join(public_key(host))}\n")  # trusted, as `provision trust` records it
    spec = write_spec(tmp_path / "spec.yml", [entry(host, known)], [instance_entry(host, "chat", 8000)])
    old = fingerprint(host)

    host.ssh("rm /etc/ssh/ssh_host_*; ssh-keygen -A; systemctl restart ssh")
    new = fingerprint(host)
    assert new != old
    # the lab's own file follows, so the lab still reaches the host
    subprocess.run(["ssh-keygen", "-R", host.address, "-f", str(lab.known_hosts)], capture_output=True, check=True)
    with lab.known_hosts.open("a") as file:
        file.write(f"{host.address} {' '.join(public_key(host))}\n")
    changed = (f"{host.name} ({host.address}:22)", "HOST KEY CHANGED", f"ED25519 {new}",
               f"{known} line 1 (ED25519 {old})", "may be an attack", f"provision trust {host.name} --spec {spec} --replace")
    before = known.read_text()

    refused_by_apply_audit_and_bench(home, spec, tmp_path, host, changed)

    refused = provision(home, "trust", host.name, "--spec", spec, "--yes")
    assert refused.returncode == 1 and "HOST KEY CHANGED" in refused.stderr
    assert f"run `provision trust {host.name} --spec {spec} --replace` — nothing written" in " ".join(refused.stderr.split())
    assert known.read_text() == before
    replaced = provision(home, "trust", host.name, "--spec", spec, "--yes", "--replace")
    assert replaced.returncode == 0, replaced.stdout + replaced.stderr
    assert f"ED25519 {old}" in replaced.stdout and "removed 1 old" in replaced.stdout
    assert f"ED25519 {new}" in replaced.stdout and before.split()[2] not in known.read_text()

    audited, report = audit(home, spec, tmp_path)  # reached again (cheaper than another apply)
    assert report["hosts"][host.name]["error"] is None and len(report["hosts"][host.name]["checks"]) >= 20
    shell = bench_target(load_spec(spec), "chat").shell  # and the bench's way in
    assert shell.run("cat /proc/sys/kernel/hostname").stdout.strip() == host.name
    nothing_written_to_ssh(home)
