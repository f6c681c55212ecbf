"""The plan's plain-Jinja2 rendering is what Ansible renders from the same templates and variables.

Uses Ansible's own Templar with the settings its template action passes
(ansible/plugins/action/template.py: trim_blocks, lstrip_blocks off, "\\n", no backslash escaping),
in-process, so it stays fast. This is what makes `provision plan` trustworthy.
"""

from __future__ import annotations

import atexit
import hashlib
import shutil
import tempfile
from functools import cache
from pathlib import Path

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.plugins.loader import init_plugin_loader
from ansible.template import Templar, trust_as_template
from ansible.utils.collection_loader import AnsibleCollectionConfig

from provisioner.audit.expectations import env_file_sha256
from provisioner.base.paths import EXAMPLES_DIR, ROLES_DIR, collections_dir
from provisioner.plan import build_plan
from provisioner.spec import load_spec, validate_spec
from provisioner.validation.roles import UNIT_TEMPLATES, host_variables
from tests.injection_values import QUOTED
from tests.unit.conftest import instance, spec_data

TEMPLATE_ACTION_OVERRIDES = {"trim_blocks": True, "lstrip_blocks": False, "newline_sequence": "\n"}


@cache
def _collection_loaded() -> None:
    """Ansible's collection loader, in this process, over this checkout as vllm_provision.gpu_host: the
    templates' filters (plugins/filter/value_rules.py) are found by their names, as ansible-playbook finds them."""
    if AnsibleCollectionConfig.collection_finder is None:
        parent = tempfile.mkdtemp(prefix="vp-collections-")
        atexit.register(shutil.rmtree, parent, True)
        init_plugin_loader([str(collections_dir(Path(parent)))])


def ansible_render(template: Path, variables: dict) -> str:
    _collection_loaded()
    templar = Templar(loader=DataLoader(), variables=variables)
    templar = templar.copy_with_new_env(searchpath=[str(template.parent)], available_variables=variables)
    return templar.template(trust_as_template(template.read_text()), escape_backslashes=False,
                            overrides=TEMPLATE_ACTION_OVERRIDES)


@pytest.mark.parametrize("example", ["seed1-3090", "seed2-4070", "seed3-2x4090"])
def test_every_planned_file_equals_ansible_rendering(example):
    spec = load_spec(EXAMPLES_DIR / f"{example}.yml")
    (plan,) = build_plan(spec)
    host = spec.hosts[0]
    variables = host_variables(host, spec.instances_on(host.name))

    pairs = [
        (ROLES_DIR / "sysctl/templates/sysctl.conf.j2", variables, plan.sysctl_file.content),
        (ROLES_DIR / "nouveau/templates/blacklist-nouveau.conf.j2", variables, plan.nouveau_files[0].content),
        (ROLES_DIR / "nouveau/templates/grub-nouveau.cfg.j2", variables, plan.nouveau_files[1].content),
    ]
    for index, unit in enumerate(plan.units):
        unit_variables = {
            **variables,
            "vllm_service_instance": variables["vllm_service_instances"][index],
            "vllm_service_instance_index": index,
            "vllm_service_api_key": unit.environment["VLLM_API_KEY"],
        }
        pairs.append((ROLES_DIR / "vllm_service/templates/vllm-instance.service.j2", unit_variables, unit.unit.content))
        pairs.append((ROLES_DIR / "vllm_service/templates/vllm-instance.env.j2", unit_variables, unit.env_file.content))
        pairs.append((ROLES_DIR / "vllm_service/templates/vllm-instance.yaml.j2", unit_variables, unit.config_file.content))

    assert len(pairs) == 3 + 3 * len(spec.instances)
    for template, template_variables, planned in pairs:
        assert ansible_render(template, template_variables) == planned, template


def test_nasty_values_render_as_ansible_renders_them():
    """Values the templates must quote (spaces, quotes, $, %, backslashes, unicode), in every engine's files."""
    env = {f"FOO{index}": value for index, value in enumerate(QUOTED)}
    instances = [
        instance(f"{engine or 'venv'}{index}", 8000 + 10 * index + position, share=0.01, model=value, env=env,
                 options={"served-model-name": [value], "chat-template": value, "compilation-config": {"backend": value}},
                 **({"container": {"engine": engine}} if engine else {}))
        for index, value in enumerate(["".join(QUOTED), "trailing\\"])  # every character; one ending in \\
        for position, engine in enumerate((None, "podman", "docker"))
    ]
    spec = validate_spec(spec_data(instances=instances), check_files=False)
    (plan,) = build_plan(spec)
    host = spec.hosts[0]
    variables = host_variables(host, spec.instances_on(host.name))
    for index, unit in enumerate(plan.units):
        entry = variables["vllm_service_instances"][index]
        unit_variables = {**variables, "vllm_service_instance": entry, "vllm_service_instance_index": index}
        engine = (entry["container"] or {}).get("engine")
        for template, planned in ((UNIT_TEMPLATES[engine], unit.unit.content),
                                  ("vllm-instance.yaml.j2", unit.config_file.content)):
            assert ansible_render(ROLES_DIR / "vllm_service/templates" / template, unit_variables) == planned, \
                (template, entry["name"])


def test_the_roles_lookups_write_the_declared_secrets_the_audit_expects(tmp_path, monkeypatch):
    """Role vllm_service's `_vllm_service_secret_env` (vars/main.yml), rendered by Ansible from the inventory's
    `secret_env` (a file, the controller's environment, a vault-encrypted value as Ansible reads the inventory's
    `!vault`), fills the env file with the values the audit hashes."""
    from ansible.parsing.vault import EncryptedString, VaultLib, VaultSecret, VaultSecretsContext

    (tmp_path / "db_conn").write_text("db-conn-value-4e2\n")
    (tmp_path / "vault.pass").write_text("role-vault-password\n")
    monkeypatch.setenv("VP_TEST_ROLE_PAT", "pat-value-9a7")
    monkeypatch.setenv("ANSIBLE_VAULT_PASSWORD_FILE", str(tmp_path / "vault.pass"))
    secret = VaultSecret(b"role-vault-password")
    monkeypatch.setattr(VaultSecretsContext, "_current", VaultSecretsContext([("default", secret)]))
    vaulted = VaultLib().encrypt("s3-conn-value-5b8", secret).decode()
    env = {"DB_CONN": {"file": "db_conn"}, "GITHUB_PAT": {"env": "VP_TEST_ROLE_PAT"}, "S3_CONN": {"vault": vaulted}}
    spec = validate_spec(spec_data(instances=[instance("chat", 8000, env=env)]), base_dir=tmp_path)
    host = spec.hosts[0]
    variables = host_variables(host, spec.instances_on(host.name))
    entry = variables["vllm_service_instances"][0]
    assert entry["secret_env"]["S3_CONN"] == {"vault": True}  # the ciphertext is apart from the entry
    # as Ansible's loader reads the inventory's `!vault` scalar
    vault_secrets = {"chat": {"S3_CONN": EncryptedString(ciphertext=str(variables["vllm_service_vault_secrets"]["chat"]["S3_CONN"]))}}
    init_plugin_loader()  # the lookups are plugins
    role_vars = yaml.safe_load((ROLES_DIR / "vllm_service/vars/main.yml").read_text())
    unit_variables = {**variables, "vllm_service_vault_secrets": vault_secrets,
                      "vllm_service_instance": entry, "vllm_service_api_key": "",
                      "_vllm_service_secret_sources": trust_as_template(role_vars["_vllm_service_secret_sources"])}
    secret_env = Templar(loader=DataLoader(), variables=unit_variables).template(
        trust_as_template(role_vars["_vllm_service_secret_env"]))
    assert secret_env == {"DB_CONN": "db-conn-value-4e2", "GITHUB_PAT": "pat-value-9a7", "S3_CONN": "s3-conn-value-5b8"}
    rendered = ansible_render(ROLES_DIR / "vllm_service/templates/vllm-instance.env.j2",
                              {**unit_variables, "vllm_service_secret_env": secret_env})
    assert rendered.splitlines()[-3:] == ["DB_CONN=db-conn-value-4e2", "GITHUB_PAT=pat-value-9a7",
                                          "S3_CONN=s3-conn-value-5b8"]
    assert hashlib.sha256(rendered.encode()).hexdigest() == env_file_sha256(variables, entry)
