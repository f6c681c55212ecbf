"""The committed catalogs of `vllm serve` / `vllm bench serve` options (provisioner/vllm/catalogs).

They are written by `python -m provisioner.vllm.make_catalog` from vLLM's own parser, in a venv with
vLLM; this venv has none, so the tests read the JSON and check it against facts read in vLLM's
source (docs: shared reference vllm-flags.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

CATALOGS = Path(__file__).resolve().parents[2] / "provisioner" / "vllm" / "catalogs"
VERSIONS = ("0.25.0", "0.33.0")
KINDS = {"flag", "bool_optional", "int", "float", "str", "json", "human_int", "bool", "other"}
FIELDS = {"names", "dest", "kind", "type_name", "choices", "nargs", "default", "negative", "help"}
INVENTED = ("--disable-cuda-graph", "--cuda-graph-capture-size", "--swap-space", "--prefix-caching-memory-percentage")


def load(version: str) -> dict:
    return json.loads((CATALOGS / f"vllm-{version}.json").read_text())


def serve(version: str) -> dict:
    return load(version)["commands"]["serve"]["options"]


def bench(version: str) -> dict:
    return load(version)["commands"]["bench serve"]["options"]


def accepted(options: dict) -> dict[str, str]:
    """Every option string the parser accepts (shown, hidden, negative) -> the option's key."""
    out = {}
    for key, opt in options.items():
        for name in [*opt["names"], *opt.get("hidden_names", []), *opt.get("negatives", []), opt["negative"]]:
            if name:
                out[name] = key
    return out


def test_one_catalog_per_supported_version():
    assert sorted(p.name for p in CATALOGS.glob("vllm-*.json")) == [f"vllm-{v}.json" for v in VERSIONS]


@pytest.mark.parametrize("version", VERSIONS)
def test_catalog_header(version):
    cat = load(version)
    assert cat["vllm_version"] == version
    assert cat["generated_by"].startswith("python -m provisioner.vllm.make_catalog (vLLM's own parser, ")
    assert set(cat["commands"]) == {"serve", "bench serve"}
    assert cat["commands"]["serve"]["positionals"] == [{"dest": "model_tag", "nargs": "?"}]


def test_serve_parser_module_per_version():
    assert "vllm.entrypoints.openai.cli_args.make_arg_parser" in load("0.25.0")["generated_by"]
    assert "vllm.entrypoints.common.cli_args.make_arg_parser" in load("0.33.0")["generated_by"]


@pytest.mark.parametrize("version", VERSIONS)
def test_file_is_written_as_the_generator_writes_it(version):
    text = (CATALOGS / f"vllm-{version}.json").read_text()
    assert text == json.dumps(json.loads(text), indent=1, sort_keys=True, ensure_ascii=False) + "\n"


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("command", ["serve", "bench serve"])
def test_every_option_is_well_formed(version, command):
    options = load(version)["commands"][command]["options"]
    assert len(options) > 90
    for key, opt in options.items():
        assert FIELDS <= set(opt), key
        assert opt["kind"] in KINDS, key
        assert isinstance(opt["type_name"], str) and opt["type_name"], key
        assert all(n.startswith("-") for n in opt["names"]), key
        assert "--" + key in opt["names"], key  # the key is the long name a --config YAML uses
        assert opt["help"] is None or len(opt["help"]) <= 200, key
        assert opt["choices"] is None or all(isinstance(c, str) for c in opt["choices"]), key
        if opt["kind"] == "bool_optional":
            assert opt["negative"].startswith("--") and opt["nargs"] == 0, key
        else:
            assert opt["negative"] is None, key
        if opt["kind"] == "flag":
            assert opt["nargs"] == 0, key
        if opt["kind"] == "other":
            assert opt["type_name"] != "None", key


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("command", ["serve", "bench serve"])
def test_no_option_string_belongs_to_two_options(version, command):
    options = load(version)["commands"][command]["options"]
    seen: dict[str, str] = {}
    for key, opt in options.items():
        for name in {*opt["names"], *opt.get("hidden_names", []), *opt.get("negatives", []), opt["negative"]} - {None}:
            assert name not in seen, f"{name}: {seen.get(name)} and {key}"
            seen[name] = key


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("flag", INVENTED)
def test_invented_flags_are_absent(version, flag):
    assert flag not in accepted(serve(version))


@pytest.mark.parametrize("version", VERSIONS)
def test_cuda_graph_flags_that_exist(version):
    opts = serve(version)
    assert opts["cudagraph-capture-sizes"]["kind"] == "int" and opts["cudagraph-capture-sizes"]["nargs"] == "+"
    assert opts["max-cudagraph-capture-size"]["kind"] == "int"


@pytest.mark.parametrize("version", VERSIONS)
def test_dtype_choices(version):
    dtype = serve(version)["dtype"]
    assert {"auto", "half", "float16", "bfloat16", "float", "float32"} == set(dtype["choices"])
    assert "bf16" not in dtype["choices"]
    assert dtype["default"] == "auto"


def test_kv_cache_dtype_choices_per_version():
    old, new = serve("0.25.0")["kv-cache-dtype"], serve("0.33.0")["kv-cache-dtype"]
    assert {"auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"} <= set(old["choices"])
    assert "fp16" not in old["choices"]  # refused at parse time in 0.25
    assert new["choices"] is None and new["kind"] == "str"  # any string parses in 0.33; the engine config refuses
    assert old["default"] == new["default"] == "auto"


def test_partial_prefill_flags_only_in_0_25():
    assert serve("0.25.0")["max-num-partial-prefills"]["kind"] == "int"
    assert "--max-num-partial-prefills" not in accepted(serve("0.33.0"))


def test_prefix_caching_negative_per_version():
    old, new = serve("0.25.0")["enable-prefix-caching"], serve("0.33.0")["enable-prefix-caching"]
    assert old["kind"] == new["kind"] == "bool_optional"
    assert old["negative"] == "--no-enable-prefix-caching"
    assert "--disable-prefix-caching" not in accepted(serve("0.25.0"))
    assert new["negative"] == "--disable-prefix-caching"
    assert "--no-enable-prefix-caching" in new["hidden_names"]  # still parsed, not in --help
    assert accepted(serve("0.33.0"))["--no-enable-prefix-caching"] == "enable-prefix-caching"


def test_disable_log_requests_per_version():
    assert "--disable-log-requests" not in accepted(serve("0.25.0"))
    assert "disable-log-requests" not in serve("0.33.0")  # not an option of its own ...
    assert serve("0.33.0")["enable-log-requests"]["negative"] == "--disable-log-requests"  # ... the negative


@pytest.mark.parametrize("version", VERSIONS)
def test_kinds_of_common_flags(version):
    opts = serve(version)
    tp = opts["tensor-parallel-size"]
    assert (tp["kind"], tp["default"], tp["names"]) == ("int", 1, ["--tensor-parallel-size", "-tp"])
    assert opts["pipeline-parallel-size"]["names"] == ["--pipeline-parallel-size", "-pp"]
    assert opts["max-model-len"]["kind"] == "human_int"
    assert opts["max-num-batched-tokens"]["kind"] == "human_int"
    assert (opts["gpu-memory-utilization"]["kind"], opts["gpu-memory-utilization"]["default"]) == ("float", 0.92)
    assert opts["compilation-config"]["kind"] == "json" and "-cc" in opts["compilation-config"]["names"]
    assert opts["enforce-eager"]["kind"] == "bool_optional"
    assert opts["disable-log-stats"]["kind"] == "flag"
    assert (opts["port"]["kind"], opts["port"]["default"]) == ("int", 8000)
    assert opts["config"]["kind"] == "str"
    assert opts["stream-interval"]["default"] == 1
    assert opts["kv-offloading-backend"]["choices"] == ["lmcache", "native"]


def test_device_memory_utilization_alias_only_in_0_33():
    assert "--device-memory-utilization" not in accepted(serve("0.25.0"))
    assert accepted(serve("0.33.0"))["--device-memory-utilization"] == "gpu-memory-utilization"


@pytest.mark.parametrize("version", VERSIONS)
def test_optimization_level_short_forms(version):
    opt = serve(version)["optimization-level"]
    assert opt["default"] == 2
    forms = {tuple(f["argv"]): f for f in load(version)["commands"]["serve"]["argv_forms"]}
    for form in (("some/model", "-O3"), ("some/model", "-O", "3"), ("some/model", "-O=3")):
        assert forms[form]["accepted"] and forms[form]["sets"] == {"optimization_level": "3"}, form
    assert forms[("some/model", "--max_model_len", "32k")]["sets"] == {"max_model_len": 32000}
    assert forms[("some/model", "-cc.mode=3")]["sets"] == {"compilation_config": {"mode": 3}}


def test_deprecation_marks():
    assert serve("0.25.0")["calculate-kv-scales"]["deprecated"] is True
    assert serve("0.33.0")["disable-cascade-attn"]["deprecated"] is True
    assert "deprecated" not in serve("0.25.0")["disable-cascade-attn"]
    assert "deprecated" not in serve("0.33.0")["tensor-parallel-size"]


@pytest.mark.parametrize("version", VERSIONS)
def test_bench_serve_defaults(version):
    opts = bench(version)
    assert opts["backend"]["default"] == "openai"
    assert opts["endpoint"]["default"] == "/v1/completions"
    assert opts["dataset-name"]["default"] == "random"
    assert (opts["random-input-len"]["default"], opts["random-output-len"]["default"]) == (1024, 128)
    assert opts["num-prompts"]["default"] == 1000
    assert (opts["request-rate"]["kind"], opts["request-rate"]["default"]) == ("float", "inf")
    assert opts["max-concurrency"]["default"] is None
    assert opts["metric-percentiles"]["default"] == "99"
    assert opts["save-result"]["kind"] == "flag"
    assert opts["request-id-prefix"]["default_varies"] is True  # a uuid per run, not recorded


def test_sonnet_dataset_only_in_0_25():
    assert "sonnet" in bench("0.25.0")["dataset-name"]["choices"]
    assert "sonnet" not in bench("0.33.0")["dataset-name"]["choices"]


# --- the generator's classifier, on plain argparse (make_catalog imports only the standard library) ---


def _human_int(value: str) -> int:
    return int(value[:-1]) * 1000 if value[-1:] == "k" else int(value)


def _str2bool(value: str) -> bool:
    if value.lower() not in ("true", "false"):
        raise ValueError(value)
    return value.lower() == "true"


@pytest.mark.parametrize(
    "kwargs, kind",
    [
        ({"action": "store_true"}, "flag"),
        ({"action": "store_false"}, "flag"),
        ({"action": __import__("argparse").BooleanOptionalAction}, "bool_optional"),
        ({"type": int}, "int"),
        ({"type": float}, "float"),
        ({}, "str"),
        ({"type": str}, "str"),
        ({"type": json.loads}, "json"),
        ({"type": _human_int}, "human_int"),
        ({"type": _str2bool}, "bool"),
        ({"type": Path}, "other"),
    ],
)
def test_kind_is_probed_from_the_type(kwargs, kind):
    import argparse

    from provisioner.vllm import make_catalog

    parser = argparse.ArgumentParser()
    action = parser.add_argument("--x", **kwargs)
    assert make_catalog.kind_of(parser, action) == kind


def test_describe_boolean_optional_and_aliases():
    import argparse

    from provisioner.vllm import make_catalog

    parser = argparse.ArgumentParser()
    key, entry = make_catalog.describe(
        parser, parser.add_argument("--enable-x", action=argparse.BooleanOptionalAction, help="Turn x on. More.")
    )
    assert (key, entry["names"], entry["negative"], entry["help"]) == (
        "enable-x", ["--enable-x"], "--no-enable-x", "Turn x on.")
    key, entry = make_catalog.describe(parser, parser.add_argument("--size", "-s", type=int, default=3))
    assert (key, entry["names"], entry["kind"], entry["default"], entry["type_name"]) == (
        "size", ["--size", "-s"], "int", 3, "int")


def test_help_and_defaults_are_made_json():
    from provisioner.vllm import make_catalog

    assert make_catalog.first_sentence("Data type, e.g. fp8.  Second.") == "Data type, e.g. fp8."
    assert make_catalog.first_sentence("Choose:\n- a\n- b") == "Choose:"
    assert len(make_catalog.first_sentence("word " * 100)) == 200
    assert make_catalog.jsonable(float("inf")) == "inf"
    assert make_catalog.jsonable((1, {2})) == [1, [2]]
