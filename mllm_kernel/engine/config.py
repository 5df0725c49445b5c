"""ModelConfig: the Llama / Qwen2 decoder hyper-parameters the engine runs, read from a Hugging Face
config (config.json's dict, or a transformers config object), with every field the engine does
not implement rejected by name rather than silently ignored."""

from __future__ import annotations

import dataclasses
import math

# model_type -> (architecture name, q/k/v projections carry a bias). Qwen2 always has the biases;
# Llama has them when attention_bias is set.
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
HEAD_DIMS = (64, 128, 256)  # what decode_attention / paged_prefill_attention implement
ROPE_TYPES = ("default", "llama3", "linear")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_type: str = "default"
    rope_factor: float = 1.0  # llama3 / linear
    rope_low_freq_factor: float = 1.0  # llama3
    rope_high_freq_factor: float = 4.0  # llama3
    rope_original_max_position: int = 8192  # llama3
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    mlp_bias: bool = False
    initializer_range: float = 0.02

    @property
    def architecture(self) -> str:
        return ARCHITECTURES[self.model_type]

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_hf(cls, hf) -> "ModelConfig":
        """From a config.json dict or a transformers PretrainedConfig (anything with to_dict())."""
        d = hf.to_dict() if hasattr(hf, "to_dict") else hf
        if not isinstance(d, dict):
            raise TypeError(f"engine config: expected a config.json dict or a transformers config, "
                            f"got {type(hf).__name__}")
        return _parse(dict(d))

    def to_hf(self) -> dict:
        """A config.json dict that transformers (and from_hf) read back as this model."""
        d = {
            "architectures": [self.architecture], "model_type": self.model_type,
            "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size, "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads, "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim, "hidden_act": "silu", "rms_norm_eps": self.rms_norm_eps,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings, "initializer_range": self.initializer_range,
            "rope_theta": self.rope_theta, "rope_parameters": self._rope_parameters(),
            "bos_token_id": None, "eos_token_id": None, "pad_token_id": None,
        }
        if self.model_type == "llama":
            d.update(attention_bias=self.qkv_bias, mlp_bias=self.mlp_bias)
        else:
            d.update(use_sliding_window=False)
        return d

    def _rope_parameters(self) -> dict:
        p = {"rope_type": self.rope_type, "rope_theta": self.rope_theta}
        if self.rope_type in ("llama3", "linear"):
            p["factor"] = self.rope_factor
        if self.rope_type == "llama3":
            p.update(low_freq_factor=self.rope_low_freq_factor, high_freq_factor=self.rope_high_freq_factor,
                     original_max_position_embeddings=self.rope_original_max_position)
        return p


def _fail(field: str, expected: str, got) -> None:
    raise ValueError(f"engine config: {field} must be {expected}, got {got!r}")


def _int(d: dict, field: str, default=None, *, low: int = 1) -> int:
    value = d.get(field, default)
    if type(value) is not int or value < low:
        _fail(field, f"an int >= {low}", value)
    return value


def _parse(d: dict) -> ModelConfig:
    model_type = d.get("model_type")
    if model_type not in ARCHITECTURES:
        raise ValueError(f"engine config: model_type {model_type!r} is not supported; the engine runs "
                         f"{sorted(ARCHITECTURES)} ({', '.join(ARCHITECTURES.values())})")
    architectures = d.get("architectures") or [ARCHITECTURES[model_type]]
    if list(architectures) != [ARCHITECTURES[model_type]]:
        _fail("architectures", f"[{ARCHITECTURES[model_type]!r}]", architectures)
    if d.get("hidden_act", "silu") != "silu":
        _fail("hidden_act", "'silu' (SwiGLU MLP)", d.get("hidden_act"))
    hidden = _int(d, "hidden_size")
    heads = _int(d, "num_attention_heads")
    kv_heads = _int(d, "num_key_value_heads", heads)
    if heads % kv_heads:
        _fail("num_key_value_heads", f"a divisor of num_attention_heads ({heads})", kv_heads)
    head_dim = d.get("head_dim") or hidden // heads
    if head_dim not in HEAD_DIMS:
        _fail("head_dim", f"one of {HEAD_DIMS} (what the attention kernels implement)", head_dim)
    for field, unsupported in (("pretraining_tp", lambda v: v not in (None, 1)),
                               ("use_sliding_window", bool),
                               ("attention_dropout", bool),
                               ("partial_rotary_factor", lambda v: v not in (None, 1, 1.0))):
        if unsupported(d.get(field)):
            raise ValueError(f"engine config: {field}={d[field]!r} is not supported")
    layer_types = d.get("layer_types")
    if layer_types is not None and any(t != "full_attention" for t in layer_types):
        _fail("layer_types", "all 'full_attention'", layer_types)
    if model_type == "qwen2":
        qkv_bias, mlp_bias = True, False
    else:
        qkv_bias, mlp_bias = bool(d.get("attention_bias", False)), bool(d.get("mlp_bias", False))

    # Rope: transformers 5 writes rope_parameters; older config.json files rope_theta + rope_scaling.
    rope = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
    if "type" in rope and "rope_type" not in rope:
        rope["rope_type"] = rope.pop("type")
    rope_type = rope.get("rope_type", "default")
    if rope_type not in ROPE_TYPES:
        _fail("rope_parameters.rope_type", f"one of {ROPE_TYPES}", rope_type)
    theta = float(rope.get("rope_theta", d.get("rope_theta", 10000.0)))
    if not (theta > 0 and math.isfinite(theta)):
        _fail("rope_theta", "a positive number", theta)
    max_pos = _int(d, "max_position_embeddings", 4096)
    return ModelConfig(
        model_type=model_type, vocab_size=_int(d, "vocab_size"), hidden_size=hidden,
        intermediate_size=_int(d, "intermediate_size"), num_layers=_int(d, "num_hidden_layers"),
        num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
        rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)), rope_theta=theta, rope_type=rope_type,
        rope_factor=float(rope.get("factor", 1.0)),
        rope_low_freq_factor=float(rope.get("low_freq_factor", 1.0)),
        rope_high_freq_factor=float(rope.get("high_freq_factor", 4.0)),
        rope_original_max_position=int(rope.get("original_max_position_embeddings", max_pos)),
        max_position_embeddings=max_pos, tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        qkv_bias=qkv_bias, mlp_bias=mlp_bias, initializer_range=float(d.get("initializer_range", 0.02)),
    )
