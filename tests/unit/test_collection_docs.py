"""The collection's reference is generated from the collection (issue 36, point 4): each role README's variables
table from its argument_specs, docs/ansible.md's roles and modules from the roles and the modules themselves. A
file that differs from what provisioner/validation/collection_docs.py generates fails here, with the command that fixes it."""

from __future__ import annotations

from provisioner.validation import collection_docs
from provisioner.base.paths import PLUGINS_DIR, ROLES_DIR


def test_every_generated_file_is_up_to_date():
    stale = [str(path) for path, text in collection_docs.generated().items() if path.read_text(encoding="utf-8") != text]
    assert stale == [], "out of date: run `.venv/bin/python -m provisioner.validation.collection_docs`"


def test_every_role_and_every_module_is_listed_with_its_own_description():
    table = collection_docs.collection_table()
    for role in ROLES_DIR.iterdir():
        assert f"`vllm_provision.gpu_host.{role.name}` (role) | " in table
    for module in (PLUGINS_DIR / "modules").glob("*.py"):
        short = collection_docs.module_doc(module)["short_description"]
        assert f"`vllm_provision.gpu_host.{module.stem}` (module) | {collection_docs.markdown(short)};" in table


def test_every_option_of_every_entry_point_has_its_row():
    for role in ROLES_DIR.iterdir():
        table = collection_docs.variables_table(role)
        for spec in collection_docs.entry_points(role).values():
            for name in spec.get("options") or {}:
                assert f"| `{name}` |" in table, (role.name, name)


def test_ansible_markup_becomes_markdown():
    assert collection_docs.markdown("C(16G) or I(none), B(not) U(https://x.y) L(the docs, https://x.y/d) a|b") == \
        "`16G` or *none*, **not** https://x.y [the docs](https://x.y/d) a\\|b"


def test_the_documented_vllm_path_is_the_one_the_roles_run():
    """The example spec and the docs name the vllm the units run as the spec model computes it (the inventory's
    vllm_service_bin): `<install_path>/venvs/<version>/bin/vllm`, never a `venv/` of one version."""
    from provisioner.base.paths import CONTENT_ROOT, SPEC_EXAMPLE
    from provisioner.spec.models import VllmSettings

    settings = VllmSettings(install_path="/INSTALL", version="0.25.0")
    documented = settings.venv.replace("/INSTALL", "<install_path>").replace("0.25.0", "<version>") + "/bin/vllm"
    assert documented == "<install_path>/venvs/<version>/bin/vllm"
    for path in [SPEC_EXAMPLE, *(CONTENT_ROOT / "docs").glob("*.md"), CONTENT_ROOT / "README.md"]:
        text = path.read_text(encoding="utf-8")
        assert "<install_path>/venv/" not in text, path
    assert documented in SPEC_EXAMPLE.read_text(encoding="utf-8")


def test_a_file_without_its_generated_block_is_refused_naming_the_markers(tmp_path):
    import pytest

    readme = tmp_path / "README.md"
    with pytest.raises(ValueError, match="README.md: no generated block — put the lines"):
        collection_docs.between_markers("# a role\n\n## Variables\n| a | b |\n", "| x |", "meta/argument_specs.yml", readme)
    marked = collection_docs.between_markers(
        f"intro\n{collection_docs.BEGIN.format(source='s')}\n| old |\n{collection_docs.END}\nafter\n", "| new |", "s",
        readme)
    assert marked == f"intro\n{collection_docs.BEGIN.format(source='s')}\n| new |\n{collection_docs.END}\nafter\n"


def test_the_contract_table_names_exactly_the_variables_the_inventory_writes(tmp_path, monkeypatch):
    """docs/variables.md's host_vars table (written by hand: which spec field becomes which variable) names every
    variable the inventory writes into a host's host_vars, no other, each with the role whose argument_specs
    declare it; types and defaults are in the generated table below it, not restated."""
    import re

    from provisioner.fleet.inventory import build_inventory
    from provisioner.spec import load_spec, validate_spec
    from tests.unit import test_audit_check_docs as samples
    from tests.unit.conftest import instance, spec_data
    from tests.unit.test_vault_secrets import PASSWORD, encrypt

    (tmp_path / "vault.pass").write_text(PASSWORD + "\n")
    monkeypatch.setenv("ANSIBLE_VAULT_PASSWORD_FILE", str(tmp_path / "vault.pass"))
    vaulted = spec_data(instances=[instance("chat", 8000, env={"TOKEN_ID": {"vault": encrypt("s")}})])
    specs = [load_spec(path) for path in sorted(samples.EXAMPLES_DIR.glob("*.yml"))]
    specs += [validate_spec(data, check_files=False) for data in (
        samples.containers_spec(), samples.gateway_spec(), samples.managed_driver_spec(), samples.monitoring_spec(),
        samples.multinode_spec(), vaulted)]
    written = {name for spec in specs for path, content in build_inventory(spec).items()
               if path.startswith("host_vars/") for name in content}

    text = collection_docs.VARIABLES_DOC.read_text(encoding="utf-8")
    table = text.split("## host_vars/<host>.yml (one per host)\n", 1)[1].split("\n\n", 2)[1]
    documented: dict[str, str] = {}
    for line in table.splitlines()[2:]:
        names, role = line.split(" | ")[:2]
        for name in re.findall(r"`([a-z_]+)`", names):
            documented[name] = role.strip()
    assert set(documented) == written
    options = {role.name: set(collection_docs.role_options(role)) for role in collection_docs.roles()}
    site = (collection_docs.CONTENT_ROOT / "playbooks" / "site.yml").read_text(encoding="utf-8")
    options["(site.yml)"] = {name for name in documented if name in site}  # the playbook's own, read there
    undeclared = {name: role for name, role in documented.items() if name not in options.get(role, set())}
    assert undeclared == {}, "named with a role whose argument_specs do not declare it"
