"""Instance options checked against the pinned vLLM's flag catalog (generated from vLLM's own parser)."""

from __future__ import annotations

import pytest

from provisioner.spec import validate_spec
from provisioner.vllm.flags import load_catalog, option_problems, supported_versions
from tests.unit.conftest import instance, problems_of, spec_data


def test_the_invented_flags_of_the_write_ups_are_named_with_the_flag_meant():
    problems = option_problems("0.25.0", {"disable-cuda-graph": True, "prefix-caching-memory-percentage": 20,
                                          "swap-space": 4})
    assert problems["disable-cuda-graph"].startswith(
        "vLLM 0.25.0 has no flag --disable-cuda-graph — did you mean 'enforce-eager'?")
    assert problems["swap-space"].startswith("vLLM 0.25.0 has no flag --swap-space — did you mean 'kv-offloading-size'?")
    assert problems["prefix-caching-memory-percentage"] == (
        "vLLM 0.25.0 has no flag --prefix-caching-memory-percentage — remove it (`vllm serve --help` lists the flags)")


def test_misspelled_values_get_the_spelling_vllm_takes():
    problems = option_problems("0.25.0", {"dtype": "bf16", "kv-cache-dtype": "fp16"})
    assert problems["dtype"] == ("'bf16' is not a choice of --dtype — did you mean 'bfloat16'? "
                                 "choices: auto, bfloat16, float, float16, float32, half")
    assert problems["kv-cache-dtype"].startswith("'fp16' is not a choice of --kv-cache-dtype — did you mean 'float16'?")


def test_a_typo_gets_the_closest_flags():
    assert option_problems("0.25.0", {"max-model-length": 4096}) == {
        "max-model-length": "vLLM 0.25.0 has no flag --max-model-length — did you mean 'max-model-len'?"}


def test_a_short_alias_is_refused_in_a_config_file():
    assert option_problems("0.25.0", {"tp": 2}) == {
        "tp": "'tp' is a short alias, which a config file does not take — write 'tensor-parallel-size'"}


@pytest.mark.parametrize("key, value, message", [
    ("block-size", "sixteen", "'sixteen' is not an integer — --block-size takes one, e.g. 4096"),
    ("max-model-len", "lots", "'lots' is not a size vLLM reads — --max-model-len takes an integer, or one with a "
                              "suffix: k, m, g, t (×1000ⁿ, decimals allowed: 25.6k) or K, M, G, T (×1024ⁿ, whole "
                              "numbers: 8G), or auto"),
    ("enforce-eager", "yes", "--enforce-eager takes no value — write `enforce-eager: true`, or remove it"),
    ("max-num-seqs", [128, 256], "--max-num-seqs takes one value, not a list — give one"),
    ("max-num-seqs", True, "--max-num-seqs takes an integer, not true/false"),
])
def test_values_of_the_wrong_type(key, value, message):
    assert option_problems("0.25.0", {key: value}) == {key: message}


def test_broken_json_in_a_nested_config():
    problem = option_problems("0.25.0", {"compilation-config": '{"cudagraph_mode": NONE}'})["compilation-config"]
    assert problem.startswith("--compilation-config: invalid JSON (Expecting value: line 1 column 20")


def test_valid_options_pass():
    options = {"max-model-len": "32k", "block-size": 16, "dtype": "bfloat16", "kv-cache-dtype": "fp8",
               "enable-prefix-caching": True, "no-enable-chunked-prefill": True, "served-model-name": ["a", "b"],
               "cudagraph-capture-sizes": [1, 2, 4], "compilation-config": {"cudagraph_mode": "NONE"},
               "max-num-batched-tokens": 4096, "stream-interval": 10, "quantization": "fp8"}
    assert option_problems("0.25.0", options) == {}


def test_the_spec_reports_them_at_the_option_with_the_fix_before_any_host_is_touched():
    """Seed 3's flags, as its write-up gives them."""
    options = {"dtype": "bf16", "kv-cache-dtype": "fp16", "disable-cuda-graph": True, "max-model-len": 4096}
    assert problems_of(spec_data(instances=[instance("chat", 8000, options=options)])) == [
        "instances[0].options.dtype: 'bf16' is not a choice of --dtype — did you mean 'bfloat16'? "
        "choices: auto, bfloat16, float, float16, float32, half",
        "instances[0].options.kv-cache-dtype: 'fp16' is not a choice of --kv-cache-dtype — did you mean 'float16'? "
        "choices: " + ", ".join(load_catalog("0.25.0").option("kv-cache-dtype").choices),
        "instances[0].options.disable-cuda-graph: vLLM 0.25.0 has no flag --disable-cuda-graph — did you mean "
        "'enforce-eager'? (" + load_catalog("0.25.0").option("enforce-eager").help + ")",
    ]


def test_an_unsupported_version_names_the_supported_ones():
    data = spec_data()
    data["hosts"][0]["vllm"] = {"version": "0.26.0"}
    assert problems_of(data) == [
        f"hosts[0].vllm.version: vLLM 0.26.0 is not supported — use one of {', '.join(supported_versions())} "
        "(or add its flag catalog: python -m provisioner.vllm.make_catalog)"]


def test_the_config_option_is_the_roles_own():
    problems = problems_of(spec_data(instances=[instance("chat", 8000, options={"config": "/etc/x.yaml"})]))
    assert problems == ["instances[0].options.config: the role writes each instance's config file and runs "
                        "`vllm serve --config` with it — put the flags in options"]


def test_valid_spec_with_flags_loads():
    spec = validate_spec(spec_data(instances=[instance("chat", 8000, options={"enforce-eager": True})]))
    assert spec.instances[0].options == {"enforce-eager": True}


@pytest.mark.parametrize("version, negative", [("0.25.0", "no-enable-prefix-caching"),
                                               ("0.33.0", "disable-prefix-caching")])
def test_false_asks_for_the_negative_flag_of_that_version(version, negative):
    """vLLM's config file reader drops `false`; each version turns prefix caching off with its own flag."""
    assert option_problems(version, {"enable-prefix-caching": False}) == {"enable-prefix-caching": (
        f"false is dropped by vLLM's config file reader, so the default stays — write `{negative}: true`")}
    assert option_problems(version, {negative: True}) == {}
    assert option_problems(version, {"no-enable-prefix-caching": True}) == {}  # 0.33 still parses the old form


def test_flags_that_exist_in_one_supported_version_only():
    assert option_problems("0.25.0", {"max-num-partial-prefills": 2}) == {}
    assert option_problems("0.33.0", {"max-num-partial-prefills": 2})["max-num-partial-prefills"].startswith(
        "vLLM 0.33.0 has no flag --max-num-partial-prefills")
    assert option_problems("0.33.0", {"max-num-scheduled-tokens": 4096}) == {}
    assert "max-num-scheduled-tokens" in option_problems("0.25.0", {"max-num-scheduled-tokens": 4096})
