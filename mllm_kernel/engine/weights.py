"""Weights: Hugging Face tensor names in and out (safetensors folders, seeded random models), fused
for the engine: q/k/v in one projection, gate/up in one (silu_and_mul reads [gate | up])."""

from __future__ import annotations

import dataclasses
import json
import os

import torch

from .config import ModelConfig


@dataclasses.dataclass
class LayerWeights:
    input_norm: torch.Tensor  # [hidden]
    qkv: torch.Tensor  # [q_size + 2 kv_size, hidden]
    qkv_bias: torch.Tensor | None
    o: torch.Tensor  # [hidden, q_size]
    post_norm: torch.Tensor  # [hidden]
    gate_up: torch.Tensor  # [2 intermediate, hidden]
    gate_up_bias: torch.Tensor | None
    down: torch.Tensor  # [hidden, intermediate]
    down_bias: torch.Tensor | None


@dataclasses.dataclass
class Weights:
    embed: torch.Tensor  # [vocab, hidden]
    layers: list[LayerWeights]
    final_norm: torch.Tensor
    lm_head: torch.Tensor  # [vocab, hidden]; embed itself when tied


def hf_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a Hugging Face checkpoint of this model holds, with its shape."""
    h, i = c.hidden_size, c.intermediate_size
    shapes = {"model.embed_tokens.weight": (c.vocab_size, h), "model.norm.weight": (h,)}
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, h)
    for n in range(c.num_layers):
        p = f"model.layers.{n}."
        shapes.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                       p + "self_attn.q_proj.weight": (c.q_size, h), p + "self_attn.k_proj.weight": (c.kv_size, h),
                       p + "self_attn.v_proj.weight": (c.kv_size, h), p + "self_attn.o_proj.weight": (h, c.q_size),
                       p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h),
                       p + "mlp.down_proj.weight": (h, i)})
        if c.qkv_bias:
            shapes.update({p + "self_attn.q_proj.bias": (c.q_size,), p + "self_attn.k_proj.bias": (c.kv_size,),
                           p + "self_attn.v_proj.bias": (c.kv_size,)})
        if c.mlp_bias:
            shapes.update({p + "mlp.gate_proj.bias": (i,), p + "mlp.up_proj.bias": (i,), p + "mlp.down_proj.bias": (h,)})
    return shapes


def random_state_dict(c: ModelConfig, seed: int, device="cpu") -> dict[str, torch.Tensor]:
    """Seeded float32 weights under Hugging Face names: matrices and biases ~ N(0, initializer_range),
    norm scales ~ 1 + N(0, 0.1) (not all ones, so that a norm weight applied wrong shows). Drawn by
    `device`'s generator (a GPU draws billions in milliseconds); the values depend on its type."""
    g = torch.Generator(device).manual_seed(seed)
    out = {}
    for name, shape in hf_shapes(c).items():
        t = torch.randn(shape, generator=g, dtype=torch.float32, device=device)
        out[name] = 1.0 + 0.1 * t if name.endswith("norm.weight") else c.initializer_range * t
    return out


def load_safetensors(path: str) -> dict[str, torch.Tensor]:
    """Every tensor of the *.safetensors files in folder `path` (sharded or not)."""
    from safetensors.torch import load_file  # only a loading engine needs it

    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        raise FileNotFoundError(f"Engine.from_pretrained: no *.safetensors file in {path!r}")
    tensors = {}
    for f in files:
        tensors.update(load_file(os.path.join(path, f)))
    return tensors


def save_pretrained(path: str, c: ModelConfig, state: dict[str, torch.Tensor]) -> None:
    """config.json + model.safetensors, readable by transformers and Engine.from_pretrained."""
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(c.to_hf(), f, indent=2)
    save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, os.path.join(path, "model.safetensors"))


def fuse(c: ModelConfig, state: dict[str, torch.Tensor], device: torch.device, dtype: torch.dtype) -> Weights:
    """The engine's weights from a Hugging Face state dict, checked name by name and shape by shape."""
    shapes = hf_shapes(c)
    missing = [k for k in shapes if k not in state]
    if missing:
        raise ValueError(f"engine weights: {len(missing)} tensors missing, e.g. {missing[:3]}")
    for k, shape in shapes.items():
        if tuple(state[k].shape) != shape:
            raise ValueError(f"engine weights: {k} has shape {tuple(state[k].shape)}, expected {shape}")
    unknown = [k for k in state if k not in shapes and not k.endswith("rotary_emb.inv_freq")
               and not (c.tie_word_embeddings and k == "lm_head.weight")]
    if unknown:
        raise ValueError(f"engine weights: {len(unknown)} tensors this architecture does not use, e.g. {unknown[:3]}")

    def get(name):
        return state[name].to(device=device, dtype=dtype)

    def cat(*names):
        return torch.cat([get(n) for n in names]).contiguous()

    layers = []
    for n in range(c.num_layers):
        p = f"model.layers.{n}."
        a, m = p + "self_attn.", p + "mlp."
        layers.append(LayerWeights(
            input_norm=get(p + "input_layernorm.weight"),
            qkv=cat(a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"),
            qkv_bias=cat(a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias") if c.qkv_bias else None,
            o=get(a + "o_proj.weight"),
            post_norm=get(p + "post_attention_layernorm.weight"),
            gate_up=cat(m + "gate_proj.weight", m + "up_proj.weight"),
            gate_up_bias=cat(m + "gate_proj.bias", m + "up_proj.bias") if c.mlp_bias else None,
            down=get(m + "down_proj.weight"),
            down_bias=get(m + "down_proj.bias") if c.mlp_bias else None,
        ))
    embed = get("model.embed_tokens.weight")
    lm_head = embed if c.tie_word_embeddings else get("lm_head.weight")
    return Weights(embed=embed, layers=layers, final_norm=get("model.norm.weight"), lm_head=lm_head)


def unfuse(c: ModelConfig, w: Weights) -> dict[str, torch.Tensor]:
    """The Hugging Face state dict of the engine's weights (views, no copies)."""
    q, kv, i = c.q_size, c.kv_size, c.intermediate_size
    state = {"model.embed_tokens.weight": w.embed, "model.norm.weight": w.final_norm}
    if not c.tie_word_embeddings:
        state["lm_head.weight"] = w.lm_head
    for n, lw in enumerate(w.layers):
        p = f"model.layers.{n}."
        a, m = p + "self_attn.", p + "mlp."
        state.update({p + "input_layernorm.weight": lw.input_norm, p + "post_attention_layernorm.weight": lw.post_norm,
                      a + "q_proj.weight": lw.qkv[:q], a + "k_proj.weight": lw.qkv[q:q + kv],
                      a + "v_proj.weight": lw.qkv[q + kv:], a + "o_proj.weight": lw.o,
                      m + "gate_proj.weight": lw.gate_up[:i], m + "up_proj.weight": lw.gate_up[i:],
                      m + "down_proj.weight": lw.down})
        if lw.qkv_bias is not None:
            state.update({a + "q_proj.bias": lw.qkv_bias[:q], a + "k_proj.bias": lw.qkv_bias[q:q + kv],
                          a + "v_proj.bias": lw.qkv_bias[q + kv:]})
        if lw.down_bias is not None:
            state.update({m + "gate_proj.bias": lw.gate_up_bias[:i], m + "up_proj.bias": lw.gate_up_bias[i:],
                          m + "down_proj.bias": lw.down_bias})
    return state
