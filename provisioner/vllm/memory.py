"""GPU memory planner: how much of each GPU every vLLM instance takes, and how much KV cache it gets.

A library (no CLI, no Ansible): `load_model_shape` reads a model's shape, the small arithmetic
functions turn a shape into bytes, and `plan_gpu` lays the instances of one GPU side by side and
lists the problems, each naming the instance and the fix.

How vLLM 0.25.0 sizes memory (read in the 0.25.0 wheel of /work/shared/gpu-lab; paths under vllm/)
----------------------------------------------------------------------------------------------------
1. Startup check: `request_memory()` (v1/worker/utils.py:405), called from `Worker.init_device()`
   (v1/worker/gpu_worker.py:371) *after* the CUDA context and the distributed environment exist:
       requested = ceil(total × gpu_memory_utilization)
   with total and free from cudaMemGetInfo (`MemorySnapshot.measure()`, utils/mem_utils.py). It
   raises "Free memory on device … is less than desired GPU memory utilization" when free <
   requested. Instances that share a GPU therefore each need their whole request free when they
   start: their shares must add up to less than 1, with room for what lives outside the shares.
2. KV budget: `Worker.determine_available_memory()` (v1/worker/gpu_worker.py:430–584) runs
   `profile_run()` inside `memory_profiling()` (utils/mem_utils.py:229) and returns
       KV = requested − (weights + torch peak increase of the profile run + non-torch increase)
                      − CUDA-graph estimate
   - weights: torch bytes allocated while loading (`DeviceMemoryProfiler` around
     `load_model`), logged as "Model loading took X GiB";
   - the profile run: one forward pass of max_num_batched_tokens tokens (`_dummy_run`) and a
     sampler pass over min(max_num_seqs, max_num_batched_tokens) requests (`_dummy_sampler_run`);
   - non-torch increase: cuBLAS/cuBLASLt workspaces, kernels loaded… allocated after the init
     snapshot (the CUDA context and NCCL set-up come before it, so they are *outside* the budget);
   - CUDA graphs: the estimate (`profile_cudagraph_memory`, subtracted when
     VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1, the default since 0.21) exists only in the V1 model
     runner (v1/worker/gpu_model_runner.py). Dense decoder models run on the V2 model runner by
     default in 0.25 (`VllmConfig.use_v2_model_runner`, config/vllm.py), whose
     `profile_cudagraph_memory()` (v1/worker/gpu/model_runner.py:680) returns 0: the graphs are
     captured after the KV cache is allocated, outside the budget. Measured: KV = requested −
     weights − activation peak − non-torch, to the logged 0.01 GiB, with 0.37–0.89 GiB of graphs
     on top.
3. Blocks: `get_kv_cache_config_from_groups()` / `get_num_blocks()` (v1/core/kv_cache_utils.py:1318, 972):
       num_blocks = KV // page_size // num_layers
       page_size  = 2 × block_size × kv_heads × head_size × kv-dtype bytes
   (`AttentionSpec.real_page_size_bytes`, v1/kv_cache_interface.py); block_size defaults to 16
   (`CacheConfig.DEFAULT_BLOCK_SIZE`, config/cache.py).
4. The logged "GPU KV cache size: N tokens" (`get_kv_cache_configs`, kv_cache_utils.py:2138–2146) is
       N = int(num_blocks / cdiv(max_model_len, block_size) × max_model_len)
   (`get_kv_cache_capacity`, `get_max_concurrency_for_kv_cache_config`,
   `FullAttentionSpec.max_memory_usage_bytes`), i.e. num_blocks × block_size when max_model_len
   is a multiple of block_size.
5. `_check_enough_kv_cache_memory()` (kv_cache_utils.py:733): startup fails unless the KV cache holds
   one whole max_model_len sequence ("To serve at least one request with the model's max seq
   len …"); KV ≤ 0 fails with "No available memory for the cache blocks".
6. Encoder-only models (bge-m3 = XLMRobertaModel, bge-reranker = XLMRobertaForSequenceClassification,
   model_executor/models/roberta.py + bert.py) use `EncoderOnlyAttention`:
   `Attention.get_kv_cache_spec()` returns None for ENCODER_ONLY, so the model has no KV cache
   group; `EngineCore._initialize_kv_caches()` (v1/engine/core.py:271–287) then skips
   `determine_available_memory()` altogether (no profile run, no budget). Their share only feeds
   the startup check of step 1; what they really hold is weights + CUDA graphs + the activations
   of the batches they run — not bounded by the share. Chunked prefill is off for them
   (`ModelConfig.is_chunked_prefill_supported`, config/model.py), so max_num_batched_tokens
   defaults to max(max_model_len, default).
7. Defaults: `EngineArgs.get_batch_defaults()` / `_set_default_max_num_seqs_and_batched_tokens_args()`
   (engine/arg_utils.py:2397, 2590), for `vllm serve` (OPENAI_API_SERVER context): on GPUs with ≥ 70 GiB
   (NVML total) that are not A100s, max_num_batched_tokens 8192 and max_num_seqs 1024, else 2048
   and 256; then max_num_batched_tokens = min(max_num_seqs × max_model_len, …) and
   max_num_seqs = min(max_num_seqs, max_num_batched_tokens). dtype auto: the config's dtype;
   a float32 config becomes float16 for pooling models and bfloat16 (the platform's first) for
   the others (`_resolve_auto_dtype`, config/model.py).

The model here
--------------
Per instance on one GPU (bytes; tp = tensor_parallel_size; b = bytes of the model dtype):
    budget   = ceil(total × share)                               (vLLM's "requested memory")
    weights  = parameter bytes / tp + LOAD_EXTRA                 (`weight_bytes`)
    overhead = activation peak + NON_TORCH                       (`estimate_overhead`)
      activation peak = vocab × hidden × b / tp + T × ACT_HIDDEN × hidden × b [+ T × intermediate
                        for FP8 linear layers], T = max_num_batched_tokens
    KV       = budget − weights − overhead                       (decoders only)
    KV tokens, full-length sequences: steps 3–4
    outside  = CUDA_CONTEXT + CUDA graphs + min(max_num_seqs, T) × vocab × 4 B of sampler logits
    footprint = budget + outside (decoders); weights + overhead + outside (encoders, whose
               activation is T × (4 × hidden + 2 × intermediate) × b: the runtime peak, unprofiled)
`plan_gpu` checks, in start order: shares ≤ usable_fraction; weights + overhead inside the budget;
one max_model_len sequence in the KV cache (else the smallest share and the longest max-model-len
that would fit); vLLM's startup check (free = total − footprints of those started before − own
CUDA context ≥ budget); the sum of footprints ≤ total.
The constants live in `OverheadModel` (DEFAULT_OVERHEAD) and were fitted to vLLM 0.25.0 logs on an
H200 (see its docstring); re-fit them from real logs of other GPUs with the same fields. With
tensor parallelism the NCCL/custom all-reduce buffers are not modelled (not measured).

What it does not model: MoE, sliding-window/hybrid/MLA attention, multimodal encoders, LoRA,
speculative decoding, pipeline parallelism, --kv-cache-memory, --cpu-offload-gb,
--performance-mode throughput (doubles the defaults), per-token-head KV quantisation.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

GiB = 1 << 30
MiB = 1 << 20

SHAPES_DIR = Path(__file__).parent / "model_shapes"

# --------------------------------------------------------------------------- model shapes


class ModelShapeError(ValueError):
    """A model's shape cannot be read; the message names the model and the fix."""


DECODER_ARCHITECTURES = {
    # architecture: (family, qkv bias, q/k norms)
    "LlamaForCausalLM": ("gated", False, False),
    "MistralForCausalLM": ("gated", False, False),
    "Qwen2ForCausalLM": ("gated", True, False),
    "Qwen3ForCausalLM": ("gated", False, True),
    "OPTForCausalLM": ("opt", True, False),
}
ENCODER_ARCHITECTURES = {
    "XLMRobertaModel",
    "XLMRobertaForSequenceClassification",
    "RobertaModel",
    "RobertaForSequenceClassification",
    "BertModel",
    "BertForSequenceClassification",
}
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
DTYPE_ALIASES = {"half": "float16", "fp16": "float16", "bf16": "bfloat16", "float": "float32", "fp32": "float32"}


@dataclass(frozen=True)
class ModelShape:
    """The parts of a model's config.json that decide its memory."""

    name: str
    architecture: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    dtype: str  # the config's torch_dtype/dtype: float16, bfloat16 or float32
    max_position_embeddings: int
    quantization: str | None = None  # "fp8" (block-wise FP8 linear weights) or None
    weight_block_size: tuple[int, int] | None = None
    family: str = "gated"  # gated (SwiGLU: llama/mistral/qwen), opt, encoder (BERT/XLM-R)
    qkv_bias: bool = False
    qk_norm: bool = False
    type_vocab_size: int = 0
    num_labels: int = 0
    source: str = ""

    @property
    def encoder_only(self) -> bool:
        """Bidirectional encoder (BERT/XLM-R): vLLM allocates it no KV cache (module docstring, 6)."""
        return self.family == "encoder"

    @property
    def is_pooling(self) -> bool:
        return self.encoder_only


def builtin_model_ids() -> list[str]:
    """The Hugging Face ids with a committed shape under model_shapes/."""
    return sorted(json.loads(path.read_text())["_model"] for path in SHAPES_DIR.glob("*.json"))


def load_model_shape(model: str, revision: str | None = None) -> ModelShape:
    """The shape of `model`: a local folder (or config.json path) or a built-in Hugging Face id."""
    path = Path(model).expanduser()
    if path.is_dir():
        config_path = path / "config.json"
        if not config_path.is_file():
            raise ModelShapeError(f"{model}: the folder holds no config.json — give the model's folder or its config.json")
        return shape_from_config(_read_json(config_path, model), name=str(path), source=str(config_path))
    if path.is_file():
        return shape_from_config(_read_json(path, model), name=str(path), source=str(path))
    if model.startswith((".", "/", "~")) or model.endswith(".json"):
        raise ModelShapeError(f"{model}: no such file or folder — give a local path holding the model's config.json")
    known = builtin_model_ids()
    builtin = SHAPES_DIR / (model.replace("/", "--", 1) + ".json")
    if "/" not in model or not builtin.is_file():
        raise ModelShapeError(
            f"{model}: no built-in shape for this model — give a local path holding its config.json, "
            f"or one of: {', '.join(known)}"
        )
    if revision not in (None, "main"):
        raise ModelShapeError(
            f"{model}@{revision}: the built-in shape is of revision main — for revision {revision} give a "
            "local path holding that revision's config.json"
        )
    config = _read_json(builtin, model)
    return shape_from_config(config, name=model, source=config.get("_source", str(builtin)))


def _read_json(path: Path, model: str) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ModelShapeError(f"{model}: cannot read {path}: {error}") from error
    if not isinstance(data, dict):
        raise ModelShapeError(f"{model}: {path} does not hold a JSON object")
    return data


def shape_from_config(config: dict, name: str = "", source: str = "") -> ModelShape:
    """A `ModelShape` from a config.json mapping (Hugging Face field names)."""
    if isinstance(config.get("text_config"), dict):
        config = {**config, **config["text_config"]}
    architectures = config.get("architectures") or []
    architecture = architectures[0] if architectures else ""
    supported = sorted(DECODER_ARCHITECTURES) + sorted(ENCODER_ARCHITECTURES)
    if architecture not in DECODER_ARCHITECTURES and architecture not in ENCODER_ARCHITECTURES:
        raise ModelShapeError(
            f"{name}: architecture {architecture or '(none)'} is not modelled — supported: {', '.join(supported)}"
        )
    if config.get("num_experts") or config.get("num_local_experts"):
        raise ModelShapeError(f"{name}: mixture-of-experts models are not modelled")

    def need(key: str, *aliases: str) -> int:
        for candidate in (key, *aliases):
            if config.get(candidate) is not None:
                return int(config[candidate])
        raise ModelShapeError(f"{name}: config.json lacks {key}")

    hidden = need("hidden_size")
    heads = need("num_attention_heads")
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "float32")
    dtype = DTYPE_ALIASES.get(dtype, dtype)
    if dtype not in DTYPE_BYTES:
        raise ModelShapeError(f"{name}: torch_dtype {dtype} is not one of {', '.join(DTYPE_BYTES)}")
    quantization, block = None, None
    quant_config = config.get("quantization_config")
    if isinstance(quant_config, dict):
        method = quant_config.get("quant_method")
        if method != "fp8":
            raise ModelShapeError(f"{name}: quantization {method} is not modelled (only fp8)")
        quantization = "fp8"
        if quant_config.get("weight_block_size"):
            block = tuple(int(x) for x in quant_config["weight_block_size"])
    if architecture in ENCODER_ARCHITECTURES:
        family, qkv_bias, qk_norm = "encoder", True, False
        labels = len(config.get("id2label") or {}) if architecture.endswith("ForSequenceClassification") else 0
    else:
        family, qkv_bias, qk_norm = DECODER_ARCHITECTURES[architecture]
        if family == "gated" and config.get("attention_bias"):
            qkv_bias = True
        labels = 0
    tie_default = family in ("opt", "encoder")
    return ModelShape(
        name=name,
        architecture=architecture,
        hidden_size=hidden,
        num_hidden_layers=need("num_hidden_layers"),
        num_attention_heads=heads,
        num_key_value_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or hidden // heads),
        intermediate_size=need("intermediate_size", "ffn_dim"),
        vocab_size=need("vocab_size"),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", tie_default)),
        dtype=dtype,
        max_position_embeddings=need("max_position_embeddings"),
        quantization=quantization,
        weight_block_size=block,
        family=family,
        qkv_bias=qkv_bias,
        qk_norm=qk_norm,
        type_vocab_size=int(config.get("type_vocab_size") or 0),
        num_labels=labels,
        source=source,
    )


# --------------------------------------------------------------------------- arithmetic


@dataclass(frozen=True)
class ParameterCount:
    """Parameters by how vLLM stores them: `linear` weights (FP8 when quantized), the rest in the model dtype."""

    linear: int  # weight matrices of the transformer layers (q/k/v/o, MLP)
    embedding: int  # token (+ position/type) embeddings, lm_head when untied, classifier heads
    other: int  # norms and biases

    @property
    def total(self) -> int:
        return self.linear + self.embedding + self.other


def parameter_count(shape: ModelShape) -> ParameterCount:
    """Parameters of the model, by kind.

    Gated (Llama/Mistral/Qwen2/Qwen3), per layer, q = heads × head_dim, kv = kv_heads × head_dim:
        linear = hidden × q (q_proj) + 2 × hidden × kv (k_proj, v_proj) + q × hidden (o_proj)
                 + 3 × hidden × intermediate (gate, up, down)
        other  = 2 × hidden (norms) [+ q + 2 × kv (qkv bias, Qwen2)] [+ 2 × head_dim (q/k norm, Qwen3)]
    embedding = vocab × hidden (+ vocab × hidden for an untied lm_head); final norm hidden.
    OPT: 4 × hidden² + 2 × hidden × ffn per layer, biases on all, two LayerNorms (weight + bias),
    learned positions (max_position + 2) × hidden, lm_head tied.
    BERT/XLM-R: 4 × hidden² + 2 × hidden × intermediate per layer, biases, two LayerNorms; word,
    position and token-type embeddings + LayerNorm; XLMRobertaModel's pooler hidden² + hidden; a
    classifier head (hidden² + hidden + hidden × labels + labels) for *ForSequenceClassification.
    """
    h, layers, inter, vocab = shape.hidden_size, shape.num_hidden_layers, shape.intermediate_size, shape.vocab_size
    q = shape.num_attention_heads * shape.head_dim
    kv = shape.num_key_value_heads * shape.head_dim
    if shape.family == "gated":
        linear = layers * (h * q + 2 * h * kv + q * h + 3 * h * inter)
        other = layers * (2 * h + (q + 2 * kv if shape.qkv_bias else 0) + (2 * shape.head_dim if shape.qk_norm else 0)) + h
        embedding = vocab * h * (1 if shape.tie_word_embeddings else 2)
    elif shape.family == "opt":
        linear = layers * (4 * h * h + 2 * h * inter)
        other = layers * (4 * h + inter + h + 4 * h) + 2 * h
        embedding = vocab * h * (1 if shape.tie_word_embeddings else 2) + (shape.max_position_embeddings + 2) * h
    else:
        linear = layers * (4 * h * h + 2 * h * inter)
        other = layers * (4 * h + inter + h + 4 * h) + 2 * h
        embedding = (vocab + shape.max_position_embeddings + shape.type_vocab_size) * h
        if shape.architecture.endswith("ForSequenceClassification"):
            embedding += h * h + h + h * shape.num_labels + shape.num_labels
        elif shape.architecture in ("XLMRobertaModel", "RobertaModel", "BertModel"):
            embedding += h * h + h
    return ParameterCount(linear=linear, embedding=embedding, other=other)


def resolve_dtype(shape: ModelShape, dtype: str = "auto") -> str:
    """The dtype vLLM runs the model in: `--dtype` or, for auto, the config's; float32 configs are
    downcast (float16 for pooling models, bfloat16 for the others: `_resolve_auto_dtype`)."""
    dtype = DTYPE_ALIASES.get(dtype, dtype)
    if dtype == "auto":
        if shape.dtype == "float32":
            return "float16" if shape.is_pooling else "bfloat16"
        return shape.dtype
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype {dtype} is not one of auto, {', '.join(DTYPE_BYTES)}, half, float")
    return dtype


def weight_bytes(shape: ModelShape, dtype: str = "auto", tensor_parallel_size: int = 1) -> int:
    """Bytes of the parameters on one GPU (without LOAD_EXTRA).

    Unquantized: total parameters × dtype bytes (2 for float16/bfloat16, 4 for float32).
    FP8 (`quantization: fp8`): linear weights 1 byte each + one float32 scale per
    weight_block_size block; embeddings, lm_head, norms and biases stay in the dtype.
    Split evenly over tensor_parallel_size GPUs (norms are in fact replicated: negligible).
    """
    count = parameter_count(shape)
    b = DTYPE_BYTES[resolve_dtype(shape, dtype)]
    if shape.quantization == "fp8":
        total = count.linear + (count.embedding + count.other) * b + _fp8_scale_bytes(shape)
    else:
        total = count.total * b
    return math.ceil(total / tensor_parallel_size)


def _fp8_scale_bytes(shape: ModelShape) -> int:
    """float32 scales of block-wise FP8: one per [block_n, block_k] tile of each linear weight."""
    if shape.family != "gated":
        return 0
    if not shape.weight_block_size:
        return 4 * shape.num_hidden_layers * 7  # one per-tensor scale per matrix
    bn, bk = shape.weight_block_size
    h, inter = shape.hidden_size, shape.intermediate_size
    q = shape.num_attention_heads * shape.head_dim
    kv = shape.num_key_value_heads * shape.head_dim
    tiles = (
        _tiles(q, h, bn, bk) + 2 * _tiles(kv, h, bn, bk) + _tiles(h, q, bn, bk)
        + 2 * _tiles(inter, h, bn, bk) + _tiles(h, inter, bn, bk)
    )
    return 4 * shape.num_hidden_layers * tiles


def _tiles(rows: int, cols: int, bn: int, bk: int) -> int:
    return math.ceil(rows / bn) * math.ceil(cols / bk)


def kv_dtype_bytes(shape: ModelShape, kv_cache_dtype: str = "auto", dtype: str = "auto") -> int:
    """Bytes per KV element: auto = the model's dtype; fp8, fp8_e4m3, fp8_e5m2 = 1; float16/bfloat16 = 2."""
    kv_cache_dtype = DTYPE_ALIASES.get(kv_cache_dtype, kv_cache_dtype)
    if kv_cache_dtype == "auto":
        return DTYPE_BYTES[resolve_dtype(shape, dtype)]
    if kv_cache_dtype in ("fp8", "fp8_e4m3", "fp8_e5m2"):
        return 1
    if kv_cache_dtype in ("float16", "bfloat16"):
        return 2
    raise ValueError(f"kv_cache_dtype {kv_cache_dtype} is not modelled (auto, float16, bfloat16, fp8, fp8_e4m3, fp8_e5m2)")


def kv_heads_per_gpu(shape: ModelShape, tensor_parallel_size: int = 1) -> int:
    """KV heads one GPU stores: kv_heads / tp, at least 1 (replicated when tp > kv_heads)."""
    return max(1, shape.num_key_value_heads // tensor_parallel_size)


def kv_bytes_per_token(
    shape: ModelShape, kv_cache_dtype: str = "auto", dtype: str = "auto", tensor_parallel_size: int = 1
) -> int:
    """layers × kv_heads × head_dim × 2 (K and V) × kv-dtype bytes, on one GPU; 0 for encoder-only models."""
    if shape.encoder_only:
        return 0
    return (
        shape.num_hidden_layers
        * kv_heads_per_gpu(shape, tensor_parallel_size)
        * shape.head_dim
        * 2
        * kv_dtype_bytes(shape, kv_cache_dtype, dtype)
    )


def block_bytes(
    shape: ModelShape,
    block_size: int = 16,
    kv_cache_dtype: str = "auto",
    dtype: str = "auto",
    tensor_parallel_size: int = 1,
) -> int:
    """Bytes of one KV block over all layers: page_size × layers = block_size × kv_bytes_per_token."""
    return block_size * kv_bytes_per_token(shape, kv_cache_dtype, dtype, tensor_parallel_size)


def logged_kv_tokens(num_blocks: int, max_model_len: int, block_size: int = 16) -> int:
    """vLLM's "GPU KV cache size: N tokens": int(num_blocks / cdiv(max_model_len, block_size) × max_model_len)."""
    if num_blocks <= 0:
        return 0
    blocks_per_sequence = -(-max_model_len // block_size)
    return int(num_blocks / blocks_per_sequence * max_model_len)


# --------------------------------------------------------------------------- overhead model


@dataclass(frozen=True)
class OverheadModel:
    """Every constant of the overhead estimate, in one place; fitted to vLLM 0.25.0 on an H200.

    Calibration (H200, CUDA total 150,109,880,320 B = 139.80 GiB, torch 2.11 + CUDA 13, the
    gpu-lab bundle, `--load-format dummy`, V2 model runner; numbers as vLLM logs them, 0.01 GiB):
        run                                   T     seqs  weights  act peak  non-torch  graphs  KV      tokens     process
        Qwen2.5-7B defaults (0.92)            8192  1024  14.29    1.13      0.22       0.89    112.98  2,115,440  133,778
        Qwen2.5-7B 0.50, len 4096             8192  128   14.29    1.13      0.22       0.37    54.26   1,016,000  72,502
        Qwen2.5-7B 0.16, len 4096             2048  128   14.29    1.04      0.22       0.37    6.81    127,520    23,134
        Qwen2.5-7B 0.16, len 4096             512   128   14.29    1.02      0.22       0.37    6.83    127,904    23,134
        Qwen3-1.7B-FP8 0.042, len 8192        4096  256   1.90     0.65      0.22       0.38    3.09    28,912     6,882
        bge-m3 fp16 0.021, len 8192           8192  256   1.06     (none: no profile run)      0.73    no KV      2,642
        bge-reranker-base fp16 0.017, len 512 8192  256   0.53     (none)                      0.53    no KV      1,858
    (GiB, except tokens and "process": the process's MiB in nvidia-smi once the engine was up),
    and in every run 0.51 GiB in use before the init snapshot (CUDA context + NCCL set-up).
    This model predicts KV 112.98 / 54.26 / 6.82 / 6.84 / 3.02 GiB and 2,115,456 / 1,016,032 /
    127,696 / 128,112 / 28,304 tokens for the five decoder runs, and process footprints of
    130.59 / 70.85 / 23.32 / 23.32 / 6.85 / 2.70 / 1.93 GiB (measured 130.64 / 70.80 / 22.59 /
    22.59 / 6.72 / 2.58 / 1.81 GiB; the encoders' runtime activations come on top).
    """

    # Weights: vLLM's "Model loading took" minus the parameter bytes. Measured 0.10 GiB for
    # Qwen2.5-7B (14.29 − 14.185), 0.01 for Qwen3-1.7B-FP8, ≤ 0.01 for the XLM-R models; the
    # origin of the 0.1 GiB was not traced, so decoders get the larger value.
    load_extra_decoder: int = 100 * MiB
    load_extra_encoder: int = 16 * MiB
    # Activation peak of the profile run (decoders). It does not move with max_num_seqs
    # (1024 vs 128 at T=8192: 1.13 both) and barely with T (1.02 → 1.13 GiB for 512 → 8192): a
    # fixed vocab × hidden × dtype-bytes term (1.015 GiB for Qwen2.5-7B, 0.58 for Qwen3-1.7B)
    # plus ACT_HIDDEN hidden-size vectors per token; FP8 linear layers add their 1-byte
    # quantized input (≤ intermediate bytes per token).
    act_vocab_hidden: float = 1.0
    act_hidden_per_token: float = 2.2
    act_fp8_intermediate_per_token: float = 1.0
    # Encoders (not profiled by vLLM; runtime peak of a T-token batch, not measured):
    # (4 × hidden + 2 × intermediate) values per token in the dtype.
    act_encoder_hidden: float = 4.0
    act_encoder_intermediate: float = 2.0
    # Non-torch memory allocated after the init snapshot (cuBLAS workspaces, kernels): 0.22 GiB
    # in every decoder run.
    non_torch: int = int(0.22 * GiB)
    # Outside the budget: what a process holds before vLLM's init snapshot (CUDA context, NCCL):
    # 0.51 GiB on the H200 (consumer cards probably somewhat less: not measured).
    cuda_context: int = int(0.51 * GiB)
    # CUDA graphs, captured after the KV cache (outside the budget for decoders on the V2 runner):
    # decoders  base + min(max_num_seqs, 512, T) × (hidden + intermediate) × per_token bytes
    #           (fits 0.89 / 0.37 / 0.38 GiB as 0.89 / 0.37 / 0.33);
    # encoders  base + layers × per_layer (fits 0.73 / 0.53 GiB as 0.71 / 0.53).
    cudagraph_decoder_base: int = int(0.20 * GiB)
    cudagraph_decoder_per_token_width: float = 64.0
    cudagraph_encoder_base: int = int(0.35 * GiB)
    cudagraph_encoder_per_layer: int = int(0.015 * GiB)
    # Sampler logits kept by the allocator after the warm-up (float32, max_num_seqs rows):
    # the Qwen2.5-7B default run held 0.62 GiB above its profiled peak (1024 × 152064 × 4 B = 0.58).
    sampler_bytes_per_logit: int = 4
    # NVML's memory.total (nvidia-smi) minus CUDA's total (cudaMemGetInfo): 143,771 MiB vs
    # 150,109,880,320 B = 644,939,776 B (615 MiB) on the H200; assumed for smaller cards too.
    nvml_cuda_gap: int = 644_939_776


DEFAULT_OVERHEAD = OverheadModel()


def cuda_total_bytes(nvml_total_bytes: int, model: OverheadModel = DEFAULT_OVERHEAD) -> int:
    """CUDA's total memory (what vLLM multiplies by the share) from NVML's / nvidia-smi's memory.total."""
    return nvml_total_bytes - model.nvml_cuda_gap


@dataclass(frozen=True)
class Overhead:
    """Memory an instance needs besides weights and KV cache, in bytes, on one GPU."""

    activation: int  # inside the budget: the profile run's torch peak (encoders: runtime peak)
    non_torch: int  # inside the budget
    cuda_context: int  # outside the budget
    cuda_graphs: int  # outside the budget
    sampler: int  # outside the budget: logits cached after the warm-up

    @property
    def in_budget(self) -> int:
        """What vLLM subtracts from the budget besides the weights."""
        return self.activation + self.non_torch

    @property
    def outside_budget(self) -> int:
        """What the process holds on top of its budget."""
        return self.cuda_context + self.cuda_graphs + self.sampler


def estimate_overhead(
    shape: ModelShape,
    dtype: str = "auto",
    max_num_batched_tokens: int = 2048,
    max_num_seqs: int = 256,
    tensor_parallel_size: int = 1,
    enforce_eager: bool = False,
    model: OverheadModel = DEFAULT_OVERHEAD,
) -> Overhead:
    """The overhead estimate (constants and their calibration: `OverheadModel`).

    Decoders, T = max_num_batched_tokens, R = min(max_num_seqs, T), b = dtype bytes:
        activation = vocab × hidden × b / tp + T × 2.2 × hidden × b  [+ T × intermediate (FP8)]
        graphs     = 0.20 GiB + min(R, 512) × (hidden + intermediate) × 64 B  (0 with enforce_eager)
        sampler    = R × vocab × 4 B
    Encoders: activation = T × (4 × hidden + 2 × intermediate) × b; graphs = 0.35 GiB + 0.015 GiB ×
    layers; no sampler. Both: non-torch 0.22 GiB, CUDA context 0.51 GiB.
    """
    b = DTYPE_BYTES[resolve_dtype(shape, dtype)]
    h, inter, vocab, tp = shape.hidden_size, shape.intermediate_size, shape.vocab_size, tensor_parallel_size
    tokens = max_num_batched_tokens
    requests = min(max_num_seqs, tokens)
    if shape.encoder_only:
        activation = tokens * (model.act_encoder_hidden * h + model.act_encoder_intermediate * inter) * b
        graphs = model.cudagraph_encoder_base + shape.num_hidden_layers * model.cudagraph_encoder_per_layer
        sampler = 0
    else:
        activation = model.act_vocab_hidden * vocab * h * b / tp + tokens * model.act_hidden_per_token * h * b
        if shape.quantization == "fp8":
            activation += tokens * model.act_fp8_intermediate_per_token * inter
        graphs = model.cudagraph_decoder_base + min(requests, 512) * (h + inter) * model.cudagraph_decoder_per_token_width
        sampler = requests * vocab * model.sampler_bytes_per_logit
    if enforce_eager:
        graphs = 0
    return Overhead(
        activation=math.ceil(activation),
        non_torch=model.non_torch,
        cuda_context=model.cuda_context,
        cuda_graphs=math.ceil(graphs),
        sampler=sampler,
    )


def default_batch_settings(
    total_bytes: int,
    max_model_len: int,
    chunked_prefill: bool = True,
    max_num_batched_tokens: int | None = None,
    max_num_seqs: int | None = None,
    gpu_name: str = "",
    performance_mode: str = "balanced",
) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) as `vllm serve` 0.25.0 fills them in (module docstring, 7).

    ≥ 70 GiB and not an A100: 8192 and 1024, else 2048 and 256, both doubled by
    `--performance-mode throughput` (engine/arg_utils.py:2623); without chunked prefill (pooling
    encoders) max(max_model_len, default); then min(max_num_seqs × max_model_len, …), and
    max_num_seqs = min(max_num_seqs, max_num_batched_tokens). Values given stay as given.
    """
    large = total_bytes >= 70 * GiB and "a100" not in gpu_name.lower()
    doubled = 2 if performance_mode == "throughput" else 1
    seqs = max_num_seqs if max_num_seqs is not None else (1024 if large else 256) * doubled
    tokens = max_num_batched_tokens
    if tokens is None:
        tokens = (8192 if large else 2048) * doubled
        if not chunked_prefill:
            tokens = max(max_model_len, tokens)
        tokens = min(seqs * max_model_len, tokens)
    if max_num_seqs is None:
        seqs = min(seqs, tokens)
    return tokens, seqs


# --------------------------------------------------------------------------- planning


@dataclass(frozen=True)
class InstanceDemand:
    """One vLLM instance on the GPU being planned (options as `vllm serve` takes them)."""

    name: str
    shape: ModelShape
    gpu_memory_utilization: float
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    max_num_batched_tokens: int | None = None  # None: vLLM 0.25's default for this GPU
    max_num_seqs: int | None = None  # None: vLLM 0.25's default for this GPU
    tensor_parallel_size: int = 1
    block_size: int = 16
    enforce_eager: bool = False
    performance_mode: str = "balanced"


@dataclass
class InstancePlan:
    """What one instance gets on this GPU (bytes, per GPU)."""

    name: str
    share: float
    budget: int  # ceil(total × share): vLLM's requested memory
    weights: int
    overhead: Overhead
    kv_cache: bool  # False for encoder-only models
    kv_bytes: int  # budget − weights − overhead (negative: does not fit); 0 without a KV cache
    num_blocks: int
    kv_tokens: int  # as vLLM logs "GPU KV cache size"
    max_model_len: int
    max_num_batched_tokens: int
    max_num_seqs: int
    min_share: float  # the smallest share (2 decimals) that fits one max_model_len sequence / the instance
    footprint: int  # what the process holds on the GPU once started (budget or needs, plus outside)
    problems: list[str] = field(default_factory=list)

    @property
    def sequences(self) -> int:
        """Full-length sequences the KV cache holds at once: kv_tokens // max_model_len."""
        return self.kv_tokens // self.max_model_len if self.kv_cache else 0

    @property
    def needs(self) -> int:
        """Bytes inside the budget that are not KV cache: weights + activation peak + non-torch."""
        return self.weights + self.overhead.in_budget


TABLE_COLUMNS = ("instance", "share", "budget GiB", "weights GiB", "overhead GiB", "KV GiB", "KV tokens", "full-length sequences")


@dataclass
class GpuPlan:
    """The instances of one GPU side by side, and every problem found."""

    total_bytes: int
    usable_fraction: float
    instances: list[InstancePlan]
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def shares(self) -> float:
        return sum(instance.share for instance in self.instances)

    @property
    def footprint(self) -> int:
        """Bytes the instances hold in all once started (budgets or needs, plus what lives outside them)."""
        return sum(instance.footprint for instance in self.instances)

    @property
    def spare(self) -> int:
        """total_bytes − footprint: negative when the instances do not fit."""
        return self.total_bytes - self.footprint

    def table_rows(self) -> list[tuple[str, ...]]:
        """One row per instance, in TABLE_COLUMNS order, formatted for a per-GPU table."""
        rows = []
        for item in self.instances:
            if item.kv_cache:
                kv = f"{item.kv_bytes / GiB:.2f}"
                tokens = f"{item.kv_tokens:,}"
                sequences = f"{item.sequences:,} × {item.max_model_len:,}"
            else:
                kv, tokens, sequences = "—", "no KV cache", "—"
            rows.append(
                (
                    item.name,
                    f"{item.share:.2f}",
                    f"{item.budget / GiB:.2f}",
                    f"{item.weights / GiB:.2f}",
                    f"{item.overhead.in_budget / GiB:.2f}",
                    kv,
                    tokens,
                    sequences,
                )
            )
        return rows


def plan_gpu(
    total_bytes: int,
    instances: list[InstanceDemand],
    usable_fraction: float,
    gpu_name: str = "",
    model: OverheadModel = DEFAULT_OVERHEAD,
) -> GpuPlan:
    """Plan the instances that share one GPU, in the order they start.

    total_bytes is CUDA's total memory of the GPU (torch.cuda.mem_get_info()[1]; from nvidia-smi's
    memory.total use `cuda_total_bytes`). Problems: shares above usable_fraction; an instance
    whose weights and overhead do not fit its share; a KV cache smaller than one max_model_len
    sequence (vLLM refuses to start); max_model_len above the model's limit; an encoder that
    uses more than its share; an instance that would fail vLLM's free-memory check at startup
    because those started before it hold too much; the whole set not fitting the GPU.
    """
    plans = [_plan_instance(total_bytes, demand, usable_fraction, gpu_name, model) for demand in instances]
    problems: list[str] = []
    total_share = sum(plan.share for plan in plans)
    if total_share > usable_fraction + 1e-9:
        listed = " + ".join(f"{plan.name} {_fmt(plan.share)}" for plan in plans)
        problems.append(
            f"shares on this GPU ({listed}) add up to {_fmt(total_share)} (limit {_fmt(usable_fraction)}) — "
            f"lower gpu_memory_utilization so they add up to at most {_fmt(usable_fraction)}"
        )
    for plan in plans:
        problems.extend(plan.problems)
    held = 0
    for index, plan in enumerate(plans):
        # vLLM measures free memory after the process's own CUDA context exists (module docstring, 1).
        free = total_bytes - held - model.cuda_context
        if free < plan.budget:
            if index:
                when = "when it starts after " + ", ".join(p.name for p in plans[:index])
            else:
                when = f"when it starts (its own CUDA context holds about {_gib(model.cuda_context)})"
            fits = math.floor(round(free / total_bytes * 100, 9)) / 100
            problems.append(
                f"{plan.name}: would fail vLLM's startup check — about {_gib(free)} free {when}, less than its "
                f"request {_fmt(plan.share)} × {_gib(total_bytes)} = {_gib(plan.budget)} — lower its "
                f"gpu_memory_utilization to at most {_fmt(fits)}"
                + (", or lower the shares started before it" if index else "")
            )
        held += plan.footprint
    if held > total_bytes:
        excess = held - total_bytes
        with_kv = [plan.name for plan in plans if plan.kv_cache]
        lower = (
            f"lower the shares of {', '.join(with_kv)} by about {_fmt(_ceil2(excess / total_bytes))} in all"
            if with_kv
            else "move an instance to another GPU"
        )
        problems.append(
            f"the instances need about {_gib(held)} of this GPU's {_gib(total_bytes)} (budgets, plus per process "
            f"about {_gib(model.cuda_context)} of CUDA context and its CUDA graphs outside the budget), "
            f"{_gib(excess)} too much — {lower}, or use fewer instances"
        )
    return GpuPlan(total_bytes=total_bytes, usable_fraction=usable_fraction, instances=plans, problems=problems)


def _plan_instance(
    total_bytes: int, demand: InstanceDemand, usable_fraction: float, gpu_name: str, model: OverheadModel
) -> InstancePlan:
    shape, tp, name = demand.shape, demand.tensor_parallel_size, demand.name
    problems: list[str] = []
    max_model_len = demand.max_model_len or shape.max_position_embeddings
    if max_model_len > shape.max_position_embeddings:
        problems.append(
            f"{name}: max-model-len {max_model_len:,} is above the model's limit {shape.max_position_embeddings:,} "
            f"(max_position_embeddings; vLLM refuses it) — lower max-model-len to at most {shape.max_position_embeddings:,}"
        )
    tokens, seqs = default_batch_settings(
        total_bytes,
        max_model_len,
        chunked_prefill=not shape.encoder_only,
        max_num_batched_tokens=demand.max_num_batched_tokens,
        max_num_seqs=demand.max_num_seqs,
        gpu_name=gpu_name,
        performance_mode=demand.performance_mode,
    )
    share = demand.gpu_memory_utilization
    budget = math.ceil(total_bytes * share)
    extra = model.load_extra_encoder if shape.encoder_only else model.load_extra_decoder
    weights = weight_bytes(shape, demand.dtype, tp) + extra
    overhead = estimate_overhead(shape, demand.dtype, tokens, seqs, tp, demand.enforce_eager, model)
    needs = weights + overhead.in_budget

    if shape.encoder_only:
        min_share = _ceil2(needs / total_bytes)
        if needs > budget:
            problems.append(
                f"{name}: weights {_gib(weights)} + overhead {_gib(overhead.in_budget)} need more than its share "
                f"{_fmt(share)} × {_gib(total_bytes)} = {_gib(budget)} (vLLM does not hold an encoder-only model to "
                f"its share, so the other instances' budgets are at risk) — raise gpu_memory_utilization to at "
                f"least {_fmt(min_share)}"
                + _beyond(min_share, usable_fraction)
            )
        return InstancePlan(
            name=name, share=share, budget=budget, weights=weights, overhead=overhead, kv_cache=False,
            kv_bytes=0, num_blocks=0, kv_tokens=0, max_model_len=max_model_len, max_num_batched_tokens=tokens,
            max_num_seqs=seqs, min_share=min_share, footprint=max(needs, 0) + overhead.outside_budget,
            problems=problems,
        )

    block = block_bytes(shape, demand.block_size, demand.kv_cache_dtype, demand.dtype, tp)
    blocks_per_sequence = -(-max_model_len // demand.block_size)
    one_sequence = blocks_per_sequence * block
    min_share = _ceil2((needs + one_sequence) / total_bytes)
    kv = budget - needs
    num_blocks = max(kv, 0) // block
    kv_tokens = logged_kv_tokens(num_blocks, max_model_len, demand.block_size)
    if kv <= 0:
        problems.append(
            f"{name}: weights {_gib(weights)} + overhead {_gib(overhead.in_budget)} do not fit in "
            f"{_fmt(share)} × {_gib(total_bytes)} = {_gib(budget)} — raise gpu_memory_utilization to at least "
            f"{_fmt(min_share)} (for one {max_model_len:,}-token sequence), or use a smaller or quantized model"
            + _beyond(min_share, usable_fraction)
        )
    elif num_blocks < blocks_per_sequence:
        longest = num_blocks * demand.block_size
        problems.append(
            f"{name}: KV cache {_gib(kv)} holds {kv_tokens:,} tokens, less than one {max_model_len:,}-token "
            f"sequence (vLLM refuses to start) — lower max-model-len to at most {longest:,} or raise "
            f"gpu_memory_utilization to {_fmt(min_share)}" + _beyond(min_share, usable_fraction)
        )
    return InstancePlan(
        name=name, share=share, budget=budget, weights=weights, overhead=overhead, kv_cache=True, kv_bytes=kv,
        num_blocks=num_blocks, kv_tokens=kv_tokens, max_model_len=max_model_len, max_num_batched_tokens=tokens,
        max_num_seqs=seqs, min_share=min_share, footprint=max(budget, needs) + overhead.outside_budget,
        problems=problems,
    )


def _beyond(min_share: float, usable_fraction: float) -> str:
    if min_share <= usable_fraction:
        return ""
    return (
        f" — more than this GPU's limit {_fmt(usable_fraction)}: use a smaller or quantized model, a shorter "
        "max-model-len, or tensor parallelism over more GPUs"
    )


def _ceil2(fraction: float) -> float:
    """Round a share up to 2 decimals (the precision gpu_memory_utilization is written with)."""
    return math.ceil(round(fraction * 100, 9)) / 100


def _fmt(value: float) -> str:
    return f"{value:.2f}"


def _gib(value: float) -> str:
    return f"{value / GiB:.2f} GiB"
