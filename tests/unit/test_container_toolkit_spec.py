"""The spec's `container_toolkit:` section: its messages word for word, how defaults and groups give it to hosts,
and the inventory variables of role container_engine (its phase toolkit) it becomes."""

from __future__ import annotations

import pytest
import yaml

from provisioner.audit.expectations import spec_targets
from provisioner.base.paths import role_dir
from provisioner.fleet.inventory import build_inventory
from provisioner.spec import validate_spec
from tests.unit.conftest import UUID0, host, instance, problems_of, spec_data

IN_A_CONTAINER = {"container": {"engine": "podman"}}


def toolkit_vars(data: dict, name: str = "ws4070") -> dict:
    variables = build_inventory(validate_spec(data, check_files=False))[f"host_vars/{name}.yml"]
    return {key: variables[key] for key in ("container_engine_nvidia_toolkit_manage",
                                            "container_engine_nvidia_toolkit_version", "container_engine_cdi_devices")}


@pytest.mark.parametrize("toolkit, message", [
    ({"version": "1.18.0"}, "hosts[0].container_toolkit.version: '1.18.0' is not a version of NVIDIA's toolkit "
                            'package — write it as apt shows it, quoted (e.g. "1.18.0-1")'),
    ({"version": 1.18}, "hosts[0].container_toolkit.version: expected a string, got 1.18 (float) — put it in quotes"),
    ({"manage": "yes"}, "hosts[0].container_toolkit.manage: expected true or false, got 'yes'"),
    ({"verison": "1.18.0-1"}, "hosts[0].container_toolkit.verison: unknown key 'verison' — did you mean 'version'? "
                              "allowed keys: manage, version"),
])
def test_a_bad_toolkit_field_is_named_with_the_fix(toolkit, message):
    assert problems_of(spec_data(hosts=[host(container_toolkit=toolkit)])) == [message]


def test_without_the_section_the_toolkit_is_the_hosts_own():
    data = spec_data(instances=[instance("chat", 8000, **IN_A_CONTAINER)])
    assert toolkit_vars(data) == {"container_engine_nvidia_toolkit_manage": False,
                                  "container_engine_nvidia_toolkit_version": "1.18.0-1",
                                  "container_engine_cdi_devices": [f"nvidia.com/gpu={UUID0}"]}


@pytest.mark.parametrize("toolkit, expected", [
    ({}, (True, "1.18.0-1")),
    ({"version": "1.17.8-1"}, (True, "1.17.8-1")),
    ({"manage": False}, (False, "1.18.0-1")),
])
def test_the_section_becomes_the_roles_variables(toolkit, expected):
    data = spec_data(hosts=[host(container_toolkit=toolkit)], instances=[instance("chat", 8000, **IN_A_CONTAINER)])
    variables = toolkit_vars(data)
    assert (variables["container_engine_nvidia_toolkit_manage"], variables["container_engine_nvidia_toolkit_version"]) \
        == expected


def test_defaults_and_groups_give_the_section_and_a_host_overrides_a_field():
    data = {**spec_data(hosts=[host(groups=["old"]), host("ws2", "192.0.2.21", gpus={}),
                               host("ws3", "192.0.2.22", gpus={}, container_toolkit={"manage": False})], instances=[]),
            "defaults": {"container_toolkit": {"version": "1.18.0-1"}},
            "groups": [{"name": "old", "container_toolkit": {"version": "1.17.8-1"}}]}
    assert [(variables["container_engine_nvidia_toolkit_manage"], variables["container_engine_nvidia_toolkit_version"])
            for variables in (toolkit_vars(data, name) for name in ("ws4070", "ws2", "ws3"))] == [
        (True, "1.17.8-1"), (True, "1.18.0-1"), (False, "1.18.0-1")]


def test_the_spec_and_the_role_default_to_the_same_version():
    defaults = yaml.safe_load((role_dir("container_engine") / "defaults" / "main.yml").read_text())
    specs = yaml.safe_load((role_dir("container_engine") / "meta" / "argument_specs.yml").read_text())
    options = specs["argument_specs"]["main"]["options"]
    assert defaults["container_engine_nvidia_toolkit_version"] == options["container_engine_nvidia_toolkit_version"][
        "default"] == toolkit_vars(spec_data(instances=[]))["container_engine_nvidia_toolkit_version"]


@pytest.mark.parametrize("toolkit, expected", [
    ({"version": "1.17.8-1"}, {"package": "nvidia-container-toolkit-base", "version": "1.17.8-1",
                               "path_unit": "vllm-provision-cdi-refresh.path"}),
    ({"version": "1.18.0-1"}, {"package": "nvidia-container-toolkit-base", "version": "1.18.0-1",
                               "path_unit": "nvidia-cdi-refresh.path"}),
    ({"version": "1.18.0~rc.6-1"}, {"package": "nvidia-container-toolkit-base", "version": "1.18.0~rc.6-1",
                                    "path_unit": "nvidia-cdi-refresh.path"}),
    ({"manage": False}, None),
])
def test_the_audit_expects_the_refresh_unit_the_version_has(toolkit, expected):
    data = spec_data(hosts=[host(container_toolkit=toolkit)], instances=[instance("chat", 8000, **IN_A_CONTAINER)])
    (target,) = spec_targets(validate_spec(data, check_files=False))
    assert target.expected["container_toolkit"] == expected


def test_the_audit_expects_no_toolkit_where_no_container_uses_a_gpu():
    (target,) = spec_targets(validate_spec(spec_data(hosts=[host(container_toolkit={})]), check_files=False))
    assert target.expected["container_toolkit"] is None
