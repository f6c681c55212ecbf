"""Every validation message, word for word: these are the product's user interface."""

from __future__ import annotations

import pytest

from provisioner.spec import SpecError, validate_spec
from tests.unit.conftest import UUID0, UUID1, host, instance, problems_of, spec_data


def test_a_valid_spec_has_no_problems():
    spec = validate_spec(spec_data())
    assert [i.name for i in spec.instances] == ["chat"]


# ------------------------------------------------------------------ GPU memory shares


def test_shares_on_one_gpu_above_the_limit_name_every_instance():
    data = spec_data(instances=[
        instance("reranker", 8001, 0.30),
        instance("embed", 8002, 0.30),
        instance("chat", 8000, 0.45),
    ])
    assert problems_of(data) == [
        "instances[2].gpu_memory_utilization: shares on GPU 0 of host ws4070 add up to 1.05 (limit 0.95) "
        "— lower gpu_memory_utilization of reranker (0.3), embed (0.3), chat (0.45) so they add up to at most 0.95"
    ]


def test_shares_exactly_at_the_limit_are_allowed():
    data = spec_data(instances=[instance("a", 8001, 0.20), instance("b", 8002, 0.25), instance("c", 8000, 0.50)])
    assert len(validate_spec(data).instances) == 3


def test_one_instance_may_take_the_whole_default_limit():
    assert validate_spec(spec_data(instances=[instance("qwen", 8000, 0.95)])).instances[0].gpu_memory_utilization == 0.95


def test_share_limit_is_per_host_setting():
    data = spec_data(
        hosts=[host(gpus={"memory_share_limit": 0.8, "devices": [{"index": 0, "uuid": UUID0}]})],
        instances=[instance("chat", 8000, 0.85)],
    )
    assert problems_of(data) == [
        "instances[0].gpu_memory_utilization: shares on GPU 0 of host ws4070 add up to 0.85 (limit 0.8) "
        "— lower gpu_memory_utilization of chat (0.85) so they add up to at most 0.8"
    ]


def test_a_gpu_named_by_index_and_by_uuid_counts_as_one():
    data = spec_data(instances=[instance("a", 8001, 0.5), instance("b", 8002, 0.5, gpus=[UUID0])])
    assert problems_of(data) == [
        "instances[1].gpu_memory_utilization: shares on GPU 0 of host ws4070 add up to 1 (limit 0.95) "
        "— lower gpu_memory_utilization of a (0.5), b (0.5) so they add up to at most 0.95"
    ]


def test_instances_on_different_gpus_do_not_share():
    two_gpus = {"devices": [{"index": 0, "uuid": UUID0}, {"index": 1, "uuid": UUID1}]}
    data = spec_data(hosts=[host(gpus=two_gpus)],
                     instances=[instance("a", 8000, 0.9, gpus=[0]), instance("b", 8001, 0.9, gpus=[1])])
    assert len(validate_spec(data).instances) == 2


# ------------------------------------------------------------------ names, ports, hosts


def test_duplicate_instance_names_across_hosts():
    data = spec_data(
        hosts=[host(), host("ws3090", "192.0.2.10", gpus={"devices": [{"index": 0, "uuid": UUID1}]})],
        instances=[instance("chat", 8000), instance("chat", 8000, on="ws3090")],
    )
    assert problems_of(data) == [
        "instances[1].name: duplicate instance name 'chat' (also instances[0]) — instance names must be unique "
        "across the spec (they name the systemd unit)"
    ]


def test_duplicate_ports_on_one_host():
    data = spec_data(instances=[instance("embed", 8000), instance("chat", 8000)])
    assert problems_of(data) == [
        "instances[1].port: port 8000 on host ws4070 is already used by instance 'embed' (instances[0].port) "
        "— give each instance on a host its own port"
    ]


def test_duplicate_host_names():
    data = spec_data(hosts=[host(), host(address="192.0.2.21", gpus={})], instances=[])
    assert problems_of(data) == [
        "hosts[1].name: duplicate host name 'ws4070' (also hosts[0]) — give each host its own name"
    ]


def test_duplicate_host_addresses():
    data = spec_data(hosts=[host(), host("ws4070b", gpus={})], instances=[])
    assert problems_of(data) == [
        "hosts[1].address: address 192.0.2.20 (ssh port 22) is already used by host 'ws4070' (hosts[0]) "
        "— list each host once"
    ]


def test_same_address_on_another_ssh_port_is_another_host():
    data = spec_data(hosts=[host(), host("ws4070b", gpus={}, ssh={"port": 2222})], instances=[])
    assert [h.name for h in validate_spec(data).hosts] == ["ws4070", "ws4070b"]


def test_instance_on_an_unknown_host_suggests_the_closest():
    data = spec_data(hosts=[host(), host("ws3090", "192.0.2.10", gpus={})],
                     instances=[instance("chat", 8000, on="ws407")])
    assert problems_of(data) == [
        "instances[0].host: unknown host 'ws407' — did you mean 'ws4070'? hosts in this spec: ws4070, ws3090"
    ]


def test_unknown_host_without_a_close_name():
    data = spec_data(instances=[instance("chat", 8000, on="gpu-box")])
    assert problems_of(data) == ["instances[0].host: unknown host 'gpu-box' — hosts in this spec: ws4070"]


def test_invalid_name():
    data = spec_data(instances=[instance("Qwen_7B", 8000)])
    assert problems_of(data) == [
        "instances[0].name: 'Qwen_7B' is not a valid name — use lowercase letters, digits and dashes, "
        "starting with a letter or digit (e.g. qwen7b, ws-3090)"
    ]


# ------------------------------------------------------------------ GPUs


def test_gpu_index_not_among_the_host_devices():
    data = spec_data(instances=[instance("chat", 8000, gpus=[1])])
    assert problems_of(data) == [
        "instances[0].gpus[0]: GPU index 1 is not among host ws4070's devices (indexes: 0) — use a listed index "
        "or add the GPU to hosts[0].gpus.devices"
    ]


def test_gpu_index_whose_device_has_no_uuid():
    data = spec_data(hosts=[host(gpus={"devices": [{"index": 0, "model": "NVIDIA GeForce RTX 4070"}]})])
    assert problems_of(data) == [
        "instances[0].gpus[0]: GPU 0 of host ws4070 has no uuid (instances are pinned by UUID) — add `uuid:` to "
        "hosts[0].gpus.devices[0]; find it with `nvidia-smi -L` or `provision facts`"
    ]


def test_gpu_uuid_not_among_the_listed_devices():
    data = spec_data(instances=[instance("chat", 8000, gpus=[UUID1])])
    assert problems_of(data) == [
        f"instances[0].gpus[0]: GPU {UUID1} is not among host ws4070's devices — add its uuid to "
        "hosts[0].gpus.devices or fix the UUID"
    ]


def test_gpu_uuid_is_accepted_when_the_host_lists_no_devices():
    data = spec_data(hosts=[host(gpus={})], instances=[instance("chat", 8000, gpus=[UUID1])])
    assert validate_spec(data).instances[0].gpus == [UUID1]


def test_gpu_listed_twice_in_one_instance():
    data = spec_data(instances=[instance("chat", 8000, gpus=[0, UUID0])])
    assert problems_of(data) == ["instances[0].gpus[1]: GPU 0 is listed twice — list each GPU once"]


def test_gpu_reference_that_is_neither_index_nor_uuid():
    data = spec_data(instances=[instance("chat", 8000, gpus=["gpu0"])])
    assert problems_of(data) == [
        "instances[0].gpus[0]: 'gpu0' is neither a GPU index nor a GPU UUID — use an index from the host's "
        "gpus.devices (e.g. 0) or a UUID as printed by `nvidia-smi -L`"
    ]


def test_malformed_device_uuid():
    data = spec_data(hosts=[host(gpus={"devices": [{"index": 0, "uuid": "GPU-1234"}]})], instances=[])
    assert problems_of(data) == [
        "hosts[0].gpus.devices[0].uuid: 'GPU-1234' is not a GPU UUID — expected "
        "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx (lowercase hex) as printed by `nvidia-smi -L`"
    ]


def test_same_uuid_on_two_hosts():
    data = spec_data(hosts=[host(), host("ws3090", "192.0.2.10")], instances=[])
    assert problems_of(data) == [
        f"hosts[1].gpus.devices[0].uuid: GPU {UUID0} is already listed at hosts[0].gpus.devices[0] "
        "— every GPU has its own UUID; copy it from `nvidia-smi -L`"
    ]


def test_device_index_listed_twice():
    gpus = {"devices": [{"index": 0, "uuid": UUID0}, {"index": 0, "uuid": UUID1}]}
    data = spec_data(hosts=[host(gpus=gpus)], instances=[])
    assert problems_of(data) == [
        "hosts[0].gpus.devices[1].index: GPU index 0 is listed twice (also devices[0]) — list each GPU once"
    ]


def test_device_count_differs_from_expected_count():
    data = spec_data(hosts=[host(gpus={"expected_count": 2, "devices": [{"index": 0, "uuid": UUID0}]})])
    assert problems_of(data) == [
        "hosts[0].gpus.expected_count: 2 GPUs expected but 1 listed under devices — list every GPU under devices "
        "or correct expected_count"
    ]


@pytest.mark.parametrize("value", ["maximum", 0, -5, True, 4.5])
def test_power_limit_must_be_watts_max_or_default(value):
    data = spec_data(hosts=[host(gpus={"devices": [{"index": 0, "uuid": UUID0, "power_limit": value}]})])
    shown = {"maximum": "'maximum'", True: "true"}.get(value, str(value))
    assert problems_of(data) == [
        f"hosts[0].gpus.devices[0].power_limit: {shown} is not a power limit — use watts (a positive integer, "
        "e.g. 450), 'max' or 'default'"
    ]


@pytest.mark.parametrize("value", [450, "max", "default"])
def test_power_limit_accepts_watts_max_and_default(value):
    data = spec_data(hosts=[host(gpus={"devices": [{"index": 0, "uuid": UUID0, "power_limit": value}]})])
    assert validate_spec(data).hosts[0].gpus.devices[0].power_limit == value


# ------------------------------------------------------------------ settings


@pytest.mark.parametrize("value", ["16GB", "2g", "16", "G", "0G"])
def test_shm_size_format(value):
    data = spec_data(hosts=[host(settings={"shm_size": value})])
    assert problems_of(data) == [
        f"hosts[0].settings.shm_size: '{value}' is not a size — write a number with a K, M, G or T suffix "
        "(e.g. 16G), or null to leave /dev/shm as it is"
    ]


def test_swappiness_range():
    data = spec_data(hosts=[host(settings={"swappiness": 250})])
    assert problems_of(data) == ["hosts[0].settings.swappiness: must be at most 200, got 250 (int)"]


def test_swappiness_is_not_a_sysctl():
    data = spec_data(hosts=[host(settings={"sysctls": {"vm.swappiness": 10}})])
    assert problems_of(data) == [
        "hosts[0].settings.sysctls['vm.swappiness']: vm.swappiness has its own setting — remove it here and set "
        "`swappiness:` under settings"
    ]


def test_sysctl_key_must_be_a_kernel_parameter_name():
    data = spec_data(hosts=[host(settings={"sysctls": {"vm max_map_count": 1, "net.ipv4.conf.eth0/100.rp_filter": 1}})])
    assert problems_of(data) == [
        "hosts[0].settings.sysctls['vm max_map_count']: 'vm max_map_count' is not a kernel parameter name "
        "(e.g. vm.max_map_count, as `sysctl -a` lists them)"
    ]


def test_gpu_reference_true_is_shown_as_yaml():
    data = spec_data(instances=[instance("chat", 8000, gpus=[True])])
    assert problems_of(data)[0].startswith("instances[0].gpus[0]: true is neither a GPU index nor a GPU UUID")


def test_sysctl_value_must_be_scalar():
    data = spec_data(hosts=[host(settings={"sysctls": {"vm.max_map_count": [1]}})])
    assert problems_of(data) == [
        "hosts[0].settings.sysctls['vm.max_map_count']: expected a string or an integer, got a list"
    ]


def test_install_path_must_be_absolute():
    data = spec_data(hosts=[host(vllm={"install_path": "opt/vllm"})])
    assert problems_of(data) == ["hosts[0].vllm.install_path: 'opt/vllm' is not an absolute path — start it with /"]


# ------------------------------------------------------------------ unknown keys and types


def test_unknown_key_lists_the_allowed_keys_and_the_closest():
    data = spec_data(hosts=[host(ssh={"prot": 2222})])
    assert problems_of(data) == [
        "hosts[0].ssh.prot: unknown key 'prot' — did you mean 'port'? allowed keys: user, port, key, known_hosts, become"
    ]


def test_unknown_top_level_key():
    data = {**spec_data(), "instance": []}
    assert problems_of(data) == [
        "instance: unknown key 'instance' — did you mean 'instances'? allowed keys: version, hosts, instances, gateways, "
        "defaults, groups, monitoring"
    ]


def test_unknown_key_in_an_instance():
    data = spec_data(instances=[instance("chat", 8000, max_model_len=4096)])
    assert problems_of(data) == [
        "instances[0].max_model_len: unknown key 'max_model_len' — allowed keys: name, host, model, port, bind, "
        "gpus, gpu_memory_utilization, profile, options, env, api_key_file, container, slo, capacity, multinode"
    ]


def test_wrong_types():
    data = spec_data(
        hosts=[host(ssh={"port": "22"}, settings={"nouveau_blacklist": "yes"})],
        instances=[instance("chat", 8000, share="0.9", env={"HF_HUB_OFFLINE": 1})],
    )
    assert problems_of(data) == [
        "hosts[0].ssh.port: expected an integer, got '22'",
        "hosts[0].settings.nouveau_blacklist: expected true or false, got 'yes'",
        "instances[0].gpu_memory_utilization: expected a number, got '0.9'",
        "instances[0].env.HF_HUB_OFFLINE: expected a string, got 1 (int) — put it in quotes",
    ]


def test_missing_required_keys():
    data = spec_data(instances=[{"name": "chat", "host": "ws4070", "gpus": [0]}])
    assert problems_of(data) == ["instances[0].model: required — add it"]


def test_unquoted_version_is_a_number():
    data = spec_data(hosts=[host(vllm={"version": 0.25})])
    assert problems_of(data) == ["hosts[0].vllm.version: expected a string, got 0.25 (float) — put it in quotes"]


def test_unsupported_spec_version():
    assert problems_of({**spec_data(), "version": 2}) == ["version: must be 1, got 2 (int)"]


def test_spec_needs_a_host():
    assert problems_of(spec_data(hosts=[], instances=[])) == ["hosts: needs at least 1 entry, got none"]


def test_hosts_that_are_not_a_list_do_not_make_every_instance_unknown():
    assert problems_of({**spec_data(), "hosts": {"ws4070": {}}}) == ["hosts: expected a list, got a mapping"]


def test_top_level_must_be_a_mapping():
    assert problems_of(["hosts"]) == ["(spec): expected a mapping at the top level, got a list"]


# ------------------------------------------------------------------ options and env


def test_option_with_leading_dashes():
    data = spec_data(instances=[instance("chat", 8000, options={"--max-model-len": 4096})])
    assert problems_of(data) == [
        "instances[0].options.--max-model-len: write option names without the leading dashes — use 'max-model-len'"
    ]


@pytest.mark.parametrize(
    ("option", "field"),
    [("port", "port"), ("host", "bind"), ("gpu-memory-utilization", "gpu_memory_utilization"),
     ("gpu_memory_utilization", "gpu_memory_utilization"), ("model", "model"), ("api-key", "api_key_file")],
)
def test_option_that_duplicates_a_dedicated_field(option, field):
    data = spec_data(instances=[instance("chat", 8000, options={option: "x"})])
    assert problems_of(data) == [
        f"instances[0].options.{option}: '{option}' is set by the instance's own field — remove it from options "
        f"and set `{field}:` instead"
    ]


def test_false_boolean_option_asks_for_the_negative_flag():
    data = spec_data(instances=[instance("chat", 8000, options={"enable-prefix-caching": False})])
    assert problems_of(data) == [
        "instances[0].options.enable-prefix-caching: false is dropped by vLLM's config file reader, "
        "so the default stays — write `no-enable-prefix-caching: true`"
    ]


def test_false_negative_option_asks_for_the_positive_flag():
    data = spec_data(instances=[instance("chat", 8000, options={"no-enable-prefix-caching": False})])
    assert problems_of(data) == [
        "instances[0].options.no-enable-prefix-caching: false is dropped by vLLM's config file reader, "
        "so the default stays — write `enable-prefix-caching: true`"
    ]


def test_option_without_a_value():
    data = spec_data(instances=[instance("chat", 8000, options={"max-num-seqs": None})])
    assert problems_of(data) == ["instances[0].options.max-num-seqs: has no value — give one or remove the option"]


def test_true_options_and_lists_are_fine():
    options = {"no-enable-prefix-caching": True, "enforce-eager": True, "cudagraph-capture-sizes": [1, 2, 4]}
    data = spec_data(instances=[instance("chat", 8000, options=options)])
    assert validate_spec(data).instances[0].options == options


@pytest.mark.parametrize(
    ("name", "why"),
    [("CUDA_VISIBLE_DEVICES", "it is set from `gpus:`"), ("CUDA_DEVICE_ORDER", "it is always PCI_BUS_ID"),
     ("VLLM_API_KEY", "use `api_key_file:` so the key stays out of the spec")],
)
def test_managed_environment_variables(name, why):
    data = spec_data(instances=[instance("chat", 8000, env={name: "x"})])
    assert problems_of(data) == [f"instances[0].env.{name}: {name} is managed — remove it; {why}"]


# ------------------------------------------------------------------ files on disk


def test_api_key_file_missing(tmp_path):
    data = spec_data(instances=[instance("chat", 8000, api_key_file="secrets/chat.key")])
    assert problems_of(data, base_dir=tmp_path) == [
        f"instances[0].api_key_file: {tmp_path}/secrets/chat.key does not exist — create it with the API key "
        "(its content becomes VLLM_API_KEY) or correct the path"
    ]


def test_api_key_file_empty(tmp_path):
    (tmp_path / "chat.key").write_text("")
    data = spec_data(instances=[instance("chat", 8000, api_key_file="chat.key")])
    assert problems_of(data, base_dir=tmp_path) == [
        f"instances[0].api_key_file: {tmp_path}/chat.key is empty — put the API key (its content becomes "
        "VLLM_API_KEY) in it"
    ]


def test_ssh_key_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    data = spec_data(hosts=[host(ssh={"key": "~/.ssh/id_ed25519"})])
    assert problems_of(data) == [
        f"hosts[0].ssh.key: {tmp_path}/.ssh/id_ed25519 does not exist — create it with an ssh private key "
        "or correct the path"
    ]


def test_known_hosts_missing(tmp_path):
    data = spec_data(hosts=[host(ssh={"known_hosts": "known_hosts"})])
    assert problems_of(data, base_dir=tmp_path) == [
        f"hosts[0].ssh.known_hosts: {tmp_path}/known_hosts does not exist — create it with a known_hosts file "
        "or correct the path"
    ]


def test_file_checks_can_be_skipped():
    data = spec_data(instances=[instance("chat", 8000, api_key_file="/nonexistent/chat.key")])
    spec = validate_spec(data, check_files=False)
    assert spec.instances[0].api_key_file == "/nonexistent/chat.key"


# ------------------------------------------------------------------ all problems at once


def test_every_problem_is_reported_in_spec_order():
    data = spec_data(
        hosts=[host(gpus={"devices": [{"index": 0, "uuid": UUID0}, {"index": 1}]})],
        instances=[
            instance("chat", 8000, 0.6, options={"--max-num-seqs": 128}),
            instance("chat", 8000, 0.6, on="ws4070", gpus=[3]),
            instance("embed", 8001, 0.2, on="ws4071", gpus=[1]),
        ],
    )
    data["version"] = "1"
    with pytest.raises(SpecError) as caught:
        validate_spec(data)
    assert [path for path, _ in caught.value.problems] == [
        "version",
        "instances[0].options.--max-num-seqs",
        "instances[1].name",
        "instances[1].port",
        "instances[1].gpus[0]",
        "instances[2].host",
    ]
    assert str(caught.value).splitlines()[0] == "version: must be 1, got '1'"


def test_checks_across_instances_still_run_when_one_instance_has_a_type_error():
    data = spec_data(instances=[instance("a", 8000, 0.6), instance("b", 8001, 0.6), instance("c", "80")])
    assert problems_of(data) == [
        "instances[1].gpu_memory_utilization: shares on GPU 0 of host ws4070 add up to 1.2 (limit 0.95) "
        "— lower gpu_memory_utilization of a (0.6), b (0.6) so they add up to at most 0.95",
        "instances[2].port: expected an integer, got '80'",
    ]


def test_a_host_with_a_type_error_does_not_make_its_instances_unknown():
    data = spec_data(hosts=[host(ssh={"port": "22"})])
    assert problems_of(data) == ["hosts[0].ssh.port: expected an integer, got '22'"]


def test_a_bad_container_entry_names_each_field_and_its_fix():
    data = spec_data(instances=[instance("chat", 8000, container={
        "engine": "dokker", "image": "Docker.io/vllm:latest", "digest": "sha256:abc", "shm_size": "lots"})])
    assert problems_of(data) == [
        "instances[0].container.engine: must be 'podman' or 'docker', got 'dokker'",
        "instances[0].container.image: 'Docker.io/vllm:latest' is not an image name — registry/repository in "
        "lowercase, without tag or digest (e.g. docker.io/vllm/vllm-openai; the tag and digest have keys of their own)",
        "instances[0].container.digest: 'sha256:abc' is not an image digest — sha256: and 64 lowercase hex digits, "
        "as `docker images --digests` prints",
        "instances[0].container.shm_size: 'lots' is not a size — write a number with a K, M, G or T suffix (e.g. 16G)",
    ]
