# SPDX-License-Identifier: Apache-2.0
# Part of vllm-provision. Runs on the controller: role vllm_service's preflight names, before any change, the declared
# secrets ansible-playbook cannot decrypt (the env file task that uses them runs under no_log, which hides why).
"""The vault-encrypted secrets of the instances that the vault password ansible-playbook was given does not decrypt:

    vllm_service_instances | vllm_provision.gpu_host.undecryptable   ->  ['chat: HF_TOKEN']

Each entry's `secret_env` maps NAME to {file: PATH}, {env: VAR} or {vault: !vault TEXT}; only the last are tried.
Names only, never a value. ansible-core 2.19 hands an undecryptable value over as a marker (the plugin accepts
markers, from its arguments and from the entries; a task that reads an entry whole, or loops over the entries,
fails unnamed instead); before 2.19 decrypting it raises.
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
def undecryptable(instances) -> list[str]:
    found = []
    for entry in list(instances or []) if isinstance(instances, (list, tuple)) else []:
        secret_env = entry.get("secret_env") if hasattr(entry, "get") else None
        for name, source in (secret_env.items() if hasattr(secret_env, "items") else []):
            value = source.get("vault") if hasattr(source, "get") else None
            if value is not None and not _decrypts(value):
                found.append(f"{entry.get('name', '?')}: {name}")
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
