"""The tuner's choice on the real H200 grid (tests/fixtures/vllm/h200-tune/grid: vLLM 0.25.0, five
candidates side by side, vLLM's own result JSON per run, 1 and 64 users, 3 rounds), replayed offline as
`provision tune --from-results` does: the highest throughput that meets the SLO, and no other."""

from __future__ import annotations

from pathlib import Path

import pytest

from provisioner.tune.measure import replay
from provisioner.tune.slo import parse_slo
from provisioner.tune.space import search_space
from tests.unit.recorded_runs import lay_out_run_set

GRID = Path(__file__).resolve().parents[1] / "fixtures" / "vllm" / "h200-tune" / "grid"
LABELS = {"defaults": "baseline", "mnbt2048": "max-num-batched-tokens=2048", "mnbt1024": "max-num-batched-tokens=1024",
          "mnbt512": "max-num-batched-tokens=512", "interactivity": "performance-mode=interactivity"}
CONCURRENCY = {"single": 1, "concurrent": 64}
AXES = search_space("0.25.0", {"max-num-batched-tokens": (2048, 1024, 512), "performance-mode": ("interactivity",)})


@pytest.fixture
def recorded(tmp_path) -> Path:
    """The grid in the layout --from-results reads: LABEL/runset.json, LABEL/runs/c<C>-r<R>.json."""
    for name, label in LABELS.items():
        lay_out_run_set(tmp_path, label, ((result, f"c{CONCURRENCY[result.stem.partition('-')[0]]}-"
                                                   f"{result.stem.partition('-')[2]}")
                                          for result in (GRID / name).glob("*.json")))
    return tmp_path


def winner(recorded: Path, slo: str) -> str | None:
    choice = replay(recorded, parse_slo(slo), AXES).choice
    return choice.winner.name if choice.winner else None


def test_every_candidate_is_read_with_its_three_rounds(recorded):
    outcomes = {outcome.name: outcome for outcome in replay(recorded, parse_slo("itl_p99<=30ms"), AXES).outcomes}
    assert sorted(outcomes) == sorted(LABELS.values())
    assert {name: outcome.concurrency for name, outcome in outcomes.items()} == dict.fromkeys(LABELS.values(), 64)
    assert [len(outcome.run_set.runs) for outcome in outcomes.values()] == [6] * 5


def test_an_itl_bound_picks_the_smallest_prefill_chunk(recorded):
    """ITL p99 at 64 users: 137 ms (8192, vLLM's default), 47 (2048), 28 (1024), 16 ms (512); the 512
    chunk also has the highest median throughput of those under 30 ms."""
    assert winner(recorded, "itl_p99<=30ms") == "max-num-batched-tokens=512"


def test_a_ttft_bound_beside_it_picks_the_next_chunk(recorded):
    """512's TTFT p99 (927 ms median) misses 900 ms; 1024's (855) meets both — the fastest candidate
    that ignores the SLO would be 512."""
    assert winner(recorded, "itl_p99<=30ms,ttft_p99<=900ms") == "max-num-batched-tokens=1024"


def test_an_slo_vllm_s_defaults_meet_keeps_them(recorded):
    assert winner(recorded, "ttft_p99<=800ms") == "baseline"


def test_an_slo_nothing_meets_names_none(recorded):
    choice = replay(recorded, parse_slo("itl_p99<=10ms"), AXES).choice
    assert choice.winner is None and choice.closest.name == "max-num-batched-tokens=512"
