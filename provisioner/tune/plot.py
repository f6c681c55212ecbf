"""The Pareto plot of a tuning run: each candidate's throughput against its tightest SLO term (as a
share of its limit), the front joined, the SLO's limit drawn, the winner marked. matplotlib is the
extra `plot`, as for `provision bench`'s plots."""

from __future__ import annotations

import math
from pathlib import Path

from provisioner.bench.plots import load_pyplot, save
from provisioner.tune.search import Outcome, choose, pareto_front


def plot_pareto(outcomes: list[Outcome], path: Path, title: str = "") -> Path:
    """One PNG: throughput against the tightest SLO term; PlotsUnavailable without matplotlib."""
    pyplot = load_pyplot()
    shown = [outcome for outcome in outcomes if math.isfinite(outcome.worst)]
    figure, axis = pyplot.subplots(figsize=(8, 5.5), constrained_layout=True)
    for outcome in shown:
        axis.scatter(outcome.worst * 100, outcome.throughput, color="C0" if outcome.meets else "C3", zorder=2)
        axis.annotate(outcome.name, (outcome.worst * 100, outcome.throughput), fontsize=6,
                      xytext=(4, 3), textcoords="offset points")
    front = pareto_front(shown)
    if front:
        axis.plot([o.worst * 100 for o in front], [o.throughput for o in front], "-", color="C0", alpha=0.5,
                  label="Pareto front", zorder=1)
    winner = choose(shown).winner
    if winner:
        axis.scatter(winner.worst * 100, winner.throughput, s=160, facecolors="none", edgecolors="black",
                     label=f"winner: {winner.name}", zorder=3)
    axis.axvline(100, color="black", linestyle="--", linewidth=1, label="SLO limit")
    axis.set_xlabel("tightest SLO term, % of its limit (≤ 100 %: meets the SLO)")
    axis.set_ylabel("output tokens/s at the highest concurrency")
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize=7)
    if title:
        axis.set_title(title)
    return save(pyplot, figure, path)
