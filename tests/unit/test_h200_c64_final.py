"""The last 64-user measurement of issue 19 on the real H200 (tests/fixtures/vllm/h200-c64-final: vLLM 0.25.0,
five servers side by side, vLLM's own result JSON per run, 5 rounds): its README's medians are those of the
JSONs, and the tuner, replaying them as `provision tune --from-results` does, finds what the README says —
an ITL bound alone picks the `latency` profile's chunk, and no chunk meets it with the defaults' TTFT p99."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest

from provisioner.tune.measure import replay
from provisioner.tune.slo import parse_slo
from provisioner.tune.space import search_space
from tests.unit.recorded_runs import lay_out_run_set

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "vllm" / "h200-c64-final"
CANDIDATES = ("defaults", "mnbt1024-cg1024", "mnbt1024-cg1024-spawn", "mnbt1280-cg1280", "mnbt1536-cg1536")
# the README's tables: their title, and the field of vLLM's result JSON they show
TABLES = {"c=64 output tok/s": "output_throughput", "c=64 TTFT p99 ms": "p99_ttft_ms", "c=64 ITL p99 ms": "p99_itl_ms"}
# the candidates the tuner can tell apart by their flags (spawn differs from fork by its environment only)
LABELS = {"defaults": "baseline",
          "mnbt1024-cg1024": "max-num-batched-tokens=1024,max-cudagraph-capture-size=1024",
          "mnbt1280-cg1280": "max-num-batched-tokens=1280,max-cudagraph-capture-size=1280",
          "mnbt1536-cg1536": "max-num-batched-tokens=1536,max-cudagraph-capture-size=1536"}
AXES = search_space("0.25.0", {"max-num-batched-tokens": (1024, 1280, 1536),
                               "max-cudagraph-capture-size": (1024, 1280, 1536)})


def rounds(candidate: str, field: str) -> list[float]:
    return [json.loads((RECORDED / candidate / f"concurrent-r{round_}.json").read_text())[field] for round_ in range(1, 6)]


def readme_medians(title: str) -> dict[str, float]:
    """The bold column (median of rounds 1-5) of the README's table under **title**."""
    text = (RECORDED / "README.md").read_text()
    table = text[text.index(f"**{title}**"):].split("\n\n")[1]
    return {row.split("|")[1].strip(): float(re.search(r"\*\*([0-9.]+)\*\*", row).group(1))
            for row in table.splitlines()[2:]}


@pytest.mark.parametrize("title", TABLES)
def test_the_readme_shows_the_medians_of_the_recorded_runs(title):
    expected = {candidate: round(statistics.median(rounds(candidate, TABLES[title])), 2) for candidate in CANDIDATES}
    assert readme_medians(title) == pytest.approx(expected, abs=0.01)


def test_fork_holds_itl_p99_under_30_ms_in_every_round_as_spawn_does():
    assert max(rounds("mnbt1024-cg1024", "p99_itl_ms")) < 30
    assert max(rounds("mnbt1024-cg1024-spawn", "p99_itl_ms")) < 30


@pytest.fixture
def recorded(tmp_path) -> Path:
    """The runs in the layout --from-results reads: LABEL/runset.json, LABEL/runs/c64-rN.json."""
    for name, label in LABELS.items():
        lay_out_run_set(tmp_path, label, ((result, f"c64-{result.stem.partition('-')[2]}")
                                          for result in (RECORDED / name).glob("concurrent-r*.json")))
    return tmp_path


def test_an_itl_bound_picks_the_chunk_of_the_latency_profile(recorded):
    """ITL p99 medians 127 (defaults), 26.0 (1024), 32.9 (1280), 36.4 ms (1536): only 1024 is under 30 ms."""
    choice = replay(recorded, parse_slo("itl_p99<=30ms"), AXES).choice
    assert choice.winner.name == LABELS["mnbt1024-cg1024"]


def test_no_chunk_meets_the_itl_bound_with_the_ttft_p99_of_the_defaults(recorded):
    """The trade the README names: the defaults' TTFT p99 (767 ms median) is met only by chunks whose ITL
    p99 is above 30 ms — the closest is the 1024 chunk, 5 % over on TTFT."""
    choice = replay(recorded, parse_slo("itl_p99<=30ms,ttft_p99<=770ms"), AXES).choice
    assert choice.winner is None
    assert choice.closest.name == LABELS["mnbt1024-cg1024"]
