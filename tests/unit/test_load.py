"""tests/lab/load.py, the bastion's steady load, against the TEST DOUBLE vLLM server on 127.0.0.1: exact
counts for a rate and a duration, the mix of chat and completions, streamed and not, a SIGTERM mid-load as
vLLM's two --shutdown-timeout behaviours show it to a client, failures by kind, and the report's text; its
chat checks also against vLLM's own answers (tests/fixtures/vllm/h200-chat) replayed byte for byte."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tests.lab.load import Load, Report, Request, Tally
from tests.unit.standin import MODEL, free_port, running
from tests.unit.test_standin_chat import FIXTURE, RECORD, parse

KEY = "sk-load-test"


def url(port: int) -> str:
    return f"http://127.0.0.1:{port}"


def load_threads() -> list[str]:
    return [thread.name for thread in threading.enumerate() if thread.name.startswith("load")]


def test_a_rate_for_a_duration_sends_that_many_and_stops_by_itself(tmp_path):
    port = free_port()
    with running(port, tmp_path / "standin.log", "--api-key", KEY):
        load = Load(url(port), MODEL, KEY, rate=20, duration=2).start()
        assert load.join(timeout=10), "the load did not stop by itself"
        ended = load.elapsed()
        report = load.report()
        time.sleep(0.5)
        assert load.report().sent == report.sent and not load.running
    # a request every 50 ms from 0 to 1.95 s (one late, as on a busy machine, goes at once)
    assert 1.95 <= report.sending_s <= ended < 5, (report.sending_s, ended)
    assert (report.sent, report.ok, report.failed) == (40, 40, {}), report.text()
    assert sum(second.ok for second in report.seconds) == 40 and report.seconds[0].ok >= 19, report.text()
    assert all(request.tokens == 16 for request in report.requests)
    assert load_threads() == []


STREAM_TOKENS = 600


def signal_mid_load(tmp_path, shutdown_timeout: int) -> tuple[Report, float, int]:
    """Streams of 600 tokens (3 s each at 5 ms a token) sent at 20/s for 1.5 s; SIGTERM to the server
    once the last one streams; (the report once every request ended, the signal's moment, the server's exit).
    The first stream is half way at the signal, so a slow, busy machine (CI's 2 cores streamed 300 tokens
    in 1.72 s) still cuts every one of them before its last token."""
    port = free_port()
    with running(port, tmp_path / "standin.log", "--shutdown-timeout", str(shutdown_timeout)) as server:
        load = Load(url(port), MODEL, None, rate=20, duration=1.5, max_tokens=STREAM_TOKENS).start()
        deadline = time.monotonic() + 10
        while load.report().sent < 30 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        signalled = load.mark("SIGTERM")
        server.terminate()
        assert load.join(timeout=20)
        exit_code = server.wait(timeout=20)
    return load.report(), signalled, exit_code


def test_sigterm_with_shutdown_timeout_0_is_counted_as_aborted_streams(tmp_path):
    report, signalled, exit_code = signal_mid_load(tmp_path, shutdown_timeout=0)
    assert exit_code == 0
    assert report.sent == 30 and set(report.failed) == {"aborted"}, report.text()
    # every stream is in flight at the signal (3 s each, the first sent about 1.7 s before), cut at once
    aborted = [request for request in report.requests if request.outcome == "aborted"]
    assert len(aborted) >= 10, report.text()
    assert {request.kind for request in aborted} == {"chat", "completions"}, report.text()  # half of each
    assert all(signalled <= request.ended_s < signalled + 1 and request.tokens < STREAM_TOKENS for request in aborted), \
        report.text()
    cut = min(request.ended_s for request in aborted)
    assert all(request.ended_s < cut + 0.1 for request in report.requests if request.outcome == "ok"), report.text()
    assert "SIGTERM" in report.text() and "aborted" in report.text()


def test_sigterm_with_shutdown_timeout_30_costs_no_request(tmp_path):
    report, signalled, exit_code = signal_mid_load(tmp_path, shutdown_timeout=30)
    assert exit_code == 0
    assert (report.sent, report.ok, report.failed) == (30, 30, {}), report.text()
    assert sum(request.ended_s > signalled + 0.3 for request in report.requests) >= 10, "nothing was in flight"
    assert all(request.tokens == STREAM_TOKENS for request in report.requests)


def test_failures_by_kind(tmp_path):
    nobody = free_port()
    refused = Load(url(nobody), MODEL, KEY, rate=20, duration=0.5).start()
    port = free_port()
    with running(port, tmp_path / "standin.log", "--api-key", KEY, STANDIN_TTFT_MS="3000"):
        with Load(url(port), MODEL, "sk-wrong", rate=20, duration=0.5) as unauthorized:
            assert unauthorized.join(timeout=10)
        slow = Load(url(port), MODEL, KEY, rate=10, duration=0.3, timeout=0.5).start()
        assert slow.join(timeout=10)
    assert refused.join(timeout=10)
    assert (refused.report().sent, refused.report().failed) == (10, {"refused": 10})
    assert (unauthorized.report().sent, unauthorized.report().failed) == (10, {"http 401": 10})
    assert (slow.report().sent, slow.report().failed) == (3, {"timeout": 3})
    assert all(0.5 <= request.ended_s - request.sent_s < 2.5 for request in slow.report().requests)  # TTFT: 3 s


def test_unstreamed_completions_and_the_with_block(tmp_path):
    port = free_port()
    with running(port, tmp_path / "standin.log"):
        with Load(url(port), MODEL, None, rate=20, stream=False) as load:  # no duration: the block bounds it
            time.sleep(0.5)
        report = load.report()
    # a request every 50 ms until the block ended
    assert not load.running and abs(report.sent - report.sending_s * 20) <= 1 and report.ok == report.sent, \
        report.text()
    assert load_threads() == []


def test_bad_arguments_are_refused():
    for arguments in ({"url": "127.0.0.1:8000"}, {"rate": 0}, {"duration": 0}, {"timeout": -1}, {"chat": 1.5},
                      {"stream": 2}):
        with pytest.raises(ValueError):
            Load(**{"url": "http://127.0.0.1:1", "model": MODEL, "api_key": None, **arguments})


def test_the_report_reads_one_line_a_second_with_the_marks():
    requests = [Request(0.0, 0.1, "ok"), Request(0.5, 0.6, "ok"),
                Request(1.0, 1.2, "aborted", "3 of 16 tokens, finish_reason abort", 3),
                Request(1.5, 1.5, "refused"), Request(2.0, 2.1, "ok")]
    report = Report(rate=2, sending_s=2.5, requests=requests, in_flight=1,
                    marks=[(0.9, "gpu-a: restart"), (2.2, "gpu-a: up"), (3.4, "done")])
    assert (report.sent, report.ok, report.failed, report.failed_total) == (6, 3, {"aborted": 1, "refused": 1}, 2)
    assert report.text().splitlines() == [
        "load 2/s for 2.5 s: 6 sent, 3 ok, 2 failed (aborted 1, refused 1), 1 in flight; "
        "ok in 0.10 s (median), 0.10 s (max)",
        "    0s    2 ok                               << 0.90 gpu-a: restart",
        "    1s    0 ok    2 failed (aborted 1, refused 1)",
        "    2s    1 ok                               << 2.20 gpu-a: up",
        "    3s    0 ok                               << 3.40 done",
        "     1.00s aborted after 0.20 s: 3 of 16 tokens, finish_reason abort",
        "     1.50s refused after 0.00 s",
    ]


def test_a_mix_of_chat_and_completions_streamed_and_not(tmp_path):
    port = free_port()
    with running(port, tmp_path / "standin.log", "--api-key", KEY):
        load = Load(url(port), MODEL, KEY, rate=20, duration=2, chat=0.5, stream=0.5).start()
        assert load.join(timeout=10)
    report = load.report()
    mix = [(request.kind, request.streamed) for request in report.requests]
    assert {pair: mix.count(pair) for pair in set(mix)} == {
        ("chat", True): 10, ("chat", False): 10, ("completions", True): 10, ("completions", False): 10}
    assert report.kinds == {"chat": Tally(ok=20), "completions": Tally(ok=20)}, report.text()
    # every streamed answer counted token by token: a chat's deltas as a completion's texts
    assert {request.tokens for request in report.requests if request.streamed} == {16}, report.text()
    assert "[chat 20 ok, 0 failed; completions 20 ok, 0 failed]" in report.summary()
    only = Load(url(port), MODEL, KEY, chat=0)
    assert [only._pick(index)[0] for index in range(3)] == ["completions"] * 3  # chat 0: as before the mix


@contextlib.contextmanager
def replaying(raw: bytes) -> Iterator[int]:
    """A server on 127.0.0.1 (its port yielded) answering every request with `raw`, then closing."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:  # closed: the block ended
                return
            with connection:
                request = b""
                while b"\r\n\r\n" not in request:
                    request += connection.recv(65536)
                head, _, body = request.partition(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                while len(body) < length:
                    body += connection.recv(65536)
                connection.sendall(raw)

    threading.Thread(target=serve, name="replay", daemon=True).start()
    try:
        yield server.getsockname()[1]
    finally:
        server.close()


def replayed(name: str, stream: bool, max_tokens: int = 8, raw: bytes | None = None) -> Report:
    """Chat requests only (8 at 20/s), each answered with the fixture's answer `name` (or `raw`)."""
    with replaying(raw or (FIXTURE / f"{name}.response.http").read_bytes()) as port:
        load = Load(url(port), RECORD.MODEL, None, rate=20, duration=0.4, max_tokens=max_tokens, stream=stream,
                    chat=1).start()
        assert load.join(timeout=10)
    return load.report()


def test_chat_answers_are_checked_as_vllm_sends_them():
    streamed = replayed("chat-stream", stream=True)
    assert streamed.kinds == {"chat": Tally(ok=8)} and {r.tokens for r in streamed.requests} == {8}, streamed.text()
    assert replayed("chat-stream-usage", stream=True).kinds == {"chat": Tally(ok=8)}
    assert replayed("chat", stream=False).kinds == {"chat": Tally(ok=8)}
    # one token fewer than asked: short; a completion's chunks have no delta: no token counted
    assert replayed("chat-stream", stream=True, max_tokens=9).failed == {"short": 8}
    assert replayed("completions-stream", stream=True).failed == {"short": 8}
    status, headers, body = parse((FIXTURE / "chat.response.http").read_bytes())
    answer = json.loads(body)
    del answer["choices"][0]["message"]["content"]
    data = json.dumps(answer).encode()
    raw = (f"HTTP/1.1 {status} OK\r\ncontent-type: {headers['content-type']}\r\n"
           f"content-length: {len(data)}\r\nconnection: close\r\n\r\n").encode() + data
    no_content = replayed("", stream=False, raw=raw)
    assert no_content.failed == {"bad answer": 8}, no_content.text()
    # a stream cut before [DONE]
    recorded = (FIXTURE / "chat-stream.response.http").read_bytes()
    cut = replayed("", stream=True, raw=recorded[:recorded.index(b"[DONE]") - 12])
    assert set(cut.failed) == {"truncated"}, cut.text()
