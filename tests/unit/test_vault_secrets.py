"""Secrets by declaration, the third source (issue 34): an env value vault-encrypted in the spec, `NAME: !vault |`
as `ansible-vault encrypt_string --name NAME` prints it (or `{vault: TEXT}`). The controller decrypts it with the
password ansible-playbook uses (ANSIBLE_VAULT_PASSWORD_FILE) only to check it and to redact it by value; a missing
or wrong password, or a malformed value, is a spec problem naming the field and the fix; the inventory holds it
still encrypted, as Ansible's `!vault` reads it, in 0600 files under 0700 folders. The ciphertexts are made here,
with ansible-vault itself and with ansible-core's VaultLib."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from provisioner.base.secrets import REDACTED, redact
from provisioner.cli.main import app
from provisioner.fleet.inventory import build_inventory
from provisioner.plan import build_plan
from provisioner.spec import load_spec, validate_spec
from provisioner.spec.errors import SpecError
from provisioner.spec.loading import parse_yaml
from tests.unit.conftest import instance, problems_of, spec_data

VAULT_SECRET = "hf-vaulted-planted-3e9c1"
PASSWORD = "vault-password-for-tests-1"
FIELD = "instances[0].env.HF_TOKEN"


def encrypt(value: str, password: str = PASSWORD) -> str:
    """The $ANSIBLE_VAULT block of `value`, as ansible-core's VaultLib writes it."""
    from ansible.parsing.vault import VaultLib, VaultSecret

    return VaultLib().encrypt(value, VaultSecret(password.encode())).decode()


@pytest.fixture
def password_file(tmp_path, monkeypatch):
    path = tmp_path / "vault.pass"
    path.write_text(PASSWORD + "\n")
    monkeypatch.setenv("ANSIBLE_VAULT_PASSWORD_FILE", str(path))
    return path


@pytest.fixture(scope="module")
def printed(tmp_path_factory) -> str:
    """What `ansible-vault encrypt_string --name HF_TOKEN` prints, the text a user pastes into the spec."""
    folder = tmp_path_factory.mktemp("vault")
    (folder / "vault.pass").write_text(PASSWORD + "\n")
    result = subprocess.run([str(Path(sys.executable).with_name("ansible-vault")), "encrypt_string", "--name",
                             "HF_TOKEN", "--vault-password-file", str(folder / "vault.pass"), VAULT_SECRET],
                            capture_output=True, text=True, check=True)
    assert result.stdout.startswith("HF_TOKEN: !vault |\n          $ANSIBLE_VAULT;1.1;AES256\n"), result.stdout
    return result.stdout


def pasted_spec(folder: Path, printed: str, **fields) -> Path:
    """A spec whose instance's env has `printed` pasted as is (the key at the same indent as ansible-vault
    writes it, its block under it)."""
    data = spec_data(instances=[instance("chat", 8000, share=0.9, env={"PLAIN": "1", "HF_TOKEN": "@@vault@@"},
                                         options={"max-model-len": 4096}, **fields)])
    text = yaml.safe_dump(data, sort_keys=False)
    (line,) = [line for line in text.splitlines() if "@@vault@@" in line]
    indent = " " * (len(line) - len(line.lstrip()))
    path = folder / "provision.yml"
    path.write_text(text.replace(line, indent + printed.rstrip("\n").replace("\n", "\n" + indent)))
    return path


def invoke(*args):
    return CliRunner().invoke(app, [str(arg) for arg in args], env={"COLUMNS": "200", "NO_COLOR": "1"})


# --------------------------------------------------------------------------- the declaration


def test_the_text_ansible_vault_prints_pasted_into_the_spec_declares_the_secret(tmp_path, password_file, printed):
    spec = load_spec(pasted_spec(tmp_path, printed))
    (chat,) = spec.instances
    assert chat.serve_env == {"PLAIN": "1"}
    assert chat.secret_env["HF_TOKEN"].vault.startswith("$ANSIBLE_VAULT;1.1;AES256\n")
    assert redact(f"token {VAULT_SECRET} used") == f"token {REDACTED} used"  # declared: redacted by value


def test_the_mapping_form_declares_it_too(password_file):
    data = spec_data(instances=[instance("chat", 8000, env={"HF_TOKEN": {"vault": encrypt(VAULT_SECRET)}})])
    (chat,) = validate_spec(data).instances
    assert set(chat.secret_env) == {"HF_TOKEN"} and chat.serve_env == {}
    assert redact(VAULT_SECRET) == REDACTED


def test_the_vault_tag_reads_as_the_mapping_form():
    assert parse_yaml("HF_TOKEN: !vault |\n  $ANSIBLE_VAULT;1.1;AES256\n  6162\n") == {
        "HF_TOKEN": {"vault": "$ANSIBLE_VAULT;1.1;AES256\n6162\n"}}


@pytest.mark.parametrize(("text", "message"), [
    ("a: !foo x\n", "spec:1:4: unknown tag '!foo' (the spec takes only !vault"),
    ("a: !!python/object/apply:os.system [ls]\n", "spec:1:4: unknown tag 'tag:yaml.org,2002:python/object/apply:os.system'"),
    ("a: !unsafe x\n", "spec:1:4: unknown tag '!unsafe'"),
    ("a:\n  b: !vault [x]\n", "spec:2:6: !vault takes the text `ansible-vault encrypt_string` prints"),
])
def test_any_other_tag_is_refused_by_name_at_its_line(text, message):
    with pytest.raises(SpecError) as caught:
        parse_yaml(text)
    (problem,) = caught.value.problems
    assert str(problem).startswith(message), problem


def test_a_vault_value_in_a_field_that_takes_no_secret_is_refused():
    data = spec_data(instances=[instance("chat", 8000, model={"vault": "$ANSIBLE_VAULT;1.1;AES256\n6162\n"})])
    assert any(problem.startswith("instances[0].model: expected a string") for problem in problems_of(data))


# --------------------------------------------------------------------------- what cannot be decrypted


def test_no_password_names_the_field_and_the_setting(monkeypatch, tmp_path):
    monkeypatch.delenv("ANSIBLE_VAULT_PASSWORD_FILE", raising=False)
    monkeypatch.setenv("ANSIBLE_CONFIG", str(tmp_path / "none.cfg"))  # no ansible.cfg of the machine's
    monkeypatch.chdir(tmp_path)
    (problem,) = problems_of(spec_data(instances=[instance("chat", 8000, env={"HF_TOKEN": {"vault": encrypt("v-1")}})]))
    assert problem.startswith(f"{FIELD}: vault-encrypted, and no vault password to decrypt it — set "
                              "ANSIBLE_VAULT_PASSWORD_FILE to the file holding the vault password"), problem


def test_a_wrong_password_names_the_field_and_both_fixes(tmp_path, password_file):
    data = spec_data(instances=[instance("chat", 8000, env={"HF_TOKEN": {"vault": encrypt("v-2", "other")}})])
    (problem,) = problems_of(data)
    assert problem.startswith(f"{FIELD}: vault-encrypted, and the vault password in {password_file} does not "
                              "decrypt it — set ANSIBLE_VAULT_PASSWORD_FILE"), problem
    assert "`ansible-vault encrypt_string --name HF_TOKEN`" in problem


def test_a_password_file_that_is_not_there_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("ANSIBLE_VAULT_PASSWORD_FILE", str(tmp_path / "missing.pass"))
    (problem,) = problems_of(spec_data(instances=[instance("chat", 8000, env={"HF_TOKEN": {"vault": encrypt("v")}})]))
    assert problem.startswith(f"{FIELD}: vault-encrypted, and the vault password cannot be read (The vault "
                              f"password file {tmp_path / 'missing.pass'} was not found)"), problem


@pytest.mark.parametrize(("vault", "message"), [
    ("$ANSIBLE_VAULT;1.1;AES256\nnot-hex-at-all\n", "it is not a valid vault-encrypted value (Vault format unhexlify"),
    ("$ANSIBLE_VAULT;1.1;AES256\n6162\n", "it is not a valid vault-encrypted value (Vault vaulttext format error"),
    ("$ANSIBLE_VAULT;1.1;ROT13\n6162\n", "it is not a valid vault-encrypted value (Cipher 'ROT13' could not be found)"),
])
def test_a_malformed_value_names_the_field_and_says_to_encrypt_it_again(password_file, vault, message):
    (problem,) = problems_of(spec_data(instances=[instance("chat", 8000, env={"HF_TOKEN": {"vault": vault}})]))
    assert problem.startswith(f"{FIELD}: vault-encrypted, and {message}"), problem
    assert problem.endswith("re-encrypt it: `ansible-vault encrypt_string --name HF_TOKEN` and paste what it prints")


def test_text_that_is_no_vault_value_is_refused_by_its_shape():
    (problem,) = problems_of(spec_data(instances=[instance("chat", 8000, env={"HF_TOKEN": {"vault": "hunter2"}})]))
    assert problem.startswith(f"{FIELD}.vault: not a vault-encrypted value (it starts with $ANSIBLE_VAULT;)"), problem
    assert "hunter2" not in problem


def test_the_decrypted_value_passes_the_env_file_check_of_the_other_sources(password_file):
    data = spec_data(instances=[instance("chat", 8000, env={"HF_TOKEN": {"vault": encrypt("two words-7d1")}})])
    (problem,) = problems_of(data)
    assert problem.startswith(f"{FIELD}: the value in the !vault block is not one line without spaces"), problem
    assert "two words-7d1" not in problem


def test_plan_refusing_a_wrong_password_shows_no_traceback_and_json_an_error_object(tmp_path, password_file, printed):
    password_file.write_text("not the password\n")
    spec = pasted_spec(tmp_path, printed)
    shown = invoke("plan", "--spec", spec)
    as_json = invoke("plan", "--json", "--spec", spec)
    assert shown.exit_code == as_json.exit_code != 0, shown.output
    assert f"{FIELD}: vault-encrypted, and the vault password in {password_file} does not decrypt it" in shown.output
    assert "Traceback" not in shown.output + as_json.output and VAULT_SECRET not in shown.output + as_json.output
    error = json.loads(as_json.output)
    assert any(problem["field"] == FIELD for problem in error["problems"]), error


# --------------------------------------------------------------------------- outputs and the inventory


def test_plan_and_plan_json_show_it_is_vault_encrypted_never_its_value(tmp_path, password_file, printed):
    spec = pasted_spec(tmp_path, printed)
    shown = invoke("plan", "--spec", spec)
    as_json = invoke("plan", "--json", "--spec", spec)
    assert shown.exit_code == 0 and as_json.exit_code == 0, shown.output + as_json.output
    assert "HF_TOKEN=<redacted: vault-encrypted in the spec>" in shown.output
    assert VAULT_SECRET not in shown.output and VAULT_SECRET not in as_json.output
    json.loads(as_json.output)


def test_a_spec_problem_quoting_the_decrypted_value_redacts_it(tmp_path, password_file):
    data = spec_data(instances=[instance("chat", 8000, env={"TOKEN_ID": {"vault": encrypt(VAULT_SECRET)}},
                                         options={"served-model-name": VAULT_SECRET, "api-key": "x"})])
    (tmp_path / "provision.yml").write_text(yaml.safe_dump(data, sort_keys=False))
    result = invoke("plan", "--spec", tmp_path / "provision.yml")
    assert result.exit_code == 1, result.output
    assert "api-key" in result.output and VAULT_SECRET not in result.output


def test_the_unit_sets_no_secret_the_env_file_holds_it(tmp_path, password_file, printed):
    (host,) = build_plan(load_spec(pasted_spec(tmp_path, printed)))
    (unit,) = host.units
    assert "HF_TOKEN" not in unit.unit.content
    assert unit.env_file.mode == "0600" and "HF_TOKEN=<redacted: vault-encrypted in the spec>" in unit.env_file.content


def test_the_inventory_holds_the_value_still_encrypted_as_ansible_reads_it(tmp_path, password_file, printed):
    spec = load_spec(pasted_spec(tmp_path, printed))
    files = build_inventory(spec, tmp_path / "inventory")
    (entry,) = files["host_vars/ws4070.yml"]["vllm_service_instances"]
    # apart from the entries, which the role loops over (Ansible decrypts a loop's items, and shows a failed one)
    assert entry["secret_env"] == {"HF_TOKEN": {"vault": True}}
    assert files["host_vars/ws4070.yml"]["vllm_service_vault_secrets"] == {
        "chat": {"HF_TOKEN": spec.instances[0].secret_env["HF_TOKEN"].vault}}
    out = tmp_path / "inventory"
    result = invoke("inventory", "--spec", tmp_path / "provision.yml", "-o", out)
    assert result.exit_code == 0, result.output
    text = (out / "host_vars" / "ws4070.yml").read_text()
    assert "    secret_env:\n      HF_TOKEN:\n        vault: true\n" in text
    assert "vllm_service_vault_secrets:\n  chat:\n    HF_TOKEN: !vault |\n      $ANSIBLE_VAULT;1.1;AES256\n" in text
    for path in [path for path in out.rglob("*") if path.is_file()]:
        assert VAULT_SECRET not in path.read_text(), path
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    for folder in [out, *(path for path in out.rglob("*") if path.is_dir())]:
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    # Ansible's own loader reads the !vault tag, and decrypts it with the password
    from ansible.parsing.dataloader import DataLoader
    from ansible.parsing.vault import VaultSecret

    loader = DataLoader()
    loader.set_vault_secrets([("default", VaultSecret(PASSWORD.encode()))])
    vaulted = loader.load_from_file(str(out / "host_vars" / "ws4070.yml"))["vllm_service_vault_secrets"]["chat"]["HF_TOKEN"]
    assert type(vaulted).__name__ in ("EncryptedString", "AnsibleVaultEncryptedUnicode")
