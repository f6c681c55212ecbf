"""A model's shape: the config.json fields the memory arithmetic needs, and its parameter count.

`load_model_shape` reads a local folder or config.json, or a built-in Hugging Face id (one committed
config per model under provisioner/vllm/model_shapes/); `parameter_count` counts the parameters by
how vLLM stores them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

SHAPES_DIR = Path(__file__).resolve().parents[1] / "model_shapes"


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
    builtin = SHAPES_DIR / (model.replace("/", "--", 1) + ".json")
    if "/" not in model or not builtin.is_file():
        raise ModelShapeError(
            f"{model}: no built-in shape for this model — give a local path holding its config.json, "
            f"or one of: {', '.join(builtin_model_ids())}"
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


# --------------------------------------------------------------------------- parameter count


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
