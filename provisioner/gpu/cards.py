"""What we know of NVIDIA cards by product name (nvidia-smi's `name`): their power-limit range.

One table, each number with its source. The ranges are nvidia-smi's `power.min_limit` and
`power.max_limit`: `nvidia-smi -pl` refuses any value outside them. They are board- (vBIOS-)
specific, so a range is only recorded here where a real card gave it; the constructed fixtures'
assumed ranges (tests/fixtures/gpu/construct.py marks them "assumed") are left out, so that a
board that allows more is not refused.

For a card not in the table only what no NVIDIA card has is refused: watts above
`NO_NVIDIA_CARD_ABOVE_W`. NVIDIA's largest modules are rated in the low thousands of watts at most
(H200 SXM: 700 W, recorded below; the Blackwell B200/B300 modules: about 1000–1400 W); a limit of
several kW is a typo (a digit too many), not a card. There is no lower bound beyond "positive":
small data-center cards (e.g. the A2, configurable from 40 to 60 W) go low, and the driver refuses
what the card cannot take.
"""

from __future__ import annotations

from typing import NamedTuple

NO_NVIDIA_CARD_ABOVE_W = 4000


class PowerRange(NamedTuple):
    min_w: int
    max_w: int
    source: str


H200_RECORDED = ("tests/fixtures/gpu/h200x1 and h200x2/query-gpu.csv: recorded with nvidia-smi on real H200s "
                 "(2026-12-01): power.min_limit 200.00 W, power.max_limit 700.00 W")
RTX4090_PUBLIC = ("tests/fixtures/gpu/construct.py: min 150 W from public `nvidia-smi -q -x` of a 450 W board "
                  "(github.com/1Panel-dev/1Panel/issues/11910); max 600 W: Founders Edition boards allow up to 600 W")

POWER_RANGES: dict[str, PowerRange] = {
    "NVIDIA H200": PowerRange(200, 700, H200_RECORDED),
    "NVIDIA GeForce RTX 4090": PowerRange(150, 600, RTX4090_PUBLIC),
}


def power_range(model: str | None) -> PowerRange | None:
    """The power-limit range of a card by its nvidia-smi name; None where no real card told us."""
    return POWER_RANGES.get(model or "")
