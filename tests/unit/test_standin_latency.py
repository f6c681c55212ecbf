"""The TEST DOUBLE stand-in's latency model (tests/doubles/vllm_package/vllm/standin_latency.py): calibrated
to the H200 run sets recorded with the real vLLM 0.25.0 (tests/fixtures/vllm/h200-bench), moving with each
flag `provision tune` searches the way vLLM moves, and the real-time server stepping as the model says."""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from provisioner.bench.results import load_run_set
from tests.unit.standin import STANDIN_PACKAGE, free_port, running

# the model's module alone (it imports nothing of the stand-in package): no `vllm` module left behind
_SPEC = importlib.util.spec_from_file_location("standin_latency", STANDIN_PACKAGE / "vllm" / "standin_latency.py")
standin_latency = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(standin_latency)
Settings, capture_sizes, simulate = standin_latency.Settings, standin_latency.capture_sizes, standin_latency.simulate
RECORDED = Path(__file__).resolve().parent.parent / "fixtures" / "vllm" / "h200-bench" / "results"
H200 = {"max_num_seqs": 1024, "max_num_batched_tokens": 8192}  # vLLM 0.25's defaults on an H200
H200_TTFT_MS, H200_TPOT_MS = 8, 4.80  # request overhead; batch-1 step (c=1 TPOT p50 of `defaults`)


def recorded(name, concurrency):
    return load_run_set(RECORDED / name).summary()[concurrency]


def model(concurrency, prompts, **options):
    return simulate(Settings({**H200, **options}, H200_TTFT_MS, H200_TPOT_MS), 512, 128, concurrency, prompts)


@pytest.mark.parametrize("key, tolerance", [("p50_tpot_ms", 0.02), ("p50_ttft_ms", 0.05), ("output_throughput", 0.02)])
def test_one_user_matches_the_h200_within_a_few_percent(key, tolerance):
    assert model(1, 10)[key] == pytest.approx(recorded("single-defaults", 1)[key], rel=tolerance)


@pytest.mark.parametrize("concurrency, prompts, key, tolerance", [
    (16, 80, "p50_itl_ms", 0.05),   # 5.09 against 5.19 ms: +0.4 % a step per sequence decoding
    (64, 320, "p50_itl_ms", 0.05),  # 6.01 against 5.78 ms
    (64, 320, "p99_itl_ms", 0.05),  # 130.7 against 127.7 ms: an 8192-token prefill step beside the decodes
    (16, 80, "output_throughput", 0.10),  # 2610 against 2413 tok/s: the model has no HTTP or detokenizing cost
    (64, 320, "output_throughput", 0.16),  # 6377 against 5548 tok/s: idem, with 64 streams
    (64, 320, "p50_ttft_ms", 0.20),  # 384 against 457 ms
])
def test_many_users_match_the_h200_within_the_stated_tolerance(concurrency, prompts, key, tolerance):
    assert model(concurrency, prompts)[key] == pytest.approx(recorded("conc-defaults", concurrency)[key], rel=tolerance)


def test_a_larger_prefill_chunk_stalls_decodes_longer_and_a_smaller_one_delays_the_first_token():
    """1024-token prompts from 16 users: 16384 prompt tokens, more than one step of 8192 takes."""
    def run(chunk):
        return simulate(Settings({"max_num_seqs": 16, "max_num_batched_tokens": chunk}, 5, 4), 1024, 32, 16, 32)
    small, middle, large = run(512), run(2048), run(8192)
    assert small["p99_itl_ms"] < middle["p99_itl_ms"] < large["p99_itl_ms"]
    assert small["p99_ttft_ms"] > middle["p99_ttft_ms"] > large["p99_ttft_ms"]
    assert round(large["p99_itl_ms"], 1) == 108.9 and round(middle["p99_itl_ms"], 1) == 30.2


def test_max_num_seqs_caps_the_batch_and_queues_the_rest():
    capped = simulate(Settings({"max_num_seqs": 4}, 5, 4), 1024, 32, 16, 32)
    open_ = simulate(Settings({"max_num_seqs": 16}, 5, 4), 1024, 32, 16, 32)
    assert capped["p99_ttft_ms"] > 2 * open_["p99_ttft_ms"]
    assert capped["output_throughput"] < 0.6 * open_["output_throughput"]


def test_a_step_is_slower_without_async_scheduling_and_above_the_largest_cuda_graph():
    base = Settings({"max_num_seqs": 256}, 5, 4)
    assert base.step_time(1, 0) == pytest.approx(0.004)
    assert Settings({"async_scheduling": False}, 5, 4).step_time(1, 0) == pytest.approx(0.004 * 1.05)
    assert Settings({"max_cudagraph_capture_size": 32}, 5, 4).step_time(64, 0) == pytest.approx(
        base.step_time(64, 0) * 1.25)


def test_interactivity_captures_every_small_batch_so_a_batch_of_13_is_not_padded():
    assert capture_sizes({}, "balanced", 256, 2048)[:6] == [1, 2, 4, 8, 16, 24]
    assert capture_sizes({}, "interactivity", 256, 2048)[:33] == [*range(1, 33), 40]
    balanced, interactive = Settings({}, 5, 4), Settings({"performance_mode": "interactivity"}, 5, 4)
    assert interactive.step_time(13, 0) < balanced.step_time(13, 0) == balanced.step_time(16, 0)
    assert (Settings({"performance_mode": "throughput"}, 5, 4).max_num_seqs,
            Settings({"performance_mode": "throughput"}, 5, 4).max_num_batched_tokens) == (512, 4096)


def _stream(port, prompt_words, tokens, arrivals):
    body = json.dumps({"model": "m", "prompt": " ".join(["w1"] * prompt_words), "max_tokens": tokens,
                       "stream": True}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                     {"Content-Type": "application/json"})
    sent = time.monotonic()
    with urllib.request.urlopen(request, timeout=60) as answer:
        for line in answer:
            if line.startswith(b"data: {") and json.loads(line[len(b"data: "):])["choices"][0]["text"] == " w":
                arrivals.append(time.monotonic() - sent)


@pytest.mark.parametrize("chunk, stalls", [(512, False), (4096, True)])
def test_the_server_stalls_decodes_behind_a_large_prefill_chunk(tmp_path, chunk, stalls):
    """One request decoding when a 4096-token prompt arrives: with 4096-token chunks its next token waits a
    whole prefill step (40 ms × (1 + 4096 × 0.0032) ≈ 564 ms); with 512-token chunks each step is ≈ 105 ms.
    The 300 ms line leaves either side more than the ~90 ms a busy CI machine added to one gap.
    The prompt is sent once the first request has streamed tokens (not after a fixed sleep, which a busy
    machine outlasts), and the first is still decoding when the prompt's answer ends."""
    port = free_port()
    with running(port, tmp_path / "standin.log", "--max-num-batched-tokens", str(chunk),
                 STANDIN_TTFT_MS="1", STANDIN_TPOT_MS="40"):
        decoding: list[float] = []
        first = threading.Thread(target=_stream, args=(port, 8, 60, decoding))
        first.start()
        deadline = time.monotonic() + 30
        while len(decoding) < 3 and time.monotonic() < deadline:
            time.sleep(0.005)
        _stream(port, 4096, 2, [])
        decoded_by_then = len(decoding)
        first.join()
    gaps = [later - earlier for earlier, later in zip(decoding, decoding[1:])]
    assert len(decoding) == 60
    assert 3 <= decoded_by_then < 60, "the prompt did not arrive while the first request decoded"
    assert (max(gaps) > 0.3) is stalls, gaps
