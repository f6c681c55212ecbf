"""The TEST DOUBLE vLLM server's /v1/chat/completions (and a /v1/completions stream) held to vLLM 0.25.0's
answers in tests/fixtures/vllm/h200-chat: each exchange there is sent to the stand-in as it was sent to vLLM,
and the two answers compared in structure: the status, the headers' names in order but those the transport
or the moment decides (date, server, connection, content-length, transfer-encoding), the content type,
every JSON body's keys in their order with their values' types, the values that name a kind (objects,
roles, finish reasons, error types and params, the ids' prefixes), an error's message (the path of the
file it names from `/vllm/` on), a stream's sequence of events (runs of alike chunks as one), [DONE] last,
and the usage's count of tokens against the chunks streamed. Not compared: values that vary (ids, times,
words, the fingerprint's hash). The stream cut by SIGTERM is cut so: a stand-in of its own gets the
signal while it streams."""

from __future__ import annotations

import http.client
import importlib.util
import json
import re
import signal
import time

import pytest

from tests.unit.standin import ROOT, free_port, running

FIXTURE = ROOT / "tests" / "fixtures" / "vllm" / "h200-chat"
NAMES = sorted(path.name.removesuffix(".response.http") for path in FIXTURE.glob("*.response.http"))
VALUES = {"object", "role", "finish_reason", "type", "param", "code"}  # compared as they are, not by type
TRANSPORT = {"date", "server", "connection", "content-length", "transfer-encoding"}  # headers not compared
_spec = importlib.util.spec_from_file_location("h200_chat_record", FIXTURE / "record.py")
RECORD = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(RECORD)  # the recording's model name, key and routes: one place
SERVED_AS_RECORDED = ("--served-model-name", RECORD.MODEL, "--api-key", RECORD.KEY)  # the stand-in's options


def parse(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """An HTTP/1.x response's (status, headers by lower-case name, body), a chunked body joined."""
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.strip().lower(): value.strip() for name, value in (line.split(":", 1) for line in lines)}
    if headers.get("transfer-encoding") == "chunked":
        joined = b""
        while True:
            size, _, body = body.partition(b"\r\n")
            size = int(size.split(b";")[0], 16)
            if not size:
                break
            joined, body = joined + body[:size], body[size + 2:]
        body = joined
    return int(status_line.split()[1]), headers, body


def events(body: bytes) -> list:
    """A Server-Sent Events body's data, each a JSON value or the string "[DONE]"."""
    data = [line[len(b"data: "):].decode() for line in body.split(b"\n\n") if line.startswith(b"data: ")]
    assert b"".join(b"data: " + item.encode() + b"\n\n" for item in data) == body, "not only data events"
    return [item if item == "[DONE]" else json.loads(item) for item in data]


def shape(value, key: str | None = None):
    """The structure of a JSON value: dicts as their (key, shape) pairs in order, lists item by item, the
    VALUES keys' values, an id's prefix and a message (but the path of a file it names) as they are, any
    other scalar as its type's name."""
    if isinstance(value, dict):
        return [(name, shape(item, name)) for name, item in value.items()]
    if isinstance(value, list):
        return [shape(item) for item in value]
    if key in VALUES or value is None:
        return value
    if key == "id":
        return value.split("-")[0] + "-…"
    if key == "message" and isinstance(value, str):  # an error's
        return re.sub(r'File "[^"]*/vllm/', 'File "…/vllm/', value)
    return type(value).__name__


def structure(raw: bytes) -> dict:
    """What the test compares of one answer."""
    status, headers, body = parse(raw)
    kind = headers.get("content-type")
    found = {"status": status, "content-type": kind, "headers": [name for name in headers if name not in TRANSPORT]}
    if not kind.startswith("text/event-stream"):
        return {**found, "body": shape(json.loads(body))}
    stream = events(body)
    runs = []
    for event in stream:
        if not runs or shape(event) != runs[-1]:
            runs.append(shape(event))
    tokens = sum(1 for event in stream if isinstance(event, dict) for choice in event["choices"]
                 if choice.get("text") or (choice.get("delta") or {}).get("content"))
    usage = [event["usage"]["completion_tokens"] for event in stream if isinstance(event, dict) and "usage" in event]
    return {**found, "events": runs, "usage counts the tokens": usage in ([], [tokens])}


def standin_answer(port: int, name: str, body: bytes | None = None, streaming=lambda: None) -> bytes:
    """The stand-in's answer to the fixture's request `name` (or to `body` sent as that one), as raw bytes
    as record.py takes them; `streaming()` runs once the answer's head came."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    key = RECORD.key_of(name)
    body = body or (FIXTURE / f"{name}.request.json").read_bytes()
    connection.request("POST", RECORD.path_of(name), body=body, headers={
        "Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})})
    response = connection.getresponse()
    streaming()
    head = f"HTTP/1.1 {response.status} {response.reason}\r\n" + "".join(
        f"{name}: {value}\r\n" for name, value in response.getheaders() if name.lower() != "transfer-encoding")
    raw = head.encode() + b"\r\n" + response.read()  # http.client joins a chunked body
    connection.close()
    return raw


@pytest.fixture(scope="module")
def standin_port(tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("standin") / "standin.log"
    with running(port, log, *SERVED_AS_RECORDED):
        yield port


def test_the_fixture_holds_the_exchanges_the_stand_in_must_answer():
    assert set(NAMES) == {*RECORD.EXCHANGES, "chat-stream-sigterm"}, NAMES


@pytest.mark.parametrize("name", NAMES)
def test_the_stand_in_answers_as_vllm_did(standin_port, name, tmp_path):
    recorded = structure((FIXTURE / f"{name}.response.http").read_bytes())
    if name == "chat-stream-sigterm":  # as record.py: the signal while the stream goes on
        port = free_port()
        with running(port, tmp_path / "standin.log", *SERVED_AS_RECORDED) as server:
            answer = standin_answer(port, name, streaming=lambda: (time.sleep(0.3), server.send_signal(signal.SIGTERM)))
    else:
        answer = standin_answer(standin_port, name)
    assert structure(answer) == recorded


def test_max_completion_tokens_bounds_a_chat_as_max_tokens_does(standin_port):
    body = json.dumps({**RECORD.EXCHANGES["chat-stream-usage"], "max_tokens": None, "max_completion_tokens": 3})
    stream = events(parse(standin_answer(standin_port, "chat-stream-usage", body.encode()))[2])
    assert [event["choices"][0]["delta"].get("content") for event in stream[1:4]] == [" w"] * 3
    assert stream[3]["choices"][0]["finish_reason"] == "length" and stream[4]["usage"]["completion_tokens"] == 3


def test_a_chat_stream_opens_with_the_role_and_ends_with_a_finish_then_done():
    """What the comparison above relies on, read in the fixture itself: so a recording that lacks it fails here."""
    stream = events(parse((FIXTURE / "chat-stream.response.http").read_bytes())[2])
    assert stream[0]["object"] == "chat.completion.chunk" and stream[0]["id"].startswith("chatcmpl-")
    assert stream[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert stream[-2]["choices"][0]["finish_reason"] in ("length", "stop") and stream[-1] == "[DONE]"


def test_the_comparison_sees_a_renamed_key_and_a_changed_object():
    recorded = (FIXTURE / "chat-stream.response.http").read_bytes()
    assert structure(recorded.replace(b'"logprobs"', b'"logprobz"')) != structure(recorded)
    assert structure(recorded.replace(b'"chat.completion.chunk"', b'"chat.completion.chonk"')) != structure(recorded)
    assert structure(recorded.replace(b"vary: Origin\r\n", b"")) != structure(recorded)
    refused = (FIXTURE / "chat-empty-messages.response.http").read_bytes()
    assert structure(refused.replace(b"at least one", b"at least 1")) != structure(refused)


@pytest.mark.parametrize("options, fingerprint", [
    ((), r"vllm-[0-9.]+-[0-9a-f]{8}"),  # as recorded: --fingerprint-mode full, one GPU (this source tree: vllm 0.0.0)
    (("--tensor-parallel-size", "2"), r"vllm-[0-9.]+-tp2-[0-9a-f]{8}"),
    (("--tensor-parallel-size", "2", "--fingerprint-mode", "hash"), r"vllm-[0-9.]+-[0-9a-f]{8}"),
    (("--fingerprint-mode", "custom", "--fingerprint-value", "ours"), "ours"),
    (("--fingerprint-mode", "none"), None)])
def test_the_system_fingerprint_follows_fingerprint_mode(tmp_path, options, fingerprint):
    """vLLM's --fingerprint-mode (vllm/entrypoints/serve/utils/fingerprint.py): a whole answer's
    system_fingerprint, and a stream's usage chunk's (left out where it is None)."""
    port = free_port()
    with running(port, tmp_path / "standin.log", *SERVED_AS_RECORDED, *options):
        whole = json.loads(parse(standin_answer(port, "chat"))[2])["system_fingerprint"]
        usage = events(parse(standin_answer(port, "chat-stream-usage"))[2])[-2]
    assert whole == fingerprint if fingerprint in (None, "ours") else re.fullmatch(fingerprint, whole), whole
    assert usage.get("system_fingerprint") == whole
