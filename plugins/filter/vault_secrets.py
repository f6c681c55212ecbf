# SPDX-License-Identifier: Apache-2.0
# Part of vllm-provision. Runs on the controller: playbook site.yml's first check (role vllm_service's
# tasks/secrets-check.yml) names, before any change, the declared secrets ansible-playbook cannot decrypt (the env
# file task that uses them runs under no_log, which hides why).
"""The instances' vault-encrypted secrets that the vault password ansible-playbook was given does not decrypt:

    vllm_service_vault_secrets | vllm_provision.gpu_host.undecryptable   ->  ['chat: HF_TOKEN']

`vllm_service_vault_secrets` maps an instance's name to NAME to a `!vault` value. Names only, never a value.
ansible-core 2.19 hands an undecryptable value over as a marker (the plugin accepts markers, from its argument and
from the mapping; a task that reads a value otherwise fails without naming it); before 2.19 decrypting it raises.
"""

from __future__ import annotations

try:
    from ansible.template import accept_args_markers, accept_lazy_markers
except ImportError:  # ansible-core before 2.19: no markers

    def accept_args_markers(plugin):
        return plugin

    accept_lazy_markers = accept_args_markers


@accept_lazy_markers
@accept_args_markers
def undecryptable(vault_secrets) -> list[str]:
    found = []
    for instance, values in (vault_secrets.items() if hasattr(vault_secrets, "items") else []):
        for name, value in (values.items() if hasattr(values, "items") else []):
            if not _decrypts(value):
                found.append(f"{instance}: {name}")
    return found


def _decrypts(value) -> bool:
    if type(value).__name__ == "VaultExceptionMarker":
        return False
    try:
        str(value)  # before 2.19, an AnsibleVaultEncryptedUnicode decrypts here
    except Exception:  # noqa: BLE001 - any failure to decrypt: the name is what the preflight reports
        return False
    return True


class FilterModule:
    def filters(self):
        return {"undecryptable": undecryptable}
