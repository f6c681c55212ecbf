"""The formats of the files the roles render, parsed in one place: units and quadlets (as systemd reads
them), compose files, environment files and sysctl.d files. Plan, audit and the suite read them here.
"""

from __future__ import annotations

import shlex

import yaml


def sysctl_settings(content: str) -> dict[str, str]:
    """`key = value` lines (sysctl.d syntax: # and ; comments, a leading - ignores errors; the last one wins)."""
    settings = {}
    for line in content.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";")) and "=" in line:
            key, _, value = line.partition("=")
            settings[key.strip().lstrip("-")] = " ".join(value.split())
    return settings


def unit_settings(content: str, section: str) -> list[tuple[str, str]]:
    """(key, value) of one section of a unit file, line continuations joined, comments skipped."""
    settings, current = [], None
    for line in content.replace("\\\n", " ").splitlines():
        line = line.strip()
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
        elif current == section and "=" in line and not line.startswith(("#", ";")):
            key, _, value = line.partition("=")
            settings.append((key.strip(), " ".join(value.split())))
    return settings


def exec_argv(command: str) -> list[str]:
    """An ExecStart= command as the process gets it: systemd quoting, $$ and %% undone."""
    return [word.replace("$$", "$").replace("%%", "%") for word in shlex.split(command)]


def unit_environment(unit: str) -> dict[str, str]:
    """The variables set by the Environment= lines of a unit or a quadlet, read as systemd reads them.

    systemd undoes %% first, then splits the line into words (quotes and C escapes undone); a line
    with an unbalanced quote is ignored, as systemd ignores it. A quadlet's [Container] values go into
    the podman command line of its unit's ExecStart=, where systemd also turns $$ into $.
    """
    environment = {}
    section = ""
    for line in unit.splitlines():
        if line.startswith("[") and line.rstrip().endswith("]"):
            section = line.strip()
        elif line.startswith("Environment="):
            setting = line.removeprefix("Environment=").replace("%%", "%")
            for assignment in systemd_words(setting) or []:
                key, _, value = assignment.partition("=")
                environment[key] = value.replace("$$", "$") if section == "[Container]" else value
    return environment


_C_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
              "\\": "\\", '"': '"', "'": "'", "s": " "}


def systemd_words(text: str) -> list[str] | None:
    """The words of a unit setting as systemd's extract_first_word(UNQUOTE|CUNESCAPE) splits them;
    None where systemd refuses the line (an unbalanced quote, an unknown escape). The \\x, \\u and
    octal escapes are not read: the templates never write them."""
    words: list[str] = []
    word: list[str] | None = None  # None: between words
    quote = ""
    characters = iter(text)
    for char in characters:
        if char == "\\":
            escaped = _C_ESCAPES.get(next(characters, ""))
            if escaped is None:
                return None
            word = (word or []) + [escaped]
        elif quote and char == quote:
            quote = ""
        elif quote:
            word.append(char)
        elif char in "\"'":
            quote, word = char, word or []
        elif char in " \t":
            if word is not None:
                words.append("".join(word))
            word = None
        else:
            word = (word or []) + [char]
    if quote:
        return None
    if word is not None:
        words.append("".join(word))
    return words


def compose_environment(compose: str) -> dict[str, str]:
    """The variables a compose file's service sets (`environment:`), $$ undone."""
    service = yaml.safe_load(compose)["services"]["vllm"]
    return {key: str(value).replace("$$", "$") for key, value in (service.get("environment") or {}).items()}


def env_file_environment(content: str) -> dict[str, str]:
    """The variables of an EnvironmentFile= (KEY=VALUE lines; comments skipped)."""
    environment = {}
    for line in content.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            environment[key.strip()] = value.strip()
    return environment
