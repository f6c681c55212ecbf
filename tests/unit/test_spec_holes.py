"""Holes in spec validation (issue 13, part 3): each bad input is refused as `path: message — fix`
before anything is written, and the CLI shows it without a traceback and leaves no output folder."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from provisioner.cli.main import app
from provisioner.fleet.inventory import write_inventory
from provisioner.gpu.cards import power_range
from provisioner.spec import Spec, SpecError, load_spec, parse_yaml, validate_spec
from provisioner.vllm import make_catalog
from provisioner.vllm.flags import (
    CATALOGS_DIR,
    NO_VALUE,
    VALUE_READERS,
    item_problem,
    load_catalog,
    read_value,
    supported_versions,
)
from provisioner.vllm.flags import length as flags_length
from tests.unit.conftest import UUID0, UUID1, host, instance, problems_of, spec_data, write_spec

runner = CliRunner()
TWO_GPUS = {"devices": [{"index": 0, "uuid": UUID0}, {"index": 1, "uuid": UUID1}]}


def invoke(*args: str | Path):
    return runner.invoke(app, [str(arg) for arg in args], env={"COLUMNS": "200", "NO_COLOR": "1"})


def refused_by_the_cli(spec_path: Path, tmp_path: Path, message: str) -> None:
    """`plan` and `inventory` both exit 1 with `message`, no traceback, and no inventory folder."""
    out = tmp_path / "inventory-out"
    for args in (("plan", "--spec", spec_path), ("inventory", "--spec", spec_path, "-o", out)):
        result = invoke(*args)
        assert result.exit_code == 1, (args, result.output)
        assert isinstance(result.exception, SystemExit), result.exception  # no traceback
        assert "Traceback" not in result.output
        assert message in result.output, result.output
        assert not out.exists()


# ------------------------------------------------------------------ 1. parallel sizes × GPUs


def test_tensor_parallel_size_must_match_the_gpu_count_even_on_one_gpu(tmp_path):
    data = spec_data(instances=[instance("chat", 8000, options={"tensor-parallel-size": 4})])
    message = ("instances[0].options.tensor-parallel-size: tensor-parallel-size 4 makes vLLM use 4 GPUs, but the "
               "instance has 1 GPU (gpus: [0]) — set tensor-parallel-size: 1, or list 4 GPUs under gpus")
    assert problems_of(data) == [message]
    refused_by_the_cli(write_spec(tmp_path / "spec.yml", data), tmp_path, message)


def test_two_gpus_without_parallelism_and_data_parallel_multiplying():
    unused = spec_data(hosts=[host(gpus=TWO_GPUS)], instances=[instance("chat", 8000, gpus=[0, 1])])
    assert problems_of(unused) == [
        "instances[0].gpus: vLLM's default (tensor-parallel-size 1) makes vLLM use 1 GPU, but the instance has "
        "2 GPUs (gpus: [0, 1]) — set tensor-parallel-size: 2, or list 1 GPU under gpus"]
    too_many = spec_data(hosts=[host(gpus=TWO_GPUS)], instances=[instance(
        "chat", 8000, gpus=[0, 1], options={"tensor-parallel-size": 2, "data-parallel-size": 2})])
    assert problems_of(too_many) == [
        "instances[0].options.tensor-parallel-size: tensor-parallel-size 2 × data-parallel-size 2 makes vLLM use "
        "4 GPUs, but the instance has 2 GPUs (gpus: [0, 1]) — make their product 2, or list 4 GPUs under gpus"]
    for options in ({"tensor-parallel-size": 2}, {"pipeline-parallel-size": 2}, {"data-parallel-size": 2},
                    {"data-parallel-size": 4, "data-parallel-size-local": 2},
                    {"tensor-parallel-size": 2, "data-parallel-size": 4, "data-parallel-rank": 1}):
        fits = spec_data(hosts=[host(gpus=TWO_GPUS)], instances=[instance("chat", 8000, gpus=[0, 1], options=options)])
        assert validate_spec(fits).instances[0].options == options


# ------------------------------------------------------------------ 2. model


@pytest.mark.parametrize("model", ["", "   "])
def test_an_empty_or_blank_model_is_refused(tmp_path, model):
    data = spec_data(instances=[instance("chat", 8000, model=model)])
    message = ("instances[0].model: is empty — give the model to serve: a Hugging Face id (e.g. Qwen/Qwen3-1.7B-FP8) "
               "or a local path")
    assert problems_of(data) == [message]
    refused_by_the_cli(write_spec(tmp_path / "spec.yml", data), tmp_path, message)


# ------------------------------------------------------------------ 3. name lengths


def test_a_host_name_longer_than_a_dns_label_is_refused_and_inventory_writes_nothing(tmp_path):
    long_name = "h" * 300
    data = spec_data(hosts=[host(long_name)], instances=[instance("chat", 8000, on=long_name)])
    message = (f"hosts[0].name: '{'h' * 20}…' is 300 characters long, more than a DNS label takes (63) — use a "
               "shorter name (it is the inventory name, often the DNS name)")
    assert problems_of(data) == [message]
    refused_by_the_cli(write_spec(tmp_path / "spec.yml", data), tmp_path, message)
    assert validate_spec(spec_data(hosts=[host("h" * 63)], instances=[instance("chat", 8000, on="h" * 63)]))


def test_an_instance_name_must_leave_vllm_dash_name_a_dns_label():
    assert problems_of(spec_data(instances=[instance("i" * 59, 8000)])) == [
        f"instances[0].name: '{'i' * 20}…' is 59 characters long, more than 58 — use a shorter name (vllm-<name> "
        "must be a DNS label of at most 63 characters: it names the container and the unit)"]
    assert validate_spec(spec_data(instances=[instance("i" * 58, 8000)])).instances[0].name == "i" * 58


# ------------------------------------------------------------------ 4. encoding


def test_a_spec_that_is_not_utf8_names_the_line_and_byte_offset(tmp_path):
    spec_path = tmp_path / "spec.yml"
    spec_path.write_bytes(b"version: 1\nhosts:\n  - name: caf\xe9\n")
    message = "spec.yml:3:14: byte 0xe9 at offset 31 is not UTF-8 — save the spec as UTF-8 (e.g. `iconv -f latin1 -t utf-8`)"
    with pytest.raises(SpecError) as caught:
        load_spec(spec_path)
    assert [str(problem) for problem in caught.value.problems] == [message]
    refused_by_the_cli(spec_path, tmp_path, message)


def test_a_control_character_names_its_line():
    with pytest.raises(SpecError) as caught:
        parse_yaml("version: 1\nhosts: \x07\n", "spec.yml")
    assert str(caught.value) == ("spec.yml:2:8: character #x0007 is not allowed in YAML — remove it (a control "
                                 "character or a stray byte; save the spec as plain UTF-8 text)")


# ------------------------------------------------------------------ 5. api_key_file


def test_an_api_key_file_that_is_a_folder_says_so(tmp_path):
    (tmp_path / "keys").mkdir()
    data = spec_data(instances=[instance("chat", 8000, api_key_file="keys")])
    message = (f"instances[0].api_key_file: {tmp_path}/keys is a folder, not a file — name the file that holds the "
               "API key (its content becomes VLLM_API_KEY)")
    assert problems_of(data, base_dir=tmp_path) == [message]
    refused_by_the_cli(write_spec(tmp_path / "spec.yml", data), tmp_path, message)


# ------------------------------------------------------------------ 6. power limits


def gpu_with(model: str | None, watts) -> dict:
    return host(gpus={"devices": [{"index": 0, "uuid": UUID0, "model": model, "power_limit": watts}]})


def test_a_power_limit_outside_the_known_cards_range_is_refused(tmp_path):
    message = ("hosts[0].gpus.devices[0].power_limit: 800 W is outside the NVIDIA H200's power-limit range "
               "(200–700 W) — use watts in that range, or 'max'")
    data = spec_data(hosts=[gpu_with("NVIDIA H200", 800)])
    assert problems_of(data) == [message]
    assert problems_of(spec_data(hosts=[gpu_with("NVIDIA H200", 150)])) == [message.replace("800 W", "150 W")]
    for watts in (200, 450, 700, "max", "default"):
        assert validate_spec(spec_data(hosts=[gpu_with("NVIDIA H200", watts)]))
    refused_by_the_cli(write_spec(tmp_path / "spec.yml", data), tmp_path, message)


def test_the_power_ranges_are_the_recorded_cards_own():
    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "gpu"
    for folder in ("h200x1", "h200x2"):
        header, *rows = [line.split(", ") for line in (fixtures / folder / "query-gpu.csv").read_text().splitlines()]
        for row in rows:
            card = dict(zip(header, row))
            known = power_range(card["name"])
            assert (f"{known.min_w}.00 W", f"{known.max_w}.00 W") == (card["power.min_limit [W]"],
                                                                      card["power.max_limit [W]"])


def test_an_unknown_card_is_refused_only_what_no_nvidia_card_takes():
    assert problems_of(spec_data(hosts=[gpu_with("NVIDIA Z9000", 45000)])) == [
        "hosts[0].gpus.devices[0].power_limit: 45000 W is more than any NVIDIA GPU takes (the largest modules are "
        "rated well under 4000 W) — give the card's watts (nvidia-smi -q -d POWER shows its range), or 'max'"]
    for model in ("NVIDIA Z9000", None, "NVIDIA GeForce RTX 3090"):  # the 3090's range is only assumed
        assert validate_spec(spec_data(hosts=[gpu_with(model, 1500)]))


# ------------------------------------------------------------------ 7. merge keys


MERGED = """\
version: 1
hosts:
  - name: ws4070
    address: 192.0.2.20
    gpus: {devices: [{index: 0, uuid: GPU-00000000-0000-4000-8000-000000000000}]}
x-defaults: &defaults
  host: ws4070
  model: Qwen/Qwen3-1.7B-FP8
  gpus: [0]
  gpu_memory_utilization: 0.3
instances:
  - <<: *defaults
    name: chat
    port: 8000
  - <<: *defaults
    name: embed
    port: 8001
    gpu_memory_utilization: 0.4
"""


def test_merge_keys_work_as_in_safe_load_and_own_keys_override():
    data = parse_yaml(MERGED)
    assert data == yaml.safe_load(MERGED)
    del data["x-defaults"]
    spec = validate_spec(data)
    assert [(i.name, i.model, i.gpu_memory_utilization) for i in spec.instances] == [
        ("chat", "Qwen/Qwen3-1.7B-FP8", 0.3), ("embed", "Qwen/Qwen3-1.7B-FP8", 0.4)]


def test_a_key_written_twice_next_to_a_merge_is_still_a_duplicate():
    with pytest.raises(SpecError) as caught:
        parse_yaml(MERGED.replace("    port: 8001\n", "    port: 8001\n    port: 8002\n"), "spec.yml")
    assert str(caught.value) == "spec.yml:18:5: duplicate key 'port' — remove one of them"


# ------------------------------------------------------------------ 8. alias bombs


def billion_laughs(levels: int = 9) -> str:
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"l{n}: &l{n} [{', '.join([f'*l{n - 1}'] * 9)}]" for n in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_before_it_is_built(tmp_path):
    started = time.monotonic()
    with pytest.raises(SpecError) as caught:
        parse_yaml(billion_laughs(), "spec.yml")
    assert time.monotonic() - started < 5
    assert str(caught.value) == (
        "spec.yml: its aliases expand to 490,329,064 values (at most 100,000; &l8 (line 9) alone is 435,848,050): "
        "a \"billion laughs\" document — write the repeated parts out, or alias fewer nested parts")
    spec_path = tmp_path / "spec.yml"
    spec_path.write_text(billion_laughs())
    refused_by_the_cli(spec_path, tmp_path, "a \"billion laughs\" document")


def test_an_alias_inside_itself_is_refused():
    with pytest.raises(SpecError) as caught:
        parse_yaml("version: 1\nhosts: &loop [*loop]\n", "spec.yml")
    assert str(caught.value) == ("spec.yml: &loop (line 2) contains an alias of itself, which expands without end "
                                 "— write the repeated part out")


@pytest.mark.parametrize("nested", ["[" * 100_000 + "]" * 100_000, "{a: " * 50_000 + "1" + "}" * 50_000])
def test_values_nested_beyond_the_bound_are_refused_not_a_crash(nested):
    """libyaml composes by recursion in C: 100,000 brackets overflowed the stack (a segmentation fault, no
    message). Run in a child, so that a crash fails this test only."""
    code = ("import sys\nfrom provisioner.spec import SpecError, parse_yaml\n"
            "try:\n    parse_yaml(sys.stdin.read(), 'spec.yml')\nexcept SpecError as error:\n    print(error)\n")
    run = subprocess.run([sys.executable, "-c", code], input="version: 1\nhosts: " + nested, capture_output=True,
                         text=True, timeout=60, cwd=Path(__file__).resolve().parents[2])
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.startswith("spec.yml:2:") and "values nested more than 200 deep" in run.stdout, run.stdout


def test_nesting_up_to_the_bound_is_read():
    nested = "[" * 199 + "1" + "]" * 199
    assert parse_yaml(f"version: 1\nx: {nested}\n")["x"] == yaml.safe_load(nested)


def test_ordinary_aliases_are_fine():
    assert parse_yaml(billion_laughs(levels=4)) == yaml.safe_load(billion_laughs(levels=4))


# ------------------------------------------------------------------ 9. no partial output


def unvalidated(data: dict) -> Spec:
    """A spec that passed only pass 1: what write_inventory would get if a check were missing."""
    return Spec.model_validate(data)


def test_inventory_writes_every_file_or_none(tmp_path):
    long_name = "h" * 300  # the file system refuses host_vars/<300 characters>.yml
    spec = unvalidated(spec_data(hosts=[host(), host(long_name, "192.0.2.21")], instances=[]))
    out = tmp_path / "deep" / "inv"
    with pytest.raises(OSError):
        write_inventory(spec, out)
    assert list(tmp_path.iterdir()) == []  # neither the folder, nor its parent, nor a staging folder


def test_inventory_into_an_existing_folder_changes_nothing_when_a_file_cannot_go_in(tmp_path):
    spec = validate_spec(spec_data(instances=[]))
    write_inventory(spec, tmp_path / "inv")
    before = {path: path.read_bytes() for path in (tmp_path / "inv").rglob("*") if path.is_file()}
    (tmp_path / "inv" / "host_vars" / "ws4070.yml").unlink()
    (tmp_path / "inv" / "host_vars" / "ws4070.yml").mkdir()  # a folder where a file must go
    (tmp_path / "inv" / "hosts.yml").write_text("old\n")

    result = invoke("inventory", "--spec", write_spec(tmp_path / "spec.yml", spec_data(instances=[])), "-o", tmp_path / "inv")

    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    assert f"{tmp_path}/inv: cannot write it: a folder is in the way ({tmp_path}/inv/host_vars/ws4070.yml) — " \
           "nothing was written" in result.output
    assert (tmp_path / "inv" / "hosts.yml").read_text() == "old\n"  # not replaced
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inv", "spec.yml"]  # no staging folder left
    assert len(before) == 3


def test_init_writes_nothing_where_it_cannot_write(tmp_path):
    (tmp_path / "a-file").write_text("x\n")
    result = invoke("init", tmp_path / "a-file" / "spec.yml")
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    assert f"{tmp_path}/a-file/spec.yml: cannot write it:" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]

    result = invoke("init", tmp_path / "new" / "spec.yml")
    assert result.exit_code == 0
    # no temporary file left: the spec, its JSON Schema and the example's key file only
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == ["provision.schema.json", "secrets", "spec.yml"]
    assert [p.name for p in (tmp_path / "new" / "secrets").iterdir()] == ["qwen.key"]


# ------------------------------------------------------------------ 10. value forms as the pinned parser reads them

VERSIONS = supported_versions()  # both catalogs were regenerated with value_forms


def serve_entries(version: str) -> dict[str, dict]:
    return json.loads((CATALOGS_DIR / f"vllm-{version}.json").read_text())["commands"]["serve"]["options"]


def recorded_forms(version: str) -> dict[str, dict]:
    """{option: its value_forms} of the options the generator probed."""
    return {key: entry["value_forms"] for key, entry in serve_entries(version).items() if "value_forms" in entry}


def spec_value(form: str):
    """The spec value that reaches vLLM's config-file reader as `form` (true: the option alone)."""
    return True if form == NO_VALUE else form


def same_value(option, form: str, recorded) -> bool:
    """What flags.read_value makes of `form` is what the parser set (a list option: a list of one)."""
    ours = read_value(option, form)
    return make_catalog.jsonable([ours] if option.takes_list else ours) == recorded  # as recorded (inf: "inf")


@pytest.mark.parametrize("version", VERSIONS)
def test_the_catalog_records_the_forms_vllm_takes_for_sizes_and_optional_values(version):
    serve = load_catalog(version)
    forms = recorded_forms(version)
    assert len(forms) >= 60
    kv = forms["kv-cache-memory-bytes"]
    assert (kv["accepts"]["8G"], kv["accepts"]["8g"], kv["accepts"]["1.5g"]) == (8 * 2**30, 8 * 10**9, 15 * 10**8)
    assert {"8GiB", "8gb", "1.5G", "auto"} <= set(kv["rejects"])
    length = forms["max-model-len"]
    assert (length["accepts"]["32k"], length["accepts"]["32K"], length["accepts"]["auto"]) == (32000, 32768, -1)
    assert "auto" in forms["max-num-batched-tokens"]["rejects"]
    assert forms["hf-token"]["accepts"][NO_VALUE] is True and serve.option("hf-token").nargs == "?"


def test_the_generator_parses_each_form_for_real():
    parser = argparse.ArgumentParser(prog="vllm")
    serve = parser.add_subparsers(dest="subparser").add_parser("serve")
    serve.add_argument("model_tag", nargs="?")
    serve.add_argument("--block-size", type=int)
    serve.add_argument("--hf-token", nargs="?", const=True)
    block = make_catalog.value_forms(parser, "--block-size", "block_size")
    assert (block["accepts"]["7"], block["accepts"]["+7"], block["accepts"]["-1"]) == (7, 7, -1)
    assert {"abc", "32k", "0.5", "-1k", "-0.5", NO_VALUE} <= set(block["rejects"])
    token = make_catalog.value_forms(parser, "--hf-token", "hf_token")
    assert (token["accepts"][NO_VALUE], token["accepts"]["abc"]) == (True, "abc") and "-1k" in token["rejects"]


def disagreements(option, entries: dict, forms) -> list[tuple]:
    """(form, what the parser did, what flags.py says) wherever flags.py differs from the real parser."""
    found = []
    for form in forms:
        problem = item_problem(option, spec_value(form))
        accepted = form in entries["accepts"]
        if accepted and option.kind == "str" and form != NO_VALUE and entries["accepts"][form] not in (form, [form]):
            accepted = False  # parsed, but not as this option's value (vLLM rewrote -O… into another option)
        if accepted != (problem is None) or (accepted and option.kind in VALUE_READERS and form != NO_VALUE
                                              and not same_value(option, form, entries["accepts"][form])):
            found.append((option.key, form, entries["accepts"].get(form, "refused"), problem))
    return found


@pytest.mark.parametrize("version", VERSIONS)
def test_flags_take_exactly_the_forms_the_real_parser_took(version):
    catalog = load_catalog(version)
    recorded = recorded_forms(version)
    assert sum(len(entries["accepts"]) + len(entries["rejects"]) for entries in recorded.values()) > 1500
    found = [disagreement for key, entries in recorded.items()
             for disagreement in disagreements(catalog.option(key), entries, [*entries["accepts"], *entries["rejects"]])]
    assert found == []


def test_sizes_in_a_spec_are_checked_as_vllm_reads_them(tmp_path):
    options = {"kv-cache-memory-bytes": "8G", "max-model-len": "32K", "max-num-batched-tokens": "16k", "hf-token": True}
    assert validate_spec(spec_data(instances=[instance("chat", 8000, options=options)])).instances[0].options == options
    bad = {"kv-cache-memory-bytes": "8GiB", "max-num-batched-tokens": "auto", "max-model-len": "1.5K"}
    assert problems_of(spec_data(instances=[instance("chat", 8000, options=bad)])) == [
        "instances[0].options.kv-cache-memory-bytes: '8GiB' is not a size vLLM reads — --kv-cache-memory-bytes takes "
        "an integer, or one with a suffix: k, m, g, t (×1000ⁿ, decimals allowed: 25.6k) or K, M, G, T (×1024ⁿ, whole "
        "numbers: 8G)",
        "instances[0].options.max-num-batched-tokens: 'auto' is not a size vLLM reads — --max-num-batched-tokens takes "
        "an integer, or one with a suffix: k, m, g, t (×1000ⁿ, decimals allowed: 25.6k) or K, M, G, T (×1024ⁿ, whole "
        "numbers: 8G)",
        "instances[0].options.max-model-len: '1.5K' has a decimal with a binary suffix (K: ×1,024), which vLLM refuses "
        "— write 1.5k (×1,000) or a whole number of a smaller unit",
    ]
    refused_by_the_cli(write_spec(tmp_path / "spec.yml", spec_data(instances=[instance("chat", 8000, options=bad)])),
                       tmp_path, "instances[0].options.kv-cache-memory-bytes: '8GiB' is not a size vLLM reads")
    assert flags_length("1.5m") == 1_500_000 and flags_length("8G") == 8 * 2**30 and flags_length("auto") is None


# Forms beyond the recorded matrix, for the opt-in run against the real parser.
MORE_FORMS = ("4096", "1.5k", "2T", " 8G ", "8 G", "0x10", "１２", "-0", "007", "1__0", "1.0", "+1k", "-1k", "k",
              ".5k", "5.k", "0.5G", "2.5m", "1e2k", "nan", "-inf", "Auto", " auto ", "-1 ", "NONE", "1,5", "0.25",
              "-", "-2", "-1.5", "-Ofoo", "- 1", "-k")
VLLM_VENVS = Path(os.environ.get("VP_VLLM_VENVS", "/nonexistent"))  # holds <version>/bin/python per version
PROBE = """
import json, sys
from provisioner.vllm import make_catalog as catalog
catalog._prepare_argv()
catalog._set_cpu_platform()
parser, _ = catalog.build_cli_parser()
wanted, forms = json.loads(sys.stdin.read())
print(json.dumps({key: catalog.value_forms(parser, "--" + key, dest, tuple(forms)) for key, dest in wanted.items()}))
"""


@pytest.mark.parametrize("version", VERSIONS)
def test_flags_agree_with_the_real_parser_on_more_forms(version):
    python = VLLM_VENVS / version / "bin" / "python"
    if not python.is_file():
        pytest.skip(f"opt-in (imports vLLM, a few minutes): set VP_VLLM_VENVS to a folder with {version}/, a venv made "
                    f"by python3 -m venv DIR/{version} && DIR/{version}/bin/pip install vllm=={version}")
    catalog = load_catalog(version)
    serve = serve_entries(version)
    wanted = {key: serve[key]["dest"] for key in recorded_forms(version)}
    run = subprocess.run([str(python), "-c", PROBE], input=json.dumps([wanted, MORE_FORMS]),
                         capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2], timeout=600,
                         env={"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")})
    assert run.returncode == 0, run.stderr[-3000:]
    real = json.loads(run.stdout.strip().splitlines()[-1])
    assert real["max-model-len"]["accepts"]["Auto"] == -1  # the probe really parsed
    found = [disagreement for key, entries in real.items()
             for disagreement in disagreements(catalog.option(key), entries, MORE_FORMS)]
    assert found == []


def test_a_known_hosts_path_with_a_double_quote_is_refused_before_ssh_sees_it(tmp_path):
    """ssh_config and Ansible's ssh arguments quote the path with ": a " in it would end the quoted word."""
    known_hosts = tmp_path / 'odd"name'
    known_hosts.write_text("")
    data = spec_data(hosts=[host(ssh={"known_hosts": str(known_hosts)})])
    with pytest.raises(SpecError) as error:
        validate_spec(data, base_dir=tmp_path)
    assert [(p.path, p.message) for p in error.value.problems] == [
        ("hosts[0].ssh.known_hosts", f"'{known_hosts}' has a double quote, which ssh's options cannot hold — rename the file")]
