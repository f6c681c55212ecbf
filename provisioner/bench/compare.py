"""Run sets side by side: per concurrency, TTFT/TPOT/ITL p50 and p99 and throughput, with deltas."""

from __future__ import annotations

from dataclasses import dataclass

from provisioner.bench.results import RunSet

# (label, summary key, higher is better)
COMPARED = (
    ("TTFT p50 ms", "p50_ttft_ms", False),
    ("TTFT p99 ms", "p99_ttft_ms", False),
    ("TPOT p50 ms", "p50_tpot_ms", False),
    ("TPOT p99 ms", "p99_tpot_ms", False),
    ("ITL p50 ms", "p50_itl_ms", False),
    ("ITL p99 ms", "p99_itl_ms", False),
    ("output tok/s", "output_throughput", True),
)


@dataclass(frozen=True)
class Row:
    concurrency: int
    metric: str
    values: tuple[float | None, ...]  # one per run set; None where it has no such value

    @property
    def higher_is_better(self) -> bool:
        return next(better for label, _, better in COMPARED if label == self.metric)

    def delta(self, index: int) -> float | None:
        """Run set `index` against the first, as a fraction (+0.05: 5 % more)."""
        base, value = self.values[0], self.values[index]
        if base in (None, 0) or value is None:
            return None
        return (value - base) / base

    def verdict(self, index: int, tolerance: float = 0.02) -> str:
        """better / worse / same (within `tolerance`) for run set `index` against the first."""
        delta = self.delta(index)
        if delta is None or abs(delta) <= tolerance:
            return "same"
        return "better" if (delta > 0) == self.higher_is_better else "worse"


def compare(*run_sets: RunSet) -> list[Row]:
    """Rows for the concurrencies every run set measured, the first run set being the reference."""
    summaries = [run_set.summary() for run_set in run_sets]
    common = sorted(set.intersection(*(set(summary) for summary in summaries)))
    return [
        Row(concurrency, label, tuple(summary[concurrency].get(key) for summary in summaries))
        for concurrency in common
        for label, key, _ in COMPARED
    ]
