"""The spec's JSON Schema and its reference page, both generated from the pydantic model (provisioner/spec/models.py).

- `spec_schema()` / `schema_text()`: the JSON Schema with every field's description, default and constraints,
  declared as draft-07: the draft editors with yaml-language-server (VS Code's YAML extension) fully support, and
  every keyword pydantic writes here is a draft-07 keyword (tests/unit/test_docs.py checks both); `provision schema` prints it, `provision init` writes it beside the spec
  (`provision.schema.json`) for editors (the yaml-language-server modeline).
- `reference_markdown()`: docs/spec.md, the annotated example and a table of every field.
- `example_with_modeline()` / `write_example_key()`: what `provision init` writes: the annotated example and the API
  key file it names (so that the untouched example plans).

The schema checks each field's shape (types, ranges, patterns, unknown keys); the checks across fields (names,
ports, GPU references, memory shares, flags against vLLM's catalog, files on disk) run when a command loads the
spec. Regenerate the checked-in copies after changing the model:

    .venv/bin/python -m provisioner.spec_docs        # writes docs/spec.md and docs/spec.schema.json
"""

from __future__ import annotations

import json
import os
import secrets
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic.json_schema import GenerateJsonSchema

from provisioner.base.paths import SPEC_EXAMPLE
from provisioner.spec import Spec

SCHEMA_DIALECT = "http://json-schema.org/draft-07/schema#"
SCHEMA_FILE_NAME = "provision.schema.json"  # `provision init` writes it beside the spec
MODELINE_PREFIX = "# yaml-language-server: $schema="


class _WithFactoryDefaults(GenerateJsonSchema):
    """pydantic leaves out the defaults of `default_factory` fields ([] {} and nested models): show them too."""

    def get_default_value(self, schema: Any) -> Any:
        factory = schema.get("default_factory")
        if factory is not None and not schema.get("default_factory_takes_data"):
            return factory()
        return super().get_default_value(schema)


def spec_schema() -> dict[str, Any]:
    """The JSON Schema of a spec file, from the model this installation validates with."""
    schema = Spec.model_json_schema(schema_generator=_WithFactoryDefaults)
    schema.pop("title", None)
    schema.pop("description", None)
    return {
        "$schema": SCHEMA_DIALECT,
        "title": "vllm-provision spec",
        "description": "One YAML file: the GPU hosts and the vLLM instances they run (docs/spec.md). This schema "
                       "checks each field's shape; `provision plan` also checks the fields against each other.",
        **schema,
    }


def schema_text() -> str:
    return json.dumps(spec_schema(), indent=2, ensure_ascii=False) + "\n"


def modeline(schema_location: str = SCHEMA_FILE_NAME) -> str:
    """The first line that makes editors with yaml-language-server validate the file against the schema
    (a relative location is taken from the YAML file's folder)."""
    return f"{MODELINE_PREFIX}{schema_location}\n"


def example_with_modeline() -> str:
    """What `provision init` writes: the modeline, then the annotated example."""
    return modeline() + SPEC_EXAMPLE.read_text(encoding="utf-8")


def write_example_key(folder: Path) -> Path | None:
    """The example's api_key_file (relative to the spec's `folder`) with a new random key, 0600 in a 0700 folder,
    so that the untouched example plans; None where that file is there already (kept as it is)."""
    key = folder / yaml.safe_load(SPEC_EXAMPLE.read_text(encoding="utf-8"))["instances"][0]["api_key_file"]
    if key.exists():
        return None
    key.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with os.fdopen(os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w", encoding="utf-8") as handle:
        handle.write(f"sk-{secrets.token_urlsafe(32)}\n")
    return key


# --------------------------------------------------------------------------- docs/spec.md


def reference_markdown() -> str:
    schema = spec_schema()
    lines = [
        "# The spec",
        "",
        "<!-- Generated from provisioner/spec/models.py by `.venv/bin/python -m provisioner.spec_docs`; do not edit: "
        "tests/unit/test_docs.py fails when this file and the model differ. -->",
        "",
        "One YAML file names the hosts, their GPUs and the vLLM instances they run. Commands find it as "
        "`--spec FILE`, else `$PROVISION_SPEC`, else `./provision.yml`. `provision init` writes the annotated "
        "example below (`templates/spec.example.yml`) with a first line, "
        f"`{modeline().strip()}`, that makes editors running yaml-language-server (VS Code's YAML extension, "
        "Neovim, Helix, …) check it against the JSON Schema init writes beside it (the installed version's; "
        "`provision schema -o FILE` writes it again, e.g. after an upgrade; the checked-in copy is "
        "[spec.schema.json](spec.schema.json)).",
        "",
        "The schema checks each field's shape. Every command that reads the spec also checks the fields against "
        "each other and reports every problem at once, before any host is touched: see "
        "[validation.md](validation.md).",
        "",
        "## The annotated example",
        "",
        "```yaml",
        SPEC_EXAMPLE.read_text(encoding="utf-8").rstrip("\n"),
        "```",
        "",
        *_DEFAULTS_AND_GROUPS,
        "## Every field",
        "",
        "`[]` marks a list item: `hosts[].ssh.port` is `port` under `ssh` of each host.",
    ]
    places = _table_places(schema, schema)
    for path, model, properties, required in _models(schema, places):
        lines += ["", f"### `{path or 'the file'}`", ""]
        if model.get("description") and path:
            lines += [_prose(model["description"]), ""]
        lines += ["| field | type | default | constraints | description |", "|---|---|---|---|---|"]
        for name, field in properties.items():
            full = f"{path}.{name}" if path else name
            lines.append("| " + " | ".join([
                f"`{full}`",
                _cell(_type(field, places)),
                _cell(_default(field, name in required, schema)),
                _cell(_constraints(field)),
                _prose(field.get("description") or _referenced(field, schema).get("description", "")),
            ]) + " |")
    return "\n".join(lines) + "\n"


_DEFAULTS_AND_GROUPS = [
    "## Defaults and groups",
    "",
    "Values many hosts share are written once. `defaults:` applies to every host; an entry of `groups:` to the hosts "
    "that list its name in their `groups:`. A host takes the defaults, then each group it lists, in the order it "
    "lists them, then its own values. Merging is per field: a host that sets `settings.shm_size` keeps the "
    "`settings.sysctls` it takes, and `sysctls` merge key by key (a host gives a key it takes a value of its own; "
    "it cannot remove it). A host may list a group that has no entry: membership only (an inventory group, a HOST "
    "argument). An entry no host lists is refused: its values would reach no host, usually a typo.",
    "",
    "Defaults and groups may set `ssh`, `settings`, `vllm`, `driver` and the rules of `gpus` (`expected_count`, "
    "`persistence_mode`, `memory_share_limit`), each field optional; not `name`, `address`, `groups` nor "
    "`gpus.devices`. Devices stay per host: every GPU has its own UUID, by which instances are pinned and which the "
    "audit checks, so a list shared by several hosts would be wrong on all of them but one (`provision facts` prints "
    "each host's own list). Identical servers share `expected_count` instead, which the audit checks as well. A "
    "host that takes any field of `driver` has a driver section (apply manages its driver, unless `manage: false`); "
    "`driver: null` on a host keeps it without one.",
    "",
    "Hosts are resolved when the spec is read: `plan`, the inventory, `apply` and the audit see each host with every "
    "value it takes. A problem with a value is reported where the value is written (`groups[1].settings.shm_size`), "
    "once, however many hosts take it. The inventory keeps each host's values in `host_vars/<host>.yml` and makes "
    "each group an inventory group (a child of `vllm_hosts`: `--limit rack_a`), with no `group_vars/<group>.yml`: "
    "Ansible ranks groups of one level by name (or `ansible_group_priority`), not in the order a host lists them, "
    "and replaces a mapping such as `sysctl_settings` whole, so group_vars would give a host in two groups other "
    "values than the spec does; `plan` and the audit read the very variables the roles get.",
    "",
]


def _table_places(model: dict, root: dict, path: str = "", places: dict[str, str] | None = None) -> dict[str, str]:
    """Where each model's table is: the path it is first met at, in order (a model met again, as defaults.ssh
    holds the fields of hosts[].ssh, points there)."""
    places = {} if places is None else places
    for name, field in model.get("properties", {}).items():
        below = _ref_below(field)
        if below and below[0] not in places:
            ref, suffix = below
            places[ref] = f"{path}.{name}{suffix}".lstrip(".")
            _table_places(_deref(ref, root), root, places[ref], places)
    return places


def _models(root: dict, places: dict[str, str]):
    """(path, model schema, properties, required) of the file and of each model, where its table is."""
    for path, model in [("", root), *((path, _deref(ref, root)) for ref, path in places.items())]:
        yield path, model, model.get("properties", {}), set(model.get("required", []))


def _ref_below(field: dict) -> tuple[str, str] | None:
    """The model a field holds (directly, or null allowed), lists (`[]`) or maps names to (`.*`: one kind of its
    values), and how its path goes on from the field's: "", "[]" or ".*"."""
    for option in field.get("anyOf", [field]):
        if "$ref" in option:
            return option["$ref"], ""
        items = option.get("items", {})
        if "$ref" in items:
            return items["$ref"], "[]"
        values = option.get("additionalProperties")
        for value in values.get("oneOf", [values]) if isinstance(values, dict) else []:
            if "$ref" in value:
                return value["$ref"], ".*"
    return None


def _deref(ref: str, root: dict) -> dict:
    return root["$defs"][ref.removeprefix("#/$defs/")]


def _referenced(field: dict, root: dict) -> dict:
    below = _ref_below(field)
    return _deref(below[0], root) if below and not below[1] else {}  # a model held directly


def _type(field: dict, places: dict[str, str]) -> str:
    if "anyOf" in field or "oneOf" in field:
        return " or ".join(_type(option, places) for option in field.get("anyOf") or field["oneOf"])
    if "$ref" in field:
        return f"mapping (`{places[field['$ref']]}`)"
    if "const" in field:
        return json.dumps(field["const"])
    if "enum" in field:
        return " or ".join(json.dumps(value) for value in field["enum"])
    kind = field.get("type")
    if kind == "array":
        items = field.get("items", {})
        return f"list of {_type(items, places) if items else 'values'}"
    if kind == "object":
        values = field.get("additionalProperties")
        return f"mapping of string to {_type(values, places)}" if isinstance(values, dict) else "mapping"
    return kind or "any value"


def _default(field: dict, required: bool, root: dict) -> str:
    if required:
        return "required"
    if "default" not in field:
        return ""
    default = field["default"]
    if isinstance(default, dict) and default and _referenced(field, root):
        return "its fields' defaults"
    return f"`{json.dumps(default, ensure_ascii=False)}`"


_BOUNDS = (("minimum", "≥ {}"), ("exclusiveMinimum", "> {}"), ("maximum", "≤ {}"), ("exclusiveMaximum", "< {}"),
           ("minItems", "at least {} item(s)"), ("minLength", "at least {} character(s)"),
           ("maxLength", "at most {} character(s)"), ("pattern", "matches `{}`"))


def _constraints(field: dict) -> str:
    found = []
    for part in [field, *field.get("anyOf", []), field.get("items", {}), field.get("additionalProperties") or {}]:
        if not isinstance(part, dict):
            continue
        found += [text.format(part[key]) for key, text in _BOUNDS if key in part]
    return ", ".join(dict.fromkeys(found))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _prose(text: str) -> str:
    """A description in a table cell: <name> shown as written, not taken for an HTML tag."""
    return _cell(text).replace("<", "&lt;").replace(">", "&gt;")


# --------------------------------------------------------------------------- the checked-in copies


def generated_docs(docs_dir: Path) -> dict[Path, str]:
    """The generated files of docs/ and what they must hold."""
    return {docs_dir / "spec.md": reference_markdown(), docs_dir / "spec.schema.json": schema_text()}


def main() -> int:
    docs_dir = Path(__file__).resolve().parent.parent / "docs"
    for path, text in generated_docs(docs_dir).items():
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
