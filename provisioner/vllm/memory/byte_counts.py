"""Bytes on one GPU: weights, KV cache per token and per block, and the overhead model around them."""

from __future__ import annotations

import math
from dataclasses import dataclass

from provisioner.vllm.memory.shapes import DTYPE_ALIASES, DTYPE_BYTES, ModelShape, parameter_count

GiB = 1 << 30
MiB = 1 << 20


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
