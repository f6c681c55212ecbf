"""provisioner/base/hostkeys.py with keys made here by ssh-keygen (the scan itself: tests/integration/test_host_keys.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from provisioner.base.hostkeys import (
    BY_AUTHORITY,
    CHANGED,
    TRUSTED,
    UNKNOWN,
    HostKey,
    HostKeyCheck,
    HostKeyError,
    covered_by_authority,
    fingerprinted,
    record_keys,
    recorded,
    ssh_options,
    trust_files,
)
from provisioner.spec import load_spec
from tests.unit.conftest import host, spec_data, write_spec

ADDRESS = "192.0.2.5"


def new_key(folder: Path, name: str, kind: str = "ed25519") -> HostKey:
    path = folder / name
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", name, "-f", str(path)], check=True)
    kind_name, blob = path.with_suffix(".pub").read_text().split()[:2]
    fingerprint = subprocess.run(["ssh-keygen", "-lf", str(path.with_suffix(".pub"))], capture_output=True,
                                 text=True, check=True).stdout.split()[1]
    (key,) = fingerprinted([(kind_name, blob)])
    assert key.fingerprint == fingerprint  # what ssh-keygen -lf says of the .pub file
    return key


def check_of(files: list[Path], *presented: HostKey, port: int = 22) -> HostKeyCheck:
    name = ADDRESS if port == 22 else f"[{ADDRESS}]:{port}"
    return HostKeyCheck("gpu1", ADDRESS, port, tuple(map(str, files)), presented,
                        tuple(recorded(name, list(map(str, files)))), trust_command="provision trust gpu1 --spec spec.yml")


@pytest.fixture
def keys(tmp_path):
    return {name: new_key(tmp_path, name) for name in ("host", "other", "third")}


def test_recorded_reads_plain_hashed_and_port_entries_with_their_line_numbers(tmp_path, keys):
    plain, hashed = tmp_path / "plain", tmp_path / "hashed"
    plain.write_text(f"# lab\n192.0.2.9 {keys['other'].type} {keys['other'].blob}\n{keys['host'].line(ADDRESS)}\n"
                     f"{keys['third'].line(f'[{ADDRESS}]:2222')}\n")
    hashed.write_text(plain.read_text())
    subprocess.run(["ssh-keygen", "-H", "-f", str(hashed)], capture_output=True, check=True)
    assert ADDRESS not in hashed.read_text()

    for file in (plain, hashed):
        (entry,) = recorded(ADDRESS, [str(file)])
        assert (entry.file, entry.line_number, entry.key) == (str(file), 3, keys["host"])
        (on_port,) = recorded(f"[{ADDRESS}]:2222", [str(file)])
        assert on_port.key == keys["third"]
    assert recorded("192.0.2.77", [str(plain)]) == []
    assert recorded(ADDRESS, [str(tmp_path / "absent")]) == []


def test_unknown_host_message_shows_the_fingerprint_the_file_and_both_fixes(tmp_path, keys):
    known = tmp_path / "known_hosts"
    known.write_text(keys["other"].line("192.0.2.9") + "\n")
    check = check_of([known], keys["host"])

    assert (check.status, check.refused) == (UNKNOWN, True)
    assert check.message() == (
        f"gpu1 ({ADDRESS}:22): host key not trusted — the host presents ED25519 {keys['host'].fingerprint}; "
        f"{known} has no key for it. Check the fingerprint on the host's console "
        "(ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub), then run `provision trust gpu1 --spec spec.yml` "
        f"(or add this line to {known}: {ADDRESS} ssh-ed25519 {keys['host'].blob})")


def test_a_different_key_of_the_presented_type_is_a_changed_key(tmp_path, keys):
    known = tmp_path / "known_hosts"
    known.write_text(f"# first line\n{keys['other'].line(ADDRESS)}\n")
    check = check_of([known], keys["host"])

    assert check.status == CHANGED and check.refused
    message = check.message()
    assert message.startswith(f"gpu1 ({ADDRESS}:22): HOST KEY CHANGED — the host presents ED25519 "
                              f"{keys['host'].fingerprint}, but {known} line 2 (ED25519 {keys['other'].fingerprint}) "
                              "holds another key for it. This may be an attack")
    assert message.endswith("only if it matches, run `provision trust gpu1 --spec spec.yml --replace`")


def test_on_another_port_the_entry_for_port_22_does_not_count(tmp_path, keys):
    known = tmp_path / "known_hosts"
    known.write_text(keys["host"].line(ADDRESS) + "\n")
    assert check_of([known], keys["host"], port=22).status == TRUSTED
    unknown = check_of([known], keys["host"], port=2222)
    assert unknown.status == UNKNOWN and f"[{ADDRESS}]:2222 ssh-ed25519" in unknown.message()


def test_trusted_when_a_presented_key_is_recorded_changed_when_a_recorded_key_of_its_type_differs(tmp_path, keys):
    rsa = new_key(tmp_path, "rsa", "rsa")
    known = tmp_path / "known_hosts"
    known.write_text(keys["host"].line(ADDRESS) + "\n")
    assert check_of([known], keys["host"], rsa).status == TRUSTED  # ssh picks the recorded type
    known.write_text(keys["host"].line(ADDRESS) + "\n" + keys["other"].line(ADDRESS) + "\n")
    assert check_of([known], keys["host"]).status == CHANGED  # a stale ed25519 key beside the right one
    known.write_text(rsa.line(ADDRESS) + "\n")
    assert check_of([known], keys["host"]).status == CHANGED  # only a key the host no longer presents


def test_trust_records_an_unknown_host_and_then_it_is_trusted(tmp_path, keys):
    known = tmp_path / "known_hosts"
    known.write_text("")  # an empty file: allowed in a spec
    recorded_keys = record_keys(check_of([known], keys["host"]))
    assert recorded_keys.added == [keys["host"].line(ADDRESS)]
    assert known.read_text() == keys["host"].line(ADDRESS) + "\n"
    assert check_of([known], keys["host"]).status == TRUSTED


def test_trust_of_a_trusted_host_writes_nothing(tmp_path, keys):
    known = tmp_path / "known_hosts"
    known.write_text("# mine\n" + keys["host"].line(ADDRESS))  # no newline at the end
    before = known.read_bytes()
    assert record_keys(check_of([known], keys["host"])).added == []
    assert known.read_bytes() == before


def test_trust_refuses_a_changed_key_unless_replace_then_only_the_new_key_is_left(tmp_path, keys):
    known = tmp_path / "known_hosts"
    known.write_text(keys["third"].line("192.0.2.9") + "\n" + keys["other"].line(ADDRESS) + "\n")
    subprocess.run(["ssh-keygen", "-H", "-f", str(known)], capture_output=True, check=True)  # hashed entries too
    (tmp_path / "known_hosts.old").unlink()
    before = known.read_bytes()

    with pytest.raises(HostKeyError, match="HOST KEY CHANGED .* --replace` — nothing written"):
        record_keys(check_of([known], keys["host"]))
    assert known.read_bytes() == before

    result = record_keys(check_of([known], keys["host"]), replace=True)
    assert [entry.key for entry in result.removed] == [keys["other"]]
    assert [entry.key for entry in recorded(ADDRESS, [str(known)])] == [keys["host"]]
    assert [entry.key for entry in recorded("192.0.2.9", [str(known)])] == [keys["third"]]  # others kept
    assert not (tmp_path / "known_hosts.old").exists()  # ssh-keygen's backup held the distrusted key


def test_ssh_options_make_the_spec_file_the_only_source_strictly_and_ssh_takes_the_first_value(tmp_path):
    known = tmp_path / "a dir" / "known%hosts"
    options = ssh_options(str(known))
    assert options == [f'UserKnownHostsFile "{tmp_path}/a dir/known%%hosts"', "GlobalKnownHostsFile /dev/null",
                       "StrictHostKeyChecking yes", "UpdateHostKeys no"]
    # as ssh reads them, even when a later option (Ansible's, with checking off) says otherwise
    argv = ["ssh", "-G", *(item for option in options for item in ("-o", option)),
            "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/tmp/x", ADDRESS]
    config = dict(line.split(" ", 1) for line in subprocess.run(argv, capture_output=True, text=True).stdout.splitlines())
    assert config["userknownhostsfile"] == str(known)
    assert (config["globalknownhostsfile"], config["stricthostkeychecking"], config["updatehostkeys"]) == (
        "/dev/null", "true", "false")
    assert ssh_options(None) == ["StrictHostKeyChecking yes", "UpdateHostKeys no"]
    with pytest.raises(HostKeyError, match="double quote"):
        ssh_options('/x/"known_hosts"')


def test_without_a_spec_file_the_users_own_files_are_the_trust_source(tmp_path):
    import os
    import pwd

    files = trust_files(ADDRESS, 22, None)
    assert files[0] == f"{pwd.getpwuid(os.getuid()).pw_dir}/.ssh/known_hosts"  # where ssh itself looks
    assert trust_files(ADDRESS, 22, str(tmp_path / "k")) == [str(tmp_path / "k")]


def test_an_empty_known_hosts_file_is_allowed_in_a_spec_an_empty_key_is_not(tmp_path):
    (tmp_path / "known_hosts").write_text("")
    spec = load_spec(write_spec(tmp_path / "spec.yml", spec_data(hosts=[host(ssh={"known_hosts": "known_hosts"})])))
    assert spec.hosts[0].ssh.known_hosts == str(tmp_path / "known_hosts")
    (tmp_path / "id").write_text("")
    from provisioner.spec import SpecError

    with pytest.raises(SpecError, match="hosts\\[0\\].ssh.key: .* is empty"):
        load_spec(write_spec(tmp_path / "spec.yml", spec_data(hosts=[host(ssh={"key": "id"})])))


def test_a_host_a_cert_authority_line_covers_is_left_to_ssh(tmp_path, keys):
    """ssh trusts a host whose certificate a @cert-authority line signs; ssh-keyscan fetches no
    certificate, so refusing the host here would refuse what ssh accepts."""
    authority = tmp_path / "known_hosts"
    authority.write_text(f"@cert-authority 192.0.2.* {keys['other'].type} {keys['other'].blob}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text(f"@cert-authority *.example.com {keys['other'].type} {keys['other'].blob}\n")
    assert covered_by_authority(ADDRESS, [str(authority)])
    assert not covered_by_authority(ADDRESS, [str(elsewhere)])

    check = check_of([authority], keys["host"])
    assert check.recorded == ()  # a marked line is no recorded key
    by_authority = HostKeyCheck(**{**check.__dict__, "authority": True})
    assert by_authority.status == BY_AUTHORITY and not by_authority.refused
    assert check.status == UNKNOWN and check.refused  # without the authority line: refused
