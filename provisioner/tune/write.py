"""`provision tune --write`: the winner's flags into the spec as the instance's options, with a comment
naming the measurement — an exact edit of the spec's text (the rest of the file, its comments and
layout, stays as it was), then the new text validated like any spec before it replaces the file.

The edit finds the instance through YAML's own node positions (yaml.compose): block or flow style,
with or without an `options:` mapping. A comment line `# provision tune …` goes above `options:` (a
flow-style instance: above its `- {…}` line); one left there by an earlier run is replaced.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import yaml

from provisioner.base.files import write_file
from provisioner.spec import Spec, load_spec

COMMENT = "# provision tune"


class WriteError(ValueError):
    """The spec cannot be edited as asked; the message says why and what to do."""


def write_winner(spec_path: Path, instance_name: str, changes: dict[str, Any], comment: str) -> Spec:
    """Set `changes` (a key → value; None: removed) in the instance's options, write the file, return
    the spec it now is. Nothing is written when the result would not validate."""
    return _write_validated(spec_path, edit_options(spec_path.read_text(encoding="utf-8"), instance_name, changes,
                                                    comment))


def write_instance_key(spec_path: Path, instance_name: str, key: str, value: Any) -> Spec:
    """Set the instance's `key` to `value` (flow style, on the key's own line), write the file, return the spec it
    now is; nothing is written when the result would not validate."""
    return _write_validated(spec_path, edit_key(spec_path.read_text(encoding="utf-8"), instance_name, key, value))


def edit_key(text: str, instance_name: str, key: str, value: Any) -> str:
    """The spec text with the instance's `key` set to `value`: its value replaced where the key is there, else a
    line added after the instance's last one (a flow-style instance: `, key: value` before its closing brace)."""
    instance = _instance_node(yaml.compose(text), instance_name)
    found = next(((name, node) for name, node in instance.value if name.value == key), None)
    if found is not None:  # from the end of the key to the end of its value: `: {…}`
        name, node = found
        start, end, new = name.end_mark.index, _node_end(text, node), f": {_flow(value)}"
    elif instance.flow_style:
        start = end = text.rindex("}", 0, instance.end_mark.index)
        new = f", {key}: {_flow(value)}"
    else:
        start = end = _line_end(text, _node_end(text, instance.value[-1][1]))
        new = f"\n{' ' * instance.value[0][0].start_mark.column}{key}: {_flow(value)}"
    return text[:start] + new + text[end:]


def _node_end(text: str, node: yaml.Node) -> int:
    """Where the node's own text ends: a block collection's end mark is at the next token, past the blank and
    the indentation after its last value."""
    index = node.end_mark.index
    while index > node.start_mark.index and text[index - 1] in " \n":
        index -= 1
    return index


def _write_validated(spec_path: Path, edited: str) -> Spec:
    with tempfile.NamedTemporaryFile("w", suffix=".yml", dir=spec_path.parent, delete=False,
                                     encoding="utf-8") as handle:
        handle.write(edited)
    try:
        spec = load_spec(handle.name)  # SpecError: the file is left as it was
    finally:
        Path(handle.name).unlink()
    write_file(spec_path, edited.encode("utf-8"))
    return spec


def edit_options(text: str, instance_name: str, changes: dict[str, Any], comment: str) -> str:
    """The spec text with the instance's options changed (module docstring)."""
    comment_line = f"{COMMENT} {comment}".replace("\n", " ")
    instance = _instance_node(yaml.compose(text), instance_name)
    options_key, options = next(((key, value) for key, value in instance.value if key.value == "options"),
                                (None, None))
    if options is not None and not isinstance(options, yaml.MappingNode):
        raise WriteError(f"instance {instance_name}: options is not a mapping — fix the spec first")
    current = next(item for item in yaml.safe_load(text)["instances"] if item.get("name") == instance_name).get("options")
    merged = _merged(current or {}, changes)
    edits: list[tuple[int, int, str]] = []  # (start, end, new text), applied from the end
    if instance.flow_style:
        if options is not None:
            edits.append((options.start_mark.index, options.end_mark.index, _flow(merged)))
        else:
            close = text.rindex("}", 0, instance.end_mark.index)
            edits.append((close, close, f", options: {_flow(merged)}"))
        line_start = text.rfind("\n", 0, instance.start_mark.index) + 1
        edits.append(_comment_edit(text, line_start, comment_line))
    elif options is None:
        column = instance.value[0][0].start_mark.column
        end = _line_end(text, _node_end(text, instance.value[-1][1]))
        indent = " " * column
        edits.append((end, end, f"\n{indent}{comment_line}\n{indent}options:{_block(merged, column + 2)}"))
    elif options.flow_style or not options.value:
        edits.append((options.start_mark.index, options.end_mark.index, _flow(merged)))
        edits.append(_comment_edit(text, options_key.start_mark.index - options_key.start_mark.column, comment_line))
    else:
        column = options.value[0][0].start_mark.column
        for key, value in options.value:
            flag = key.value.replace("_", "-")
            if flag in _normalized(changes):
                new = _normalized(changes)[flag]
                if new is None:  # the key's whole line(s) go
                    start = key.start_mark.index - key.start_mark.column
                    edits.append((start, _line_end(text, value.end_mark.index) + 1, ""))
                else:
                    edits.append((value.start_mark.index, value.end_mark.index, _flow(new)))
        present = {key.value.replace("_", "-") for key, _ in options.value}
        added = {flag: value for flag, value in _normalized(changes).items() if flag not in present and value is not None}
        if added:
            end = _line_end(text, options.value[-1][1].end_mark.index)
            edits.append((end, end, _block(added, column)))
        edits.append(_comment_edit(text, options_key.start_mark.index - options_key.start_mark.column, comment_line))
    for start, end, new in sorted(edits, key=lambda edit: (edit[0], edit[1]), reverse=True):
        text = text[:start] + new + text[end:]
    return text


def _instance_node(root: yaml.Node | None, name: str) -> yaml.MappingNode:
    instances = next((value for key, value in (root.value if isinstance(root, yaml.MappingNode) else [])
                      if key.value == "instances"), None)
    for node in instances.value if isinstance(instances, yaml.SequenceNode) else []:
        if isinstance(node, yaml.MappingNode) and any(key.value == "name" and getattr(value, "value", None) == name
                                                      for key, value in node.value):
            return node
    raise WriteError(f"no instance '{name}' written in the spec's instances: — --write edits the instance where "
                     "the spec lists it")


def _comment_edit(text: str, line_start: int, comment_line: str) -> tuple[int, int, str]:
    """A comment line at line_start's indentation, replacing one an earlier run left just above."""
    indent = len(text[line_start:]) - len(text[line_start:].lstrip(" "))
    previous_start = text.rfind("\n", 0, max(line_start - 1, 0)) + 1
    previous = text[previous_start:line_start]
    if line_start and previous.strip().startswith(COMMENT):
        return previous_start, line_start, " " * indent + comment_line + "\n"
    return line_start, line_start, " " * indent + comment_line + "\n"


def _line_end(text: str, index: int) -> int:
    """The index of the newline ending the line that `index` is on (its last character when it ends one)."""
    if index > 0 and text[index - 1] == "\n":
        index -= 1
    end = text.find("\n", index)
    return len(text) if end < 0 else end


def _normalized(options: dict[str, Any]) -> dict[str, Any]:
    return {key.replace("_", "-"): value for key, value in options.items()}


def _merged(current: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    changed = _normalized(changes)
    merged = {key: value for key, value in current.items() if key.replace("_", "-") not in changed}
    merged.update({key: value for key, value in changed.items() if value is not None})
    return merged


def _flow(value: Any) -> str:
    """One value as YAML flow text: 8192, true, interactivity, [1, 2], {a: 1}."""
    return yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=2**31).strip().removesuffix("\n...")


def _block(mapping: dict[str, Any], column: int) -> str:
    """`key: value` lines at `column`, each starting with a newline."""
    return "".join(f"\n{' ' * column}{key}: {_flow(value)}" for key, value in mapping.items())
