"""The memory planner: model shapes, the byte arithmetic, and per-GPU plans for the seed setups.

Expected numbers are worked out by hand below (the arithmetic is in the comments and in the
expressions), from the model's formulas and constants as the package docstring of
provisioner/vllm/memory/ states them, and checked against published parameter counts, the
gpu-lab README (H200) and vLLM 0.25.0 logs measured on an H200 (OverheadModel's docstring).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from provisioner.vllm.memory import (
    GiB,
    MiB,
    TABLE_COLUMNS,
    InstanceDemand,
    ModelShapeError,
    builtin_model_ids,
    cuda_total_bytes,
    default_batch_settings,
    kv_bytes_per_token,
    load_model_shape,
    logged_kv_tokens,
    parameter_count,
    plan_gpu,
    weight_bytes,
)

REPO = Path(__file__).resolve().parents[2]

# Constants of the overhead model, restated (see OverheadModel): a changed constant must change
# these tests on purpose.
LOAD_EXTRA_DECODER = 100 * 2**20
NON_TORCH = int(0.22 * 2**30)  # 236,223,201
CONTEXT = int(0.51 * 2**30)  # 547,608,330
DRIVER_GAP = 644_939_776  # NVML total − CUDA total on the H200: 143,771 MiB − 150,109,880,320 B (615 MiB)

# Qwen2.5-7B-Instruct: hidden 3584, 28 layers, 28 heads, 4 KV heads, head_dim 128, MLP 18944,
# vocab 152064, untied lm_head, bf16; q/k/v biases.
QWEN25_PARAMS = (
    28 * (3584 * 3584 + 2 * 3584 * 512 + 3584 * 3584 + 3 * 3584 * 18944)  # q, k+v, o, gate/up/down: 6,525,288,448
    + 28 * (3584 + 2 * 512 + 2 * 3584)  # q/k/v biases + 2 RMSNorms: 329,728
    + 3584  # final norm
    + 2 * 152064 * 3584  # embed_tokens + lm_head: 1,089,994,752
)  # = 7,615,616,512
QWEN25_WEIGHTS = 2 * QWEN25_PARAMS + LOAD_EXTRA_DECODER  # bf16 + load extra = 15,336,090,624
QWEN25_BLOCK = 16 * 28 * 4 * 128 * 2 * 2  # block_size × layers × kv_heads × head_dim × K,V × bf16 = 917,504


def qwen25_activation(tokens: int) -> int:
    """vocab × hidden × 2 B + T × 2.2 × hidden × 2 B."""
    return math.ceil(152064 * 3584 * 2 + tokens * 2.2 * 3584 * 2)


# --------------------------------------------------------------------------- shapes and arithmetic


def test_qwen25_7b_has_7_62_billion_parameters_and_15_2_gb_of_bf16_weights():
    shape = load_model_shape("Qwen/Qwen2.5-7B-Instruct")
    assert QWEN25_PARAMS == 7_615_616_512
    assert parameter_count(shape).total == QWEN25_PARAMS
    assert abs(QWEN25_PARAMS / 7.62e9 - 1) < 0.005  # the gpu-lab README's 7.62 B
    weights = weight_bytes(shape)  # dtype auto = the config's bfloat16
    assert weights == 2 * QWEN25_PARAMS == 15_231_233_024
    assert round(weights / 1e9, 2) == 15.23  # README: 15.23 GB; seeds.md: 15.2 GB
    # vLLM logs "Model loading took 14.29 GiB": parameters (14.185 GiB) + the load extra.
    assert abs((weights + LOAD_EXTRA_DECODER) / GiB - 14.29) < 0.01


@pytest.mark.parametrize(
    ("model", "published"),
    [
        ("meta-llama/Llama-3.1-8B-Instruct", 8_030_261_248),  # 32 × 218,112,000 + 2 × 128256 × 4096 + 4096
        ("mistralai/Mistral-7B-Instruct-v0.3", 7_248_023_552),  # same layers, vocab 32768
        ("facebook/opt-125m", 125_239_296),
        ("BAAI/bge-m3", 567_754_752),  # XLMRobertaModel with its pooler: "568M"
        ("Qwen/Qwen2-7B-Instruct", 7_615_616_512),  # same shape as Qwen2.5-7B
    ],
)
def test_parameter_counts_match_the_published_ones(model, published):
    assert parameter_count(load_model_shape(model)).total == published


def test_fp8_weights_take_one_byte_per_linear_parameter():
    fp8 = load_model_shape("Qwen/Qwen3-1.7B-FP8")
    bf16 = load_model_shape("Qwen/Qwen3-1.7B")
    linear = 28 * (2048 * 2048 + 2 * 2048 * 1024 + 2048 * 2048 + 3 * 2048 * 6144)  # 1,409,286,144
    rest = 151936 * 2048 + 28 * (2 * 2048 + 2 * 128) + 2048  # tied embedding + norms + q/k norms: 311,288,832
    # one float32 scale per 128×128 tile: q 16×16, k and v 8×16, o 16×16, gate and up 48×16, down 16×48
    scales = 4 * 28 * (256 + 2 * 128 + 256 + 2 * 768 + 768)  # 344,064
    assert weight_bytes(bf16) == 2 * (linear + rest)  # 3,441,150,... : 3.21 GiB
    assert weight_bytes(fp8) == linear + 2 * rest + scales  # 2,032,207,872
    # vLLM logged 1.90 GiB for the FP8 model (H200): parameters + ~8 MiB
    assert abs(weight_bytes(fp8) / GiB - 1.90) < 0.01


def test_kv_bytes_per_token():
    qwen25 = load_model_shape("Qwen/Qwen2.5-7B-Instruct")
    assert kv_bytes_per_token(qwen25) == 28 * 4 * 128 * 2 * 2 == 57_344
    assert kv_bytes_per_token(qwen25, kv_cache_dtype="fp8") == 28 * 4 * 128 * 2 * 1
    assert kv_bytes_per_token(qwen25, tensor_parallel_size=2) == 28 * 2 * 128 * 2 * 2
    assert kv_bytes_per_token(qwen25, tensor_parallel_size=8) == 28 * 1 * 128 * 2 * 2  # KV heads replicated
    assert kv_bytes_per_token(load_model_shape("Qwen/Qwen3-1.7B-FP8")) == 28 * 8 * 128 * 2 * 2 == 114_688
    assert kv_bytes_per_token(load_model_shape("BAAI/bge-m3")) == 0  # encoder-only: no KV cache


def test_logged_token_count_rounds_to_whole_blocks_per_sequence():
    assert logged_kv_tokens(100, 4096) == 1600  # 4096 is 256 whole blocks: 100 × 16
    assert logged_kv_tokens(100, 1000) == int(100 / 63 * 1000) == 1587  # cdiv(1000, 16) = 63 blocks per sequence
    assert logged_kv_tokens(0, 4096) == 0


def test_batch_defaults_follow_vllm_025():
    assert default_batch_settings(24 * GiB, 4096) == (2048, 256)
    assert default_batch_settings(140 * GiB, 32768) == (8192, 1024)
    assert default_batch_settings(80 * GiB, 32768, gpu_name="NVIDIA A100-SXM4-80GB") == (2048, 256)
    # encoder-only pooling models have no chunked prefill: max(max_model_len, 2048)
    assert default_batch_settings(12 * GiB, 8192, chunked_prefill=False) == (8192, 256)
    assert default_batch_settings(12 * GiB, 512, chunked_prefill=False) == (2048, 256)
    # min(max_num_seqs × max_model_len, …) and max_num_seqs ≤ max_num_batched_tokens
    assert default_batch_settings(12 * GiB, 4, max_num_seqs=8) == (32, 8)
    assert default_batch_settings(12 * GiB, 4096, max_num_batched_tokens=128) == (128, 128)


# --------------------------------------------------------------------------- the H200 reference


def test_h200_reference_prediction_matches_the_gpu_lab_readme():
    """H200, Qwen2.5-7B shape, defaults (share 0.92, 8192 batched tokens, 1024 sequences, len 32768).

    Prediction: 112.98 GiB of KV cache, 2,115,456 tokens. README: "KV cache 113 GiB (2.1 M tokens)",
    rounded to whole GiB and 0.1 M tokens, so the tolerance is half of that rounding. The vLLM log
    behind it (measured for OverheadModel) says 112.98 GiB and 2,115,440 tokens: within one block.
    """
    total = cuda_total_bytes(143_771 * MiB)  # nvidia-smi's 143771 MiB − 615 MiB = CUDA's 139.80 GiB
    assert total == 143_771 * MiB - DRIVER_GAP == 150_109_880_320  # torch.cuda.mem_get_info() on that H200
    requested = math.ceil(total * 0.92)  # 138,101,089,895 = 128.62 GiB ("worker requested memory")
    kv = requested - QWEN25_WEIGHTS - qwen25_activation(8192) - NON_TORCH  # 121,309,596,754
    blocks = kv // QWEN25_BLOCK  # 132,216
    tokens = blocks * 16  # 32768 is a multiple of 16

    plan = plan_gpu(total, [InstanceDemand("qwen", load_model_shape("Qwen/Qwen2.5-7B-Instruct"), 0.92)], 0.95)
    item = plan.instances[0]
    assert (item.max_num_batched_tokens, item.max_num_seqs) == (8192, 1024)
    assert item.budget == requested
    assert item.kv_bytes == kv
    assert item.kv_tokens == tokens == 2_115_456
    assert abs(kv / GiB - 113) <= 0.5  # README, rounded to GiB
    assert abs(tokens - 2_100_000) <= 50_000  # README, rounded to 0.1 M
    assert abs(tokens - 2_115_440) <= 16  # vLLM's log line: one 16-token block apart
    assert item.sequences == tokens // 32768 == 64
    assert plan.problems == []


# --------------------------------------------------------------------------- seed 1: RTX 3090


def seed1(share: float) -> tuple:
    """Seed 1 as inventory/examples/seed1-3090.yml has it: Qwen2.5-7B bf16, len 4096, 128 sequences."""
    example = yaml.safe_load((REPO / "inventory/examples/seed1-3090.yml").read_text())
    (instance,) = example["instances"]
    options = instance["options"]
    assert (instance["model"], instance["gpu_memory_utilization"]) == ("Qwen/Qwen2.5-7B-Instruct", 0.95)
    # An RTX 3090 has 24 GiB (24576 MiB in nvidia-smi); CUDA sees less. The driver's share is taken
    # as the H200's 615 MiB (a 3090 probably keeps ~300 MiB: not measured), so this is a low total.
    total = cuda_total_bytes(24_576 * MiB)
    assert total == 24_576 * MiB - DRIVER_GAP == 25_124_864_000  # 23.40 GiB
    demand = InstanceDemand(
        instance["name"],
        load_model_shape(instance["model"]),
        share,
        dtype=options["dtype"],
        max_model_len=options["max-model-len"],
        max_num_seqs=options["max-num-seqs"],
        block_size=options["block-size"],
    )
    return total, plan_gpu(total, [demand], 0.95)


def test_seed1_3090_qwen25_7b_at_0_95():
    total, plan = seed1(0.95)
    requested = math.ceil(total * 0.95)  # 23,868,620,800 = 22.23 GiB
    kv = requested - QWEN25_WEIGHTS - qwen25_activation(2048) - NON_TORCH  # 2048 batched tokens on a 24 GiB card
    assert round(kv / GiB, 2) == 6.68  # 7,174,016,082 B
    blocks = kv // QWEN25_BLOCK  # 7819
    item = plan.instances[0]
    assert item.max_num_batched_tokens == 2048
    assert item.kv_tokens == blocks * 16 == 125_104
    assert item.sequences == 125_104 // 4096 == 30
    # outside the budget: CUDA context + graphs (0.2 GiB + 128 × (3584 + 18944) × 64 B) + 128 × 152064 × 4 B
    outside = CONTEXT + int(0.2 * 2**30) + 128 * (3584 + 18944) * 64 + 128 * 152064 * 4
    assert item.footprint == requested + outside  # 23.18 GiB of 23.40
    assert plan.problems == []
    assert plan.table_rows() == [("qwen7b", "0.95", "22.23", "14.28", "1.27", "6.68", "125,104", "30 × 4,096")]
    assert len(TABLE_COLUMNS) == len(plan.table_rows()[0])


def test_seed1_at_0_99_does_not_start_and_would_not_fit():
    """The article's 0.99 was OOM-killed; with vLLM 0.25 it fails the startup free-memory check."""
    total, plan = seed1(0.99)
    requested = math.ceil(total * 0.99)  # 23.16 GiB
    free = total - CONTEXT  # 22.89 GiB: the process's own CUDA context is already there
    assert free < requested
    messages = "\n".join(plan.problems)
    assert "add up to 0.99 (limit 0.95)" in messages
    assert f"about {free / GiB:.2f} GiB free when it starts" in messages
    assert "qwen7b: would fail vLLM's startup check" in messages
    assert "too much" in messages  # budget + outside > total


def test_a_model_that_does_not_fit_names_the_smallest_share():
    total, _ = seed1(0.95)
    shape = load_model_shape("Qwen/Qwen2.5-7B-Instruct")
    plan = plan_gpu(total, [InstanceDemand("qwen7b", shape, 0.5, max_model_len=4096, max_num_seqs=128)], 0.95)
    # needs = weights + activation(2048) + non-torch = 16,694,604,718; one 4096-token sequence = 256 blocks
    needs = QWEN25_WEIGHTS + qwen25_activation(2048) + NON_TORCH
    smallest = (needs + 256 * QWEN25_BLOCK) / total  # 0.6738…
    assert math.ceil(smallest * 100) / 100 == 0.68
    (problem,) = plan.problems
    assert problem.startswith("qwen7b: weights 14.28 GiB + overhead 1.27 GiB do not fit in 0.50 × 23.40 GiB = 11.70 GiB")
    assert "raise gpu_memory_utilization to at least 0.68" in problem
    assert "smaller or quantized model" in problem
    assert plan.instances[0].kv_tokens == 0 and plan.instances[0].kv_bytes < 0


def test_a_model_beyond_the_limit_says_so():
    total, _ = seed1(0.95)
    shape = load_model_shape("Qwen/Qwen3-8B")  # 16.38 GB of bf16 weights on a 23.40 GiB card
    plan = plan_gpu(total, [InstanceDemand("big", shape, 0.95, max_model_len=40960)], 0.95)
    (problem,) = plan.problems
    assert "less than one 40,960-token sequence" in problem
    assert "more than this GPU's limit 0.95" in problem


# --------------------------------------------------------------------------- seed 2: RTX 4070


def seed2_demands() -> list[InstanceDemand]:
    """The three instances of inventory/examples/seed2-4070.yml, in their start order."""
    example = yaml.safe_load((REPO / "inventory/examples/seed2-4070.yml").read_text())
    demands = []
    for instance in example["instances"]:
        options = instance.get("options", {})
        demands.append(
            InstanceDemand(
                instance["name"],
                load_model_shape(instance["model"]),
                instance["gpu_memory_utilization"],
                dtype=options.get("dtype", "auto"),
                max_model_len=options.get("max-model-len"),
                max_num_batched_tokens=options.get("max-num-batched-tokens"),
            )
        )
    # the hand arithmetic below is for these shares
    assert [(d.name, d.gpu_memory_utilization) for d in demands] == [("reranker", 0.20), ("embed", 0.25), ("chat", 0.50)]
    return demands


# Qwen3-1.7B-FP8 chat instance: weights and activation at 4096 batched tokens
CHAT_WEIGHTS = (
    28 * (2048 * 2048 + 2 * 2048 * 1024 + 2048 * 2048 + 3 * 2048 * 6144)  # FP8 linear, 1 B each
    + 2 * (151936 * 2048 + 28 * (2 * 2048 + 2 * 128) + 2048)  # bf16 tied embedding and norms
    + 4 * 28 * 3072  # block scales
    + LOAD_EXTRA_DECODER
)  # 2,137,065,472
CHAT_ACTIVATION = math.ceil(151936 * 2048 * 2 + 4096 * 2.2 * 2048 * 2 + 4096 * 6144)  # 684,405,556
CHAT_BLOCK = 16 * 28 * 8 * 128 * 2 * 2  # 1,835,008


def test_seed2_4070_three_instances_at_the_example_shares():
    """RTX 4070: 12 GB of GDDR6X (seeds.md says 8 GB: no RTX 4070 has 8 GB; 8 GB is the 4060 Ti's)."""
    total = cuda_total_bytes(12 * GiB)  # 12288 − 615 = 11673 MiB = 11.40 GiB
    plan = plan_gpu(total, seed2_demands(), 0.95)
    reranker, embed, chat = plan.instances

    requested = math.ceil(total * 0.50)  # 6,119,981,056 = 5.70 GiB
    kv = requested - CHAT_WEIGHTS - CHAT_ACTIVATION - NON_TORCH  # 3,062,286,827 = 2.85 GiB
    blocks = kv // CHAT_BLOCK  # 1668
    assert (chat.max_num_batched_tokens, chat.max_num_seqs) == (4096, 256)
    assert chat.kv_bytes == kv
    assert chat.kv_tokens == blocks * 16 == 26_688
    assert chat.sequences == 3  # 26,688 // 8192

    # encoders: no KV cache; 2048 (reranker: max(512, 2048)) and 8192 (embed) batched tokens
    assert (reranker.kv_cache, embed.kv_cache) == (False, False)
    assert (reranker.max_num_batched_tokens, embed.max_num_batched_tokens) == (2048, 8192)
    assert embed.weights == 2 * 567_754_752 + 16 * MiB  # fp16 + the encoders' load extra
    assert plan.problems == []
    # what the three processes hold: about 11.2 GiB of the 11.40 GiB CUDA sees — no headroom
    assert 0 < plan.spare < 0.5 * GiB
    rows = plan.table_rows()
    assert [row[0] for row in rows] == ["reranker", "embed", "chat"]
    assert rows[0][5:] == ("—", "no KV cache", "—")
    assert rows[2][6:] == ("26,688", "3 × 8,192")


def test_seed2_on_the_8_gb_card_of_the_article_does_not_work():
    total = cuda_total_bytes(8 * GiB)  # 7577 MiB = 7.40 GiB
    plan = plan_gpu(total, seed2_demands(), 0.95)
    chat = plan.instances[2]
    requested = math.ceil(total * 0.50)  # 3,972,497,408 = 3.70 GiB
    blocks = (requested - CHAT_WEIGHTS - CHAT_ACTIVATION - NON_TORCH) // CHAT_BLOCK  # 498
    assert chat.kv_tokens == int(blocks / (8192 // 16) * 8192) == 7968
    needs = CHAT_WEIGHTS + CHAT_ACTIVATION + NON_TORCH + 512 * CHAT_BLOCK  # one 8192-token sequence
    smallest = math.ceil(needs / total * 100) / 100  # 0.5032 → 0.51
    messages = "\n".join(plan.problems)
    assert (
        f"chat: KV cache 0.85 GiB holds 7,968 tokens, less than one 8,192-token sequence (vLLM refuses to start) — "
        f"lower max-model-len to at most {blocks * 16:,} or raise gpu_memory_utilization to {smallest:.2f}"
    ) in messages
    assert "chat: would fail vLLM's startup check" in messages


def test_shares_above_the_limit():
    demands = seed2_demands()
    demands[2] = InstanceDemand("chat", demands[2].shape, 0.60, max_model_len=8192, max_num_batched_tokens=4096)
    plan = plan_gpu(cuda_total_bytes(12 * GiB), demands, 0.95)
    assert plan.problems[0] == (
        "shares on this GPU (reranker 0.20 + embed 0.25 + chat 0.60) add up to 1.05 (limit 0.95) — "
        "lower gpu_memory_utilization so they add up to at most 0.95"
    )


def test_an_encoder_above_its_share():
    total = cuda_total_bytes(12 * GiB)
    shape = load_model_shape("BAAI/bge-m3")
    plan = plan_gpu(total, [InstanceDemand("embed", shape, 0.05, dtype="half", max_model_len=8192)], 0.95)
    # needs: 1.07 GiB weights + 8192 × (4 × 1024 + 2 × 4096) × 2 B activation + 0.22 GiB = 1.48 GiB > 0.57 GiB
    needs = 2 * 567_754_752 + 16 * MiB + 8192 * (4 * 1024 + 2 * 4096) * 2 + NON_TORCH
    (problem,) = plan.problems
    assert problem.startswith("embed: weights 1.07 GiB + overhead 0.41 GiB need more than its share 0.05")
    assert f"at least {math.ceil(needs / total * 100) / 100:.2f}" in problem  # 0.13


def test_a_later_instance_can_fail_the_startup_check_although_shares_are_below_the_limit():
    """Two Qwen3-1.7B at 0.47 each on the 3090: 0.94 ≤ 0.95, but the first holds its budget plus
    its CUDA context, graphs and sampler cache, so the second finds less free than it requests."""
    total = cuda_total_bytes(24_576 * MiB)
    shape = load_model_shape("Qwen/Qwen3-1.7B")
    first_budget = math.ceil(total * 0.47)  # 11,808,686,080 = 11.00 GiB
    # outside: context + graphs (0.2 GiB + 256 × (2048 + 6144) × 64 B) + sampler (256 × 151936 × 4 B)
    first_outside = CONTEXT + int(0.2 * 2**30) + 256 * 8192 * 64 + 256 * 151936 * 4  # 1,052,156,886
    free = total - (first_budget + first_outside) - CONTEXT  # 11,716,412,704 = 10.91 GiB
    assert free < first_budget
    demands = [InstanceDemand(name, shape, 0.47, max_model_len=8192) for name in ("one", "two")]
    plan = plan_gpu(total, demands, 0.95)
    startup, whole = plan.problems
    assert startup.startswith(f"two: would fail vLLM's startup check — about {free / GiB:.2f} GiB free when it starts after one")
    assert "lower its gpu_memory_utilization to at most 0.46" in startup  # floor(10.91 / 23.40 × 100) / 100
    held = 2 * (first_budget + first_outside)  # 23.95 GiB
    assert whole.startswith(f"the instances need about {held / GiB:.2f} GiB of this GPU's 23.40 GiB")
    ok = plan_gpu(total, [InstanceDemand(n, shape, 0.45, max_model_len=8192) for n in ("one", "two")], 0.95)
    assert ok.problems == []


# --------------------------------------------------------------------------- loading shapes


def test_a_local_config_json_path(tmp_path):
    # the gpu-lab's Qwen2.5-7B-shaped config (make_model.py), as a folder and as a file
    config = {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
        "intermediate_size": 18944, "max_position_embeddings": 32768, "num_attention_heads": 28,
        "num_hidden_layers": 28, "num_key_value_heads": 4, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "vocab_size": 152064,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    for given in (tmp_path, tmp_path / "config.json"):
        shape = load_model_shape(str(given))
        assert parameter_count(shape).total == QWEN25_PARAMS
        assert (shape.head_dim, shape.num_key_value_heads, shape.max_position_embeddings) == (128, 4, 32768)
        assert kv_bytes_per_token(shape) == 57_344
    # num_key_value_heads and head_dim default to num_attention_heads and hidden / heads
    del config["num_key_value_heads"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert kv_bytes_per_token(load_model_shape(str(tmp_path))) == 28 * 28 * 128 * 2 * 2
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelShapeError, match="holds no config.json"):
        load_model_shape(str(empty))


def test_an_unknown_model_id_names_the_model_and_the_fix():
    with pytest.raises(ModelShapeError) as caught:
        load_model_shape("someorg/unknown-model-7B")
    message = str(caught.value)
    assert message.startswith("someorg/unknown-model-7B: no built-in shape for this model")
    assert "give a local path holding its config.json, or one of: " in message
    assert "Qwen/Qwen2.5-7B-Instruct" in message and "BAAI/bge-m3" in message


def test_a_revision_other_than_main_needs_a_local_config():
    with pytest.raises(ModelShapeError, match="for revision v2 give a local path"):
        load_model_shape("Qwen/Qwen2.5-7B-Instruct", revision="v2")


def test_the_built_in_shapes():
    expected = {
        "Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2-7B-Instruct", "Qwen/Qwen3-1.7B", "Qwen/Qwen3-1.7B-FP8",
        "Qwen/Qwen3-8B", "meta-llama/Llama-3.1-8B-Instruct", "mistralai/Mistral-7B-Instruct-v0.3",
        "BAAI/bge-m3", "BAAI/bge-reranker-base", "facebook/opt-125m",
    }
    assert expected <= set(builtin_model_ids())
    for model in expected:
        shape = load_model_shape(model)
        assert shape.source == f"https://huggingface.co/{model}/blob/main/config.json"
    assert load_model_shape("Qwen/Qwen3-1.7B-FP8").quantization == "fp8"
    assert load_model_shape("BAAI/bge-reranker-base").encoder_only
    assert not load_model_shape("facebook/opt-125m").encoder_only


def test_performance_mode_throughput_doubles_the_batch_defaults_not_the_values_given():
    """engine/arg_utils.py:2623 of vLLM 0.25.0: only defaults are doubled."""
    h200 = 143771 * 2**20
    assert default_batch_settings(h200, 32768) == (8192, 1024)
    assert default_batch_settings(h200, 32768, performance_mode="throughput") == (16384, 2048)
    assert default_batch_settings(h200, 32768, max_num_batched_tokens=4096, performance_mode="throughput") == (4096, 2048)
