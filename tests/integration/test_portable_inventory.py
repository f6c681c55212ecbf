"""`provision inventory -o DIR` is portable: generated in one folder, moved with the spec's folder, then
applied with plain `ansible-playbook` (no checkout's ansible.cfg) against a real systemd test host; a spec
value that looks like Jinja reaches the host as written (Ansible does not run it); the secrets the spec declares
(a file in its folder, the controller's environment) are read by the roles' lookups where the playbook runs, and
a variable not set there is named before the env file is written; one vault-encrypted in the spec stays encrypted
in the inventory, ansible-playbook decrypts it with `--vault-password-file`, and without the password it is named
before any change."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ansible.parsing.vault import VaultLib, VaultSecret

from provisioner.base.paths import collections_dir, site_playbook
from tests.lab.specs import host_entry, install_standin, instance_entry, standin_wheelhouse, write_spec

PROVISION = [sys.executable, "-m", "provisioner.cli.main"]
API_KEY = "sk-portable-inventory-7"
DB_PASS = "db-pass-portable-inventory-3"  # secrets/db.pass in the spec's folder
GITHUB_PAT = "ghp-portable-inventory-5"  # the controller's environment variable PAT_VARIABLE
PAT_VARIABLE = "VP_LAB_PORTABLE_PAT"
S3_CONN = "s3-conn-portable-inventory-8"  # vault-encrypted in the spec
VAULT_PASSWORD = "portable-vault-password-2"  # vault.pass in the spec's folder


@pytest.fixture(scope="module")
def lab_host(lab):
    """One fresh host. Named pi<n>: nspawn names each host's veth after it, so labs side by side on one
    machine must not share host names."""
    (host,) = lab.boot_many([f"pi{lab.boot_count}"])
    install_standin(host)
    yield host
    lab.destroy(host)


def project_folder(folder: Path, host, note: str) -> Path:
    """A spec folder as a user keeps one: the spec naming its files relative to itself."""
    (folder / "keys").mkdir(parents=True)
    shutil.copy(host.ssh_key, folder / "keys" / "id")
    (folder / "keys" / "id").chmod(0o600)
    shutil.copy(host.known_hosts, folder / "known_hosts")
    shutil.copytree(standin_wheelhouse(), folder / "wheelhouse")
    (folder / "secrets").mkdir()
    (folder / "secrets" / "chat.key").write_text(API_KEY + "\n")
    (folder / "secrets" / "db.pass").write_text(DB_PASS + "\n")
    (folder / "vault.pass").write_text(VAULT_PASSWORD + "\n")
    secret = VaultSecret(VAULT_PASSWORD.encode())
    entry = host_entry(host)
    entry["ssh"].update(key="keys/id", known_hosts="known_hosts")
    entry["vllm"]["wheelhouse"] = "wheelhouse"
    return write_spec(folder / "provision.yml", [entry],
                      [instance_entry(host, "chat", 8000, share=0.9, api_key_file="secrets/chat.key",
                                     env={"NOTE": note, "DB_PASS": {"file": "secrets/db.pass"},
                                          "GITHUB_PAT": {"env": PAT_VARIABLE},
                                          "S3_CONN": {"vault": VaultLib().encrypt(S3_CONN, secret).decode()}})])


def test_an_inventory_moved_with_its_spec_folder_still_applies(lab_host, tmp_path):
    host = lab_host
    # a spec value that Ansible would run on the controller if it templated it: it stays data
    marker = tmp_path / "templated"
    note = "{{ lookup('pipe', 'touch " + str(marker) + "') }}"
    spec = project_folder(tmp_path / "made-here", host, note)
    made = subprocess.run([*PROVISION, "inventory", "--spec", str(spec), "-o", str(spec.parent / "inventory")],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, PAT_VARIABLE: GITHUB_PAT,
                               "ANSIBLE_VAULT_PASSWORD_FILE": str(spec.parent / "vault.pass")})
    assert made.returncode == 0, made.stdout + made.stderr
    for path in (spec.parent / "inventory").rglob("*.yml"):
        assert str(spec.parent) not in path.read_text(), path  # the folder it was made in
        assert DB_PASS not in path.read_text() and GITHUB_PAT not in path.read_text(), path
        assert S3_CONN not in path.read_text(), path
    assert "    S3_CONN: !vault |\n" in next((spec.parent / "inventory" / "host_vars").glob("*.yml")).read_text()

    moved = tmp_path / "another" / "place"
    moved.parent.mkdir()
    shutil.move(spec.parent, moved)  # nothing is left where the inventory was made
    elsewhere = tmp_path / "elsewhere"  # run from a folder with no ansible.cfg, as a collection user would
    elsewhere.mkdir()
    environment = {key: value for key, value in os.environ.items() if not key.startswith("ANSIBLE_") and key != PAT_VARIABLE}
    environment |= {"ANSIBLE_COLLECTIONS_PATH": str(collections_dir(tmp_path / "collections")), "ANSIBLE_FORCE_COLOR": "0"}

    def ansible_playbook(env: dict[str, str], *options: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(moved / "inventory" / "hosts.yml"),
             *options, site_playbook()], capture_output=True, text=True, timeout=600, cwd=elsewhere, env=env)

    vault_password = ("--vault-password-file", str(moved / "vault.pass"))
    no_password = ansible_playbook({**environment, PAT_VARIABLE: GITHUB_PAT})  # the vault password not given
    assert no_password.returncode != 0
    assert "vault-encrypted value not decrypted: chat: S3_CONN" in no_password.stdout, no_password.stdout[-4000:]
    assert "Take the apply lock]" not in no_password.stdout  # the first task, on every host before the lock
    assert host.ssh("test -e /etc/vllm/chat.env", check=False).returncode != 0  # before any change
    unset = ansible_playbook(environment, *vault_password)  # the variable a secret comes from is not exported
    assert unset.returncode != 0
    assert f"environment variable not set on the controller: {PAT_VARIABLE}" in unset.stdout, unset.stdout[-4000:]
    applied = ansible_playbook({**environment, PAT_VARIABLE: GITHUB_PAT}, *vault_password)

    assert applied.returncode == 0, applied.stdout[-4000:] + applied.stderr[-2000:]
    assert "failed=0" in applied.stdout and "unreachable=0" in applied.stdout
    assert host.ssh("systemctl is-active vllm-chat.service").stdout.strip() == "active"
    env_file = host.ssh("cat /etc/vllm/chat.env").stdout
    assert f"VLLM_API_KEY={API_KEY}" in env_file  # read from the moved file
    # the moved file; the controller's environment; decrypted by ansible-playbook
    assert f"DB_PASS={DB_PASS}\nGITHUB_PAT={GITHUB_PAT}\nS3_CONN={S3_CONN}\n" in env_file
    assert host.ssh("stat -c '%a %U' /etc/vllm/chat.env").stdout.split() == ["600", "root"]
    assert DB_PASS not in applied.stdout + unset.stdout and GITHUB_PAT not in applied.stdout
    assert S3_CONN not in applied.stdout + unset.stdout + no_password.stdout
    assert host.ssh("/opt/vllm/venvs/0.25.0/bin/pip show vllm").stdout.count("Version: 0.25.0") == 1  # from the moved wheelhouse
    assert not marker.exists()
    assert "lookup('pipe', 'touch " in host.ssh("systemctl show -p Environment vllm-chat.service").stdout
