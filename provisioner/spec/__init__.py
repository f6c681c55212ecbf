"""The spec: one YAML file that says what every host and every vLLM instance should be.

It is the single source of truth. `load_spec` reads and validates it; every
problem is collected (not just the first) and raised together as a `SpecError`.
Validation never touches a host; relative file paths (ssh keys, API key files)
are resolved against the spec file's folder and `~` is expanded.

Two passes:
1. shape: pydantic models (unknown keys rejected, types strict, ranges checked);
2. consistency: checks across hosts and instances (names, ports, GPU references,
   memory shares, options, files on disk).
The second pass also runs on the hosts and instances that passed the first one
when others did not, so one run reports as much as it can. Before both, each host
is resolved from `defaults:` and the `groups:` it lists (host_groups), and a
problem with a value a host took is reported where the value is written.

The modules, from the bottom up: `errors` (Problem, SpecError) and `wording` (values in messages);
`models` (the pydantic models: pass 1); `loading` (text → data: UTF-8, strict YAML, bounded
aliases); `messages` (pass 1's errors rephrased, paths, order); `host_groups` (hosts resolved
from defaults and groups, problems moved where a value is written); `parts` (what passed pass 1);
`text_checks` and `cross_checks` (pass 2); `validation` (`load_spec`, `validate_spec`).
"""

from provisioner.spec.errors import Problem, SpecError
from provisioner.spec.loading import decode_spec, parse_yaml
from provisioner.spec.messages import gpu_label
from provisioner.spec.models import (
    Container,
    Gateway,
    GpuDevice,
    GpuSettings,
    Host,
    HostSettings,
    Instance,
    Spec,
    Ssh,
    VllmSettings,
)
from provisioner.spec.validation import load_spec, validate_spec

__all__ = [
    "Container",
    "Gateway",
    "GpuDevice",
    "GpuSettings",
    "Host",
    "HostSettings",
    "Instance",
    "Problem",
    "Spec",
    "SpecError",
    "Ssh",
    "VllmSettings",
    "decode_spec",
    "gpu_label",
    "load_spec",
    "parse_yaml",
    "validate_spec",
]
