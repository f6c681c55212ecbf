"""TEST DOUBLE: the stand-in server's `GET /metrics`, vLLM 0.25.0's own names, types, labels (model_name, engine)
and histogram buckets, as recorded on the H200 (tests/fixtures/vllm/h200-metrics; tests/unit/test_standin_metrics.py
compares them), for the metrics docs/monitoring.md uses. Driven by the server's real load: requests waiting (for
one of the --max-num-seqs slots) and running, tokens, time to first token, inter-token latency, time per
output token, end-to-end latency and queue time as the requests really take them. KV cache use: the tokens of
the requests in flight (prompt + generated so far) over the cache's size in tokens, STANDIN_KV_CACHE_TOKENS
(default: --max-model-len × 16). No preemptions. Standard library only (the exposition format written here)."""
import contextlib
import os
import threading
import time

# bucket bounds, as vLLM 0.25.0 declares them (recorded)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
TOKEN_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
                 80.0)
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                   480.0, 960.0, 1920.0, 7680.0)
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
GAUGES = (  # name, help
    ("vllm:num_requests_running", "Number of requests in model execution batches."),
    ("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
    ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
)
COUNTERS = (
    ("vllm:num_preemptions", "Cumulative number of preemption from the engine."),
    ("vllm:prompt_tokens", "Number of prefill tokens processed."),
    ("vllm:generation_tokens", "Number of generation tokens processed."),
)
SUCCESS = ("vllm:request_success", "Count of successfully processed requests.")
HISTOGRAMS = (  # name, help, buckets
    ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS),
    ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", TOKEN_BUCKETS),
    ("vllm:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request.",
     TOKEN_BUCKETS),
    ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", REQUEST_BUCKETS),
    ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", REQUEST_BUCKETS),
)


class Histogram:
    def __init__(self, bounds):
        self.bounds, self.counts, self.sum, self.count = bounds, [0] * len(bounds), 0.0, 0

    def observe(self, value):
        for index, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[index] += 1
        self.sum += value
        self.count += 1


def number(value):
    """A sample value as prometheus_client writes it (1.0, 0.25, 1.7e+09)."""
    return repr(float(value))


def labelled(labels):
    return "{" + ",".join('%s="%s"' % (name, labels[name]) for name in sorted(labels)) + "}"


class Metrics:
    """The engine's counters, fed by the server's requests (`request`, `at_once`), written by `exposition`."""

    def __init__(self, model_name, kv_cache_tokens):
        self.labels = {"engine": "0", "model_name": model_name}
        self.kv_cache_tokens = max(1, int(kv_cache_tokens))
        self.lock = threading.Lock()
        self.created = time.time()
        self.running = self.waiting = self.tokens_in_flight = 0
        self.counters = {name: 0 for name, _ in COUNTERS}
        self.success = {reason: 0 for reason in FINISHED_REASONS}
        self.histograms = {name: Histogram(bounds) for name, _, bounds in HISTOGRAMS}

    def _observe(self, name, value):
        self.histograms[name].observe(value)

    @contextlib.contextmanager
    def request(self, prompt_tokens):
        """Held for one request from its arrival: it waits until `one.run()`, then `one.token()` per token."""
        one = Request(self, prompt_tokens)
        with self.lock:
            self.waiting += 1
        try:
            yield one
        finally:
            one.end()

    def at_once(self, prompt_tokens, tokens):
        """A request answered without streaming (the stand-in does not pace those): counted, latencies 0."""
        with self.request(prompt_tokens) as one:
            one.run()
            for _ in range(tokens):
                one.token()
            one.finish("length")

    def exposition(self):
        with self.lock:
            lines = []
            values = {"vllm:num_requests_running": self.running, "vllm:num_requests_waiting": self.waiting,
                      "vllm:kv_cache_usage_perc": min(1.0, self.tokens_in_flight / self.kv_cache_tokens)}
            for name, text in GAUGES:
                lines += ["# HELP %s %s" % (name, text), "# TYPE %s gauge" % name,
                          "%s%s %s" % (name, labelled(self.labels), number(values[name]))]
            for name, text in COUNTERS:
                lines += self._counter(name, text, [(self.labels, self.counters[name])])
            lines += self._counter(*SUCCESS, [({**self.labels, "finished_reason": reason}, count)
                                              for reason, count in self.success.items()])
            for name, text, _ in HISTOGRAMS:
                lines += self._histogram(name, text, self.histograms[name])
            return "\n".join(lines) + "\n"

    def _counter(self, name, text, samples):
        lines = ["# HELP %s_total %s" % (name, text), "# TYPE %s_total counter" % name]
        lines += ["%s_total%s %s" % (name, labelled(labels), number(value)) for labels, value in samples]
        lines += ["# HELP %s_created %s" % (name, text), "# TYPE %s_created gauge" % name]
        lines += ["%s_created%s %s" % (name, labelled(labels), number(self.created)) for labels, _ in samples]
        return lines

    def _histogram(self, name, text, histogram):
        lines = ["# HELP %s %s" % (name, text), "# TYPE %s histogram" % name]
        for bound, count in zip(histogram.bounds, histogram.counts):
            lines.append("%s_bucket%s %s" % (name, labelled({**self.labels, "le": str(float(bound))}), number(count)))
        lines.append("%s_bucket%s %s" % (name, labelled({**self.labels, "le": "+Inf"}), number(histogram.count)))
        lines += ["%s_count%s %s" % (name, labelled(self.labels), number(histogram.count)),
                  "%s_sum%s %s" % (name, labelled(self.labels), number(histogram.sum)),
                  "# HELP %s_created %s" % (name, text), "# TYPE %s_created gauge" % name,
                  "%s_created%s %s" % (name, labelled(self.labels), number(self.created))]
        return lines


class Request:
    """One request's way through the engine: waiting, running (its tokens), finished."""

    def __init__(self, metrics, prompt_tokens):
        self.metrics, self.prompt_tokens = metrics, prompt_tokens
        self.arrived = time.monotonic()
        self.started = self.first = self.last = None
        self.generated = 0
        self.reason = None

    def run(self):
        """It got a slot: its prompt is prefilled (the prompt's tokens take KV cache from here)."""
        metrics = self.metrics
        with metrics.lock:
            self.started = time.monotonic()
            metrics.waiting -= 1
            metrics.running += 1
            metrics.tokens_in_flight += self.prompt_tokens
            metrics.counters["vllm:prompt_tokens"] += self.prompt_tokens
            metrics._observe("vllm:request_queue_time_seconds", self.started - self.arrived)

    def token(self):
        metrics, now = self.metrics, time.monotonic()
        with metrics.lock:
            if self.first is None:
                self.first = now
                metrics._observe("vllm:time_to_first_token_seconds", now - self.arrived)
            else:
                metrics._observe("vllm:inter_token_latency_seconds", now - self.last)
            self.last = now
            self.generated += 1
            metrics.tokens_in_flight += 1
            metrics.counters["vllm:generation_tokens"] += 1

    def finish(self, reason):
        self.reason = reason

    def end(self):
        metrics, now = self.metrics, time.monotonic()
        with metrics.lock:
            if self.started is None:
                metrics.waiting -= 1
                return
            metrics.running -= 1
            metrics.tokens_in_flight -= self.prompt_tokens + self.generated
            metrics.success[self.reason or "abort"] += 1
            metrics._observe("vllm:e2e_request_latency_seconds", now - self.arrived)
            if self.generated > 1:
                metrics._observe("vllm:request_time_per_output_token_seconds",
                                 (self.last - self.first) / (self.generated - 1))


def kv_cache_tokens(options):
    """The stand-in's KV cache size in tokens: STANDIN_KV_CACHE_TOKENS, else --max-model-len × 16."""
    return int(os.environ.get("STANDIN_KV_CACHE_TOKENS") or int(options.get("max_model_len") or 4096) * 16)
