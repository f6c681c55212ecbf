"""No secret in a file others can read: the files the roles manage and every drop-in of the vLLM units.

Spec and profile modes. A file holds a secret when provisioner/base/secrets.py's rules find one in it (`VLLM_API_KEY=…`,
`--api-key …`, `*_TOKEN=…`, `*_PASS=…`, a URL's password…; not in an executable, whose code the rules do not
read) or when it holds a value the spec declares secret (its API keys, its env secrets: looked for by their
sha256, the checks are never handed them). The instances' env
files hold the secrets by design: their own rows (`UNIT: EnvironmentFile mode`, `owner`) want them 0600 root.
"""

from __future__ import annotations

from collections.abc import Iterator

from provisioner.audit.registry import check
from provisioner.base.secrets import holds_secret

CHECK = "secrets readable by others"
EXPECTED = "none (a file that holds a secret is for its owner alone: 0600)"


@check
def secrets_readable_by_others(case, facts, audit):
    """`secrets readable by others` — every file the roles manage and every drop-in of the vLLM units that holds a secret and that others may read.

    Modes: spec, profile.

    Expected `none`; actual each such file with its mode, `PATH (0644) holds a secret` (never the secret), else
    `none`. Move the secret into the instance's env file (the spec: `NAME: {file: …}` or `NAME: {env: …}`), or
    make the file 0600.
    """
    digests = case.target.get("secret_digests", [])
    exposed = [f"{path} ({mode}) holds a secret" for path, mode, text in files_read(facts)
               if readable_by_others(mode) and holds_secret(text, digests, by_rules=not executable(mode))]
    audit.expect(CHECK, EXPECTED, "; ".join(exposed) or "none", passed=not exposed)


def files_read(facts) -> Iterator[tuple[str, str, str]]:
    """(path, mode, content) of each file the audit read with its mode: the managed files, the units' drop-ins."""
    for path, found in facts.managed_files.items():
        if found is not None:
            (mode, _), text = found
            yield path, mode, text
    for unit in facts.units.values():
        for path, text in unit.dropins:
            yield path, unit.dropin_modes.get(path, "unknown"), text


def executable(mode: str) -> bool:
    """A program (wait-ready, the GPU limits script): its code is no configuration, only a declared secret counts."""
    return mode.isdigit() and bool(int(mode, 8) & 0o111)


def readable_by_others(mode: str) -> bool:
    """An octal mode (`0644`) that lets others read; an unknown one (the file could not be stat'ed) does not."""
    return mode.isdigit() and bool(int(mode, 8) & 0o004)
