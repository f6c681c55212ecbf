"""One variable at a time: the instance restarted with each value of one `vllm serve` flag, benched,
then put back as it was — also when the sweep is interrupted (Ctrl-C, SIGTERM, SIGHUP) or a run fails.

Each value is a changed spec: validated like any spec (flag known to the pinned vLLM, value of its
type, memory plan) before the host is touched, rendered by the same plan apply uses, checked on the
host by the installed vLLM's parser (the role's vllm-check-args), written over the instance's config
file, and the unit restarted (`systemctl restart` returns once the readiness probe passed). At the end
the config file found before the sweep is written back byte for byte and the unit restarted again.
"""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import yaml

from provisioner.base.signals import signals_held, signals_interrupt
from provisioner.bench.target import BenchTarget, bench_target
from provisioner.plan import build_plan
from provisioner.spec import Spec, SpecError, validate_spec
from provisioner.validation.roles import role_defaults

RESTART_TIMEOUT_S = 1900  # a little over the units' TimeoutStartSec (1800)


@dataclass(frozen=True)
class Sweep:
    flag: str  # long name without -- (the config file's key)
    values: tuple[Any, ...]


def parse_sweep(text: str, option: str = "--sweep") -> Sweep:
    """'max_num_batched_tokens=2048,4096' → Sweep('max-num-batched-tokens', (2048, 4096)); values read as YAML scalars.
    `option` names the command-line option it came from in the error."""
    flag, equals, values = text.partition("=")
    flag = flag.strip().removeprefix("--").replace("_", "-")
    items = [item.strip() for item in values.split(",") if item.strip()]
    if not equals or not flag or not items:
        raise ValueError(f"{option} {text!r}: write FLAG=VALUE,VALUE,… (e.g. max_num_batched_tokens=2048,4096,8192)")
    return Sweep(flag, tuple(yaml.safe_load(item) for item in items))


def swept_specs(spec: Spec, instance_name: str, sweep: Sweep) -> list[tuple[Any, Spec]]:
    """The spec with the instance's flag set to each value; every one validated (SpecError) and
    planned (memory) before anything runs."""
    return [(value, changed_spec(spec, instance_name, {sweep.flag: value}, f"--sweep {sweep.flag}={value}"))
            for value in sweep.values]


def changed_spec(spec: Spec, instance_name: str, changes: dict[str, Any], context: str) -> Spec:
    """The spec with the instance's options changed (a key set; None: removed), validated like any spec
    (SpecError, each message ending in `(context)`) and planned (memory: ValueError) before anything runs."""
    source = spec.source_path
    base_dir = source.parent if source else "."
    data = spec.model_dump(mode="python")
    changed_keys = {key.replace("_", "-") for key in changes}
    for instance in data["instances"]:
        if instance["name"] == instance_name:
            instance["options"] = {key: item for key, item in instance["options"].items()
                                   if key.replace("_", "-") not in changed_keys}
            instance["options"].update({key: value for key, value in changes.items() if value is not None})
    try:
        changed = validate_spec(data, base_dir=base_dir)
    except SpecError as error:
        raise SpecError([problem._replace(message=f"{problem.message} ({context})")
                         for problem in error.problems]) from None
    problems = [problem for plan in build_plan(changed) for problem in plan.memory_problems]
    if problems:
        raise ValueError(f"{context}: " + "; ".join(problems))
    return changed


class InstanceConfig:
    """The instance's config file on its host: written with one value, put back as found."""

    def __init__(self, target: BenchTarget):
        self.target = target
        self.shell = target.shell
        self.original = self.shell.read_text(target.config_path)
        self.changed = False

    def use(self, swept: BenchTarget) -> None:
        """Check `swept`'s rendered config with vLLM's parser on the host, write it, restart the unit."""
        check_args = role_defaults()["vllm_service_check_args"]
        python = shlex.quote(self.target.python)
        candidate = f"{self.target.config_path}.sweep"
        self.shell.run(f"cat > {shlex.quote(candidate)}", stdin=swept.config_text)
        try:
            self.shell.run(f"{python} {shlex.quote(check_args)} serve --config {shlex.quote(candidate)}")
        finally:
            self.shell.run(f"rm -f {shlex.quote(candidate)}", check=False)
        self.changed = True
        self.shell.write_text(self.target.config_path, swept.config_text)
        self.restart()

    def restore(self) -> None:
        if self.changed:
            self.shell.write_text(self.target.config_path, self.original)
            self.changed = False
            self.restart()

    def restart(self) -> None:
        self.shell.run(f"systemctl restart {shlex.quote(self.target.unit)}", timeout=RESTART_TIMEOUT_S)


def run_sweep(spec: Spec, instance_name: str, sweep: Sweep, bench: Callable[[BenchTarget, Any], Any],
              vllm: str | None = None, on_restart: Callable[[Any], None] | None = None) -> list[Any]:
    """bench(target, value) for the config as it is (value None), then for each value of the sweep;
    the instance's config is restored afterwards whatever happens. Returns bench's results in order."""
    target = bench_target(spec, instance_name, vllm)
    variants = swept_specs(spec, instance_name, sweep)  # every value valid before the host is touched
    results = [bench(target, None)]
    with restored_config(target, on_restart) as config:
        for value, changed in variants:
            if on_restart:
                on_restart(value)
            config.use(bench_target(changed, instance_name, vllm))
            results.append(bench(target, value))
    return results


@contextlib.contextmanager
def restored_config(target: BenchTarget, on_restart: Callable[[Any], None] | None = None) -> Iterator[InstanceConfig]:
    """The instance's config, changed inside (`config.use`), written back byte for byte and the unit
    restarted on the way out, whatever happens: an error, Ctrl-C, SIGTERM or SIGHUP (held off while the
    restore runs). on_restart("restore") is called before the restore restarts the unit."""
    config = InstanceConfig(target)
    with signals_interrupt():
        try:
            yield config
        finally:
            if on_restart and config.changed:
                on_restart("restore")
            with signals_held():
                config.restore()
