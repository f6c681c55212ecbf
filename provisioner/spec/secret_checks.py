"""Secrets by declaration: an instance's env value is secret because the spec says where it comes from
(`{file: PATH}` or `{env: NAME}`, models.SecretValue) or holds it vault-encrypted (`!vault |`, decrypted with
ansible-playbook's vault password: provisioner/base/vault.py), never in clear. These checks refuse an inline
value whose name looks secret, and a declared secret the controller cannot read or the env file cannot hold;
`declare_secrets` hands every declared value to provisioner/base/secrets.py, which redacts it wherever it appears.
No message shows a value: they name the field and where the value comes from."""

from __future__ import annotations

import re

from provisioner.base.secrets import declare_secret, is_secret_name, read_secret
from provisioner.base.vault import VaultProblem
from provisioner.spec.errors import Problem
from provisioner.spec.models import SecretValue, Spec
from provisioner.spec.parts import SpecParts, present

# what the env file's readers (systemd, podman --env-file, docker compose's env_file) all read back as written,
# unquoted: one line, no spaces, no quotes, backslashes or `$` (compose interpolates it), not starting with `#`
ENV_FILE_VALUE_RE = re.compile(r"""^[^\s'"\\$`#][^\s'"\\$`]*$""")


def inline_secret_problem(name: str, value: str | SecretValue) -> str | None:
    """An env value written in the spec whose name says it is a secret: refused, with the syntax to use."""
    if not isinstance(value, str) or not is_secret_name(name):
        return None
    return (f"'{name}' looks like a secret, and its value is written in the spec (plan, the inventory and the unit "
            f"would hold it in clear) — declare where it comes from instead: `{name}: {{file: "
            f"secrets/{name.lower()}}}` (a file beside the spec, mode 0600), `{name}: {{env: {name}}}` (the "
            f"controller's environment when plan, apply and audit run) or the value encrypted: `{name}: !vault |` "
            f"as `ansible-vault encrypt_string --name {name}` prints it")


def secret_source_problems(parts: SpecParts) -> list[Problem]:
    """Each declared secret can be read on the controller and written unquoted into the env file. A missing,
    empty or unreadable file is cross_checks' `_missing_files`'s."""
    problems = []
    for index, instance in present(parts.instances):
        for name, source in instance.secret_env.items():
            message = _source_problem(name, source)
            if message:
                problems.append(Problem(f"instances[{index}].env.{name}", message))
    return problems


def _source_problem(name: str, source: SecretValue) -> str | None:
    where = f"the file {source.file}" if source.file else f"the controller's environment variable {source.env}" \
        if source.env else "the !vault block"
    try:
        value = read_secret(source.model_dump(), name)
    except VaultProblem as problem:
        return f"vault-encrypted, and {problem}"
    except KeyError:
        return (f"{source.env} is not set in the controller's environment — export it before running provision "
                "(and ansible-playbook), or declare {file: PATH}")
    except (OSError, UnicodeDecodeError):
        return None  # _missing_files names the file
    if not ENV_FILE_VALUE_RE.match(value):
        return (f"the value in {where} is not one line without spaces, quotes, backslashes, `$` or a leading `#` "
                "(it goes unquoted into the env file that systemd, podman and docker read) — put the value alone "
                "on one line")
    return None


def declared_secret_values(spec: Spec) -> list[str]:
    """Every value the spec declares secret that the controller can read: the instances' API keys and their
    env secrets."""
    values = []
    for instance in spec.instances:
        sources = [source.model_dump() for source in instance.secret_env.values()]
        if instance.api_key_file:
            sources.append({"file": instance.api_key_file})
        for source in sources:
            try:
                values.append(read_secret(source))
            except (OSError, UnicodeDecodeError, KeyError, VaultProblem):
                continue  # reported by the checks above
    return values


def declare_secrets(spec: Spec) -> None:
    """From now on, every output of this process redacts the spec's declared secrets by value."""
    for value in declared_secret_values(spec):
        declare_secret(value)

