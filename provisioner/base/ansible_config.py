"""Ansible's settings for an apply: the user's own ansible.cfg wherever ours need not win.

Ansible finds the user's configuration the usual way ($ANSIBLE_CONFIG, ./ansible.cfg, ~/.ansible.cfg,
/etc/ansible/ansible.cfg; ANSIBLE_* variables above it). On top of it:

- MUST_WIN: set as environment variables, which beat any ansible.cfg (strict host key checking; the
  variables our output needs are set in provisioner/apply/playbook.py).
- The collection's event callback (EVENTS_CALLBACK), added to the callbacks the user enables.
- PREFERRED: our defaults, applied only where the user's configuration (file or ANSIBLE_* variable)
  does not set the setting; which one does is read with Ansible's own ConfigManager.
- Mitogen's linear strategy (STRATEGY: provisioner/ansible_plugins/strategy/, Mitogen's own with its
  module scan compiling each file once), where the user names no strategy: Ansible's own linear order,
  with one Python interpreter per host that runs every module instead of one per task (a no-change
  apply of one host takes about half the time; benchmarks/structure_costs.py measures it).
- A user ssh_args that sets a host-key option is refused: ssh takes the first value it sees, and
  ssh_args comes before the options that make ssh check the spec's known_hosts.

The configuration is read once per process and folder (reading it loads Ansible's config definitions).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shlex
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provisioner.base.hostkeys import ssh_options

MUST_WIN = {
    # both names the ssh plugin reads
    "ANSIBLE_HOST_KEY_CHECKING": "True",
    "ANSIBLE_SSH_HOST_KEY_CHECKING": "True",
}


@dataclass(frozen=True)
class Preferred:
    """One of our defaults: the environment variable that sets it, its value, and the settings
    (`name` or `plugin_type/plugin_name/name`) whose origin says whether the user set it."""

    env: str
    value: str
    settings: tuple[str, ...]


PREFERRED = (
    Preferred("ANSIBLE_FORKS", "16", ("DEFAULT_FORKS",)),
    Preferred("ANSIBLE_PIPELINING", "True", ("ANSIBLE_PIPELINING", "connection/ssh/pipelining")),
    # how long a silent host is waited for is the inventory's (ansible_ssh_common_args): one value on every path
    Preferred("ANSIBLE_SSH_ARGS", "-o ControlMaster=auto -o ControlPersist=120s",
              ("connection/ssh/ssh_args",)),
    # a Debian-family host's python3 (what the collection supports): no discovery round trip per host
    Preferred("ANSIBLE_PYTHON_INTERPRETER", "/usr/bin/python3", ("INTERPRETER_PYTHON",)),
    Preferred("ANSIBLE_RETRY_FILES_ENABLED", "False", ("RETRY_FILES_ENABLED",)),
)

# Mitogen's strategy (its package is a dependency), from our strategy folder; the user's strategy plugin
# folders stay on the path after it
STRATEGY = "mitogen_linear_cached"
STRATEGY_DIR = Path(__file__).resolve().parents[1] / "ansible_plugins" / "strategy"
STRATEGY_SETTINGS = ("DEFAULT_STRATEGY", "DEFAULT_STRATEGY_PLUGIN_PATH")

HOST_KEY_OPTIONS = {option.split()[0].lower() for option in ssh_options("x")} | {"knownhostscommand", "hostkeyalias"}


class AnsibleConfigError(ValueError):
    """The user's Ansible configuration cannot be read, or weakens host key checking."""


@dataclass(frozen=True)
class Setting:
    value: Any
    origin: str  # "default", "env: ANSIBLE_…" or the ansible.cfg that sets it

    @property
    def user_set(self) -> bool:
        return self.origin != "default"


def _manager():
    """The ConfigManager ansible-playbook started here would read its configuration with (the ssh
    connection plugin's settings known to it): one per folder and set of ANSIBLE_* variables."""
    ansible_variables = tuple(sorted((key, value) for key, value in os.environ.items() if key.startswith("ANSIBLE_")))
    return _cached_manager(os.getcwd(), ansible_variables)


@functools.lru_cache(maxsize=8)
def _cached_manager(folder: str, ansible_variables: tuple):
    from ansible import constants  # Ansible only here: the other commands run where it is not installed
    from ansible.config.manager import ConfigManager
    from ansible.plugins.loader import connection_loader

    with warnings.catch_warnings():  # the ssh plugin's import of DSA support warns on every command; not the user's
        warnings.filterwarnings("ignore", message="DSA is deprecated")
        connection_loader.get("ssh", class_only=True)  # registers the plugin's settings in constants.config
    manager = ConfigManager()
    manager.initialize_plugin_configuration_definitions(
        "connection", "ssh", constants.config.get_configuration_definitions("connection", "ssh"))
    return manager


def read_settings(names: set[str]) -> dict[str, Setting]:
    """Each setting's value and origin, as ansible-playbook started here would read them."""
    from ansible.errors import AnsibleError

    try:
        manager = _manager()
        settings = {}
        for name in names:
            plugin_type, plugin_name, option = name.split("/") if "/" in name else (None, None, name)
            value, origin = manager.get_config_value_and_origin(option, plugin_type=plugin_type,
                                                                plugin_name=plugin_name)
            settings[name] = Setting(value, str(origin))
    except AnsibleError as error:
        raise AnsibleConfigError(f"Ansible's configuration: {error.message} — fix it, or point ANSIBLE_CONFIG "
                                 "at another file") from None
    return settings


def host_key_options(ssh_args: str) -> list[str]:
    """The host-key options (-o StrictHostKeyChecking=no, …) an ssh_args value sets."""
    words = shlex.split(ssh_args)
    found = []
    for index, word in enumerate(words):
        option = word[2:] if word.startswith("-o") and len(word) > 2 else (
            words[index + 1] if word == "-o" and index + 1 < len(words) else "")
        if option and option.replace("=", " ").split()[0].lower() in HOST_KEY_OPTIONS:
            found.append(option)
    return found


def ansible_environment() -> dict[str, str]:
    """The environment variables an apply sets for Ansible: MUST_WIN, and each PREFERRED default the
    user's configuration leaves unset. Raises AnsibleConfigError for a configuration we cannot use."""
    names = {"connection/ssh/ssh_args"} | {name for preferred in PREFERRED for name in preferred.settings}
    settings = read_settings(names)
    ssh_args = settings["connection/ssh/ssh_args"]
    weakening = host_key_options(str(ssh_args.value or "")) if ssh_args.user_set else []
    if weakening:
        raise AnsibleConfigError(
            f"ssh_args ({ssh_args.origin}) sets {', '.join(weakening)}: vllm-provision checks every host's key "
            "against the spec's known_hosts itself — remove the host-key options from ssh_args (keep the others)")
    environment = {preferred.env: preferred.value for preferred in PREFERRED
                   if not any(settings[name].user_set for name in preferred.settings)}
    return {**environment, **strategy_environment(), **MUST_WIN}


def mitogen_strategy_dir() -> Path | None:
    """The folder of our Mitogen strategy plugin, or None where Mitogen is not installed."""
    return STRATEGY_DIR if importlib.util.find_spec("ansible_mitogen") is not None else None


def strategy_environment() -> dict[str, str]:
    """ANSIBLE_STRATEGY and ANSIBLE_STRATEGY_PLUGINS for Mitogen's strategy, unless the user names a
    strategy (theirs is kept, `linear` included) or Mitogen is missing."""
    settings = read_settings(set(STRATEGY_SETTINGS))
    folder = mitogen_strategy_dir()
    if settings["DEFAULT_STRATEGY"].user_set or folder is None:
        return {}
    plugin_path = settings["DEFAULT_STRATEGY_PLUGIN_PATH"]
    theirs = plugin_path.value or [] if plugin_path.user_set else []
    theirs = theirs if isinstance(theirs, list) else str(theirs).split(os.pathsep)
    return {"ANSIBLE_STRATEGY": STRATEGY,
            "ANSIBLE_STRATEGY_PLUGINS": os.pathsep.join([str(folder), *(str(path) for path in theirs)])}


EVENTS_CALLBACK = "vllm_provision.gpu_host.provision_events"  # plugins/callback/provision_events.py


def events_environment(events_file: Path) -> dict[str, str]:
    """ANSIBLE_CALLBACKS_ENABLED with the collection's event callback added to the user's own, and the
    file it appends the run's events to."""
    setting = read_settings({"CALLBACKS_ENABLED"})["CALLBACKS_ENABLED"]
    theirs = (setting.value or []) if setting.user_set else []
    theirs = theirs if isinstance(theirs, list) else str(theirs).split(",")
    enabled = [str(name).strip() for name in theirs if str(name).strip() and str(name).strip() != EVENTS_CALLBACK]
    return {"ANSIBLE_CALLBACKS_ENABLED": ",".join([*enabled, EVENTS_CALLBACK]),
            "PROVISION_EVENTS_FILE": str(events_file)}


def collections_paths() -> list[str]:
    """The collections path the user's configuration gives (ours goes before it)."""
    setting = read_settings({"COLLECTIONS_PATHS"})["COLLECTIONS_PATHS"]
    if not setting.user_set:  # Ansible's default (a template it expands itself)
        return ["~/.ansible/collections", "/usr/share/ansible/collections"]
    value = setting.value or []
    return [str(path) for path in (value if isinstance(value, list) else str(value).split(os.pathsep))]
