"""Secrets never shown: the one place that knows where they hide in command lines, environments and files.

Every output that shows a command line, an environment or a file's content (plan, apply, audit,
bench) passes it through here. What counts as a secret:
  - the values of vLLM's secret flags: `--api-key K1 K2 …` (nargs='+': every word up to the next
    `-…` option), `--api-key=K`, `--hf-token …`; any `--…-key`/`--…-token`/`--…-secret`/
    `--…password` flag (vLLM also takes `--api_key`); quoted or not, also inside `bash -c '…'`;
  - the values of variables and keys whose names hold secrets (`is_secret_name`): `VLLM_API_KEY=…`
    in a unit's Environment=, an env file, /proc/<pid>/environ (NUL-separated), `export …`, YAML
    `api-key: …`, JSON `"HF_TOKEN": "…"`, Python reprs `'api_key': ['…']`;
  - credentials: `Authorization: Bearer …` (or Basic), a bare `Bearer …`, a URL's password;
  - every value the spec declares secret (`declare_secret`: an instance's API key, its env values from
    `{file: …}`, `{env: …}` or `!vault`), wherever it appears, whatever its name.

`read_api_key` reads an instance's key file as the roles read it; `read_secret` a declared secret's value
as the roles' lookups read it. `redact_argv` works on a split command
line word by word; `redact` on any text (it finds the secret
values with the same rules, then replaces each wherever it occurs, whatever the quoting);
`redact_data` on JSON-able data. A text without secrets comes back unchanged. `holds_secret` says whether a
text holds one, a declared one given by its digest (`declared_digests`: the audit's checks are never handed a value).
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
from collections.abc import Iterable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from provisioner.base.module_utils import value_rules

REDACTED = "<redacted>"
# names whose values are secrets: VLLM_API_KEY, HF_TOKEN, HUGGING_FACE_HUB_TOKEN, *_TOKEN, *_KEY,
# *_SECRET, *_PASS, *_PAT, *_CREDENTIAL(S), *PASSWORD (compared upper-case, dashes as underscores:
# `--api-key` → API_KEY)
SECRET_NAME = re.compile(r"(^|_)(TOKEN|KEY|APIKEY|SECRET|PASS|PAT|CREDENTIALS?)$|PASSWORD$|PASSWD$")
ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", re.S)
VALUE = r"""(\[[^\]\n]*\]|'[^'\n]*'|"[^"\n]*"|[^\s,;}\]"'\x00|&()<>]+)"""
# NAME=value and --name=value anywhere; "NAME": value and 'name': ['v1', 'v2'] (JSON, Python reprs)
# anywhere; NAME: value as a YAML key (at the start of a line, or of a list item)
KEY_VALUE = re.compile(
    r"""(?=(?<![\w-])(-{0,2}[A-Za-z_][\w-]*)[ \t]*=[ \t]*""" + VALUE + ")"
    r"""|(?=['"]([A-Za-z_][\w-]*)['"][ \t]*:[ \t]*""" + VALUE + ")"
    r"""|^[ \t]*(?:-[ \t]+)?([A-Za-z_][\w-]*)[ \t]*:[ \t]+""" + VALUE)
# a word starting with one ends a secret flag's values (a shell's operators, a remark in parentheses)
SHELL_OPERATORS = "();<>|&"
QUOTED = re.compile(r"""'([^']*)'|"([^"]*)"|([^\s,\[\]'"]+)""")
CREDENTIALS = re.compile(
    r"""(?i)\bauthorization['"]?[ \t]*[:=][ \t]*['"]?(?:(?:bearer|basic|token)[ \t]+)?([^\s'",;}\x00]+)"""
    r"""|\bbearer[ \t]+([A-Za-z0-9._~+/=-]+)"""
    r"""|://[^/\s:@'"]+:([^/\s@'"]+)@""")  # a password in a URL: ssh://user:PASSWORD@host
# what may stand next to a secret where it is replaced in a text (not part of a longer word)
BOUNDED = r"(?<![\w.+/-]){}(?![\w.+/-])"


# the values the spec declares secret (`declare_secret`): redacted wherever they appear
_declared: set[str] = set()


def declare_secret(value: str) -> None:
    """Redact `value` from now on wherever it appears, whatever names it (the spec declared it secret)."""
    if value.strip():
        _declared.add(value)


def declared_digests() -> list[tuple[int, str]]:
    """(length, sha256) of each declared secret: what the audit's checks look for in a text
    without being handed the secret itself (`holds_secret`)."""
    return sorted((len(value), hashlib.sha256(value.encode()).hexdigest()) for value in _declared)


def holds_secret(text: str, digests: Iterable[tuple[int, str]] = (), by_rules: bool = True) -> bool:
    """Whether `text` holds a secret: one the rules find (`by_rules`: they read configuration and command lines,
    not a program's code), or a declared one given by its `declared_digests`."""
    if by_rules and secrets_in(text):
        return True
    wanted = {tuple(digest) for digest in digests}
    return any(hashlib.sha256(text[start:start + length].encode()).hexdigest() == digest
               for length, digest in wanted for start in range(len(text) - length + 1))


def forget_declared_secrets() -> None:
    """No declared secret any more (a process that reads another spec; tests)."""
    _declared.clear()


def is_secret_name(name: str) -> bool:
    """A variable, key or flag name whose value is a secret: VLLM_API_KEY, hf-token, --api-key, db_password…"""
    return bool(SECRET_NAME.search(name.strip("'\"").lstrip("-").replace("-", "_").upper()))


def is_secret_flag(word: str) -> bool:
    """`--api-key`, `--api_key`, `--hf-token`…: a long option whose values are secrets."""
    return word.startswith("--") and is_secret_name(word)


def redact_argv(argv: Iterable[str]) -> list[str]:
    """A split command line with every secret replaced by REDACTED, word for word (same length)."""
    return [_replace_anywhere(shown, _declared) for shown, _ in _scan_words(list(argv))]


def shown_command(argv: Iterable[str]) -> str:
    """A command line for a report: `vllm serve m --api-key <redacted> <redacted> --port 1`."""
    return " ".join(redact_argv(argv))


def redact_environment(environment: Mapping[str, Any]) -> dict[str, Any]:
    """NAME → value, the values of secret names (and secrets inside other values) redacted."""
    return {name: redact_value(name, value) for name, value in environment.items()}


def redact_value(name: str, value: Any) -> Any:
    """The value of variable or key `name` as shown: REDACTED when the name holds a secret (a value
    already redacted, e.g. the plan's `<redacted: 12 bytes from FILE>`, stays as it is)."""
    if is_secret_name(name) and value not in (None, "", []) and not (isinstance(value, str) and not _unredacted(value)):
        return REDACTED
    return redact_data(value)


def redact_data(data: Any) -> Any:
    """JSON-able data with its secrets redacted: values of secret keys, argv lists, strings."""
    if isinstance(data, Mapping):
        return {key: redact_value(key, value) if isinstance(key, str) else redact_data(value)
                for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        items = list(data)
        if items and all(isinstance(item, str) for item in items):
            items = redact_argv(items)
        return [redact_data(item) for item in items]
    if isinstance(data, str):
        return redact(data)
    return data


def redact(text: str) -> str:
    """Any text (a command line, a unit or env file, a diff, a log, program output) with every secret
    replaced by REDACTED; a text without secrets comes back as it was."""
    if not text:
        return text
    text = _replace_anywhere(text, _declared)
    found = secrets_in(text)
    if not found:
        return text
    shown = _replace(text, found)
    if not secrets_in(shown):
        return shown
    # a secret written differently from how it reads (escaped quotes…): its lines rebuilt from their words
    lines = []
    for line in shown.split("\n"):
        if secrets_in(line):
            line = " ".join(shlex.quote(word) for word in redact_argv(_words(line)))
            line = line if not secrets_in(line) else REDACTED
        lines.append(line)
    return "\n".join(lines)


def secrets_in(text: str) -> set[str]:
    """The secret values that `text` holds (by the rules above)."""
    found: set[str] = set()
    for line in _logical_lines(text):
        found.update(_line_secrets(line))
    return found


@lru_cache(maxsize=65536)
def _line_secrets(line: str) -> frozenset[str]:
    """The secret values of one logical line: the rules are a function of the text alone, and the lines of
    a fleet's files repeat from host to host (a plan of 200 hosts reads each distinct line once)."""
    found: set[str] = set()
    for _, values in _scan_words(_words(line)):
        found.update(values)
    found.update(_key_value_secrets(line))
    return frozenset(value for value in found if _unredacted(value))


# --------------------------------------------------------------------------- the rules


def _scan_words(words: list[str]) -> list[tuple[str, list[str]]]:
    """Per word: (what to show, the secret values in it). A secret flag's values run to the next `-…` word."""
    scanned: list[tuple[str, list[str]]] = []
    in_values = False
    for previous, word in zip(["", *words], words):
        if in_values and not word.startswith(("-", *SHELL_OPERATORS)):
            value = word.rstrip(SHELL_OPERATORS)  # `--api-key k; next command`
            scanned.append((REDACTED + word[len(value):], [value]))
            in_values = value == word
            continue
        in_values = False
        name, equals, value = word.partition("=")
        if is_secret_flag(name):
            if equals:
                scanned.append((f"{name}={REDACTED}{value[len(_unterminated(value)):]}", [_unterminated(value)]))
            else:
                scanned.append((word, []))
                in_values = True
            continue
        nested = previous == "-c" or (any(character.isspace() for character in word) and not ASSIGNMENT.fullmatch(word))
        # a nested command line (bash -c '… --api-key K …'), or NAME=value
        values = sorted(secrets_in(word)) if nested else _assignment_secrets(word)
        scanned.append((_replace(word, set(values)) if values else word, values))
    return scanned


def _assignment_secrets(word: str) -> list[str]:
    """NAME=value with a secret NAME (also nested: `Environment=VLLM_API_KEY=k`) → [value]."""
    match = ASSIGNMENT.fullmatch(word)
    while match:
        name, value = match.groups()
        if is_secret_name(name):
            return [_unterminated(value)]
        match = ASSIGNMENT.fullmatch(value)
    return []


def _unterminated(value: str) -> str:
    """A value without the shell operator that ends it (`k;` → `k`)."""
    return value.rstrip(SHELL_OPERATORS) or value


def _key_value_secrets(line: str) -> set[str]:
    found = set()
    for match in KEY_VALUE.finditer(line):
        groups = [group for group in match.groups() if group is not None]
        if len(groups) == 2 and is_secret_name(groups[0]):
            found.update(_listed(groups[1]))
    for credentials in CREDENTIALS.findall(line):
        found.update(value for value in credentials if value)
    return found


def _listed(value: str) -> list[str]:
    """`'k'` → [k]; `['k1', "k2"]` → [k1, k2]; `k` → [k]."""
    if value.startswith("["):
        return [next(part for part in parts if part) for parts in QUOTED.findall(value[1:-1]) if any(parts)]
    if value[:1] in "'\"" and value[-1:] == value[:1] and len(value) > 1:
        return [value[1:-1]]
    return [value]


def _words(line: str) -> list[str]:
    """A line split as a shell would (quotes, escapes); as whitespace where it is no valid shell text."""
    try:
        return shlex.split(line)
    except ValueError:
        return [word.strip("'\"") for word in line.split()]


def _logical_lines(text: str) -> list[str]:
    """Lines, backslash continuations joined, NUL-separated entries (/proc/<pid>/environ) apart;
    a diff line also without its +/- mark."""
    lines = []
    for line in re.split(r"\n|\x00", re.sub(r"\\\n", " ", text)):
        lines.append(line)
        if line[:1] in "+-" and line[1:2] != "-":
            lines.append(line[1:])
    return lines


def _unredacted(value: str) -> bool:
    """A value with more than redactions and punctuation left in it (`[<redacted>],`: none)."""
    return bool(re.sub(r"<redacted[^>]*>?", "", value).strip("[](){},;:'\" \t"))


def _replace(text: str, values: set[str]) -> str:
    for value in sorted(values, key=len, reverse=True):
        text = re.sub(BOUNDED.format(re.escape(value)), REDACTED, text)
    return text


def _replace_anywhere(text: str, values: Iterable[str]) -> str:
    """`text` with each value in it replaced, also inside a longer word (a declared secret shows nowhere)."""
    for value in sorted(values, key=len, reverse=True):
        if value in text:
            text = text.replace(value, REDACTED)
    return text


def read_secret(source: Mapping[str, str], name: str = "NAME") -> str:
    """A declared secret's value as the roles' lookups read it: `{file: PATH}` as Ansible's file lookup
    (`read_api_key`), `{env: NAME}` the controller's environment variable, `{vault: TEXT}` decrypted with
    ansible-playbook's vault password (provisioner/base/vault.py; `name` goes into its fix). Raises OSError,
    UnicodeDecodeError, KeyError for an unset variable, or vault.VaultProblem."""
    if source.get("file") is not None:
        return read_api_key(source["file"])
    if source.get("vault") is not None:
        from provisioner.base.vault import decrypt  # Ansible's vault library, only for a vault-encrypted secret

        return decrypt(source["vault"], name)
    return os.environ[source["env"]]


def read_api_key(path: str | Path) -> str:
    """An API key file's key as Ansible's file lookup reads it (UTF-8, trailing whitespace off), which is
    what the roles write into an env file and a health check. Only a regular file, and only its first 64 KiB
    (value_rules.read_small_file: a FIFO or /dev/zero is refused, never read). Raises OSError or
    UnicodeDecodeError."""
    return value_rules.read_small_file(str(Path(path).expanduser())).decode("utf-8").rstrip()
