"""The decoder forward pass: every non-GEMM op is an mllm-kernel op, the GEMMs are torch's.

One step runs a `StepBatch`: a ragged set of new tokens (several requests' prompt chunks for a
prefill step, one token per request for a decode step) whose K/V go into the paged cache before
attention reads it. Only the rows in `logit_rows` reach the LM head.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F

import mllm_kernel as mk

from .config import ModelConfig
from .weights import Weights


@dataclasses.dataclass
class StepBatch:
    ids: torch.Tensor  # int64 [tokens]
    positions: torch.Tensor  # int64 [tokens]
    slots: torch.Tensor  # int64 [tokens]: block * block_size + offset in the paged cache; -1 skips
    block_table: torch.Tensor  # int32 [requests, max_blocks_per_seq]
    seq_lens: torch.Tensor  # int32 [requests]: cached tokens after this step
    logit_rows: torch.Tensor  # int64 [requests]: the token row whose logits are sampled
    cu_seqlens_q: torch.Tensor | None = None  # int32 [requests + 1]; None: a decode step (one token each)


def rope_cos_sin(c: ModelConfig, max_positions: int, device) -> torch.Tensor:
    """float32 [max_positions, head_dim] = cos | sin of position * inv_freq, computed in float32
    as transformers does (so that float32 runs agree bit for bit on the angles)."""
    inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.int64).float() / c.head_dim))
    if c.rope_type == "linear":
        inv_freq = inv_freq / c.rope_factor
    elif c.rope_type == "llama3":
        inv_freq = _llama3_inv_freq(c, inv_freq)
    angles = torch.arange(max_positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=1).to(device)


def _llama3_inv_freq(c: ModelConfig, inv_freq: torch.Tensor) -> torch.Tensor:
    """Llama 3.1's frequency scaling: long wavelengths divided by `factor`, short ones kept, the
    band between interpolated smoothly (Meta's published rule)."""
    low_wavelen = c.rope_original_max_position / c.rope_low_freq_factor
    high_wavelen = c.rope_original_max_position / c.rope_high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / c.rope_factor, inv_freq)
    smooth = (c.rope_original_max_position / wavelen - c.rope_low_freq_factor) / (
        c.rope_high_freq_factor - c.rope_low_freq_factor)
    smoothed = (1 - smooth) * scaled / c.rope_factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


class Attention:
    """The two attention calls of a step, as mllm-kernel implements them. A benchmark swaps in
    another implementation by replacing this object (Model.attention)."""

    def __init__(self, device: torch.device, dtype: torch.dtype):
        # The CPU kernels take a thread count; use torch's, as the GEMMs do.
        self.num_threads = torch.get_num_threads() if device.type == "cpu" else 1
        # CUDA's prefill kernels are half precision: a float32 model prefills with decode_attention,
        # one row per prompt token over its request's first position + 1 keys (the causal rule).
        self.prefill_as_decode = device.type == "cuda" and dtype == torch.float32
        self._decode_rows = None  # (batch, block-table rows, lengths): built once per step, not per layer

    def prefill(self, q, k_cache, v_cache, batch: StepBatch):
        if self.prefill_as_decode:
            if self._decode_rows is None or self._decode_rows[0] is not batch:
                counts = (batch.cu_seqlens_q[1:] - batch.cu_seqlens_q[:-1]).long()
                request = torch.repeat_interleave(torch.arange(counts.numel(), device=q.device), counts,
                                                  output_size=q.shape[0])  # output_size: no host sync
                self._decode_rows = (batch, batch.block_table.index_select(0, request),
                                     (batch.positions + 1).to(torch.int32))
            _, block_rows, lengths = self._decode_rows
            return mk.decode_attention(q, k_cache, v_cache, block_rows, lengths)
        return mk.paged_prefill_attention(q, k_cache, v_cache, batch.block_table, batch.cu_seqlens_q, batch.seq_lens,
                                          num_threads=self.num_threads)

    def decode(self, q, k_cache, v_cache, batch: StepBatch):
        return mk.decode_attention(q, k_cache, v_cache, batch.block_table, batch.seq_lens,
                                   num_threads=self.num_threads)


class Model:
    def __init__(self, config: ModelConfig, weights: Weights, *, num_blocks: int, block_size: int,
                 max_seq_len: int, device: torch.device, dtype: torch.dtype):
        self.config, self.weights, self.device, self.dtype = config, weights, device, dtype
        self.block_size = block_size
        shape = (num_blocks, block_size, config.num_kv_heads, config.head_dim)
        self.k_caches = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_layers)]
        self.v_caches = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_layers)]
        self.cos_sin = rope_cos_sin(config, max_seq_len, device)
        self.attention = Attention(device, dtype)

    @torch.inference_mode()
    def forward(self, batch: StepBatch) -> torch.Tensor:
        """float32 logits [requests, vocab] of the batch's logit rows (computed in the model's dtype
        as transformers does, then widened)."""
        c, w = self.config, self.weights
        tokens = batch.ids.shape[0]
        h = mk.embedding(batch.ids, w.embed, check=False)  # ids were checked on the host
        residual = None
        for layer, lw in enumerate(w.layers):
            if residual is None:
                residual, x = h, mk.rms_norm(h, lw.input_norm, c.rms_norm_eps)
            else:
                mk.fused_add_rms_norm(h, residual, lw.input_norm, c.rms_norm_eps)
                x = h
            qkv = F.linear(x, lw.qkv, lw.qkv_bias)
            q = qkv[:, :c.q_size].view(tokens, c.num_heads, c.head_dim)
            k = qkv[:, c.q_size:c.q_size + c.kv_size].view(tokens, c.num_kv_heads, c.head_dim)
            v = qkv[:, c.q_size + c.kv_size:].view(tokens, c.num_kv_heads, c.head_dim)
            mk.apply_rope(q, k, batch.positions, self.cos_sin)
            k_cache, v_cache = self.k_caches[layer], self.v_caches[layer]
            mk.store_kv_cache(k, v, k_cache, v_cache, batch.slots)
            if batch.cu_seqlens_q is None:
                attn = self.attention.decode(q, k_cache, v_cache, batch)
            else:
                attn = self.attention.prefill(q, k_cache, v_cache, batch)
            h = F.linear(attn.view(tokens, c.q_size), lw.o)
            mk.fused_add_rms_norm(h, residual, lw.post_norm, c.rms_norm_eps)
            h = F.linear(mk.silu_and_mul(F.linear(h, lw.gate_up, lw.gate_up_bias)), lw.down, lw.down_bias)
        last = h.index_select(0, batch.logit_rows)
        residual = residual.index_select(0, batch.logit_rows)
        mk.fused_add_rms_norm(last, residual, w.final_norm, c.rms_norm_eps)
        return F.linear(last, w.lm_head).float()
