"""Planner profiles: flags every supported vLLM accepts, merged under the instance's own options."""

import pytest

from provisioner.fleet.inventory import build_inventory
from provisioner.spec import validate_spec
from provisioner.vllm import flags
from provisioner.vllm.profiles import planner_profiles, profile_env, profile_options


@pytest.mark.parametrize("version", flags.supported_versions())
@pytest.mark.parametrize("profile", ["latency", "throughput"])
def test_profile_flags_are_accepted_by_each_supported_vllm(version, profile):
    assert flags.option_problems(version, profile_options(profile)) == {}


def test_the_spec_offers_exactly_the_profiles_of_the_file():
    import typing

    from provisioner.spec import Instance

    offered = set(typing.get_args(typing.get_args(Instance.model_fields["profile"].annotation)[0]))
    assert offered == set(planner_profiles())


def _spec(**instance):
    return validate_spec({
        "version": 1,
        "hosts": [{"name": "gpu1", "address": "10.0.0.5",
                   "gpus": {"devices": [{"index": 0, "uuid": "GPU-00000000-1111-2222-3333-000000000001",
                                         "model": "NVIDIA H200"}]}}],
        "instances": [{"name": "chat", "host": "gpu1", "model": "Qwen/Qwen2.5-7B-Instruct", "gpus": [0], **instance}],
    }, check_files=False)


def test_a_profile_adds_its_flags_and_env_to_the_rendered_instance():
    (instance,) = _spec(profile="latency").instances
    entry = build_inventory(_spec(profile="latency"))["host_vars/gpu1.yml"]["vllm_service_instances"][0]
    assert entry["options"] == profile_options("latency") == instance.serve_options
    assert entry["env"] == profile_env("latency")


def test_the_instance_own_options_win_over_its_profile_in_either_spelling():
    (instance,) = _spec(profile="latency", options={"performance_mode": "balanced", "max-model-len": 4096}).instances
    options = instance.serve_options
    assert options["performance_mode"] == "balanced" and "performance-mode" not in options
    assert options["max-model-len"] == 4096
    assert options["max-num-batched-tokens"] == profile_options("latency")["max-num-batched-tokens"]


def test_no_profile_means_only_the_instance_options():
    (instance,) = _spec(options={"max-model-len": 4096}).instances
    assert instance.serve_options == {"max-model-len": 4096}


def test_an_unknown_profile_is_refused_with_the_choices():
    from provisioner.spec import SpecError

    with pytest.raises(SpecError) as error:
        _spec(profile="fast")
    assert "instances[0].profile: must be 'latency' or 'throughput', got 'fast'" in str(error.value)
