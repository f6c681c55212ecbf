"""Which kernel modules of the NVIDIA driver a GPU runs on, told from its product name (nvidia-smi's `name`).

Since release 515 the driver's kernel modules come in two flavours. NVIDIA's Driver Installation Guide,
"Kernel Modules" (https://docs.nvidia.com/datacenter/tesla/driver-installation-guide/kernel-modules.html):
the proprietary flavour "is required for older GPUs from the Maxwell, Pascal, or Volta architectures.
The open-source GPU kernel modules are not compatible with these platforms"; the open flavour is "only
for Turing and newer architectures", and the default from release 560. NVIDIA's announcement of that
default ("NVIDIA Transitions Fully Towards Open-Source GPU Kernel Modules", NVIDIA Technical Blog, July
2024, https://developer.nvidia.com/blog/nvidia-transitions-fully-towards-open-source-gpu-kernel-modules/):
Grace Hopper and Blackwell require the open modules, the proprietary driver is unsupported on them; a
mix of older and newer GPUs stays on the proprietary driver.

Names are matched by product family: a name that matches neither list (every Turing-to-Hopper card,
and any card not known here) runs on both flavours.
"""

from __future__ import annotations

import re

# Maxwell, Pascal and Volta (and the Kepler cards of old drivers), by nvidia-smi's product names:
# GeForce GTX 9xx/10xx and GT 10xx (GTX 16xx is Turing), TITAN X/Xp/V, Tesla and Quadro K/M/P
# boards, Quadro GP100/GV100, Tesla V100/V100S
PRE_TURING = re.compile(
    r"\bGTX (9\d\d|10\d\d)\b|\bGT 10\d\d\b|\bTITAN (X|Xp|V|Black|Z)\b|\b(Tesla|Quadro) [KMP]\d|"
    r"\bQuadro G[PV]100\b|\bV100")
# Blackwell: B100/B200/B300 and the Grace superchips GB10/GB200/GB300, GeForce RTX 50xx, the RTX PRO
# Blackwell boards (their names say so)
BLACKWELL = re.compile(r"\bG?B(10|100|200|300)\b|\bRTX 50\d0\b|Blackwell")
# Grace Hopper (GH200): open modules only, as Blackwell
GRACE_HOPPER = re.compile(r"\bGH200\b")


def older_than_turing(model: str | None) -> bool:
    """A Maxwell, Pascal or Volta card: only the proprietary kernel modules run it."""
    return bool(model) and PRE_TURING.search(model) is not None


def needs_open_modules(model: str | None) -> bool:
    """A Blackwell card (or a Grace Hopper superchip): only the open kernel modules run it."""
    return bool(model) and (BLACKWELL.search(model) is not None or GRACE_HOPPER.search(model) is not None)
