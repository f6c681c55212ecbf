"""A secret the spec holds vault-encrypted (`NAME: !vault |` as `ansible-vault encrypt_string` prints it, or
`{vault: "$ANSIBLE_VAULT;…"}`), decrypted on the controller only to check it and to redact it by value.

The password is the one ansible-playbook itself uses: its setting DEFAULT_VAULT_PASSWORD_FILE
(`ANSIBLE_VAULT_PASSWORD_FILE`, or `vault_password_file` in the user's ansible.cfg), a file holding the
password or a script printing it, read with ansible-core's own vault library (`get_file_vault_secret`,
`VaultLib`). `provision apply` hands its environment to ansible-playbook, which finds the same password.

Every failure is a `VaultProblem` whose message says what to do, never a traceback, never a value.
"""

from __future__ import annotations

import os
from functools import lru_cache

VAULT_HEADER = "$ANSIBLE_VAULT;"
PASSWORD_SETTING = "DEFAULT_VAULT_PASSWORD_FILE"
PASSWORD_VARIABLE = "ANSIBLE_VAULT_PASSWORD_FILE"
REENCRYPT = "re-encrypt it: `ansible-vault encrypt_string --name {name}` and paste what it prints"


class VaultProblem(ValueError):
    """A vault-encrypted value the controller cannot decrypt: the message names the cause and the fix."""


def is_vault_text(text: str) -> bool:
    """Text as ansible-vault writes it: `$ANSIBLE_VAULT;1.1;AES256` (or 1.2;AES256;ID) then hex lines."""
    return isinstance(text, str) and text.lstrip().startswith(VAULT_HEADER)


def password_file() -> str | None:
    """The vault password file ansible-playbook started here would use (its environment variable first,
    then ansible.cfg), or None."""
    named = os.environ.get(PASSWORD_VARIABLE)
    if named:
        return os.path.expanduser(named)
    try:
        from provisioner.base.ansible_config import AnsibleConfigError, read_settings

        value = read_settings({PASSWORD_SETTING})[PASSWORD_SETTING].value
    except (ImportError, AnsibleConfigError):
        return None
    return str(value) if value else None


def decrypt(vault_text: str, name: str = "NAME") -> str:
    """The value of a vault-encrypted string, as ansible-playbook decrypts it (UTF-8); `name` (the variable's)
    goes into the fix. Raises VaultProblem."""
    reencrypt = REENCRYPT.format(name=name)
    try:
        from ansible.errors import AnsibleError
        from ansible.parsing.vault import VaultLib
    except ImportError:
        raise VaultProblem("ansible-core is not installed here, so the value cannot be decrypted — install "
                           "vllm-provision with its dependencies") from None
    if not is_vault_text(vault_text):
        raise VaultProblem(f"it is not a vault-encrypted value (it must start with {VAULT_HEADER}) — {reencrypt}")
    path = password_file()
    if not path:
        raise VaultProblem(f"no vault password to decrypt it — set {PASSWORD_VARIABLE} to the file holding the "
                           "vault password (as for ansible-playbook --vault-password-file)")
    secrets = _secrets(path, *_stamp(path))
    try:
        plaintext = VaultLib(secrets).decrypt(vault_text.strip())
    except AnsibleError as error:
        if "Decryption failed" in str(error.message):
            raise VaultProblem(f"the vault password in {path} does not decrypt it — set {PASSWORD_VARIABLE} to the "
                               f"file holding the password it was encrypted with, or {reencrypt}") from None
        raise VaultProblem(f"it is not a valid vault-encrypted value ({_first_line(error.message)}) — "
                           f"{reencrypt}") from None
    except (ValueError, TypeError):
        raise VaultProblem(f"it is not a valid vault-encrypted value — {reencrypt}") from None
    try:
        return plaintext.decode("utf-8")
    except UnicodeDecodeError:
        raise VaultProblem("its value is not UTF-8 text — encrypt the text value with "
                           f"`ansible-vault encrypt_string --name {name}`") from None


def _stamp(path: str) -> tuple[int, int]:
    try:
        status = os.stat(path)
    except OSError:
        return (0, 0)
    return (status.st_mtime_ns, status.st_size)


@lru_cache(maxsize=8)
def _secrets(path: str, *_stamp: int) -> list:
    """[(vault id, secret)] read from the password file (a script run once per process and file version)."""
    from ansible.errors import AnsibleError
    from ansible.parsing.dataloader import DataLoader
    from ansible.parsing.vault import get_file_vault_secret

    try:
        secret = get_file_vault_secret(filename=path, vault_id="default", loader=DataLoader())
        secret.load()
    except AnsibleError as error:
        raise VaultProblem(f"the vault password cannot be read ({_first_line(error.message)}) — set "
                           f"{PASSWORD_VARIABLE} to the file holding the vault password") from None
    return [("default", secret)]


def _first_line(message: object) -> str:
    return str(message).strip().splitlines()[0].rstrip(".") if str(message).strip() else "unreadable"
