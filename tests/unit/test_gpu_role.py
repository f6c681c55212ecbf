"""Role nvidia_gpu reads exactly the variables the inventory emits, and site.yml runs it before vllm_service."""

from __future__ import annotations

import yaml

from provisioner.base.paths import COLLECTION, EXAMPLES_DIR, PLAYBOOKS_DIR, ROLES_DIR
from provisioner.fleet.inventory import host_vars
from provisioner.spec import load_spec

ROLE = ROLES_DIR / "nvidia_gpu"


def load(path):
    return yaml.safe_load(path.read_text())


def test_every_nvidia_gpu_variable_of_the_inventory_is_typed_with_its_device_fields():
    options = load(ROLE / "meta" / "argument_specs.yml")["argument_specs"]["main"]["options"]
    spec = load_spec(EXAMPLES_DIR / "seed3-2x4090.yml")
    emitted = {key: value for key, value in host_vars(spec.hosts[0], spec.instances).items()
               if key.startswith("nvidia_gpu_")}

    assert sorted(emitted) == ["nvidia_gpu_devices", "nvidia_gpu_expected_count", "nvidia_gpu_persistence_mode"]
    assert set(emitted) <= set(options)
    assert set(emitted["nvidia_gpu_devices"][0]) == set(options["nvidia_gpu_devices"]["options"])


def test_every_option_has_a_literal_default():
    options = load(ROLE / "meta" / "argument_specs.yml")["argument_specs"]["main"]["options"]
    defaults = load(ROLE / "defaults" / "main.yml")
    assert set(defaults) == set(options)
    assert not any("{{" in str(value) for value in defaults.values())


def test_site_runs_the_role_before_the_vllm_units_tagged_nvidia_gpu():
    _lock, play, _gateways, _monitoring, _release = load(PLAYBOOKS_DIR / "site.yml")
    roles = [entry["role"] for entry in play["roles"]]
    assert roles.index(f"{COLLECTION}.nvidia_gpu") < roles.index(f"{COLLECTION}.vllm_service")
    assert next(entry for entry in play["roles"] if entry["role"] == f"{COLLECTION}.nvidia_gpu")["tags"] == ["nvidia_gpu"]
