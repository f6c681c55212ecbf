"""The roles, read as data: what plan, audit and bench know of a role comes from here.

A role's variables are its `defaults/main.yml` (literal values, no Jinja) overlaid with the host_vars
the inventory generates for the host (`host_variables`); a file it writes is its own template,
rendered with plain Jinja2 as Ansible's template module renders it, at the destination and mode of
the role's own template task (`render_role_file`). Each role's tasks and defaults are read once per
process. Nothing here re-implements a unit or a config file in Python.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import jinja2
import yaml

from provisioner.base.module_utils import value_rules
from provisioner.base.paths import COLLECTION, role_dir
from provisioner.fleet.inventory import gateway_vars, host_vars
from provisioner.fleet.monitoring import exporter_vars, prometheus_vars
from provisioner.spec import Host, Instance, Spec

ROLES = ("sysctl", "nouveau", "nvidia_driver", "shm", "nvidia_gpu", "vllm_install", "container_engine", "vllm_service",
         "node_exporter", "gateway", "prometheus")  # site.yml's order (gateway: its second play, prometheus: its third)
UNIT_TEMPLATE = "vllm-instance.service.j2"
QUADLET_TEMPLATE = "vllm-instance.container.j2"
COMPOSE_TEMPLATE = "vllm-instance.compose.yaml.j2"
COMPOSE_UNIT_TEMPLATE = "vllm-instance.compose.service.j2"
UNIT_TEMPLATES = {None: UNIT_TEMPLATE, "podman": QUADLET_TEMPLATE, "docker": COMPOSE_TEMPLATE}  # by container engine
ENV_TEMPLATE = "vllm-instance.env.j2"
CONFIG_TEMPLATE = "vllm-instance.yaml.j2"
NOUVEAU_TEMPLATES = ("blacklist-nouveau.conf.j2", "grub-nouveau.cfg.j2")


@dataclass(frozen=True)
class PlannedFile:
    """A file a role writes: where, with which mode, and its rendered content."""

    path: str
    content: str
    mode: str | None
    role: str


def host_variables(host: Host, instances: list[Instance], spec: Spec | None = None) -> dict[str, Any]:
    """What the roles read on `host`: their defaults overlaid with the host_vars the inventory generates
    (with `spec`, also the gateways the host runs: their replicas are instances of other hosts)."""
    return {**role_defaults(), **host_vars(host, instances), **(gateway_vars(spec, host) if spec else {}),
            **(exporter_vars(spec, host) if spec else {}), **(prometheus_vars(spec, host) if spec else {})}


# libyaml's parser where PyYAML has it (the same safe loading, several times faster: a plan reads every
# task file of the roles); PyYAML's own otherwise
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_yaml(path: Path) -> Any:
    """One of the roles' own YAML files, read safely."""
    return yaml.load(path.read_text(encoding="utf-8"), Loader=_SafeLoader)


# the folder role vllm_service keeps each instance's files in as they last got ready (vars/main.yml)
KEPT_COPY = "_vllm_service_previous_dir"


@cache
def role_defaults() -> dict[str, Any]:
    """The roles' defaults/main.yml merged (they are literal values, no Jinja)."""
    merged: dict[str, Any] = {}
    for role in ROLES:
        path = role_dir(role) / "defaults" / "main.yml"
        merged.update(read_yaml(path) or {})
    return merged


@cache
def role_vars(role: str) -> dict[str, Any]:
    """The role's vars/main.yml, as written (its values may be Jinja: `render_string` renders one)."""
    return read_yaml(role_dir(role) / "vars" / "main.yml") or {}


def render_role_file(role: str, template: str, variables: dict[str, Any]) -> PlannedFile:
    """Render roles/<role>/templates/<template> where the role's template task puts it (not where vllm_service
    keeps the copy of it that got ready, for a rollback: its tasks/commit.yml)."""
    task = find_task_args(role, "template", lambda args: args.get("src") == template and KEPT_COPY not in str(args.get("dest")))
    return PlannedFile(
        path=render_string(task["dest"], variables),
        content=_environment(role).get_template(template).render(variables),
        mode=task.get("mode"),
        role=role,
    )


def render_string(text: str, variables: dict[str, Any], role: str = ROLES[0]) -> str:
    """`text` (a task's `dest:`, a `line:`) rendered as Ansible renders a task argument."""
    return _compiled(role, text).render(variables)


@cache
def _compiled(role: str, text: str) -> jinja2.Template:
    return _environment(role).from_string(text)


@cache
def _environment(role: str) -> jinja2.Environment:
    """Plain Jinja2 set up as Ansible's template module sets it up for a role's template: templates
    it includes or imports are looked up in the role's templates/ folder, as Ansible looks them up; the
    collection's filters (plugins/filter/value_rules.py) by the names the templates use."""
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(role_dir(role) / "templates"),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    environment.filters.update({f"{COLLECTION}.{name}": rule for name, rule in value_rules.FILTERS.items()})
    return environment


def find_task_args(role: str, module: str, matches: Callable[[dict], bool]) -> dict[str, Any]:
    """The arguments of the role's first `module` task (short or ansible.builtin name) that `matches`."""
    names = (module, f"ansible.builtin.{module}")
    for task in role_tasks(role):
        for name in names:
            args = task.get(name)
            if isinstance(args, dict) and matches(args):
                return args
    raise LookupError(f"role {role} has no matching {module} task (looked in {role_dir(role) / 'tasks'})")


@cache
def role_tasks(role: str) -> tuple[dict, ...]:
    """Every task of the role (its tasks/*.yml, blocks flattened), read once per process."""
    tasks: list[dict] = []
    for path in sorted((role_dir(role) / "tasks").glob("*.yml")):
        tasks += _flatten(read_yaml(path) or [])
    return tuple(tasks)


def _flatten(tasks: list) -> Iterator[dict]:
    for task in tasks:
        if not isinstance(task, dict):
            continue
        yield task
        for section in ("block", "rescue", "always"):
            yield from _flatten(task.get(section) or [])
