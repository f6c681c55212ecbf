"""PNG charts of run sets against concurrency: latency percentiles and throughput, with the batch-1
TPOT floor (weight bytes / measured HBM bandwidth) drawn where it is known."""

from __future__ import annotations

from pathlib import Path

from provisioner.bench.results import RunSet

PLOT_EXTRA = "pipx inject vllm-provision matplotlib, or pip install 'vllm-provision[plot]'"

PANELS = (  # (title, [(summary key, line style, legend suffix)], y label)
    ("time per output token", [("p50_tpot_ms", "-", "TPOT p50"), ("p99_tpot_ms", "--", "TPOT p99"),
                               ("p99_itl_ms", ":", "ITL p99")], "ms"),
    ("time to first token", [("p50_ttft_ms", "-", "TTFT p50"), ("p99_ttft_ms", "--", "TTFT p99")], "ms"),
    ("output throughput", [("output_throughput", "-", "tok/s")], "tokens/s"),
)


class PlotsUnavailable(RuntimeError):
    """matplotlib, the extra `plot`, is not installed: the tables print, the plots are not drawn."""


def plot_run_sets(run_sets: list[RunSet], path: Path, title: str = "", floor_ms: float | None = None) -> Path:
    """Write one PNG with a panel per metric family; one colour per run set."""
    pyplot = load_pyplot()
    figure, axes = pyplot.subplots(1, len(PANELS), figsize=(6 * len(PANELS), 4.8), constrained_layout=True)
    concurrencies = sorted({c for run_set in run_sets for c in run_set.concurrencies})
    for axis, (panel_title, lines, unit) in zip(axes, PANELS):
        for colour, run_set in enumerate(run_sets):
            summary = run_set.summary()
            for key, style, suffix in lines:
                points = [(c, summary[c][key]) for c in sorted(summary) if key in summary[c]]
                if points:
                    axis.plot(*zip(*points), style, marker="o", color=f"C{colour}", label=f"{run_set.name} {suffix}")
        if panel_title == "time per output token" and floor_ms:
            axis.axhline(floor_ms, color="black", linewidth=1, linestyle="-.",
                         label=f"batch-1 floor {floor_ms:.2f} ms")
        if panel_title == "time per output token":
            axis.set_yscale("log")  # a prefill stall in p99 ITL (100+ ms) would flatten the per-token lines
        axis.set_xscale("log", base=2)
        axis.set_xticks(concurrencies, [str(c) for c in concurrencies])
        axis.set_xlabel("concurrency (requests in flight)")
        axis.set_ylabel(unit)
        axis.set_title(panel_title)
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=7)
    if title:
        figure.suptitle(title)
    return save(pyplot, figure, path)


def load_pyplot():
    """matplotlib's pyplot on the Agg backend (files, no display), or PlotsUnavailable saying how to get it."""
    try:
        import matplotlib
    except ImportError:
        raise PlotsUnavailable(f"no plot drawn: matplotlib is not installed — for plots: {PLOT_EXTRA}") from None

    matplotlib.use("Agg")
    from matplotlib import pyplot
    return pyplot


def save(pyplot, figure, path: Path) -> Path:
    """The figure as a PNG at `path` (its folder made), then closed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    pyplot.close(figure)
    return path
