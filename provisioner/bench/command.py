"""The `vllm bench serve` command line of one run, built from a load profile.

Only options of the pinned vLLM's `bench serve` parser (provisioner/vllm/catalogs) are used: vLLM's
random dataset with exact lengths (--ignore-eos), all requests sent at once (request rate inf) and
held to `concurrency` in flight, or (arrivals) sent at a request rate with gamma-distributed gaps
(--request-rate, --burstiness; at most the arrivals' max_concurrency in flight), every latency percentile we
compare, the result saved as JSON.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from provisioner.bench.loads import Arrivals, Load

PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el")
PERCENTILES = (50, 90, 99)
READY_TIMEOUT_S = 120


@dataclass(frozen=True)
class Endpoint:
    """What the bench needs of a running server."""

    base_url: str  # http://127.0.0.1:8000
    model: str  # the served model name (requests' "model")
    tokenizer: str  # what vLLM loads the tokenizer from (a folder or a Hugging Face id)


def bench_argv(vllm: str, endpoint: Endpoint, load: Load, concurrency: int, seed: int,
               result_dir: str, result_filename: str, metadata: dict[str, str] | None = None,
               goodput: tuple[str, ...] = (), arrivals: Arrivals | None = None) -> list[str]:
    """argv of one `vllm bench serve` run (vllm: the `vllm` executable on the host); goodput: vLLM's
    per-request SLO (`ttft:200` …), its result then holds request_goodput; arrivals: at a request rate
    (`concurrency` is then ignored)."""
    prompts = arrivals.num_prompts(load.min_prompts) if arrivals else load.num_prompts(concurrency)
    pace = (["--max-concurrency", str(arrivals.max_concurrency), "--request-rate", f"{arrivals.rate:g}",
             "--burstiness", f"{arrivals.burstiness:g}"] if arrivals else
            ["--max-concurrency", str(concurrency), "--request-rate", "inf"])
    argv = [
        vllm, "bench", "serve",
        "--backend", "vllm",
        "--base-url", endpoint.base_url,
        "--endpoint", "/v1/completions",
        "--model", endpoint.model,
        "--tokenizer", endpoint.tokenizer,
        "--dataset-name", "random",
        "--random-input-len", str(load.input_len),
        "--random-output-len", str(load.output_len),
        "--random-range-ratio", "0",
        "--ignore-eos",
        "--num-prompts", str(prompts),
        *pace,
        "--seed", str(seed),
        "--percentile-metrics", ",".join(PERCENTILE_METRICS),
        "--metric-percentiles", ",".join(map(str, PERCENTILES)),
        "--ready-check-timeout-sec", str(READY_TIMEOUT_S),
        "--disable-tqdm",
        "--save-result",
        "--result-dir", result_dir,
        "--result-filename", result_filename,
    ]
    if goodput:
        argv += ["--goodput", *goodput]
    if metadata:
        argv += ["--metadata", *(f"{key}={value}" for key, value in metadata.items())]
    return argv


def shell_command(argv: list[str], env: dict[str, str] | None = None, key_on_stdin: bool = False) -> str:
    """`argv` as bash text; with key_on_stdin the API key is read from stdin into OPENAI_API_KEY
    (what `vllm bench serve` sends as the bearer token), so it never shows on a command line."""
    words = " ".join(shlex.quote(word) for word in argv)
    exports = "".join(f"export {name}={shlex.quote(value)}; " for name, value in (env or {}).items())
    key = "IFS= read -r OPENAI_API_KEY; export OPENAI_API_KEY; " if key_on_stdin else ""
    return f"{exports}{key}exec {words}"
