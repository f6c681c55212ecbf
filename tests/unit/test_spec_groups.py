"""Defaults and groups (issue 17, point 5): what a host takes, in which order, what reaches the inventory, plan
and audit, and every message about them, word for word."""

from __future__ import annotations

import json

import jsonschema
import pytest
from typer.testing import CliRunner

from provisioner.cli.audit_cmd import targets_of_spec
from provisioner.cli.main import app
from provisioner.fleet.inventory import build_inventory
from provisioner.spec import validate_spec
from provisioner.spec_docs import spec_schema
from tests.unit.conftest import UUID0, UUID1, host, instance, problems_of, spec_data, write_spec


def fleet(defaults: dict | None = None, groups: list[dict] | None = None, hosts: list[dict] | None = None,
          instances: list[dict] | None = None) -> dict:
    """ws4070 in rack_a and big, ws3090 in rack_a only; defaults and groups as given."""
    data = spec_data(hosts=hosts or [
        host(groups=["rack_a", "big"]),
        host("ws3090", "192.0.2.10", groups=["rack_a"], gpus={"devices": [{"index": 0, "uuid": UUID1}]}),
    ], instances=instances or [])
    if defaults is not None:
        data["defaults"] = defaults
    if groups is not None:
        data["groups"] = groups
    return data


RACK_A = {"name": "rack_a", "ssh": {"user": "admin"}, "settings": {"shm_size": "32G", "sysctls": {"vm.a": 2, "vm.b": 2}}}
BIG = {"name": "big", "ssh": {"user": "big"}, "vllm": {"version": "0.33.0"}, "gpus": {"persistence_mode": False}}


# ------------------------------------------------------------------ what a host takes


def test_a_host_takes_defaults_then_its_groups_in_its_order_then_its_own_values():
    defaults = {"ssh": {"user": "ubuntu", "become": True, "port": 2222}, "vllm": {"install_path": "/srv/vllm"}}
    hosts = [host(groups=["rack_a", "big"], ssh={"port": 22}), host("ws3090", "192.0.2.10", groups=["big", "rack_a"],
                                                                      gpus={"devices": [{"index": 0, "uuid": UUID1}]})]
    first, second = validate_spec(fleet(defaults, [RACK_A, BIG], hosts)).hosts
    assert (first.ssh.user, first.ssh.become, first.ssh.port) == ("big", True, 22)  # big listed last; port its own
    assert (second.ssh.user, second.ssh.port) == ("admin", 2222)  # rack_a listed last
    assert first.vllm.version == second.vllm.version == "0.33.0"
    assert first.vllm.install_path == second.vllm.install_path == "/srv/vllm"
    assert first.gpus.persistence_mode is False and first.gpus.devices[0].uuid == UUID0  # its own devices


def test_fields_merge_one_by_one_and_sysctls_key_by_key():
    hosts = [host(groups=["rack_a"], settings={"shm_size": "16G", "sysctls": {"vm.b": 3, "vm.c": 3}})]
    data = fleet({"settings": {"sysctls": {"vm.a": 1, "vm.z": 1}, "swappiness": 10}}, [RACK_A], hosts)
    (taken,) = validate_spec(data).hosts
    assert taken.settings.shm_size == "16G"  # its own, and it keeps the sysctls it takes
    assert taken.settings.sysctls == {"vm.a": 2, "vm.z": 1, "vm.b": 3, "vm.c": 3}
    assert taken.settings.swappiness == 10


def test_a_null_a_host_writes_is_its_value_and_a_null_section_of_a_group_sets_nothing():
    hosts = [host(groups=["rack_a", "big"], settings={"shm_size": None})]
    data = fleet({"settings": {"shm_size": "8G"}}, [RACK_A, {"name": "big", "settings": None}], hosts)
    (taken,) = validate_spec(data).hosts
    assert taken.settings.shm_size is None and taken.settings.sysctls == {"vm.a": 2, "vm.b": 2}


def test_a_group_without_an_entry_is_membership_only_and_no_entries_change_nothing():
    plain = validate_spec(fleet())
    assert [h.groups for h in plain.hosts] == [["rack_a", "big"], ["rack_a"]]
    with_entries = validate_spec(fleet({}, [{"name": "big"}]))
    assert with_entries.hosts == plain.hosts


def test_a_resolved_spec_written_out_and_read_again_is_the_same():
    """As `bench run --sweep` does: the hosts hold every value, the groups give them the same ones again."""
    spec = validate_spec(fleet({"ssh": {"user": "ubuntu"}, "settings": {"sysctls": {"vm.z": 1}}}, [RACK_A, BIG]))
    assert validate_spec(spec.model_dump(mode="python")).hosts == spec.hosts


def test_paths_a_group_names_are_taken_from_the_specs_folder(tmp_path):
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "fleet").write_text("key")
    spec = validate_spec(fleet({"ssh": {"key": "keys/fleet"}}), base_dir=tmp_path)
    assert [h.ssh.key for h in spec.hosts] == [str(tmp_path / "keys" / "fleet")] * 2


# ------------------------------------------------------------------ downstream: inventory, plan, audit, selection


def test_the_inventory_has_each_hosts_resolved_values_and_each_group_as_an_inventory_group():
    files = build_inventory(validate_spec(fleet({"settings": {"sysctls": {"vm.z": 1}}}, [RACK_A, BIG])))
    assert sorted(files) == ["group_vars/all.yml", "host_vars/ws3090.yml", "host_vars/ws4070.yml", "hosts.yml"]
    group = files["hosts.yml"]["all"]["children"]["vllm_hosts"]
    assert group["children"] == {"rack_a": {"hosts": {"ws4070": {}, "ws3090": {}}}, "big": {"hosts": {"ws4070": {}}},
                                 "gateway": {}, "monitoring": {}}
    assert [group["hosts"][name]["ansible_user"] for name in ("ws4070", "ws3090")] == ["big", "admin"]
    first, second = files["host_vars/ws4070.yml"], files["host_vars/ws3090.yml"]
    assert first["sysctl_settings"] == second["sysctl_settings"] == {"vm.a": 2, "vm.b": 2, "vm.swappiness": 1,
                                                                      "vm.z": 1}
    assert (first["vllm_install_version"], second["vllm_install_version"]) == ("0.33.0", "0.25.0")
    assert (first["nvidia_gpu_persistence_mode"], second["nvidia_gpu_persistence_mode"]) == (False, True)
    assert files["group_vars/all.yml"] == {}


def invoke(*args):
    return CliRunner().invoke(app, [str(arg) for arg in args], env={"COLUMNS": "200", "NO_COLOR": "1",
                                                                    "PROVISION_SPEC": ""})


def test_plan_and_audit_of_a_group_of_groups_work_on_its_hosts_with_their_values(tmp_path):
    fits = {"max-model-len": 4096}
    spec = write_spec(tmp_path / "spec.yml", fleet({"ssh": {"user": "ubuntu"}}, [RACK_A, BIG], instances=[
        instance("chat", 8000, 0.9, options=fits), instance("qwen", 8000, 0.9, on="ws3090", options=fits)]))
    planned = invoke("plan", "big", "--json", "--spec", spec)
    assert planned.exit_code == 0, planned.output
    assert [plan["host"] for plan in json.loads(planned.output)["hosts"]] == ["ws4070"]
    targets = targets_of_spec(spec, ["rack_a"])
    assert [(target.name, target.connection.user) for target in targets] == [("ws4070", "big"), ("ws3090", "admin")]
    assert targets[1].expected["sysctl"]["settings"] == {"vm.a": "2", "vm.b": "2", "vm.swappiness": "1"}


def test_apply_of_a_group_checks_only_its_hosts_before_touching_any(tmp_path):
    """Stopped by the memory check (an instance too big for ws3090's GPU), naming only the group's host."""
    too_big = instance("qwen", 8000, 0.9, on="ws3090", model="Qwen/Qwen2.5-7B-Instruct", options={"max-model-len": 32768})
    card = {"index": 0, "uuid": UUID1, "model": "NVIDIA GeForce RTX 4070"}  # known memory: the check runs
    spec = write_spec(tmp_path / "spec.yml", fleet(groups=[RACK_A, BIG], hosts=[
        host(groups=["big"]), host("ws3090", "192.0.2.10", groups=["rack_a"], gpus={"devices": [card]})],
        instances=[instance("chat", 8000, 0.9, options={"max-model-len": 4096}), too_big]))
    result = invoke("apply", "rack_a", "--spec", spec)
    assert "memory: ws3090 GPU 0: qwen" in result.output and "ws4070" not in result.output, result.output
    assert "nothing applied" in result.output and result.exit_code == 1


# ------------------------------------------------------------------ problems, where they are written


@pytest.mark.parametrize("group, message", [
    ({"name": "rack_a", "settings": {"shm_sise": "32G"}},
     "groups[0].settings.shm_sise: unknown key 'shm_sise' — did you mean 'shm_size'? allowed keys: swappiness, sysctls, "
     "shm_size, nouveau_blacklist"),
    ({"name": "rack_a", "colour": "blue"},
     "groups[0].colour: unknown key 'colour' — allowed keys: name, ssh, settings, gpus, vllm, driver, container_toolkit"),
    ({"name": "rack_a", "settings": {"shm_size": "32GB"}},
     "groups[0].settings.shm_size: '32GB' is not a size — write a number with a K, M, G or T suffix (e.g. 16G), or "
     "null to leave /dev/shm as it is"),
    ({"name": "rack_a", "ssh": "admin"}, "groups[0].ssh: expected a mapping (key: value), got 'admin'"),
    ({"name": "rack_a", "gpus": {"persistence_mode": "yes"}},
     "groups[0].gpus.persistence_mode: expected true or false, got 'yes'"),
    ({"name": "rack_a", "vllm": {"version": 0.33}},
     "groups[0].vllm.version: expected a string, got 0.33 (float) — put it in quotes"),
    ({"name": "rack_a", "address": "192.0.2.9"},
     "groups[0].address: a group cannot set address (each host has its own) — set it on each host: hosts[].address"),
    ({"name": "rack_a", "groups": ["big"]},
     "groups[0].groups: a group cannot set groups (each host lists its own) — set it on each host: hosts[].groups"),
    ({"name": "rack_a", "gpus": {"expected_count": 8, "devices": [{"index": 0, "uuid": UUID0}]}},
     "groups[0].gpus.devices: a group cannot set devices (every GPU has its own UUID) — set it on each host: "
     "hosts[].gpus.devices"),
    ({"name": "rack-a"}, "groups[0].name: 'rack-a' is not a valid Ansible group name — use letters, digits and "
                         "underscores, not starting with a digit (e.g. rack_a, h200)"),
    ({"settings": {}}, "groups[0].name: required — add it"),
])
def test_a_bad_group_is_one_problem_where_it_is_written(group, message):
    assert problems_of(fleet(groups=[group])) == [message]


@pytest.mark.parametrize("defaults, message", [
    ({"name": "gpu"}, "defaults.name: defaults cannot set name (each host has its own) — set it on each host: hosts[].name"),
    ({"address": "192.0.2.9"},
     "defaults.address: defaults cannot set address (each host has its own) — set it on each host: hosts[].address"),
    ({"gpus": {"devices": []}}, "defaults.gpus.devices: defaults cannot set devices (every GPU has its own UUID) — set it "
                                "on each host: hosts[].gpus.devices"),
    ({"ssh": {"prot": 22}},
     "defaults.ssh.prot: unknown key 'prot' — did you mean 'port'? allowed keys: user, port, key, known_hosts, become"),
    ({"gpus": {"expected_count": -1}}, "defaults.gpus.expected_count: must be at least 0, got -1 (int)"),
    ([], "defaults: expected a mapping (key: value), got a list"),
])
def test_bad_defaults_are_one_problem_where_they_are_written(defaults, message):
    assert problems_of(fleet(defaults)) == [message]


def test_a_group_that_is_not_a_list_is_one_problem():
    assert problems_of(fleet(groups={"rack_a": {}})) == ["groups: expected a list, got a mapping"]


def forty_hosts(**group) -> dict:
    hosts = [host(f"gpu{n}", f"192.0.2.{n + 1}", groups=["h100"], gpus={}) for n in range(40)]
    return fleet(groups=[{"name": "h100", **group}], hosts=hosts)


def test_a_bad_value_forty_hosts_take_is_one_problem_at_the_group():
    assert problems_of(forty_hosts(settings={"swappiness": 300})) == [
        "groups[0].settings.swappiness: must be at most 200, got 300 (int)"]


def test_checks_across_the_spec_report_a_taken_value_once_at_the_group(tmp_path):
    data = forty_hosts(vllm={"version": "0.30.0"}, ssh={"key": "keys/fleet"},
                       settings={"sysctls": {"vm max_map_count": 1, "vm.swappiness": 5}})
    data["defaults"] = {"ssh": {"user": "ad min"}}
    assert problems_of(data, base_dir=tmp_path) == [
        "defaults.ssh.user: 'ad min' is not a user name — use letters, digits and '_.-', starting with a letter or '_' "
        "(e.g. root, ubuntu)",
        "groups[0].settings.sysctls['vm max_map_count']: 'vm max_map_count' is not a kernel parameter name (e.g. "
        "vm.max_map_count, as `sysctl -a` lists them)",
        "groups[0].settings.sysctls['vm.swappiness']: vm.swappiness has its own setting — remove it here and set "
        "`swappiness:` under settings",
        "groups[0].vllm.version: vLLM 0.30.0 is not supported — use one of 0.25.0, 0.33.0 (or add its flag catalog: "
        "python -m provisioner.vllm.make_catalog)",
        f"groups[0].ssh.key: {tmp_path}/keys/fleet does not exist — create it with an ssh private key or correct the "
        "path",
    ]


def test_a_value_a_host_overrides_is_not_checked_where_it_is_overridden():
    data = forty_hosts(vllm={"version": "0.30.0"})
    for each in data["hosts"]:
        each["vllm"] = {"version": "0.33.0"}
    assert len(validate_spec(data).hosts) == 40


def test_a_taken_count_checked_against_the_hosts_own_devices_stays_on_the_host_and_says_where_it_is_from():
    data = fleet(groups=[{"name": "big", "gpus": {"expected_count": 2}}])
    assert problems_of(data) == [
        "hosts[0].gpus.expected_count: 2 GPUs expected but 1 listed under devices — list every GPU under devices or "
        "correct expected_count (the host takes it from groups[0].gpus.expected_count)"]


def test_a_host_that_takes_a_bad_group_reports_its_own_problems_and_none_the_group_causes():
    """ws4070's instance uses a flag vLLM 0.33.0 has and 0.25.0 not, and big gives it 0.33.0: with big broken, the
    flag is not checked against the default version; the host's own type error is still reported."""
    hosts = [host(groups=["rack_a", "big"], ssh={"port": "22"}), host("ws3090", "192.0.2.10", gpus={})]
    chat = instance("chat", 8000, options={"max-num-active-seqs": 8})
    assert len(validate_spec(fleet(groups=[RACK_A, BIG], hosts=[host(groups=["rack_a", "big"]), hosts[1]],
                                   instances=[chat])).instances) == 1
    big = {**BIG, "settings": {"shm_size": "lots"}}
    assert problems_of(fleet(groups=[RACK_A, big], hosts=hosts, instances=[chat])) == [
        "hosts[0].ssh.port: expected an integer, got '22'",
        "groups[1].settings.shm_size: 'lots' is not a size — write a number with a K, M, G or T suffix (e.g. 16G), or "
        "null to leave /dev/shm as it is",
    ]


def test_group_names_are_each_once_not_taken_and_listed_by_a_host():
    hosts = [host(groups=["rack_a", "racka"]), host("ws3090", "192.0.2.10", gpus={})]
    groups = [{"name": "rack_a"}, {"name": "rack_a"}, {"name": "vllm_hosts"}, {"name": "gateway"}, {"name": "ws3090"},
              {"name": "h200"}, {"name": "racka_"}]
    assert problems_of(fleet(groups=groups, hosts=hosts)) == [
        "groups[1].name: duplicate group name 'rack_a' (also groups[0]) — give each group its own name",
        "groups[2].name: 'vllm_hosts' is a group every host is in already (all, ungrouped and vllm_hosts are taken) — "
        "choose another name",
        "groups[3].name: 'gateway' is the group of the hosts that run a gateway (the inventory makes it) — choose "
        "another name",
        "groups[4].name: 'ws3090' is the name of a host — a group needs a name of its own (HOST arguments take both)",
        "groups[5].name: no host lists 'h200' in its groups, so no host takes these values — add it to the groups of "
        "the hosts that share them, or remove the entry",
        "groups[6].name: no host lists 'racka_' in its groups, so no host takes these values — did you mean 'racka' "
        "(hosts list it)? add it to the groups of the hosts that share them, or remove the entry",
    ]


def test_a_taken_name_with_an_entry_is_reported_at_the_entry_not_at_each_host():
    hosts = [host(f"gpu{n}", f"192.0.2.{n + 1}", groups=["all"], gpus={}) for n in range(3)]
    assert problems_of(fleet(groups=[{"name": "all", "ssh": {"user": "admin"}}], hosts=hosts)) == [
        "groups[0].name: 'all' is a group every host is in already (all, ungrouped and vllm_hosts are taken) — "
        "choose another name"]


def test_an_unknown_key_of_an_optional_section_lists_its_keys():
    data = spec_data(instances=[instance("chat", 8000, container={"engine": "podman", "tags": "v1"})])
    assert problems_of(data) == [
        "instances[0].container.tags: unknown key 'tags' — did you mean 'tag'? allowed keys: engine, image, tag, "
        "digest, shm_size, ipc_host, image_archive"]


# ------------------------------------------------------------------ the schema


def schema_errors(data) -> list[str]:
    validator = jsonschema.Draft7Validator(spec_schema())
    return sorted(f"{'/'.join(map(str, error.absolute_path))}: {error.message}" for error in validator.iter_errors(data))


def test_the_schema_takes_defaults_and_groups_and_refuses_what_hosts_set_alone():
    good = fleet({"ssh": {"user": "ubuntu"}, "gpus": {"expected_count": 1}}, [RACK_A, BIG])
    assert schema_errors(good) == []
    bad = fleet({"name": "x"}, [{**RACK_A, "address": "192.0.2.9"}, {**BIG, "gpus": {"devices": []}}, {"ssh": {}}])
    assert schema_errors(bad) == [
        "defaults: {'name': 'x'} is not valid under any of the given schemas",  # a mapping of its own, or null
        "groups/0: Additional properties are not allowed ('address' was unexpected)",
        "groups/1/gpus: {'devices': []} is not valid under any of the given schemas",
        "groups/2: 'name' is a required property",
    ]
