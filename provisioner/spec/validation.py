"""Read a spec file and validate it: the hosts resolved from defaults and groups, the two passes, every problem
collected into one `SpecError`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from provisioner.spec.cross_checks import consistency_problems
from provisioner.spec.errors import Problem, SpecError
from provisioner.spec.host_groups import relocated, resolve_hosts
from provisioner.spec.loading import decode_spec, parse_yaml
from provisioner.spec.messages import shape_problems, spec_order
from provisioner.spec.models import Spec
from provisioner.spec.parts import parts_of, salvage, without_hosts
from provisioner.spec.secret_checks import declare_secrets
from provisioner.spec.wording import show


def load_spec(path: str | Path) -> Spec:
    """Read, parse and validate a spec file; raise `SpecError` with every problem found."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise SpecError([Problem(str(path), f"cannot read the spec: {error.strerror or error}")]) from None
    data = parse_yaml(decode_spec(raw, path.name), path.name)
    spec = validate_spec(data, base_dir=path.parent)
    spec._source_path = path
    return spec


def validate_spec(data: Any, base_dir: str | Path = ".", check_files: bool = True) -> Spec:
    """Validate parsed spec data; relative paths are resolved against `base_dir`.

    `check_files=False` skips the checks that files named by the spec exist.
    """
    if data is None:
        raise SpecError([Problem("(spec)", "the spec is empty — start from `provision init`")])
    if not isinstance(data, dict):
        raise SpecError([Problem("(spec)", f"expected a mapping at the top level, got {show(data)}")])
    context = {"base_dir": Path(base_dir)}
    resolution = resolve_hosts(data, context)
    if "hosts" in data:
        data = {**data, "hosts": resolution.hosts}
    try:
        spec = Spec.model_validate(data, context=context)
    except ValidationError as error:
        problems = shape_problems(error)
        parts = salvage(data, context)
    else:
        problems = []
        parts = parts_of(spec)
        declare_secrets(spec)  # redacted by value in every output from now on, this validation's errors too
    problems += consistency_problems(without_hosts(parts, resolution.unresolved), check_files=check_files)
    problems = relocated(problems, resolution.origins)
    if problems:
        raise SpecError(sorted(problems, key=spec_order))
    return spec
