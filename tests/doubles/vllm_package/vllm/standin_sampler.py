"""TEST DOUBLE of vLLM 0.25.0's first-batch stall, as recorded on the H200 (tests/fixtures/vllm/h200-tune):
a request without sampling fields samples as the model's generation_config.json says (top-k/top-p for
Qwen's), and vLLM runs top-k/top-p through a Triton kernel it compiles at the first batch of 8 or more
such rows; every request in flight waits for the compile (TTFT p99 7.3-9.8 s there). Greedy requests
(temperature 0) never take that path.

STANDIN_SAMPLER_JIT_S: the compile's seconds (0, the default: no stall). The stand-in's "batch" is the
requests in flight at once; each takes at least STANDIN_TTFT_MS, so requests sent together overlap."""
import os
import threading
import time
from contextlib import contextmanager

BATCHED_ROWS = 8  # vLLM 0.25.0's apply_top_k_top_p: the Triton kernel from 8 rows on
SAMPLING_FIELDS = ("temperature", "top_k", "top_p")


def samples_with_model_defaults(request):
    """Whether a request samples with top-k/top-p from the model's defaults: it sets no sampling field
    (an explicit temperature 0 is greedy)."""
    return not any(field in request for field in SAMPLING_FIELDS)


class Sampler:
    def __init__(self, jit_seconds=None):
        self.jit_seconds = float(os.environ.get("STANDIN_SAMPLER_JIT_S", "0")) if jit_seconds is None else jit_seconds
        self._lock = threading.Lock()
        self._rows = 0
        self._compiled = False
        self._stalled_until = 0.0

    @contextmanager
    def row(self, request):
        """A request in the batch while it runs: the compile starts once BATCHED_ROWS sample with the
        model's defaults at once."""
        counted = self.jit_seconds > 0 and samples_with_model_defaults(request)
        if counted:
            with self._lock:
                self._rows += 1
                if self._rows >= BATCHED_ROWS and not self._compiled:
                    self._compiled = True
                    self._stalled_until = time.monotonic() + self.jit_seconds
        try:
            yield
        finally:
            if counted:
                with self._lock:
                    self._rows -= 1

    def wait(self):
        """Every request in flight waits while the kernel compiles."""
        time.sleep(max(0.0, self._stalled_until - time.monotonic()))
