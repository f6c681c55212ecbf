"""Text that reaches a host: what no quoting can carry into the files and command lines the roles write.

Every string of the spec ends up in a file a role writes (a unit, a quadlet, a compose or config file,
the sysctl file, the inventory) or on a command line. The templates quote each value for its
destination; what no quoting can carry is refused here, for every string field alike: control
characters and the other line breaks (our own parsers split lines with str.splitlines), and per field
what its destination cannot take.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from provisioner.base.secrets import read_api_key
from provisioner.spec.errors import Problem
from provisioner.spec.messages import path_of
from provisioner.spec.models import Host, SecretValue
from provisioner.spec.parts import SpecParts, keyed_problems, present

# the line breaks str.splitlines splits on that are not control characters
_LINE_SEPARATORS = {"\u2028": "a line separator", "\u2029": "a paragraph separator"}
_LINE_BREAKS = "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"
_CHARACTER_NAMES = {"\n": "a newline", "\r": "a carriage return", "\t": "a tab", "\0": "a NUL character",
                    "\v": "a vertical tab", "\f": "a form feed", "\x85": "a next-line character", **_LINE_SEPARATORS}

# Where a field's text goes (by the field's name under hosts[i] / instances[i]), for the messages.
_DESTINATIONS = {
    "model": "the unit (Description=, ExecStartPost=) and the config file",
    "options": "the config file (and the unit's ExecStartPost= for served-model-name)",
    "env": "the unit (Environment=)",
    "container": "the quadlet or compose file",
    "settings": "the sysctl file",
    "ssh": "the inventory and ssh's command line",
    "vllm": "the inventory and the install's command lines",
    "gpus": "the inventory",
}

USER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*\$?$")
INSTALL_PATH_RE = re.compile(r"^/[A-Za-z0-9._+@/-]*$")
API_KEY_RE = re.compile(r"^[A-Za-z0-9._~+/=-]+$")  # roles/vllm_service/tasks/preflight.yml: one env-file line


def text_problems(parts: SpecParts, check_files: bool = True) -> list[Problem]:
    """Every string of the hosts and instances that passed pass 1, checked for where it goes."""
    problems = []
    for section, items in (("hosts", parts.hosts), ("instances", parts.instances)):
        for index, item in present(items):
            for loc, text in _strings_of(item, (section, index)):
                message = _character_problem(text, _DESTINATIONS.get(loc[2], "the files the roles write"))
                if message:
                    problems.append(Problem(path_of(loc), message))
    flagged = {problem.path for problem in problems}  # one problem per field: its characters first
    for index, host in present(parts.hosts):
        problems += [problem for problem in _host_text_problems(index, host) if problem.path not in flagged]
    if check_files:
        problems += _api_key_problems(parts)
    return problems


def _strings_of(value: Any, loc: tuple) -> Iterator[tuple[tuple, str]]:
    """(location, text) of every string in a model's fields, lists and mappings (keys too)."""
    if isinstance(value, str):
        yield loc, value
    elif isinstance(value, BaseModel):
        for name in type(value).model_fields:
            if isinstance(value, SecretValue) and name == "vault":
                continue  # ciphertext in lines, decrypted and checked apart (secret_checks); written nowhere as is
            yield from _strings_of(getattr(value, name), (*loc, name))
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings_of(key, (*loc, key))
            yield from _strings_of(item, (*loc, key))
    elif isinstance(value, (list, tuple)):
        for position, item in enumerate(value):
            yield from _strings_of(item, (*loc, position))


def _character_problem(text: str, destination: str) -> str | None:
    for char in text:
        category = unicodedata.category(char)
        if char in _LINE_BREAKS:
            return (f"contains {_character_name(char)}, which would end its line in {destination} "
                    "— remove it")
        if char == "\t":
            return f"contains {_character_name(char)} — write spaces instead"
        if category == "Cc":
            return f"contains {_character_name(char)}, a control character {destination} cannot hold — remove it"
        if category == "Cs":
            return f"contains {_character_name(char)}, half of a character (a lone surrogate) — write the whole character"
    return None


def _character_name(char: str) -> str:
    code = f"U+{ord(char):04X}"
    return f"{_CHARACTER_NAMES[char]} ({code})" if char in _CHARACTER_NAMES else code


def _host_text_problems(index: int, host: Host) -> list[Problem]:
    where = f"hosts[{index}]"
    problems = []
    if not USER_RE.match(host.ssh.user):
        problems.append(Problem(f"{where}.ssh.user", f"'{host.ssh.user}' is not a user name — use letters, digits "
                                "and '_.-', starting with a letter or '_' (e.g. root, ubuntu)"))
    if not INSTALL_PATH_RE.match(host.vllm.install_path):
        problems.append(Problem(f"{where}.vllm.install_path", f"'{host.vllm.install_path}' cannot be written "
                                "unquoted on the install's command line (`python3 -m venv <path>/venv`) — use "
                                "letters, digits and . _ + @ - / only"))
    for field, path in (("key", host.ssh.key), ("known_hosts", host.ssh.known_hosts)):
        if path and '"' in path:  # ssh_config and Ansible's ssh arguments quote these paths with "
            problems.append(Problem(f"{where}.ssh.{field}", f"'{path}' has a double quote, which ssh's options "
                                    "cannot hold — rename the file"))
    if host.vllm.wheelhouse and any(char in host.vllm.wheelhouse for char in "*?[]"):
        problems.append(Problem(f"{where}.vllm.wheelhouse", f"'{host.vllm.wheelhouse}' has a glob character "
                                "(* ? [ ]); the roles find its wheels with a glob pattern — rename the folder"))
    if host.vllm.index_url is not None and (not host.vllm.index_url or any(char.isspace() for char in host.vllm.index_url)):
        problems.append(Problem(f"{where}.vllm.index_url", "a URL has no spaces — write a space as %20, or null for PyPI"))
    problems += keyed_problems(("hosts", index, "settings", "sysctls"), host.settings.sysctls, _sysctl_text_problem)
    return problems


def _sysctl_text_problem(key: str, value: int | str) -> str | None:
    """The sysctl file is `key = value` lines: systemd-sysctl trims the value and the role refuses '='."""
    if not isinstance(value, str):
        return None
    if not value.strip():
        return "is empty — give the value, or remove the parameter"
    if value != value.strip():
        return f"'{value}' has spaces around it, which the sysctl file drops — remove them"
    if "=" in value:
        return f"'{value}' contains '=', which the role refuses in a sysctl file line — remove it"
    return None


def _api_key_problems(parts: SpecParts) -> list[Problem]:
    """The key goes unquoted into the env file: one line of the role's charset. Names the file, never the key."""
    problems = []
    for index, instance in present(parts.instances):
        path = instance.api_key_file
        if not path or not Path(path).is_file() or Path(path).stat().st_size == 0:
            continue  # a missing or empty file is reported by _missing_files
        try:
            key = read_api_key(path)
        except (OSError, UnicodeDecodeError):
            key = None
        if key is None or not API_KEY_RE.match(key):
            problems.append(Problem(
                f"instances[{index}].api_key_file",
                f"the key in {path} is not one line of letters, digits and . _ ~ + / = - (it goes unquoted "
                "into an env file) — put the key alone on the file's first line, without spaces or quotes"))
    return problems
