"""A steady, bounded load from the bastion (the test process): completions and chat completions sent at a
fixed rate to an OpenAI-compatible server (a gateway, or one vLLM), each request's outcome counted, for
tests that prove a change costs no client request (rolling restarts behind a gateway).

    with Load(f"http://{gateway.address}:8080", MODEL, KEY, rate=20, duration=300) as load:
        ...                              # restart the hosts one by one
        load.mark("gpu-a: restart")      # a labelled moment, shown on the timeline
    report = load.report()
    assert report.failed_total == 0, report.text()
    report.kinds                         # {"chat": Tally(ok=N, failed=0), "completions": Tally(ok=M, failed=0)}

Open loop: a request every 1/rate s whatever the server does, each in a worker of its own (a bounded
pool, large enough for `rate` requests a second that each take up to `timeout`), so a slow or stopped
server shows as failed requests, never as a lower rate. One connection a request, with `Authorization:
Bearer KEY`: `POST {url}/v1/completions` with `{"model", "prompt", "max_tokens", "stream"}`, or (the
share `chat`, default 0.5) `POST {url}/v1/chat/completions` with `{"model", "messages": [{"role": "user",
"content": prompt}], "max_tokens", "stream"}`. `stream`: True (every request streamed, the default),
False, or the share streamed (0.5: half of each kind). The kinds and the streamed ones are spread evenly
over the requests in the order sent (chat 0.5: every other one), so a count of requests has a known mix.

Bounded: sending ends at `stop()`, at the end of the `with` block, or `duration` s after `start()`
(a safety bound: a test that fails before it stops the load leaves no load running); a request in flight
ends within its `timeout`.

Outcomes: `ok` is HTTP 200 and, for a stream, `data: [DONE]` seen after a finish_reason other than
"abort" and every token (max_tokens chunks with text, one a token as vLLM streams them: a completion's
`text`, a chat's `delta.content`, not counting the chat's opening chunk of role and empty content;
unless the model stopped on its own: finish_reason "stop"); unstreamed, a finish_reason other than
"abort" and, for a chat, a `choices[0].message.content` string and a finish_reason. A failure has a kind:
  refused       the connection was refused (nothing listens: a stopped server)
  closed        the connection closed before the status line
  reset         the connection reset before the status line
  http NNN      a status other than 200 (the gateway's 503: no replica up)
  aborted       finish_reason "abort" (vLLM's --shutdown-timeout 0 cuts the streams in flight so)
  truncated     the stream ended without [DONE] (the connection dropped mid-stream)
  short         [DONE] after fewer tokens than max_tokens, finish_reason "length"
  stream error  an error event in the stream
  bad answer    a 200 whose body is not what vLLM sends (a chat answer without message.content or
                finish_reason)
  timeout       no end within `timeout` s of sending
  error NAME    another exception (its class name)
  bastion busy  no free worker when the request was due (the load's own limit, never the server's)
Which replica answered is not recorded: neither vLLM nor the stand-in nor the gateway says it.

Standard library only.
"""

from __future__ import annotations

import http.client
import json
import math
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

OK = "ok"
COMPLETIONS, CHAT = "completions", "chat"  # the kinds of request
EXAMPLES = 5  # failed requests the report's text describes one by one


@dataclass(frozen=True)
class Request:
    """One request: seconds since the load started when it was sent and when it ended, its outcome."""

    sent_s: float
    ended_s: float
    outcome: str  # OK or a failure kind (the module's docstring)
    detail: str = ""  # what the failure showed (an error, a status's body, how far a stream got)
    tokens: int = 0  # text chunks streamed
    status: int | None = None
    kind: str = COMPLETIONS  # or CHAT
    streamed: bool = True


@dataclass(frozen=True)
class Tally:
    """The ended requests of one kind: how many were ok, how many failed."""

    ok: int = 0
    failed: int = 0


@dataclass
class Second:
    """One second of the timeline: the requests sent in it, by outcome, and the marks made in it."""

    second: int
    ok: int = 0
    failed: dict[str, int] = field(default_factory=dict)
    marks: list[tuple[float, str]] = field(default_factory=list)

    def line(self) -> str:
        failed = sum(self.failed.values())
        kinds = ", ".join(f"{kind} {count}" for kind, count in sorted(self.failed.items()))
        text = f"{self.second:5d}s {self.ok:4d} ok" + (f" {failed:4d} failed ({kinds})" if failed else "")
        marks = "; ".join(f"{at:.2f} {label}" for at, label in self.marks)
        return f"{text:<44} << {marks}" if marks else text


@dataclass(frozen=True)
class Report:
    """Totals and the per-second timeline (by the second each request was sent)."""

    rate: float
    sending_s: float  # how long requests were sent for
    requests: list[Request]  # the ended ones, in the order they were sent
    in_flight: int  # sent, not ended yet
    marks: list[tuple[float, str]]
    sent: int = field(init=False)
    ok: int = field(init=False)
    failed: dict[str, int] = field(init=False)  # kind of failure → count
    seconds: list[Second] = field(init=False)
    kinds: dict[str, Tally] = field(init=False)  # kind of request (COMPLETIONS, CHAT) → its ended requests

    def __post_init__(self):
        failed: dict[str, int] = {}
        for request in self.requests:
            if request.outcome != OK:
                failed[request.outcome] = failed.get(request.outcome, 0) + 1
        object.__setattr__(self, "sent", len(self.requests) + self.in_flight)
        object.__setattr__(self, "ok", len(self.requests) - sum(failed.values()))
        object.__setattr__(self, "failed", dict(sorted(failed.items())))
        object.__setattr__(self, "seconds", self._timeline())
        kinds: dict[str, Tally] = {}
        for request in self.requests:
            tally = kinds.get(request.kind, Tally())
            kinds[request.kind] = Tally(tally.ok + (request.outcome == OK), tally.failed + (request.outcome != OK))
        object.__setattr__(self, "kinds", dict(sorted(kinds.items())))

    @property
    def failed_total(self) -> int:
        return sum(self.failed.values())

    def _timeline(self) -> list[Second]:
        moments = [request.sent_s for request in self.requests] + [at for at, _ in self.marks]
        seconds = [Second(second) for second in range(int(max(moments, default=-1)) + 1)]
        for request in self.requests:
            second = seconds[int(request.sent_s)]
            if request.outcome == OK:
                second.ok += 1
            else:
                second.failed[request.outcome] = second.failed.get(request.outcome, 0) + 1
        for at, label in self.marks:
            seconds[int(at)].marks.append((at, label))
        return seconds

    def summary(self) -> str:
        kinds = ", ".join(f"{kind} {count}" for kind, count in self.failed.items())
        took = sorted(request.ended_s - request.sent_s for request in self.requests if request.outcome == OK)
        latency = f"; ok in {took[len(took) // 2]:.2f} s (median), {took[-1]:.2f} s (max)" if took else ""
        mix = "; ".join(f"{kind} {tally.ok} ok, {tally.failed} failed" for kind, tally in self.kinds.items())
        return (f"load {self.rate:g}/s for {self.sending_s:.1f} s: {self.sent} sent, {self.ok} ok, "
                f"{self.failed_total} failed" + (f" ({kinds})" if kinds else "")
                + (f", {self.in_flight} in flight" if self.in_flight else "")
                + (f" [{mix}]" if set(self.kinds) - {COMPLETIONS} else "") + latency)

    def lines(self) -> list[str]:
        """The summary, one line a second (marks inline), then the first failed requests."""
        failures = [request for request in self.requests if request.outcome != OK]
        examples = [f"  {request.sent_s:7.2f}s {request.outcome} after {request.ended_s - request.sent_s:.2f} s"
                    + (f": {request.detail}" if request.detail else "") for request in failures[:EXAMPLES]]
        more = [f"  ... {len(failures) - EXAMPLES} more failed"] if len(failures) > EXAMPLES else []
        return [self.summary(), *(second.line() for second in self.seconds), *examples, *more]

    def text(self) -> str:
        return "\n".join(self.lines())

    __str__ = text


class Load:
    """A steady load of completions and chat completions (see the module's docstring); start() or `with`,
    then stop()."""

    def __init__(self, url: str, model: str, api_key: str | None, rate: float = 20.0, duration: float | None = None,
                 max_tokens: int = 16, stream: bool | float = True, timeout: float = 30, prompt: str = "ping",
                 chat: float = 0.5):
        address = urllib.parse.urlsplit(url)
        if address.scheme not in ("http", "https") or not address.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        if rate <= 0 or timeout <= 0 or (duration is not None and duration <= 0):
            raise ValueError("rate, timeout and duration must be positive")
        if not (0 <= chat <= 1 and 0 <= stream <= 1):
            raise ValueError("chat and stream (a share) must be between 0 and 1")
        self.url, self.rate, self.duration, self.timeout = url, rate, duration, timeout
        self.max_tokens, self.stream, self.chat = max_tokens, float(stream), chat
        self._connection = http.client.HTTPSConnection if address.scheme == "https" else http.client.HTTPConnection
        self._host, self._port = address.hostname, address.port
        base = address.path.rstrip("/")
        self._paths = {COMPLETIONS: base + "/v1/completions", CHAT: base + "/v1/chat/completions"}
        asked = {COMPLETIONS: {"prompt": prompt}, CHAT: {"messages": [{"role": "user", "content": prompt}]}}
        self._bodies = {(kind, streamed): json.dumps({"model": model, **asked[kind], "max_tokens": max_tokens,
                                                      "stream": streamed}).encode()
                        for kind in asked for streamed in (False, True)}
        self._sent_of_kind = {COMPLETIONS: 0, CHAT: 0}
        self._headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
        # every request ends within `timeout` (+ a little): so many at once at the most
        self.workers = math.ceil(rate * (timeout + 1)) + 2
        self._slots = threading.BoundedSemaphore(self.workers)
        self._pool: ThreadPoolExecutor | None = None
        self._sender: threading.Thread | None = None
        self._stopping = threading.Event()
        self._changed = threading.Condition()
        self._ended: list[tuple[int, Request]] = []  # (order sent, request)
        self._in_flight = 0
        self._sending_ended: float | None = None
        self._marks: list[tuple[float, str]] = []
        self._t0 = 0.0

    # --- control

    def start(self) -> Load:
        if self._sender is not None:
            raise RuntimeError("the load was started already")
        self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="load")
        self._t0 = time.monotonic()
        self._sender = threading.Thread(target=self._send, name="load-sender", daemon=True)
        self._sender.start()
        return self

    def stop(self, wait: bool = True) -> Report:
        """Send no more; with `wait`, wait for the requests in flight (each ends within `timeout`)."""
        self._stopping.set()
        if self._sender is not None:
            self._sender.join()
            if wait:
                self.join()
        return self.report()

    def join(self, timeout: float | None = None) -> bool:
        """Wait until sending has ended (stop() or `duration`) and every request has ended; False if
        `timeout` s passed first."""
        if self._sender is None:
            raise RuntimeError("the load was not started")
        deadline = None if timeout is None else time.monotonic() + timeout
        self._sender.join(timeout)
        with self._changed:
            done = self._changed.wait_for(
                lambda: self._sending_ended is not None and not self._in_flight,
                None if deadline is None else max(0.0, deadline - time.monotonic()))
        if done:
            self._pool.shutdown(wait=True)
        return done

    @property
    def running(self) -> bool:
        """Whether requests are still sent or in flight."""
        with self._changed:
            return self._sender is not None and (self._sending_ended is None or self._in_flight > 0)

    def mark(self, label: str) -> float:
        """Record a labelled moment (seconds since the start, returned) for the timeline."""
        at = self.elapsed()
        with self._changed:
            self._marks.append((at, label))
        return at

    def elapsed(self) -> float:
        if self._sender is None:
            raise RuntimeError("the load was not started")
        return time.monotonic() - self._t0

    def report(self) -> Report:
        """What has been counted so far (requests in flight as such)."""
        with self._changed:
            ended = [request for _, request in sorted(self._ended, key=lambda pair: pair[0])]
            sending = (self._sending_ended if self._sending_ended is not None
                       else time.monotonic() - self._t0 if self._sender is not None else 0.0)
            return Report(rate=self.rate, sending_s=sending, requests=ended, in_flight=self._in_flight,
                          marks=sorted(self._marks))

    def __enter__(self) -> Load:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- sending

    def _send(self) -> None:
        """The open loop: request `index` is due `index / rate` s after the start."""
        index = 0
        try:
            while True:
                due = index / self.rate
                if self.duration is not None and due >= self.duration:
                    break
                if self._stopping.wait(max(0.0, self._t0 + due - time.monotonic())):
                    break
                sent = time.monotonic() - self._t0
                kind, streamed = self._pick(index)
                if not self._slots.acquire(blocking=False):
                    self._record(index, Request(sent, sent, "bastion busy", f"{self.workers} requests in flight",
                                                kind=kind, streamed=streamed))
                else:
                    with self._changed:
                        self._in_flight += 1
                    try:
                        self._pool.submit(self._one, index, sent, kind, streamed)
                    except RuntimeError:  # the interpreter is exiting
                        self._slots.release()
                        self._record(index, Request(sent, sent, "bastion busy", "the interpreter is exiting",
                                                    kind=kind, streamed=streamed), in_flight=True)
                        break
                index += 1
        finally:
            with self._changed:
                self._sending_ended = time.monotonic() - self._t0
                self._changed.notify_all()
            self._pool.shutdown(wait=False)  # the workers end with the last request

    def _pick(self, index: int) -> tuple[str, bool]:
        """Request `index`'s kind and whether it streams: the shares spread evenly, the streamed ones over
        each kind's own requests (so that chat 0.5 and stream 0.5 stream half of each kind)."""
        kind = CHAT if evenly(index, self.chat) else COMPLETIONS
        of_kind = self._sent_of_kind[kind]
        self._sent_of_kind[kind] += 1
        return kind, evenly(of_kind, self.stream)

    def _record(self, index: int, request: Request, in_flight: bool = False) -> None:
        with self._changed:
            self._ended.append((index, request))
            self._in_flight -= in_flight
            self._changed.notify_all()

    def _one(self, index: int, sent: float, kind: str, streamed: bool) -> None:
        try:
            outcome, detail, tokens, status = self._request(kind, streamed, self._t0 + sent + self.timeout)
        except Exception as error:  # noqa: BLE001 - counted, never lost in a worker
            outcome, detail, tokens, status = f"error {type(error).__name__}", str(error)[:200], 0, None
        finally:
            self._slots.release()
        ended = time.monotonic() - self._t0
        self._record(index, Request(sent, ended, outcome, detail, tokens, status, kind, streamed), in_flight=True)

    def _request(self, kind: str, streamed: bool, deadline: float) -> tuple[str, str, int, int | None]:
        """One completion or chat completion: (outcome, detail, tokens, status)."""
        connection = self._connection(self._host, self._port, timeout=self.timeout)
        try:
            connection.request("POST", self._paths[kind], body=self._bodies[kind, streamed], headers=self._headers)
            sock = connection.sock  # the connection lets go of it once the answer says it closes
            response = connection.getresponse()
            if response.status != 200:
                return f"http {response.status}", response.read(200).decode(errors="replace"), 0, response.status
            if not streamed:
                return (*answered(kind, json.loads(response.read())), 0, 200)
            return (*self._read_stream(kind, sock, response, deadline), 200)
        except ConnectionRefusedError:
            return "refused", "", 0, None
        except http.client.RemoteDisconnected as error:
            return "closed", str(error), 0, None
        except ConnectionResetError as error:
            return "reset", str(error), 0, None
        except TimeoutError:
            return "timeout", f"no answer in {self.timeout:g} s", 0, None
        except (ValueError, KeyError, IndexError, TypeError) as error:
            return "bad answer", f"{type(error).__name__}: {error}"[:200], 0, 200
        except (OSError, http.client.HTTPException) as error:
            return f"error {type(error).__name__}", str(error)[:200], 0, None
        finally:
            connection.close()

    def _read_stream(self, kind: str, sock, response, deadline: float) -> tuple[str, str, int]:
        """Server-Sent Events until [DONE]: (outcome, detail, tokens)."""
        tokens, finish, done = 0, None, False
        try:
            while not done:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                sock.settimeout(left)
                line = response.readline()
                if not line:
                    break
                data = line.decode(errors="replace").strip()
                if not data.startswith("data:"):
                    continue
                data = data[5:].strip()
                if data == "[DONE]":
                    done = True
                    continue
                event = json.loads(data)
                if "error" in event:
                    return "stream error", json.dumps(event["error"])[:200], tokens
                for choice in event.get("choices") or []:
                    tokens += bool(choice.get("text") if kind == COMPLETIONS
                                   else (choice.get("delta") or {}).get("content"))
                    finish = choice.get("finish_reason") or finish
        except TimeoutError:
            return "timeout", f"{tokens} of {self.max_tokens} tokens in {self.timeout:g} s", tokens
        except (OSError, http.client.HTTPException) as error:
            return "truncated", f"{type(error).__name__} after {tokens} of {self.max_tokens} tokens", tokens
        got = f"{tokens} of {self.max_tokens} tokens, finish_reason {finish}"
        if finish == "abort":
            return "aborted", got, tokens
        if not done:
            return "truncated", f"no [DONE] after {got}", tokens
        if finish is None or (finish != "stop" and tokens < self.max_tokens):
            return "short", got, tokens
        return OK, "", tokens


def evenly(index: int, share: float) -> bool:
    """Whether the `index`th of a run is among a `share` of them spread evenly (0.5: every other one)."""
    return math.floor((index + 1) * share) > math.floor(index * share)


def answered(kind: str, answer: dict) -> tuple[str, str]:
    """(outcome, detail) of an unstreamed answer: a chat's must hold a message's content and a finish_reason."""
    choice = answer["choices"][0]
    finish = choice.get("finish_reason")
    if kind == CHAT:
        if not isinstance(choice["message"]["content"], str) or finish is None:
            return "bad answer", f"message {json.dumps(choice['message'])[:120]}, finish_reason {finish}"
    return ("aborted" if finish == "abort" else OK), ""


def first_token_seconds(address: str, port: int, model: str, users: int, sampling: dict | None = None,
                        timeout: float = 60.0) -> list[float]:
    """`users` streamed completions sent together (the first users after a start), in the model's own
    sampling unless `sampling` sets fields: each one's seconds to its first token, sorted."""
    seconds: list[float] = []

    def one() -> None:
        connection = http.client.HTTPConnection(address, port, timeout=timeout)
        sent = time.monotonic()
        body = {"model": model, "prompt": "hello", "max_tokens": 4, "stream": True, **(sampling or {})}
        try:
            connection.request("POST", "/v1/completions", body=json.dumps(body))
            for line in connection.getresponse():
                if line.startswith(b"data: {"):
                    seconds.append(time.monotonic() - sent)
                    break
        finally:
            connection.close()

    threads = [threading.Thread(target=one) for _ in range(users)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if len(seconds) != users:
        raise AssertionError(f"{users - len(seconds)} of {users} requests got no first token")
    return sorted(seconds)
