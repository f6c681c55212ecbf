"""TEST DOUBLE of vllm.platforms: the platform vLLM resolves (the stand-in has no use for it), and the
mapping of vLLM's kernels that resolving it brings.

Real vLLM's CUDA platform imports its kernels (`import vllm._C`, vllm/platforms/cuda.py): every process
that resolves the platform, the API server and a headless node alike, holds `…/site-packages/vllm/_C.abi3.so`
in its /proc/PID/maps, which is how the audit reads the vLLM a process imported (provisioner/audit/
processes.py). `map_kernels` does the same with the wheel's placeholder `vllm/_C.abi3.so` (not an ELF
object: nothing runs from it, it is only mapped, read-only; tests/doubles/vllm_wheel.py writes it into the
wheel, the source tree has none). STANDIN_PURE_PYTHON=1 (or the source tree) leaves it unmapped: a server
that maps no vLLM object, which the audit finds by its API's answers instead.
"""

import mmap
import os

current_platform = None
KERNELS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_C.abi3.so")
_mapped = []  # kept for the life of the process, as a loaded shared object is


def map_kernels():
    if os.environ.get("STANDIN_PURE_PYTHON") == "1" or _mapped or not os.path.exists(KERNELS):
        return
    with open(KERNELS, "rb") as kernels:
        _mapped.append(mmap.mmap(kernels.fileno(), 0, prot=mmap.PROT_READ))
