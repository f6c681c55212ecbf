"""The NVML seam: the one place NVML is asked anything (pynvml, from nvidia-ml-py).

A backend answers `call(function, *labels)` — an NVML function name and its
arguments as labels, as tests/fixtures/gpu/record_nvml.py records them
("nvmlDeviceGetP2PStatus(0,1,READ)") — with plain JSON data, or raises
`NvmlCallError`:

- `LiveNvml()` asks this machine's driver (raises `NvmlUnavailable` without pynvml or driver);
- `ReplayNvml.from_file(path)` answers from a recording (`nvml.json`), so CI runs the
  same code on real, recorded answers.

`read_nvml_facts(backend)` turns the answers into the facts' plain data; see
`provisioner.gpu.facts` for the typed view. The code is the role's module_utils
(nvidia_gpu_facts.py), shared with the Ansible module that runs it on the targets.
"""

from __future__ import annotations

from provisioner.base.module_utils import gpu_facts

LiveNvml = gpu_facts.LiveNvml
ReplayNvml = gpu_facts.ReplayNvml
NvmlUnavailable = gpu_facts.NvmlUnavailable
NvmlCallError = gpu_facts.NvmlCallError
read_nvml_facts = gpu_facts.read_nvml_facts
call_key = gpu_facts.call_key
