"""TEST DOUBLE: the server `vllm serve` runs instead of an engine: /health, /v1/models, /v1/completions and
/v1/chat/completions (a chat with no list of messages: vLLM's 400 validation error; then the served model
name only, else vLLM's 404; an empty list of messages: the chat template's 400 BadRequestError; with
"stream": true, Server-Sent Events as vLLM sends them: a chat's opening chunk of role and empty content,
one chunk per token, the last with the finish and the system_fingerprint, a usage chunk (then it carries
the fingerprint) when stream_options.include_usage, then [DONE]; the bodies, keys in vLLM's order, in
standin_openai.py, held to vLLM's answers recorded on the H200 by tests/unit/test_standin_chat.py; every
answer `Vary: Origin` as vLLM's CORS middleware adds it, but the 401 and the empty conversation's 400),
/standin/process (argv, parsed options, CUDA environment), /metrics (vLLM's names, driven by the load:
standin_metrics.py). Like vLLM, --api-key / VLLM_API_KEY guard /v1, not /health. Chat and completions go
the same way through the latency model, the metrics and the shutdown below.
Timing, so that `vllm bench serve` measures something: the TEST DOUBLE vllm/standin_latency.py, a
scheduler stepping as vLLM's: STANDIN_TTFT_MS before a request is scheduled, STANDIN_TPOT_MS a batch-1
step, at most --max-num-seqs requests generating at once (the rest wait), prompts in chunks of
--max-num-batched-tokens; CUDA-graph sizes, --performance-mode and --async-scheduling change a step.
STANDIN_STARTUP_DELAY (seconds) delays the listening socket, like a slow model load.
STANDIN_SAMPLER_JIT_S: the stall of the first batch of 8 requests sampling with the model's
defaults (vllm/standin_sampler.py, as recorded on the H200).
Several nodes (--nnodes N --node-rank R --master-addr A --master-port P, --headless on ranks >= 1): the
rendezvous of vllm/standin_rendezvous.py first; node rank 0 listens for HTTP only once every node joined, a
headless node serves nothing and ends (exit 1) when its leader goes.

A vLLM that cannot start (a wheel built with fails_at_start: tests/doubles/vllm_wheel.py): the options
parsed, it writes a traceback ending in that message to stderr, as vLLM dies of a fatal start-up error
(a CUDA driver too old for its CUDA runtime), and exits 1: it never listens and starts no EngineCore.
STANDIN_FAILS_AT_START (an instance's env): the same, with that message, from any wheel: a setting of one instance
that stops it at start (as VLLM_ATTENTION_BACKEND=NO_SUCH_BACKEND does the real vLLM).

Stopping, as real vLLM 0.25 stops (recorded on the H200: tests/fixtures/vllm/h200-drain): on SIGTERM the
listening socket closes at once (new requests and /health: connection refused); with --shutdown-timeout
0 (vLLM's default) every stream in flight ends at once, its last chunk a token with finish_reason "abort"
(tests/fixtures/vllm/h200-chat/chat-stream-sigterm), then [DONE]; with N > 0
the streams in flight go on to their end, for at most N seconds (then abort); then the server exits 0.

GPU memory, as real vLLM holds it (tests/fixtures/gpu/h200-processes): not by this process but by a
child named `VLLM::EngineCore` (its comm and its argv[0]). The child declares on its own command line
the GPUs it would use (CUDA_VISIBLE_DEVICES, else the first; --tensor-parallel-size of them) and its
share (--gpu-memory-utilization, vLLM's default 0.9); the TEST DOUBLE nvidia-smi lists it among its
compute processes from that (declaration: `standin-gpu=VISIBLE standin-count=N standin-share=S`).
The child ends with this process."""
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import vllm
from vllm import platforms
from vllm import standin_rendezvous as rendezvous
from vllm.entrypoints.cli.standin_metrics import Metrics, kv_cache_tokens
from vllm.entrypoints.cli.standin_openai import error, fingerprint, kind_of, usage_of
from vllm.standin_latency import Engine, Settings
from vllm.standin_sampler import Sampler

PROTECTED = ("/v1/",)
COMPACT = (",", ":")  # JSON as vLLM writes it (pydantic, starlette's JSONResponse)
POLL_S = 0.05  # how soon a SIGTERM is acted on
FAILS_AT_START = None  # the wheel builder writes the message of a vLLM that cannot start here


def serve(options):
    model = options.get("model_tag") or options.get("model")
    if not model or model == "serve":
        sys.exit("vllm: error: no model given")
    if FAILS_AT_START or os.environ.get("STANDIN_FAILS_AT_START"):
        fail_at_start(FAILS_AT_START or os.environ["STANDIN_FAILS_AT_START"])
    platforms.map_kernels()  # as vLLM resolves its platform: its kernels in this process's maps
    served = options.get("served_model_name") or [model]
    host = options.get("host") or "0.0.0.0"
    port = int(options.get("port") or 8000)
    # as vLLM (`args.api_key or [envs.VLLM_API_KEY]`): every --api-key (it takes one or more), else the env's
    given = options.get("api_key")
    keys = [key for key in (([given] if isinstance(given, str) else given) or [os.environ.get("VLLM_API_KEY")]) if key]
    process = {
        "argv": sys.argv,
        "options": {name: value for name, value in options.items() if name not in ("api_key", "dispatch_function")},
        "version": vllm.__version__,
        "env": {k: v for k, v in os.environ.items() if k.startswith(("CUDA_", "NVIDIA_", "VLLM_", "HF_", "STANDIN_"))},
        "user": os.getuid(),
    }
    if "VLLM_API_KEY" in process["env"]:  # never expose the secret itself
        process["env"]["VLLM_API_KEY"] = "<set>"
    engine = Engine(Settings(options, os.environ.get("STANDIN_TTFT_MS", "5"), os.environ.get("STANDIN_TPOT_MS", "1")))
    streams = Streams()
    sampler = Sampler()  # the first batch's compile stall (STANDIN_SAMPLER_JIT_S)
    metrics = Metrics(served[0], kv_cache_tokens(options))  # GET /metrics: standin_metrics.py
    system_fingerprint = fingerprint(options)

    class Handler(BaseHTTPRequestHandler):
        def _send(self, code, body, cors=True):
            """A JSON answer; `cors` False for one that vLLM sends from outside its CORS middleware (no Vary)."""
            self._send_text(code, json.dumps(body, default=str, separators=COMPACT), "application/json", cors)

        def _head(self, code, content_type, cors=True, **headers):
            """The status line and the headers as vLLM's: the content type, then (from the CORS middleware,
            which every answer passes but the API key's 401 and an unhandled error's) `vary: Origin`."""
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            for name, value in headers.items():
                self.send_header(name.replace("_", "-"), value)
            if cors:
                self.send_header("Vary", "Origin")
            self.end_headers()

        def _authorized(self):
            if keys and self.path.startswith(PROTECTED) and self.headers.get("Authorization") not in [
                    f"Bearer {key}" for key in keys]:
                self._send(401, {"error": "Unauthorized"}, cors=False)
                return False
            return True

        def do_GET(self):
            if not self._authorized():
                return
            if self.path == "/health":
                self._send(200, {})
            elif self.path == "/version":  # as vLLM's: outside /v1, no key asked
                from vllm import __version__

                self._send(200, {"version": __version__})
            elif self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": name, "object": "model", "root": model}
                                                            for name in served]})
            elif self.path == "/standin/process":
                self._send(200, process)
            elif self.path == "/metrics":
                self._send_text(200, metrics.exposition(), "text/plain; version=0.0.4; charset=utf-8")
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self):
            if not self._authorized():
                return
            length = int(self.headers.get("Content-Length") or 0)
            try:
                request = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                return self._send(400, {"error": {"message": "invalid JSON", "code": 400}})
            kind = kind_of(self.path)
            if kind is None:
                return self._send(404, {"detail": "Not Found"})
            shape = kind(request, system_fingerprint)
            if problem := shape.invalid():
                return self._send(*problem)
            if request.get("model") not in served:
                return self._send(404, error(404, f"The model `{request.get('model')}` does not exist.",
                                             "NotFoundError", "model"))
            if problem := shape.unrenderable():  # vLLM raises it through its middleware: no Vary
                return self._send(*problem, cors=False)
            tokens = int(request.get("max_completion_tokens") or request.get("max_tokens") or 16)
            prompt_tokens = shape.prompt_tokens()
            if not request.get("stream"):
                with sampler.row(request):  # in flight as long as a streamed request waits to be scheduled
                    time.sleep(engine.settings.overhead_s)
                    sampler.wait()
                metrics.at_once(prompt_tokens, tokens)
                return self._send(200, shape.answer(" pong", "length", usage_of(prompt_tokens, tokens)))
            self._head(200, "text/event-stream; charset=utf-8")
            with metrics.request(prompt_tokens) as counted, streams.one(), sampler.row(request), \
                    engine.sequence(prompt_tokens, tokens, on_scheduled=counted.run) as sequence:
                sent = 0
                for index in range(tokens):
                    sampler.wait()
                    engine.next_token(sequence, streams.aborted)
                    if index == 0:  # as vLLM, with the first output (a token, or the abort)
                        for chunk in shape.opening():
                            self._event(chunk)
                    counted.token()  # as vLLM's, the output that carries the abort carries a token too
                    sent += 1
                    finish = "abort" if streams.aborted.is_set() else "length" if index == tokens - 1 else None
                    if finish == "length":
                        counted.finish(finish)
                    self._event(shape.token(" w", finish))
                    if finish:
                        break
                if shape.include_usage:
                    self._event(shape.usage(usage_of(prompt_tokens, sent)))
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()

        def _send_text(self, code, text, content_type, cors=True):
            data = text.encode()
            self._head(code, content_type, cors, content_length=str(len(data)))
            self.wfile.write(data)

        def _event(self, body):
            self.wfile.write(b"data: " + json.dumps(body, separators=COMPACT).encode() + b"\n\n")
            self.wfile.flush()

        def log_message(self, *args):
            pass

    # as vLLM: SIGTERM shuts the server down (in a container it is PID 1, which ignores signals it has no
    # handler for), also while the model "loads" or its node waits for the group
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    if join_group(options, model, stop) is None:
        sys.exit(0)
    if options.get("headless"):  # a node of rank >= 1: its workers only, no API (vllm/standin_rendezvous.py)
        start_engine_core(options)
        signalled(stop)
        os._exit(0)
    print(f"stand-in vllm {vllm.__version__} (TEST DOUBLE) serving {', '.join(served)} on {host}:{port}", flush=True)
    start_engine_core(options)
    if signalled(stop, float(os.environ.get("STANDIN_STARTUP_DELAY", "0"))):
        sys.exit(0)
    ThreadingHTTPServer.request_queue_size = 2048  # uvicorn's backlog, as vLLM's (the default 5 drops bursts)
    server = ThreadingHTTPServer((host, port), Handler)
    # its loop looks for shutdown() between connections, or every poll_interval: the socket closes at once
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": POLL_S}, daemon=True).start()
    signalled(stop)
    server.shutdown()
    server.server_close()  # new connections are refused from here on
    streams.drain(float(options.get("shutdown_timeout") or 0))
    sys.stdout.flush()
    os._exit(0)  # at once, as vLLM's own exit: no interpreter teardown waiting on the handlers' threads


def join_group(options, model, stop):
    """A node of a multi-node instance (--nnodes > 1) takes part in the group's rendezvous before it serves
    (vllm/standin_rendezvous.py): the leader returns once every follower joined, a follower once it joined;
    None on SIGTERM meanwhile. True on one node alone."""
    nnodes, rank, address, master_port, _ = rendezvous.node_of(options)
    if nnodes < 2:
        return True
    identity = {"version": vllm.__version__, "model": model}
    if rank == 0:
        return rendezvous.lead(nnodes, master_port, identity, stop)
    return rendezvous.follow(rank, nnodes, address, master_port, identity, stop)


def fail_at_start(message):
    """As vLLM dies while it starts: the traceback, its last line the error, on stderr; exit status 1."""
    sys.stderr.write("Traceback (most recent call last):\n" + "".join(traceback.format_stack()[:-1]) + message + "\n")
    sys.stderr.flush()
    sys.exit(1)


def signalled(stop, within=None):
    """stop.wait(within), woken every POLL_S: Python runs a signal's handler in the main thread when that
    thread runs Python code, and a main thread asleep in a plain wait() slept through a SIGTERM that came
    while the handlers' threads were streaming (4 rounds in 45 of a steady load; 0 in 30 so)."""
    deadline = None if within is None else time.monotonic() + within
    while not stop.wait(POLL_S):
        if deadline is not None and time.monotonic() >= deadline:
            return False
    return True


class Streams:
    """The streams in flight, and the abort that ends them."""

    def __init__(self):
        self.count = 0
        self.changed = threading.Condition()
        self.aborted = threading.Event()

    @contextlib.contextmanager
    def one(self):
        """Held while one stream is in flight."""
        with self.changed:
            self.count += 1
        try:
            yield
        finally:
            with self.changed:
                self.count -= 1
                self.changed.notify_all()

    def drain(self, timeout_s):
        """Let the streams in flight finish for at most timeout_s, abort the rest, wait for them to end."""
        with self.changed:
            self.changed.wait_for(lambda: self.count == 0, timeout=timeout_s)
            self.aborted.set()
            self.changed.wait_for(lambda: self.count == 0, timeout=5)


ENGINE_CORE = """\
import ctypes, os, sys, time
parent = int(sys.argv[1])  # the server's pid, from the server: it may have ended before this line runs
try:  # as vLLM's setproctitle: the name ps and nvidia-smi show
    libc = ctypes.CDLL(None)
    libc.prctl(15, b"VLLM::EngineCore", 0, 0, 0)  # PR_SET_NAME
    libc.prctl(1, 15, 0, 0, 0)  # PR_SET_PDEATHSIG: SIGTERM when the server goes
except (OSError, AttributeError):
    pass
while os.getppid() == parent:
    time.sleep(1)
"""


def start_engine_core(options):
    """The child that 'holds' the GPU memory (see the module docstring)."""
    declaration = [f"standin-gpu={os.environ.get('CUDA_VISIBLE_DEVICES', '')}",
                   f"standin-count={int(options.get('tensor_parallel_size') or 1)}",
                   f"standin-share={float(options.get('gpu_memory_utilization') or 0.9)}"]
    return subprocess.Popen(["VLLM::EngineCore", "-c", ENGINE_CORE, str(os.getpid()), *declaration],
                            executable=sys.executable,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
