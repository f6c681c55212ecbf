"""The audit replayed over what a real H200 host answered (issue 35, point 5).

TEST DOUBLE: the host. What it answered is a recording (tests/fixtures/gpu/h200-audit/replay/outputs.json) made
on the lent GPU machine (an H100 80GB that day) by record_outputs.py: `provision audit host ssh://root@127.0.0.1:2222 --all` over real SSH, with
real vLLM 0.25.0 servers on the GPU (benchmarks/h200/gpu_session.sh), every command the audit sent and the output
and exit status it got, in order. audit-recorded.json is the report that run gave there. Here the same discovery,
expectations and checks run over the recorded answers and must give the same rows: what the audit concludes from
a real GPU host's answers is pinned, and a change to a check that would read them differently fails here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from provisioner.audit import discovery, engine
from provisioner.audit.engine import Output, audit_facts, host_cases, read_facts
from provisioner.audit.expectations import load_profile, profile_expectations, profile_variables

REPLAY = Path(__file__).resolve().parents[1] / "fixtures" / "gpu" / "h200-audit" / "replay"


@pytest.fixture
def answers(monkeypatch):
    """The recorded answers, handed out in the order the audit asked for them; each call must ask for the
    same commands it asked for there."""
    calls = list(json.loads((REPLAY / "outputs.json").read_text(encoding="utf-8"))["calls"])

    def answered(host, commands, given=None):
        assert calls, f"the audit asked for more than it did on the H200: {sorted(commands)}"
        call = calls.pop(0)
        assert sorted(commands) == sorted(call["commands"]), "the audit asks other questions than it did there"
        return {name: Output(out["text"], out["rc"]) for name, out in call["outputs"].items()}

    monkeypatch.setattr(engine, "run_commands", answered)
    monkeypatch.setattr(discovery, "run_commands", answered)
    return calls


def recorded_report() -> tuple[str, dict]:
    ((host, report),) = json.loads((REPLAY / "audit-recorded.json").read_text(encoding="utf-8"))["hosts"].items()
    return host, report


def rows(checks) -> list[tuple[str, str, str, str]]:
    return [(check["check"], check["expected"], check["actual"], check["status"]) for check in checks]


def test_the_audit_over_the_h200_s_answers_gives_the_rows_it_gave_there(answers):
    host, report = recorded_report()
    profile = load_profile("recommended")
    expected = profile_expectations(profile, discovery.discover(None, profile_variables(profile)["nvidia_gpu_nvidia_smi"]))
    replayed = [result.__dict__ for result in audit_facts(host, expected, lambda: read_facts(None, expected),
                                                          host_cases(host, expected))]
    assert rows(replayed) == rows(report["checks"])
    assert answers == []  # every recorded answer was asked for


def test_the_recording_is_of_a_gpu_serving_vllm():
    """What the replay pins is a real GPU host's: the lent machine's card, two vLLM 0.25.0 servers on it."""
    _, report = recorded_report()
    found = {check["check"]: check["actual"] for check in report["checks"]}
    assert found["GPU 0 model"].startswith("NVIDIA H100"), found["GPU 0 model"]
    assert found["vLLM processes"].count("process ") == 2, found["vLLM processes"]
    assert [found[f"process {pid}: vLLM running"] for pid in (773, 1077)] == ["0.25.0 (its API's /version)"] * 2
