"""An instance of the spec as the bench reaches it: read from the same plan the roles apply (the
rendered unit and `vllm serve --config` file), so the bench talks to what apply deployed."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

import yaml

from provisioner.base.secrets import read_api_key
from provisioner.bench.command import Endpoint
from provisioner.fleet.remote import HostShell
from provisioner.plan import PlannedUnit, host_plan
from provisioner.spec import Instance, Spec
from provisioner.vllm.serve_args import serving_expectations


@dataclass(frozen=True)
class BenchTarget:
    instance: Instance
    shell: HostShell
    vllm: str  # the `vllm` executable on the host that runs `vllm bench serve`
    python: str  # the venv's Python (vLLM's torch), for the bandwidth measurement
    endpoint: Endpoint
    unit: str  # vllm-<name>.service
    config_path: str  # /etc/vllm/<name>.yaml
    config_text: str  # as apply renders it
    environment: dict[str, str]  # for the bench client: the unit's HF_* and the instance's env
    gpu_uuids: tuple[str, ...]
    api_key: str | None

    @property
    def name(self) -> str:
        return self.instance.name


def bench_target(spec: Spec, instance_name: str, vllm: str | None = None) -> BenchTarget:
    """The target for `instance_name`; a ValueError names the instances there are."""
    instance = next((item for item in spec.instances if item.name == instance_name), None)
    if instance is None:
        names = [item.name for item in spec.instances]
        guess = difflib.get_close_matches(instance_name, names, n=1)
        hint = f"did you mean '{guess[0]}'? " if guess else ""
        raise ValueError(f"no instance '{instance_name}' in the spec — {hint}instances: {', '.join(names) or 'none'}")
    host = spec.host(instance.host)
    planned: PlannedUnit = next(unit for unit in host_plan(host, spec.instances_on(host.name)).units
                                if unit.instance == instance.name)
    config = yaml.safe_load(planned.config_file.content)
    serving = serving_expectations(["vllm", "serve"], config)
    venv_bin = f"{host.vllm.venv}/bin"
    api_key = read_api_key(instance.api_key_file) if instance.api_key_file else None
    return BenchTarget(
        instance=instance,
        shell=HostShell.for_host(host, spec.source_path),
        vllm=vllm or f"{venv_bin}/vllm",
        python=f"{venv_bin}/python",
        endpoint=Endpoint(serving["url"], serving["served_names"][0], str(config.get("tokenizer") or config["model"])),
        unit=Path(planned.unit.path).name,
        config_path=planned.config_file.path,
        config_text=planned.config_file.content,
        environment={key: value for key, value in planned.environment.items()
                     if not key.startswith("CUDA_") and key != "VLLM_API_KEY"},
        gpu_uuids=tuple(host.gpu_uuid(ref) or "" for ref in instance.gpus),
        api_key=api_key,
    )
