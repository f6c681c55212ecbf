"""The stand-in server's /metrics (TEST DOUBLE, standin_metrics.py) against vLLM 0.25.0's recorded on the H200
(tests/fixtures/vllm/h200-metrics): every family it writes has the recorded type, help, label names and
histogram buckets; its values follow a real load on the stand-in (a slot each for 2 of 4 streams)."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.unit.standin import MODEL, free_port, standin, stop

RECORDED = Path(__file__).resolve().parent.parent / "fixtures" / "vllm" / "h200-metrics"
SAMPLE_RE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')
LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
USED = ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
        "vllm:num_preemptions_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
        "vllm:request_success_total", "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
        "vllm:request_time_per_output_token_seconds", "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds"]  # what docs/monitoring.md's rules and dashboards read


def families(text: str) -> dict[str, dict]:
    """Exposition text → {family: {type, help, samples: [(name, labels, value)]}}."""
    found: dict[str, dict] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, text_ = line[7:].partition(" ")
            found.setdefault(name, {"samples": []})["help"] = text_
        elif line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            found.setdefault(name, {"samples": []})["type"] = kind
        elif line and not line.startswith("#"):
            name, _, labels, value = SAMPLE_RE.match(line).groups()
            family = next(f for f in (name, re.sub(r"_(bucket|count|sum)$", "", name)) if f in found)
            found[family]["samples"].append((name, dict(LABEL_RE.findall(labels or "")), float(value)))
    return found


def shape(family: dict) -> dict:
    """What must match the recording: type, help, label names per sample name, the buckets."""
    return {"type": family["type"], "help": family["help"],
            "labels": sorted({(name, tuple(sorted(set(labels) - {"model_name"} | {"model_name"})))
                              for name, labels, _ in family["samples"]}),
            "le": [labels["le"] for name, labels, _ in family["samples"] if name.endswith("_bucket")]}


def value(found: dict, family: str, **labels: str) -> float:
    return next(v for name, sample_labels, v in found[family]["samples"]
                if name in (family, family + "_count") and all(sample_labels.get(k) == w for k, w in labels.items())
                and (name == family or name.endswith("_count")) and "le" not in sample_labels)


def scrape(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        assert answer.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return families(answer.read().decode())


def stream(port: int, tokens: int) -> None:
    body = json.dumps({"model": MODEL, "prompt": "one two three", "max_tokens": tokens, "stream": True}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        answer.read()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = free_port()
    process = standin(port, tmp_path_factory.mktemp("standin") / "log", "--max-num-seqs", "2", "--max-model-len", "64",
                      STANDIN_TTFT_MS="300", STANDIN_TPOT_MS="80", STANDIN_KV_CACHE_TOKENS="100")
    yield port
    stop(process)


def test_the_stand_in_writes_the_recorded_names_types_labels_and_buckets(server):
    recorded = families((RECORDED / "metrics-under-load.txt").read_text())
    written = scrape(server)
    assert sorted(written) == sorted([*USED, *[name.removesuffix("_total") + "_created" for name in USED
                                               if name.endswith("_total")],
                                      *[name + "_created" for name in USED if recorded[name]["type"] == "histogram"]])
    for name in written:
        assert shape(written[name]) == shape(recorded[name]), name
    assert [shape(written[name])["type"] for name in USED] == [
        "gauge", "gauge", "gauge", "counter", "counter", "counter", "counter",
        "histogram", "histogram", "histogram", "histogram", "histogram"]
    assert {labels["model_name"] for family in written.values() for _, labels, _ in family["samples"]} == {MODEL}


def test_its_values_follow_the_load(server):
    """Four requests of 5 tokens at once, two slots (--max-num-seqs 2): each is scheduled 300 ms after it
    arrives (STANDIN_TTFT_MS), a step takes ~80 ms (STANDIN_TPOT_MS); two run (first tokens ~0.38 s, done
    ~0.70 s), two wait for their slots (first tokens ~0.78 s)."""
    before = scrape(server)
    assert [value(before, name) for name in USED[:3]] == [0.0, 0.0, 0.0]
    threads = [threading.Thread(target=stream, args=(server, 5)) for _ in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(0.45)  # two hold the slots, two wait for them
    during = scrape(server)
    for thread in threads:
        thread.join()
    after = scrape(server)
    assert value(during, "vllm:num_requests_running") == 2.0
    assert value(during, "vllm:num_requests_waiting") == 2.0
    # two prompts of 3 tokens of the 100, and the first token or two each has generated by then
    assert 0.06 < value(during, "vllm:kv_cache_usage_perc") <= 0.1
    assert [value(after, name) for name in USED[:3]] == [0.0, 0.0, 0.0]
    assert value(after, "vllm:prompt_tokens_total") == 12.0
    assert value(after, "vllm:generation_tokens_total") == 20.0
    assert value(after, "vllm:request_success_total", finished_reason="length") == 4.0
    assert value(after, "vllm:time_to_first_token_seconds") == 4.0
    assert value(after, "vllm:inter_token_latency_seconds") == 16.0
    assert value(after, "vllm:request_time_per_output_token_seconds") == 4.0
    ttft = {labels["le"]: v for name, labels, v in after["vllm:time_to_first_token_seconds"]["samples"]
            if name.endswith("_bucket")}
    # two got their first token after ~0.38 s, two waited for a slot first (~0.78 s)
    assert (ttft["0.25"], ttft["0.5"], ttft["0.75"], ttft["1.0"], ttft["2.5"]) == (0.0, 2.0, 2.0, 4.0, 4.0)
    queued = {labels["le"]: v for name, labels, v in after["vllm:request_queue_time_seconds"]["samples"]
              if name.endswith("_bucket")}
    assert (queued["0.3"], queued["0.5"], queued["0.8"]) == (0.0, 2.0, 4.0)  # scheduled at ~0.30 s and ~0.70 s
