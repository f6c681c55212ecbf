"""Which spec a command reads, and which of its hosts a command works on.

The spec: `--spec FILE`, else $PROVISION_SPEC, else ./provision.yml. The hosts: names of hosts, of
groups (a host's `groups:`) or `all`; none given means every host of the spec.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the CLI finds the spec file without loading the spec's models
    from provisioner.spec import Host, Spec

SPEC_ENV = "PROVISION_SPEC"
DEFAULT_SPEC = Path("provision.yml")
ALL = "all"


class SelectionError(ValueError):
    """No spec was found, or a HOST argument names no host or group of the spec."""


def find_spec(option: str | Path | None = None, environ: dict[str, str] | None = None) -> Path:
    """The spec a command reads: `option` (--spec), else $PROVISION_SPEC, else ./provision.yml when it exists."""
    environ = os.environ if environ is None else environ
    if option:
        return Path(option)
    if environ.get(SPEC_ENV):
        return Path(environ[SPEC_ENV])
    if DEFAULT_SPEC.is_file():
        return DEFAULT_SPEC
    raise SelectionError(
        f"no spec: give one with --spec FILE, set ${SPEC_ENV}=FILE, or write ./{DEFAULT_SPEC} "
        f"(`provision init` writes an example there)")


def groups_of(spec: Spec) -> dict[str, list[str]]:
    """Each group of the spec -> its hosts, in spec order (groups in the order first named)."""
    groups: dict[str, list[str]] = {}
    for host in spec.hosts:
        for group in host.groups:
            groups.setdefault(group, []).append(host.name)
    return groups


def select_hosts(spec: Spec, names: Sequence[str] = ()) -> list[Host]:
    """The hosts `names` (host names, group names, `all`) stand for, in spec order; no names: every host.

    Raises SelectionError naming every unknown name, with the hosts and groups there are."""
    if not names:
        return list(spec.hosts)
    groups = groups_of(spec)
    host_names = [host.name for host in spec.hosts]
    unknown = [name for name in dict.fromkeys(names) if name != ALL and name not in host_names and name not in groups]
    if unknown:
        listed = f"hosts: {', '.join(host_names)}"
        if groups:
            listed += f"; groups: {', '.join(groups)}"
        what = "host or group" if len(unknown) == 1 else "hosts or groups"
        message = f"no {what} {', '.join(map(repr, unknown))} in {spec.source_path or 'the spec'} — {listed} (or all)"
        files = [name for name in unknown if name.endswith((".yml", ".yaml")) or Path(name).is_file()]
        if files:  # the CLI's old form, `provision apply SPEC`
            message += f"; to read {files[0]} as the spec, give it with --spec {files[0]}"
        raise SelectionError(message)
    chosen: set[str] = set()
    for name in names:
        chosen.update(host_names if name == ALL else groups.get(name, [name]))
    return [host for host in spec.hosts if host.name in chosen]
