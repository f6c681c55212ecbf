"""GPU memory planner: how much of each GPU every vLLM instance takes, and how much KV cache it gets.

A library (no CLI, no Ansible): `load_model_shape` reads a model's shape (`shapes`), the small
arithmetic functions turn a shape into bytes (`byte_counts`, with the overhead model), and `plan_gpu`
lays the instances of one GPU side by side and lists the problems, each naming the instance and the
fix (`gpu_plan`). Each module imports only those before it.

How vLLM 0.25.0 sizes memory (read in the source of the vLLM 0.25.0 wheel; paths under vllm/)
--------------------------------------------------------------------------------------------
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

from provisioner.vllm.memory.byte_counts import (
    DEFAULT_OVERHEAD,
    GiB,
    MiB,
    Overhead,
    OverheadModel,
    block_bytes,
    cuda_total_bytes,
    default_batch_settings,
    estimate_overhead,
    kv_bytes_per_token,
    kv_dtype_bytes,
    kv_heads_per_gpu,
    logged_kv_tokens,
    resolve_dtype,
    weight_bytes,
)
from provisioner.vllm.memory.gpu_plan import TABLE_COLUMNS, GpuPlan, InstanceDemand, InstancePlan, plan_gpu
from provisioner.vllm.memory.shapes import (
    SHAPES_DIR,
    ModelShape,
    ModelShapeError,
    ParameterCount,
    builtin_model_ids,
    load_model_shape,
    parameter_count,
    shape_from_config,
)

__all__ = [
    "DEFAULT_OVERHEAD",
    "GiB",
    "GpuPlan",
    "InstanceDemand",
    "InstancePlan",
    "MiB",
    "ModelShape",
    "ModelShapeError",
    "Overhead",
    "OverheadModel",
    "ParameterCount",
    "SHAPES_DIR",
    "TABLE_COLUMNS",
    "block_bytes",
    "builtin_model_ids",
    "cuda_total_bytes",
    "default_batch_settings",
    "estimate_overhead",
    "kv_bytes_per_token",
    "kv_dtype_bytes",
    "kv_heads_per_gpu",
    "load_model_shape",
    "logged_kv_tokens",
    "parameter_count",
    "plan_gpu",
    "resolve_dtype",
    "shape_from_config",
    "weight_bytes",
]
