"""Spec text → Python data: UTF-8 only, strict YAML (no duplicate keys), aliases bounded.

Every failure is a `SpecError` whose problem names the line and column (or the byte offset) and the fix.
"""

from __future__ import annotations

from typing import Any

import yaml

from provisioner.spec.errors import Problem, SpecError


def parse_yaml(text: str, source_name: str = "spec") -> Any:
    """YAML → Python data; syntax errors and duplicate keys become a `SpecError` with line:column."""
    try:
        return _load_bounded(text, source_name)
    except yaml.reader.ReaderError as error:
        line, column = _line_column(text, error.position)
        raise SpecError([Problem(
            f"{source_name}:{line}:{column}",
            f"character #x{error.character:04x} is not allowed in YAML — remove it (a control character "
            "or a stray byte; save the spec as plain UTF-8 text)")]) from None
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f"{source_name}:{mark.line + 1}:{mark.column + 1}" if mark else source_name
        what = error.problem or "invalid YAML"
        if error.context:
            what = f"{what} ({error.context})"
        fix = "remove one of them" if what.startswith("duplicate key") else \
            "remove the tag" if what.startswith("unknown tag") else "fix the YAML syntax"
        raise SpecError([Problem(where, f"{what} — {fix}")]) from None
    except RecursionError:
        raise SpecError([Problem(source_name, "values nested too deeply to read — a spec nests a few levels; "
                                              "fix the brackets")]) from None


class _NoDuplicateKeys(yaml.constructor.SafeConstructor):
    """SafeConstructor rejecting duplicate keys instead of keeping the last one silently.

    Merge keys (`<<: *defaults`) work as in `yaml.safe_load`: the mapping's own keys override the
    merged ones (that is no duplicate); a key written twice in the mapping itself still is."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # flattened by SafeConstructor.construct_mapping
            key = self.construct_object(key_node, deep=deep)
            try:
                repeated = key in seen
            except TypeError:
                continue  # a list or mapping as a key: SafeConstructor says "found unhashable key"
            if repeated:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key '{key}'", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


VAULT_TAG = "!vault"


def _construct_vault(loader: yaml.constructor.SafeConstructor, node: yaml.Node) -> dict[str, str]:
    """`NAME: !vault |` then the $ANSIBLE_VAULT block, as `ansible-vault encrypt_string --name NAME` prints it:
    the secret declared as `{vault: TEXT}` (models.SecretValue), whatever field it is written in (a field that
    takes no mapping refuses it)."""
    if not isinstance(node, yaml.ScalarNode):
        raise yaml.constructor.ConstructorError(
            None, None, "!vault takes the text `ansible-vault encrypt_string` prints, not a list or mapping",
            node.start_mark)
    return {"vault": loader.construct_scalar(node)}


def _unknown_tag(loader: yaml.constructor.SafeConstructor, node: yaml.Node) -> None:
    """A tag the spec does not take (`!!python/object`, Ansible's `!unsafe`…): refused, named, at its line."""
    raise yaml.constructor.ConstructorError(
        None, None, f"unknown tag '{node.tag}' (the spec takes only {VAULT_TAG}, for a value `ansible-vault "
                    "encrypt_string` encrypted)", node.start_mark)


_NoDuplicateKeys.add_constructor(VAULT_TAG, _construct_vault)
_NoDuplicateKeys.add_constructor(None, _unknown_tag)


class _StrictLoader(_NoDuplicateKeys, yaml.SafeLoader):
    """PyYAML's own parser (its messages name line and column) with the strict constructor."""

    def compose_document(self) -> yaml.Node:
        """yaml.composer.Composer.compose_document, keeping the anchors for the expansion check."""
        self.get_event()  # DocumentStartEvent
        node = self.compose_node(None, None)
        self.get_event()  # DocumentEndEvent
        self.composed_anchors, self.anchors = self.anchors, {}
        return node


if yaml.__with_libyaml__:
    class _FastStrictLoader(yaml.CSafeLoader, _NoDuplicateKeys):
        """libyaml's parser (several times faster on a fleet's spec) with the strict constructor."""


def decode_spec(raw: bytes, source_name: str = "spec") -> str:
    """The spec's bytes as UTF-8 text; other bytes become a `SpecError` naming the line and byte offset."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        column = error.start - (raw.rfind(b"\n", 0, error.start) + 1) + 1
        raise SpecError([Problem(
            f"{source_name}:{line}:{column}",
            f"byte 0x{raw[error.start]:02x} at offset {error.start} is not UTF-8 — save the spec as UTF-8 "
            "(e.g. `iconv -f latin1 -t utf-8`)")]) from None


def _line_column(text: str, position: int) -> tuple[int, int]:
    line = text.count("\n", 0, position) + 1
    return line, position - (text.rfind("\n", 0, position) + 1) + 1


# Scalars, sequences and mappings a document may expand to once its aliases are followed. A spec
# of a hundred hosts is a few thousand; "billion laughs" documents (nested aliases, each repeating
# the one before) expand to billions from a few lines, and constructing them exhausts the memory.
MAX_EXPANDED_NODES = 100_000


# Collections a value may sit in. A spec nests a dozen levels; libyaml composes nested collections by recursion
# in C, which no RecursionError stops: tens of thousands of `[` overflow the stack (a segmentation fault).
MAX_NESTING = 200
_OPENING = (yaml.SequenceStartEvent, yaml.MappingStartEvent)
_CLOSING = (yaml.SequenceEndEvent, yaml.MappingEndEvent)


def _nesting_problem(text: str, source_name: str) -> Problem | None:
    """A Problem when collections nest deeper than MAX_NESTING: counted on the parser's events (read one by
    one, no recursion), before anything is composed. A document that does not parse is left to the loader."""
    depth = 0
    try:
        for event in yaml.parse(text, Loader=yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader):
            if isinstance(event, _OPENING):
                depth += 1
                if depth > MAX_NESTING:
                    mark = event.start_mark
                    return Problem(f"{source_name}:{mark.line + 1}:{mark.column + 1}",
                                   f"values nested more than {MAX_NESTING} deep — a spec nests a few levels; fix "
                                   "the brackets")
            elif isinstance(event, _CLOSING):
                depth -= 1
    except yaml.YAMLError:
        return None
    return None


def _load_bounded(text: str, source_name: str) -> Any:
    """Compose the document (aliases stay references), refuse it if its aliases expand beyond
    MAX_EXPANDED_NODES, then construct it; as `yaml.load(text, Loader=_StrictLoader)` otherwise.
    A document libyaml reads without a problem is read by libyaml; any other is read again by PyYAML's
    own parser, whose error (or expansion problem, which names the anchor) is the one reported."""
    problem = _nesting_problem(text, source_name)
    if problem:
        raise SpecError([problem])
    if yaml.__with_libyaml__:
        loaded = _fast_load(text)
        if loaded is not _UNREAD:
            return loaded
    loader = _StrictLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        problem = _alias_expansion_problem(root, loader.composed_anchors, source_name)
        if problem:
            raise SpecError([problem])
        return loader.construct_document(root)
    finally:
        loader.dispose()


_UNREAD = object()


def _fast_load(text: str) -> Any:
    """The document as libyaml reads it, or _UNREAD where it finds any problem (PyYAML then says which)."""
    loader = _FastStrictLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        if _alias_expansion_problem(root, {}, ""):
            return _UNREAD
        return loader.construct_document(root)
    except (yaml.YAMLError, RecursionError, ValueError):
        return _UNREAD
    finally:
        loader.dispose()


def _alias_expansion_problem(root: yaml.Node, anchors: dict[str, yaml.Node], source_name: str) -> Problem | None:
    """A Problem when following the aliases would build more than MAX_EXPANDED_NODES values, or a
    value that contains itself; counted on the composed nodes (an alias is the anchored node itself)."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def expanded(node: yaml.Node) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        if id(node) in open_nodes:
            raise _SelfContaining(node)
        open_nodes.add(id(node))
        children = node.value if isinstance(node, yaml.SequenceNode) else \
            [part for pair in node.value for part in pair] if isinstance(node, yaml.MappingNode) else []
        sizes[id(node)] = 1 + sum(expanded(child) for child in children)
        open_nodes.discard(id(node))
        return sizes[id(node)]

    def anchor_of(node: yaml.Node) -> str:
        name = next((name for name, anchored in anchors.items() if anchored is node), None)
        mark = node.start_mark
        return f"&{name} (line {mark.line + 1})" if name else f"the value at line {mark.line + 1}"

    try:
        total = expanded(root)
    except _SelfContaining as error:
        return Problem(source_name, f"{anchor_of(error.node)} contains an alias of itself, which expands without end "
                                    "— write the repeated part out")
    if total <= MAX_EXPANDED_NODES or total == len(sizes):  # no alias repeats anything: as long as the text
        return None
    biggest = max(anchors.values(), key=lambda node: sizes.get(id(node), 0))
    return Problem(source_name, f"its aliases expand to {total:,} values (at most {MAX_EXPANDED_NODES:,}; "
                                f"{anchor_of(biggest)} alone is {sizes[id(biggest)]:,}): a \"billion laughs\" "
                                "document — write the repeated parts out, or alias fewer nested parts")


class _SelfContaining(Exception):
    def __init__(self, node: yaml.Node):
        self.node = node
