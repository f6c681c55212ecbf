"""The README and docs/ stay true: the generated spec reference and JSON Schema match the model, the
examples load against it, README stays a front door (short, its links alive, its commands those CI runs).

After a deliberate change to the spec model, regenerate docs/spec.md and docs/spec.schema.json with
    .venv/bin/python -m provisioner.spec_docs
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import get_args, get_origin

import jsonschema
import pytest
import typer
import yaml
from pydantic import BaseModel
from typer.testing import CliRunner

from provisioner.base.paths import SPEC_EXAMPLE
from provisioner.cli.main import app
from provisioner.spec import Spec, SpecError, load_spec, validate_spec
from provisioner.spec_docs import MODELINE_PREFIX, SCHEMA_FILE_NAME, generated_docs, spec_schema

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
README_MAX_LINES = 150
REGENERATE = ".venv/bin/python -m provisioner.spec_docs"


def fenced_blocks(text: str, language: str = "") -> list[str]:
    """The bodies of the ``` blocks of `text` opened with `language` (any block when empty)."""
    pattern = re.compile(r"^```" + re.escape(language) + r"[^\n]*\n(.*?)^```", re.S | re.M)
    return [match[1] for match in pattern.finditer(text)]


def schema_errors(data) -> list[str]:
    validator = jsonschema.Draft7Validator(spec_schema())
    return sorted(f"{'/'.join(map(str, error.absolute_path))}: {error.message}" for error in validator.iter_errors(data))


# --------------------------------------------------------------------------- generated from the model


@pytest.mark.parametrize("name", ["spec.md", "spec.schema.json"])
def test_the_generated_docs_are_what_the_model_generates(name):
    expected = generated_docs(DOCS)[DOCS / name]
    assert (DOCS / name).read_text(encoding="utf-8") == expected, (
        f"docs/{name} differs from the spec model (provisioner/spec/models.py) — regenerate it: {REGENERATE}")


def model_field_paths(model: type[BaseModel], prefix: str = "", walked: set | None = None) -> list[str]:
    """Every field of the model and of the models below it, as docs/spec.md names them (hosts[].ssh.port); a
    model met again is named where it was first met (defaults.ssh is a row, its fields are hosts[].ssh's)."""
    walked = set() if walked is None else walked
    paths = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        paths.append(path)
        annotation = field.annotation
        is_list = get_origin(annotation) is list
        below = [arg for arg in (get_args(annotation) or (annotation,)) if isinstance(arg, type) and issubclass(arg, BaseModel)]
        for child in below:
            if child not in walked:
                walked.add(child)
                paths += model_field_paths(child, f"{path}{'[]' if is_list else ''}.", walked)
    return paths


def test_spec_md_names_every_field_of_the_model_with_its_description():
    reference = (DOCS / "spec.md").read_text(encoding="utf-8")
    rows = {match[1]: match[0] for match in re.finditer(r"^\| `([^`]+)` \|.*$", reference, re.M)}
    paths = model_field_paths(Spec)
    assert "hosts[].gpus.devices[].power_limit" in paths and "instances[].container.engine" in paths
    assert "groups[].gpus" in paths and "defaults.gpus.persistence_mode" in paths and "groups[].ssh.user" not in paths
    assert "| `groups[].ssh` | mapping (`hosts[].ssh`) or null |" in reference  # its fields: at hosts[].ssh
    assert [path for path in paths if path not in rows] == [], f"fields missing from docs/spec.md — {REGENERATE}"
    undescribed = [path for path in paths if rows[path].rstrip(" |").endswith("|")]
    assert undescribed == [], "fields without a description: add Field(description=...) in provisioner/spec/models.py"


# draft-07's keywords (json-schema.org/draft-07/json-schema-validation and -core): editors with
# yaml-language-server support that draft fully, later ones in part; `$defs` only holds the definitions
DRAFT7_KEYWORDS = {
    "$schema", "$id", "$ref", "$comment", "$defs", "definitions", "title", "description", "default", "examples",
    "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum",
    "maxLength", "minLength", "pattern", "items", "additionalItems", "maxItems", "minItems", "uniqueItems",
    "contains", "maxProperties", "minProperties", "required", "properties", "patternProperties",
    "additionalProperties", "dependencies", "propertyNames", "if", "then", "else", "allOf", "anyOf", "oneOf",
    "not", "format", "readOnly", "writeOnly",
}


def keywords(schema) -> set[str]:
    """The keywords a schema uses (not the names under properties/$defs, not the values of default/const/enum)."""
    found: set[str] = set()
    if isinstance(schema, list):
        for item in schema:
            found |= keywords(item)
    elif isinstance(schema, dict):
        for key, value in schema.items():
            found.add(key)
            if key in ("properties", "$defs", "definitions", "patternProperties"):
                for sub in value.values():
                    found |= keywords(sub)
            elif key not in ("default", "const", "enum", "examples", "required"):
                found |= keywords(value)
    return found


def test_the_schema_is_a_valid_draft7_schema_with_draft7_keywords_only():
    schema = spec_schema()
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    jsonschema.Draft7Validator.check_schema(schema)
    assert keywords(schema) - DRAFT7_KEYWORDS == set(), "keywords editors with draft-07 support do not know"
    assert {"$ref", "anyOf", "pattern", "additionalProperties", "minimum", "exclusiveMinimum"} <= keywords(schema)


def test_the_schema_rejects_what_the_model_rejects():
    """Not a schema that takes anything: unknown keys, wrong types and patterns are errors for editors too."""
    data = yaml.safe_load(SPEC_EXAMPLE.read_text(encoding="utf-8"))
    data["instances"][0]["colour"] = "blue"
    data["hosts"][0]["ssh"]["port"] = "22x"
    data["hosts"][0]["name"] = "WS 3090"
    errors = schema_errors(data)
    assert any(error.startswith("instances/0: Additional properties are not allowed ('colour'") for error in errors)
    assert "hosts/0/ssh/port: '22x' is not of type 'integer'" in errors
    assert "hosts/0/name: 'WS 3090' does not match '^[a-z0-9][a-z0-9-]*$'" in errors
    del data["instances"][0]["colour"]
    data["hosts"][0]["ssh"]["port"] = 22
    data["hosts"][0]["name"] = "ws3090"
    assert schema_errors(data) == []


# --------------------------------------------------------------------------- the examples load


def uncommented(example: str) -> str:
    """The example with its commented-out keys (`# profile: latency`, the `# container:` block, `# - name:` of
    a group) put in."""
    return re.sub(r"^(\s*)# ( *(?:- )?[a-z_]+:(?: |$))", r"\1\2", example, flags=re.M)


def test_the_annotated_example_loads_against_the_model_and_the_schema():
    example = SPEC_EXAMPLE.read_text(encoding="utf-8")
    data = yaml.safe_load(example)
    validate_spec(data, base_dir=SPEC_EXAMPLE.parent, check_files=False)
    assert schema_errors(data) == []


def test_the_annotated_examples_commented_keys_are_valid_too():
    full = yaml.safe_load(uncommented(SPEC_EXAMPLE.read_text(encoding="utf-8")))
    assert full["instances"][0]["container"]["engine"] == "podman"  # the block really was put in
    assert full["instances"][0]["profile"] == "latency"
    assert full["hosts"][0]["groups"] == ["rack_a"]
    assert [group["name"] for group in full["groups"]] == ["rack_a"] and full["defaults"]["ssh"]["become"] is True
    spec = validate_spec(full, base_dir=SPEC_EXAMPLE.parent, check_files=False)
    assert spec.instances[0].container is not None
    (ws3090,) = spec.hosts  # the host's own values over rack_a's over the defaults'
    assert (ws3090.ssh.user, ws3090.ssh.become) == ("root", False)
    assert ws3090.settings.shm_size == "16G"
    assert ws3090.settings.sysctls == {"net.core.somaxconn": 4096, "vm.max_map_count": 262144}
    assert (ws3090.gpus.expected_count, ws3090.vllm.version) == (1, "0.25.0")
    assert schema_errors(full) == []


def readme_example() -> dict:
    blocks = fenced_blocks(README.read_text(encoding="utf-8"), "yaml")
    assert len(blocks) == 1, "README has one example spec (a ```yaml block)"
    return yaml.safe_load(blocks[0])


def leaves(value, path=()):
    if isinstance(value, dict):
        for key, item in value.items():
            yield from leaves(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from leaves(item, (*path, index))
    else:
        yield path, value


def at(data, path):
    for part in path:
        data = data[part]
    return data


def test_the_readme_example_loads_and_is_an_excerpt_of_the_annotated_example(tmp_path):
    data = readme_example()
    path = tmp_path / "provision.yml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    load_spec(path)  # every check, files included: the README's spec names no file
    assert schema_errors(data) == []
    example = yaml.safe_load(SPEC_EXAMPLE.read_text(encoding="utf-8"))
    differing = []
    for where, value in leaves(data):
        try:
            if at(example, where) != value:
                differing.append((where, value, at(example, where)))
        except (KeyError, IndexError, TypeError):
            differing.append((where, value, "(not in the example)"))
    assert differing == [], "README's spec must be an excerpt of templates/spec.example.yml"


def test_the_validation_page_shows_what_validation_says():
    page = (DOCS / "validation.md").read_text(encoding="utf-8")
    bad = yaml.safe_load(fenced_blocks(page, "yaml")[0])
    shown = fenced_blocks(page)[1].splitlines()
    assert shown[0].startswith("$ provision plan --spec bad.yml")
    with pytest.raises(SpecError) as raised:
        validate_spec(bad)
    assert shown[1:] == [f"bad.yml: {len(raised.value.problems)} problems", *map(str, raised.value.problems)]


# --------------------------------------------------------------------------- init: the modeline and its schema


def test_init_writes_a_modeline_whose_schema_validates_the_example(tmp_path):
    target = tmp_path / "fleet" / "provision.yml"
    result = CliRunner().invoke(app, ["init", str(target)])
    assert result.exit_code == 0, result.output
    first_line, rest = target.read_text(encoding="utf-8").split("\n", 1)
    assert first_line.startswith(MODELINE_PREFIX)
    location = first_line.removeprefix(MODELINE_PREFIX)
    assert not Path(location).is_absolute() and "://" not in location  # offline, beside the spec
    schema_file = target.parent / location  # yaml-language-server takes a relative path from the YAML file
    assert schema_file.name == SCHEMA_FILE_NAME
    schema = json.loads(schema_file.read_text(encoding="utf-8"))
    assert schema == spec_schema()  # this installation's model
    assert rest == SPEC_EXAMPLE.read_text(encoding="utf-8")
    data = yaml.safe_load(target.read_text(encoding="utf-8"))
    assert list(jsonschema.Draft7Validator(schema).iter_errors(data)) == []
    assert validate_spec(data, base_dir=target.parent, check_files=False).hosts[0].name == "ws3090"


def test_schema_command_prints_and_writes_the_schema(tmp_path):
    printed = CliRunner().invoke(app, ["schema"])
    assert printed.exit_code == 0, printed.output
    assert json.loads(printed.output) == spec_schema()
    out = tmp_path / "s.json"
    written = CliRunner().invoke(app, ["schema", "-o", str(out)])
    assert written.exit_code == 0 and f"wrote {out}" in written.output
    assert json.loads(out.read_text(encoding="utf-8")) == spec_schema()


def test_schema_command_to_an_unwritable_place_says_so_without_a_traceback(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = CliRunner().invoke(app, ["schema", "-o", str(blocker / "s.json")])
    assert result.exit_code == 1
    assert f"{blocker / 's.json'}: cannot write it:" in result.output and "nothing was written" in result.output
    assert "Traceback" not in result.output


# --------------------------------------------------------------------------- README: a front door


def test_readme_is_at_most_150_lines():
    count = len(README.read_text(encoding="utf-8").splitlines())
    assert count <= README_MAX_LINES, f"README.md has {count} lines — move details to docs/"


def relative_links(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    return [link for link in links if "://" not in link and not link.startswith(("#", "mailto:"))]


@pytest.mark.parametrize("page", [README, *sorted(DOCS.glob("*.md"))], ids=lambda page: page.relative_to(REPO).as_posix())
def test_every_relative_link_resolves(page):
    dead = [link for link in relative_links(page) if not (page.parent / link.split("#")[0]).exists()]
    assert dead == [], f"dead links in {page.relative_to(REPO)}"


def test_readme_links_every_page_of_docs():
    linked = {(README.parent / link).resolve() for link in relative_links(README)}
    assert [page.name for page in sorted(DOCS.glob("*.md")) if page.resolve() not in linked] == []


def test_readme_keeps_the_setup_and_test_commands_ci_runs():
    blocks = [block.strip() for block in fenced_blocks(README.read_text(encoding="utf-8"), "sh")]
    assert "bash .ci/setup && .venv/bin/python -m tests.lab demo" in blocks
    assert ".venv/bin/python -m pytest -q" in blocks
    ci_run = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert "bash .ci/setup" in ci_run and ".venv/bin/python -m pytest -q" in ci_run
    assert re.search(r"^def demo\(", (REPO / "tests" / "lab" / "__main__.py").read_text(encoding="utf-8"), re.M)


def test_readme_command_table_lists_every_command():
    table = [line for line in README.read_text(encoding="utf-8").splitlines() if line.startswith("| `provision ")]
    documented = {re.match(r"\| `provision ([a-z][a-z-]*)", line)[1] for line in table if not line.startswith("| `provision -")}
    registered = set(typer.main.get_command(app).commands)  # commands and groups (`audit`, `bench`)
    assert registered - documented == set(), "commands missing from README's command table"
    assert documented - registered == set(), "README's command table names commands that do not exist"


def test_the_drift_matrix_page_is_what_the_matrix_generates():
    from tests.integration.drift_matrix import markdown

    page = Path("docs/drift-matrix.md")
    assert page.read_text(encoding="utf-8") == markdown(), (
        "docs/drift-matrix.md is stale: python -m tests.integration.drift_matrix > docs/drift-matrix.md")
