"""What the user passes on to ansible-playbook (tags, -e, forks, the rollout, the lock's wait), checked before any
host is touched.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import yaml

from provisioner.base import paths
from provisioner.base.rollout import Rollout

# extra vars that would undo how ssh checks the host's key (provisioner/base/hostkeys.py): refused
TRUST_VARS = ("ansible_host_key_checking", "ansible_ssh_host_key_checking", "ansible_ssh_args",
              "ansible_ssh_common_args")


class ControlError(ValueError):
    """An option for ansible-playbook that cannot be used (an unknown tag, a bad -e): nothing was run."""


@dataclass(frozen=True)
class Controls:
    """What `provision apply` passes on to ansible-playbook, besides --check/--diff and the hosts."""

    tags: tuple[str, ...] = ()
    skip_tags: tuple[str, ...] = ()
    extra_vars: tuple[str, ...] = ()  # each VAR=VALUE (several, space-separated), YAML/JSON, or @FILE
    verbosity: int = 0
    forks: int | None = None
    become_password: str | None = field(default=None, repr=False)  # to ansible-playbook's standard input, never written
    rollout: Rollout | None = None  # --rolling: batches, a canary first (provisioner/base/rollout.py)
    wait_lock: int = 0  # seconds to wait for another run's lock: the spec's here, each host's (role apply_lock)

    def options(self) -> list[str]:
        """ansible-playbook's options for these controls (the become password is not one of them)."""
        options = [f"--tags={','.join(self.tags)}"] if self.tags else []
        options += [f"--skip-tags={','.join(self.skip_tags)}"] if self.skip_tags else []
        for extra in self.extra_vars:
            options += ["--extra-vars", extra]
        options += ["-" + "v" * min(self.verbosity, 6)] if self.verbosity else []
        options += [f"--forks={self.forks}"] if self.forks is not None else []
        # read from ansible-playbook's standard input (run_playbook writes it there)
        options += ["--become-password-file", "-"] if self.become_password is not None else []
        options += ["--extra-vars", self.rollout.extra_vars()] if self.rollout is not None else []
        options += ["--extra-vars", json.dumps({"apply_lock_wait": self.wait_lock})] if self.wait_lock else []
        return options


@functools.cache
def site_tags() -> list[str]:
    """The tags of the site playbook's roles (playbooks/site.yml), in play order."""
    tags: list[str] = []
    for role in _site_roles():
        role_tags = (role.get("tags") or []) if isinstance(role, dict) else []
        tags += [tag for tag in role_tags if tag not in tags]
    return tags


@functools.cache
def phase_tags() -> list[str]:
    """The tags of the roles' phases (sysctl_preflight, vllm_service_configure, ...: the tags on the
    imports of each site role's tasks/main.yml), in play order."""
    tags: list[str] = []
    for role in _site_roles():
        name = (role.get("role") if isinstance(role, dict) else role).rsplit(".", 1)[-1]
        for task in yaml.safe_load((paths.role_dir(name) / "tasks" / "main.yml").read_text(encoding="utf-8")) or []:
            tags += [tag for tag in task.get("tags") or [] if tag not in tags]
    return tags


def _site_roles() -> list[dict | str]:
    """The role entries of the site playbook's plays, in play order."""
    plays = yaml.safe_load((paths.PLAYBOOKS_DIR / "site.yml").read_text(encoding="utf-8")) or []
    return [role for play in plays for role in play.get("roles") or []]


def split_tags(values: Sequence[str]) -> tuple[str, ...]:
    """`--tags a,b --tags c` -> ("a", "b", "c")."""
    return tuple(dict.fromkeys(tag.strip() for value in values for tag in value.split(",") if tag.strip()))


def extra_vars_data(extra: str) -> dict:
    """What one -e value sets, read as ansible-playbook reads it (ansible's own parsers)."""
    from ansible.errors import AnsibleError
    from ansible.parsing.dataloader import DataLoader
    from ansible.parsing.splitter import parse_kv

    try:
        if extra.startswith("@"):
            data = DataLoader().load_from_file(os.path.expanduser(extra[1:]))
        elif extra.lstrip().startswith(("{", "[")):
            data = DataLoader().load(extra)
        else:
            data = parse_kv(extra)
    except AnsibleError as error:
        raise ControlError(f"-e {extra}: {str(error.message).splitlines()[0]} — write VAR=VALUE, or @FILE "
                           "with a YAML or JSON mapping") from None
    if not isinstance(data, dict) or not data or "_raw_params" in data:
        raise ControlError(f"-e {extra}: sets no variable — write VAR=VALUE, or @FILE with a YAML or JSON mapping")
    return data


def check_controls(controls: Controls) -> None:
    """Raise ControlError for anything ansible-playbook would refuse or that would weaken host key
    checking, before any host is touched."""
    roles, phases = site_tags(), phase_tags()
    for option, tags in (("--tags", controls.tags), ("--skip-tags", controls.skip_tags)):
        unknown = [tag for tag in tags if tag not in roles + phases]
        if unknown:
            raise ControlError(f"{option}: no role tagged {', '.join(map(repr, unknown))} — the tags are: "
                               f"{', '.join(roles)}, and a role's phases: {', '.join(phases)}")
    for extra in controls.extra_vars:
        refused = sorted(set(extra_vars_data(extra)) & set(TRUST_VARS))
        if refused:
            raise ControlError(f"-e {extra}: {', '.join(refused)} would change how ssh checks host keys — "
                               "vllm-provision checks them against the spec's known_hosts; leave it out")
    if controls.forks is not None and controls.forks < 1:
        raise ControlError(f"--forks {controls.forks}: give 1 or more")
    for problem in controls.rollout.problems() if controls.rollout is not None else []:
        raise ControlError(problem)
