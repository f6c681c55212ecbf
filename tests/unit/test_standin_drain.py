"""The TEST DOUBLE vLLM server stops as the real vLLM 0.25 stopped on the H200 (recorded by
benchmarks/h200/drain.py: tests/fixtures/vllm/h200-drain/drain.json): the same protocol (streams in
flight, SIGTERM, new requests and /health while it stops), run here against the stand-in, must show the
same behaviour for each --shutdown-timeout the recording has."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.h200.drain import behaviour, round_of
from tests.unit.standin import free_port, standin, stop

ROOT = Path(__file__).resolve().parents[2]
RECORDING = json.loads((ROOT / "tests" / "fixtures" / "vllm" / "h200-drain" / "drain.json").read_text())
RECORDED_TIMEOUTS = sorted({entry["shutdown_timeout_s"] for entry in RECORDING["rounds"]})


def recorded(timeout: int, signal: str) -> dict:
    (entry,) = [entry for entry in RECORDING["rounds"]
                if entry["shutdown_timeout_s"] == timeout and entry["signal"] == signal]
    return entry


def test_the_recording_shows_what_the_shutdown_timeout_changes():
    """The record itself: 0 aborts the streams in flight at once, 30 lets them finish; how the signal
    reaches the server (API server alone, or its whole process group as systemd sends it) changes nothing."""
    for signal in ("SIGTERM to the API server", "SIGTERM to the process group"):
        aborted, drained = (behaviour(recorded(timeout, signal)) for timeout in (0, 30))
        assert (aborted["streams_in_flight"], aborted["streams_end"]) == (["abort"], "at the signal"), signal
        assert (drained["streams_in_flight"], drained["streams_end"]) == (["finished"], "after the signal"), signal
        assert aborted["exits"] == drained["exits"] == "with the last stream", signal
        assert aborted["new_requests"] == drained["new_requests"] == ["ConnectionRefusedError"], signal


@pytest.mark.parametrize("timeout", RECORDED_TIMEOUTS)
def test_the_standin_stops_as_the_real_server_stopped(timeout, tmp_path):
    port, log = free_port(), tmp_path / "standin.log"
    server = standin(port, log, "--shutdown-timeout", str(timeout))  # 400 tokens a stream at 5 ms each (2 s)
    try:
        result = round_of(port, server, whole_group=False, long_tokens=400, signal_after_s=0.5, watch_s=20)
    finally:
        if server.poll() is None:
            stop(server)
    assert server.returncode == 0, log.read_text()
    assert behaviour(result) == behaviour(recorded(timeout, "SIGTERM to the API server")), json.dumps(result)[:3000]


def test_an_exit_seen_a_hair_before_the_last_stream_ended_is_with_it_and_one_well_before_or_after_is_not():
    """CI saw the stand-in exit at 0.550 s and its last stream end at 0.551 s (two threads' clocks)."""
    round_ = recorded(0, "SIGTERM to the API server")
    last = max(stream["ended_s"] for stream in round_["in_flight"])
    assert behaviour({**round_, "server_exited_s": last - 0.001})["exits"] == "with the last stream"
    assert behaviour({**round_, "server_exited_s": last - 0.5})["exits"] == "before the last stream"
    assert behaviour({**round_, "server_exited_s": last + 7})["exits"] == "later"
