#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
# Part of vllm-provision (role nvidia_gpu). Runs on the target: standard library, optional pynvml.

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvidia_gpu
short_description: Gather NVIDIA GPU facts; set persistence mode and per-GPU power limits
description:
  - Reads every GPU of the host through NVML (pynvml, from nvidia-ml-py, in the target's Python) or, when
    pynvml is absent or NVML does not start, from C(nvidia-smi --query-gpu=... --format=csv) and C(nvidia-smi topo).
  - Facts per GPU - index, UUID, name, PCI bus id, memory total/used, power limit (current, default, min, max,
    enforced) and draw, persistence mode, PCIe link generation and width (current and max), clocks, performance
    state, active clocks event (throttle) reasons, temperature; per pair of GPUs - PCIe path, NVLink, P2P read/write
    status; the driver and (NVML only) CUDA version.
  - Sets persistence mode on every GPU and the power limit of each listed device with C(nvidia-smi -i <uuid> -pm)
    and C(nvidia-smi -i <uuid> -pl <watts>), only where they differ (power limits within 1 W count as equal).
  - Every target is checked first; a target outside a card's min/max range, a listed GPU that is not there, or a
    UUID that does not match fails the task before anything is set.
  - Power limits set this way last until the driver unloads or the host reboots; role nvidia_gpu installs a boot
    unit that applies them again.
version_added: "0.1.0"
author: vllm-provision contributors (@vllm-provision)
options:
  persistence_mode:
    description: Persistence mode wanted on every GPU of the host; null leaves it as it is.
    type: bool
  devices:
    description: The GPUs whose power limit to set, as the inventory lists them (C(nvidia_gpu_devices)).
    type: list
    elements: dict
    default: []
    suboptions:
      index:
        description: The GPU's index (nvidia-smi's, PCI bus order).
        type: int
        required: true
      uuid:
        description: Its UUID; when given, the GPU at O(devices[].index) must have it, else the task fails.
        type: str
      model:
        description: Its product name, for people and the audit; not checked here.
        type: str
      power_limit:
        description: Watts (a positive integer), C(max) (the card's maximum) or C(default) (the card's default).
        type: raw
        default: default
  backend:
    description: How to read the facts. C(auto) is NVML when it starts, else nvidia-smi.
    type: str
    choices: [auto, nvml, nvidia-smi]
    default: auto
  nvidia_smi:
    description: The nvidia-smi executable (a name looked up on the PATH, or a path); used to set, and to read without NVML.
    type: str
    default: nvidia-smi
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Reads the GPUs and reports what would change; it never sets anything.
  diff_mode:
    support: full
    details: Each GPU's persistence mode and power limit before and after.
  platform:
    support: full
    platforms: posix
notes:
  - Check mode reads the GPUs and reports what would change; it never sets anything.
  - Diff mode shows each GPU's persistence mode and power limit before and after.
  - Setting needs root (C(become)).
requirements:
  - the NVIDIA driver (nvidia-smi); pynvml (nvidia-ml-py) in the target's Python is used when present
"""

EXAMPLES = r"""
- name: Read the GPUs
  nvidia_gpu:
  register: gpus

- name: Persistence mode on; GPU 0 at 450 W, GPU 1 at its maximum
  nvidia_gpu:
    persistence_mode: true
    devices:
      - {index: 0, uuid: GPU-0c1d2e3f-4a5b-4c6d-8e7f-9a0b1c2d3e4f, power_limit: 450}
      - {index: 1, power_limit: max}
  become: true

- name: What would change (nothing is set)
  nvidia_gpu:
    devices: "{{ nvidia_gpu_devices }}"
  check_mode: true
  diff: true
"""

RETURN = r"""
backend:
  description: Where the facts came from.
  returned: always
  type: str
  sample: nvml
facts:
  description: >-
    The GPUs after the changes (in check mode, as they are) - source, driver_version, cuda_version,
    gpus (one dict per GPU, see the description), links (one per pair of GPUs).
  returned: always
  type: dict
  sample:
    source: nvml
    driver_version: 580.159.04
    cuda_version: "13.0"
    gpus:
      - {index: 0, uuid: GPU-4b0b4056-7044-6b7c-5c07-ac8934fd439c, name: NVIDIA H200, pci_bus_id: "00000000:00:06.0",
         memory_total_mib: 143771, power_limit_w: 700.0, power_default_w: 700.0, power_min_w: 200.0,
         power_max_w: 700.0, power_enforced_w: 700.0, persistence_mode: true, pcie_gen_current: 5, pcie_gen_max: 5,
         pcie_width_current: 16, pcie_width_max: 16, throttle_reasons: [gpu_idle], performance_state: P0}
    links: []
changes:
  description: What was changed (in check mode, what would be), in the order applied.
  returned: always
  type: list
  elements: dict
  sample:
    - {index: 0, uuid: GPU-0c1d2e3f-4a5b-4c6d-8e7f-9a0b1c2d3e4f, name: NVIDIA GeForce RTX 4090,
       setting: power_limit_w, before: 300.0, after: 450.0}
targets:
  description: Each listed device's power limit target, resolved to watts (what a boot-time re-apply sets).
  returned: always
  type: list
  elements: dict
  sample:
    - {index: 0, uuid: GPU-0c1d2e3f-4a5b-4c6d-8e7f-9a0b1c2d3e4f, power_limit: max, power_limit_w: 450.0}
commands:
  description: The nvidia-smi commands run (none in check mode).
  returned: always
  type: list
  elements: list
no_driver:
  description: True when the task failed because neither NVML nor nvidia-smi is there (no NVIDIA driver).
  returned: failure
  type: bool
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vllm_provision.gpu_host.plugins.module_utils.nvidia_gpu_facts import (
    LiveNvml,
    NvmlUnavailable,
    SmiError,
    read_nvml_facts,
    read_smi_facts,
)
from ansible_collections.vllm_provision.gpu_host.plugins.module_utils.nvidia_gpu_settings import (
    POWER_TOLERANCE_W,
    describe_change,
    nvidia_smi_arguments,
    plan_settings,
    power_limit_matches,
    settings_text,
)


class NoDriver(Exception):
    """Neither NVML nor nvidia-smi can be used on this host."""


class Gpus:
    """Reads and sets the host's GPUs for one module run."""

    def __init__(self, module):
        self.module = module
        self.backend = module.params["backend"]
        self.nvidia_smi = module.get_bin_path(module.params["nvidia_smi"], required=False)
        self.nvml_problem = None
        self.commands = []

    def read(self):
        """The facts; the backend used is in facts['source']."""
        if self.backend in ("auto", "nvml"):
            try:
                nvml = LiveNvml()
            except NvmlUnavailable as error:
                self.nvml_problem = str(error)
                if self.backend == "nvml":
                    raise NoDriver(self.nvml_problem)
            else:
                try:
                    return read_nvml_facts(nvml)
                finally:
                    nvml.close()
        return read_smi_facts(self.run_nvidia_smi)

    def run_nvidia_smi(self, arguments):
        if not self.nvidia_smi:
            why = " and NVML is not usable (%s)" % self.nvml_problem if self.nvml_problem else ""
            raise NoDriver("nvidia-smi (%s) is not on the PATH%s" % (self.module.params["nvidia_smi"], why))
        rc, out, err = self.module.run_command([self.nvidia_smi] + arguments)
        if rc != 0:
            raise SmiError("`nvidia-smi %s` exited %d: %s" % (" ".join(arguments), rc, (err or out).strip()))
        return out

    def apply(self, change):
        arguments = nvidia_smi_arguments(change)
        self.commands.append(["nvidia-smi"] + arguments)
        self.run_nvidia_smi(arguments)


def unmet_targets(facts, plan, persistence_mode):
    """After setting: the settings that still differ from their targets."""
    by_index = {gpu["index"]: gpu for gpu in facts["gpus"]}
    unmet = [
        "GPU %s: power limit is %s W, not %s W (±%g W)" % (
            target["index"], by_index[target["index"]].get("power_limit_w"), target["power_limit_w"], POWER_TOLERANCE_W)
        for target in plan["targets"]
        if not power_limit_matches(by_index[target["index"]].get("power_limit_w"), target["power_limit_w"])
    ]
    if persistence_mode is not None:
        unmet += [
            "GPU %s: persistence mode is still %s" % (gpu["index"], "on" if gpu["persistence_mode"] else "off")
            for gpu in facts["gpus"]
            if gpu.get("persistence_mode") is not None and gpu["persistence_mode"] != persistence_mode
        ]
    return unmet


def main():
    module = AnsibleModule(
        argument_spec=dict(
            persistence_mode=dict(type="bool"),
            devices=dict(type="list", elements="dict", default=[], options=dict(
                index=dict(type="int", required=True),
                uuid=dict(type="str"),
                model=dict(type="str"),
                power_limit=dict(type="raw", default="default"),
            )),
            backend=dict(type="str", default="auto", choices=["auto", "nvml", "nvidia-smi"]),
            nvidia_smi=dict(type="str", default="nvidia-smi"),
        ),
        supports_check_mode=True,
    )
    persistence_mode = module.params["persistence_mode"]
    devices = [_with_int_power_limit(device) for device in module.params["devices"]]
    gpus = Gpus(module)
    try:
        before = gpus.read()
    except NoDriver as error:
        module.fail_json(msg="No NVIDIA driver found on this host: %s — install the NVIDIA driver first" % error,
                         no_driver=True)
    except SmiError as error:
        module.fail_json(msg="Could not read the GPUs: %s" % error)

    plan = plan_settings(before, devices, persistence_mode)
    result = dict(changed=bool(plan["changes"]), backend=before["source"], facts=before, changes=plan["changes"],
                  targets=plan["targets"], commands=gpus.commands)
    if plan["problems"]:
        result["changed"] = False
        module.fail_json(msg="; ".join(plan["problems"]), problems=plan["problems"], **result)
    if module._diff:
        result["diff"] = dict(
            before=settings_text(before, plan["changes"], after=False),
            after=settings_text(before, plan["changes"], after=True),
            before_header="GPU settings", after_header="GPU settings",
        )
    descriptions = [describe_change(change) for change in plan["changes"]]
    if module.check_mode or not plan["changes"]:
        result["msg"] = ("would change: " + "; ".join(descriptions)) if descriptions else "GPUs as wanted"
        module.exit_json(**result)

    for change in plan["changes"]:
        try:
            gpus.apply(change)
        except (SmiError, NoDriver) as error:
            module.fail_json(msg="Setting %s failed: %s" % (describe_change(change), error), **result)
    try:
        result["facts"] = after = gpus.read()
    except (SmiError, NoDriver) as error:
        module.fail_json(msg="Could not read the GPUs back after setting them: %s" % error, **result)
    unmet = unmet_targets(after, plan, persistence_mode)
    if unmet:
        module.fail_json(msg="Set, but not in effect: " + "; ".join(unmet), **result)
    result["msg"] = "changed: " + "; ".join(descriptions)
    module.exit_json(**result)


def _with_int_power_limit(device):
    """power_limit arrives as raw data: '450' (a string from the command line or a template) means 450 W."""
    limit = device.get("power_limit")
    if isinstance(limit, str) and limit.strip().isdigit():
        device = dict(device, power_limit=int(limit))
    return device


if __name__ == "__main__":
    main()
