"""The NVIDIA driver against what the host's vLLM needs: the CUDA its wheel is built for decides the driver branch.

Spec mode, on hosts with venv instances: the build is the host's `vllm.version` in its `vllm.cuda` build (the
catalog's, provisioner/vllm/builds.py), its minimum from provisioner/vllm/cuda_drivers.py; the driver is
nvidia-smi's `driver_version`, read with the GPU rows' query.
"""

from provisioner.audit.checks import each
from provisioner.gpu import checks as gpu

needs = each(lambda expected: [expected["driver"]] if expected.get("driver") else [], ids=lambda _: "driver")


@needs
def test_driver_runs_the_vllm_build(case, facts, audit):
    """`driver ≥ what vLLM VERSION (CUDA X.Y) needs` — the driver nvidia-smi reports against the branch the host's vLLM build needs (≥ 580 for a CUDA 13 build, ≥ 525 for CUDA 12).

    Modes: spec.
    """
    name, minimum = case.item["name"], case.item["minimum"]
    if facts.gpu is None:
        audit.expect(name, f"≥ {minimum}", f"(unreadable: {facts.gpu_problem})", passed=False)
    check = gpu.driver_check(name, facts.gpu.driver_version, minimum)
    audit.expect(check.name, check.expected, check.actual, passed=check.passed)
