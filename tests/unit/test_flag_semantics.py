"""Which `vllm serve` flags change what the model generates (provisioner/vllm/semantics.yml, issue 37): profiles
hold performance flags only, `provision tune` searches a semantic flag only when told to, and `provision plan`
names every semantic flag an instance runs with."""

from __future__ import annotations

import pytest
import yaml
from typer.testing import CliRunner

from provisioner.cli.main import app
from provisioner.plan import build_plan
from provisioner.spec import validate_spec
from provisioner.tune.space import AXES, SpaceError, search_space
from provisioner.vllm import flags
from provisioner.vllm.profiles import planner_profiles, profile_options
from provisioner.vllm.semantics import SEMANTICS_FILE, classified, flag_kind
from tests.unit.conftest import instance, spec_data, write_spec


def test_every_classified_flag_is_a_flag_of_a_supported_vllm_and_has_one_kind():
    data = yaml.safe_load(SEMANTICS_FILE.read_text(encoding="utf-8"))
    assert set(data) == {"performance", "semantic"}
    assert not set(data["performance"]) & set(data["semantic"])
    catalogs = [flags.load_catalog(version) for version in flags.supported_versions()]
    unknown = [flag for flag in classified() if not any(catalog.option(flag) for catalog in catalogs)]
    assert unknown == []


@pytest.mark.parametrize("profile", sorted(planner_profiles()))
def test_a_profile_holds_performance_flags_only(profile):
    assert {flag: flag_kind(flag) for flag in profile_options(profile)} == {
        flag: "performance" for flag in profile_options(profile)}


def test_the_tuner_searches_performance_flags_by_default():
    assert {flag: flag_kind(flag) for flag in AXES} == {flag: "performance" for flag in AXES}
    assert [axis.flag for axis in search_space("0.25.0")] == list(AXES)


def test_a_semantic_or_unclassified_flag_is_searched_only_when_allowed():
    with pytest.raises(SpaceError, match=r"generation-config changes what the model generates .* --allow-semantic "
                                         r"generation-config$"):
        search_space("0.25.0", {"generation-config": ("vllm", "auto")})
    with pytest.raises(SpaceError, match=r"max-num-partial-prefills is not known to change only speed and memory "
                                         r"\(not classified as a flag of speed and memory only\)"):
        search_space("0.25.0", {"max-num-partial-prefills": (1, 2)})
    (axis,) = search_space("0.25.0", {"generation-config": ("vllm", "auto")}, allow_semantic=("generation-config",))
    assert axis.values == ("vllm", "auto")


def plan_of(**fields):
    data = spec_data(instances=[instance("chat", 8000, **fields)])
    data["instances"][0]["model"] = "Qwen/Qwen2.5-7B-Instruct"  # a built-in shape: its context is 32768
    (host_plan,) = build_plan(validate_spec(data, check_files=False))
    return host_plan


def test_plan_names_each_semantic_flag_an_instance_runs_with_and_why():
    changes = plan_of(options={"generation-config": "vllm", "max-model-len": 4096, "max-num-seqs": 64}).semantic_changes
    assert changes == [
        "chat: generation-config=vllm changes what the model generates — vllm ignores the model's "
        "generation_config.json: every request that sends no sampling fields gets vLLM's neutral defaults instead of "
        "the temperature, top-p, top-k and repetition penalty the model's authors chose",
        "chat: max-model-len=4096 changes what the model generates — below the model's own context, longer prompts "
        "are refused and outputs cut short"]


def test_plan_names_them_in_either_spelling_the_spec_takes():
    changes = plan_of(options={"generation_config": "vllm", "max_model_len": 4096}).semantic_changes
    assert [change.split(" changes ")[0] for change in changes] == ["chat: generation_config=vllm",
                                                                    "chat: max_model_len=4096"]
    assert plan_of(options={"max_model_len": 32768}).semantic_changes == []


@pytest.mark.parametrize("fields", [{"options": {"max-model-len": 32768}}, {"options": {"max-model-len": "auto"}},
                                    {"profile": "latency"}, {"profile": "throughput"}, {}],
                         ids=["the model's context", "auto", "latency", "throughput", "defaults"])
def test_plan_names_nothing_where_the_model_generates_as_its_authors_chose(fields):
    assert plan_of(**fields).semantic_changes == []


def test_plan_prints_them_and_its_json_has_them(tmp_path):
    data = spec_data(instances=[instance("chat", 8000, options={"generation-config": "vllm", "max-model-len": 4096})])
    spec = write_spec(tmp_path / "spec.yml", data)
    shown = CliRunner().invoke(app, ["plan", "--spec", str(spec)], env={"COLUMNS": "300", "NO_COLOR": "1"})
    assert shown.exit_code == 0, shown.output
    assert "semantic: chat: generation-config=vllm changes what the model generates — vllm ignores" in shown.output
    as_json = CliRunner().invoke(app, ["plan", "--spec", str(spec), "--json"], env={"COLUMNS": "300"})
    assert as_json.exit_code == 0, as_json.output
    assert '"semantic_changes": [\n        "chat: generation-config=vllm changes' in as_json.output
