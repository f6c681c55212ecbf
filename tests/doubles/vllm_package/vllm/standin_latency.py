"""TEST DOUBLE: the stand-in server's latency model — not vLLM, a small step-by-step scheduler shaped like
vLLM 0.25's (continuous batching, chunked prefill), so that what `vllm bench serve` measures against the
stand-in moves with the flags `provision tune` searches, in the directions the real engine moves:

- every step, each running request that has its prompt decodes one token; what is left of the step's
  token budget (--max-num-batched-tokens) goes to prompts, cut into chunks of it (FCFS);
- at most --max-num-seqs requests run, the rest wait (queueing: TTFT);
- a step costs a batch-1 decode step (STANDIN_TPOT_MS) × (1 + DECODE_PER_SEQ × (decodes − 1) +
  PREFILL_PER_TOKEN × prompt tokens): more sequences decoding → a slower step (TPOT); a large prompt
  chunk → one long step that stalls every decode batched with it (ITL p99); small chunks → more steps
  before the first token (TTFT);
- a pure decode batch runs as a CUDA graph padded up to the next captured size (vLLM's sizes: 1, 2, 4,
  8, 16, … up to min(2 × max-num-seqs, 512, max-num-batched-tokens); --performance-mode interactivity:
  every size 1..32; --cudagraph-capture-sizes / --max-cudagraph-capture-size as given); a batch above
  the largest captured size runs eagerly, EAGER_FACTOR slower;
- without async scheduling (--no-async-scheduling) each step pays SYNC_OVERHEAD more (the scheduler no
  longer overlaps the GPU's step);
- --performance-mode throughput doubles the default max-num-seqs and max-num-batched-tokens.
A request waits STANDIN_TTFT_MS (HTTP, tokenizing) before it reaches the scheduler; its first token comes
with the step that finishes its prompt. The defaults (max-num-seqs 256, max-num-batched-tokens 2048) are
vLLM 0.25's for a GPU below 70 GiB, such as the lab's RTX 3090.

Calibration (tests/unit/test_standin_latency.py checks `simulate` against these within stated
tolerances): the H200 run sets of tests/fixtures/vllm/h200-bench (vLLM 0.25.0, Qwen2.5-7B-shaped, random
512 in / 128 out, `defaults`: max-num-batched-tokens 8192, max-num-seqs 1024) and gpu-lab's README table.
  batch-1 step 4.80 ms (c=1 TPOT p50); c=16 ITL p50 5.19 ms, c=64 ITL p50 5.78 ms → DECODE_PER_SEQ 0.004
  (≈ +0.02 ms per sequence); c=64 ITL p99 127.7 ms: 16 prompts × 512 = one 8192-token step beside the
  running decodes → ≈ 26 batch-1 steps → PREFILL_PER_TOKEN 0.0032 (15 µs a prompt token); c=1 TTFT p50
  20.6 ms = overhead + one 512-token step (≈ 12.7 ms) → STANDIN_TTFT_MS 8 for that model.
Not calibrated (no recording on the H200 yet, stated as assumptions): EAGER_FACTOR 1.25 (vLLM's CUDA
graphs save kernel-launch time at small batches), SYNC_OVERHEAD 0.05 (async scheduling hides the CPU's
scheduling time, a few % of a step), and the padding cost of the balanced capture sizes.
"""
from __future__ import annotations

import bisect
import collections
import contextlib
import math
import threading
import time

DECODE_PER_SEQ = 0.004
PREFILL_PER_TOKEN = 0.0032
EAGER_FACTOR = 1.25
SYNC_OVERHEAD = 0.05
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048


class Settings:
    """The flags the model reads, from `vllm serve`'s parsed options (dests) and the env knobs."""

    def __init__(self, options, ttft_ms=5.0, tpot_ms=1.0):
        self.overhead_s = float(ttft_ms) / 1000
        self.step_s = float(tpot_ms) / 1000
        mode = options.get("performance_mode") or "balanced"
        doubled = 2 if mode == "throughput" else 1
        self.max_num_seqs = int(options.get("max_num_seqs") or DEFAULT_MAX_NUM_SEQS * doubled)
        self.max_num_batched_tokens = int(options.get("max_num_batched_tokens")
                                          or DEFAULT_MAX_NUM_BATCHED_TOKENS * doubled)
        self.async_scheduling = options.get("async_scheduling") is not False
        self.capture_sizes = capture_sizes(options, mode, self.max_num_seqs, self.max_num_batched_tokens)

    def step_time(self, decodes, prompt_tokens):
        """Seconds of one step with `decodes` sequences decoding and `prompt_tokens` of prompts."""
        size, factor = decodes, 1.0
        if prompt_tokens == 0 and decodes:
            at = bisect.bisect_left(self.capture_sizes, decodes)
            if at < len(self.capture_sizes):
                size = self.capture_sizes[at]  # padded to the graph captured for it
            else:
                factor = EAGER_FACTOR
        cost = 1 + DECODE_PER_SEQ * max(size - 1, 0) + PREFILL_PER_TOKEN * prompt_tokens
        return self.step_s * (cost * factor + (0 if self.async_scheduling else SYNC_OVERHEAD))


def capture_sizes(options, mode, max_num_seqs, max_num_batched_tokens):
    """The batch sizes vLLM 0.25 captures CUDA graphs for (config/vllm.py, _set_cudagraph_sizes)."""
    if options.get("enforce_eager"):
        return []
    largest = options.get("max_cudagraph_capture_size") or min(max_num_seqs * 2, 512)
    largest = min(int(largest), max_num_batched_tokens)
    given = options.get("cudagraph_capture_sizes")
    if given:
        return sorted({int(size) for size in given if int(size) <= max_num_batched_tokens})
    if mode == "interactivity":
        sizes = list(range(1, min(largest, 32) + 1))
    else:
        sizes = [size for size in (1, 2, 4) if size <= largest]
    sizes += list(range(8, min(largest + 1, 256), 8)) + list(range(256, largest + 1, 16))
    return sorted(set(sizes))


class Sequence:
    def __init__(self, prompt_tokens, output_tokens, on_scheduled=None):
        self.prompt_left = max(1, int(prompt_tokens))
        self.output_left = max(1, int(output_tokens))
        self.cancelled = False
        self.on_scheduled = on_scheduled  # called once, when it joins the running batch (the /metrics counts)


class Scheduler:
    """Which sequences a step decodes and which prompt chunks it runs; what it emits. Not thread-safe:
    the Engine holds its lock around it; `simulate` runs it in virtual time."""

    def __init__(self, settings):
        self.settings = settings
        self.waiting = collections.deque()
        self.running = []

    def plan(self):
        """(decoding sequences, [(sequence, prompt tokens)]) of the next step; None when there is no work."""
        self.running = [seq for seq in self.running if not seq.cancelled]
        while self.waiting and len(self.running) < self.settings.max_num_seqs:
            seq = self.waiting.popleft()
            if not seq.cancelled:
                self.running.append(seq)
                if seq.on_scheduled is not None:
                    seq.on_scheduled()
        decodes = [seq for seq in self.running if seq.prompt_left == 0]
        budget = self.settings.max_num_batched_tokens - len(decodes)
        chunks = []
        for seq in self.running:
            if seq.prompt_left and budget > 0:
                take = min(seq.prompt_left, budget)
                chunks.append((seq, take))
                budget -= take
        if not decodes and not chunks:
            return None
        return decodes, chunks

    def duration(self, step):
        decodes, chunks = step
        return self.settings.step_time(len(decodes), sum(take for _, take in chunks))

    def commit(self, step):
        """The step done: the sequences that got a token (a finished prompt gets its first one)."""
        decodes, chunks = step
        emitted = list(decodes)
        for seq, take in chunks:
            seq.prompt_left -= take
            if seq.prompt_left == 0:
                emitted.append(seq)
        for seq in emitted:
            seq.output_left -= 1
        self.running = [seq for seq in self.running if seq.output_left > 0 and not seq.cancelled]
        return emitted


class Engine:
    """The scheduler in real time: one thread runs the steps; each request's handler waits for its tokens."""

    def __init__(self, settings):
        self.settings = settings
        self.scheduler = Scheduler(settings)
        self.lock = threading.Condition()
        self.tokens = {}  # sequence → threading.Semaphore released once per token
        threading.Thread(target=self._loop, daemon=True).start()

    def submit(self, prompt_tokens, output_tokens, on_scheduled=None):
        """A sequence, queued after the request overhead; take its tokens with next_token()."""
        time.sleep(self.settings.overhead_s)
        seq = Sequence(prompt_tokens, output_tokens, on_scheduled)
        with self.lock:
            self.tokens[seq] = threading.Semaphore(0)
            self.scheduler.waiting.append(seq)
            self.lock.notify()
        return seq

    @contextlib.contextmanager
    def sequence(self, prompt_tokens, output_tokens, on_scheduled=None):
        """A request in the engine while the block runs (its tokens: next_token); out of it after."""
        seq = self.submit(prompt_tokens, output_tokens, on_scheduled)
        try:
            yield seq
        finally:
            self.finish(seq)

    def next_token(self, seq, stop, poll_s=0.05):
        """Wait for the sequence's next token; False when `stop` (an abort) is set first."""
        while not self.tokens[seq].acquire(timeout=poll_s):
            if stop.is_set():
                return False
        return True

    def finish(self, seq):
        """The handler is done with it (all tokens, an abort, a client gone): it leaves the batch."""
        with self.lock:
            seq.cancelled = True
            self.tokens.pop(seq, None)

    def _loop(self):
        while True:
            with self.lock:
                step = self.scheduler.plan()
                while step is None:
                    self.lock.wait()
                    step = self.scheduler.plan()
            time.sleep(self.scheduler.duration(step))
            with self.lock:
                for seq in self.scheduler.commit(step):
                    if seq in self.tokens:
                        self.tokens[seq].release()


def simulate(settings, input_len, output_len, concurrency, num_prompts):
    """`vllm bench serve` (closed loop: `concurrency` clients, each sending its next request when the
    last ends) against the model in virtual time: vLLM's result keys (ms, tokens/s)."""
    scheduler = Scheduler(settings)
    now, sent, started, pending = 0.0, 0, {}, []  # pending: (time it reaches the scheduler, sequence)
    ttfts, itls, tpots, e2els, last, first = [], [], [], [], {}, {}

    def send(at):
        nonlocal sent
        seq = Sequence(input_len, output_len)
        started[seq] = at
        pending.append((at + settings.overhead_s, seq))
        sent += 1

    for _ in range(min(concurrency, num_prompts)):
        send(0.0)
    finished = 0
    while finished < num_prompts:
        for arrival, seq in sorted(pending, key=lambda item: item[0]):
            if arrival <= now:
                scheduler.waiting.append(seq)
        pending[:] = [(arrival, seq) for arrival, seq in pending if arrival > now]
        step = scheduler.plan()
        if step is None:
            now = min(arrival for arrival, _ in pending)
            continue
        now += scheduler.duration(step)
        for seq in scheduler.commit(step):
            if seq not in last:
                first[seq] = now - started[seq]
                ttfts.append(first[seq])
            else:
                itls.append(now - last[seq])
            last[seq] = now
            if seq.output_left == 0:
                finished += 1
                e2els.append(now - started[seq])
                tpots.append((e2els[-1] - first[seq]) / max(output_len - 1, 1))
                if sent < num_prompts:
                    send(now)
    result = {"completed": num_prompts, "duration": now, "output_throughput": num_prompts * output_len / now}
    for name, values in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        for label, q in (("median", 50), ("p50", 50), ("p90", 90), ("p99", 99)):
            result[f"{label}_{name}_ms"] = percentile(values, q) * 1000 if values else 0.0
    return result


def percentile(values, q):
    """numpy's default (linear) percentile, as `vllm bench serve` computes its own."""
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
