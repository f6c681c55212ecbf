"""The batch-1 TPOT floor: a decode step streams every weight from HBM once, so one token takes at
least weight bytes / HBM bandwidth. The bandwidth is measured on the host: a short torch copy
(read + write) on the instance's GPU, with the Python of the instance's venv (vLLM's torch).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from provisioner.fleet.remote import HostShell, RemoteError

# Copies a buffer of up to 1 GiB (a quarter of the free memory at most: instances may hold the rest)
# 20 times after 3 warm-ups; prints the GPU's name and GB/s as JSON. Also the read-only rate (a sum).
BANDWIDTH_SCRIPT = r"""
import json, sys, torch
if not torch.cuda.is_available():
    print(json.dumps({"error": "torch sees no CUDA device"})); sys.exit(0)
free, total = torch.cuda.mem_get_info()
n = min(2**30, free // 4) // 2
a = torch.empty(n, dtype=torch.bfloat16, device="cuda").normal_()
b = torch.empty_like(a)
def seconds(fn, iters=20):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters): fn()
    end.record(); torch.cuda.synchronize()
    return start.elapsed_time(end) / iters / 1e3
copy = seconds(lambda: b.copy_(a))
read = seconds(lambda: torch.sum(a, dtype=torch.float32))
print(json.dumps({"gpu": torch.cuda.get_device_name(0), "buffer_bytes": 2 * n,
                  "copy_GBps": 2 * 2 * n / copy / 1e9, "read_GBps": 2 * n / read / 1e9}))
"""


@dataclass(frozen=True)
class Bandwidth:
    gpu: str
    copy_gbps: float  # (read + write) bytes of a copy / its time
    read_gbps: float


def measure_bandwidth(shell: HostShell, python: str, cuda_visible_devices: str | None) -> Bandwidth | str:
    """The host's HBM bandwidth, or why it could not be measured (no torch, no GPU)."""
    env = f"CUDA_VISIBLE_DEVICES={shlex.quote(cuda_visible_devices)} CUDA_DEVICE_ORDER=PCI_BUS_ID " \
        if cuda_visible_devices else ""
    try:
        result = shell.run(f"{env}{shlex.quote(python)} -", stdin=BANDWIDTH_SCRIPT, timeout=180)
    except RemoteError as error:
        return f"bandwidth not measured: {error}"
    try:
        data = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return f"bandwidth not measured: unexpected output {result.stdout[-200:]!r}"
    if "error" in data:
        return f"bandwidth not measured: {data['error']}"
    return Bandwidth(data["gpu"], data["copy_GBps"], data["read_GBps"])


def tpot_floor_ms(weight_bytes: int, bandwidth_gbps: float) -> float:
    return weight_bytes / (bandwidth_gbps * 1e9) * 1e3
