"""Decode attention over the paged KV cache, and the merge of partial attention states
(kernels/decode_attention/decode_attention.{cpp,cuh}).

Cache layout: k_cache / v_cache [num_blocks, block_size, num_kv_heads, head_dim], as
store_kv_cache writes them; request i's token t lives in block block_table[i, t // block_size]
at offset t % block_size. Query head h reads KV head h // (num_heads // num_kv_heads).

Bad indices (a block id outside [0, num_blocks) among the blocks a request reads, a seq_len < 0
or > max_blocks_per_seq * block_size):
  * CPU: checked before anything is written; ValueError names the request and the entry.
  * CUDA: never read out of bounds. The kernel treats a bad block's keys as masked and clamps a
    bad seq_len into [0, max_blocks_per_seq * block_size], and records the first offender in a
    per-device flag buffer (no host sync). `check=True` reads that flag right after the kernel
    (it SYNCS the stream) and raises ValueError; `pop_decode_attention_error()` reads it later.
    Inside CUDA-graph capture the read is skipped. Call once before capturing a graph (the first
    call per device allocates the flag buffer).

Split-KV: when batch * kv_heads cannot fill the GPU, each request's keys are cut into
num_splits chunks whose partial results are merged with merge_attention_states' math. The split
count depends on shapes only (batch, heads, head_dim, max_blocks_per_seq * block_size and the
GPU), never on seq_lens' values, so a captured CUDA graph stays valid when seq_lens change.
"""

from __future__ import annotations

import math

import torch

from mllm_kernel.kernels.device_errors import DeviceErrorRecord
from mllm_kernel.kernels.cache_scale import cache_scale_args, no_scale
from mllm_kernel.kernels.op_modules import DeviceModules, as_bool, custom_op, expect_tensor, op_specs

EXPORTS = ("decode_attention", "merge_attention_states")
SPECS = op_specs(__file__, EXPORTS)
_modules = DeviceModules(SPECS)
_errors = DeviceErrorRecord("decode_attention", "")  # formatted by _describe_error

MAX_SPLITS = 128  # decode_attention.hpp kMaxSplits
# Split-KV plan (CUDA): chunks of at least MIN_KEYS_PER_SPLIT keys; query heads one CTA serves
# (decode_attention.cuh kRows; larger groups use several); CTAs resident per SM by head_dim
# (decode_attention.cuh: registers at 64, shared memory at 128 and 256, 100 and 200 KiB of 227).
MIN_KEYS_PER_SPLIT = 128
LONG_SPLIT_KEYS = 1024  # chunks at least this long fill all CTA slots, shorter ones one per SM
HEADS_PER_CTA = 16
CTAS_PER_SM = {64: 2, 128: 2, 256: 1}


def _describe_error(index: int, value: int) -> str:
    # The kernel's encoding (decode_attention.cuh, the error record): -(b + 1) for seq_lens[b],
    # b << 32 | j for block_table[b, j].
    if index < 0:
        return (f"seq_lens[{-index - 1}] = {value} is outside [0, max_blocks_per_seq * block_size]; "
                "the kernel clamped it")
    return (f"block_table[{index >> 32}, {index & 0xFFFFFFFF}] = {value} is not a block id in "
            "[0, num_blocks); the kernel masked that block's keys")


def pop_decode_attention_error(device=None) -> str | None:
    """The first bad block id or seq_len that a CUDA decode_attention recorded on `device` since
    the last read (a message; None if none), clearing the record. Syncs the stream."""
    recorded = _errors.pop(device)
    return None if recorded is None else _describe_error(*recorded)


def _raise_recorded(device: torch.device) -> None:
    if device.type == "cpu" or torch.cuda.is_current_stream_capturing():
        return
    recorded = _errors.pop(device)
    if recorded is not None:
        raise ValueError(f"decode_attention: {_describe_error(*recorded)} "
                         f"(recorded on {device} by this call or an earlier unchecked one)")


_sm_counts: dict[torch.device, int] = {}


def plan_num_splits(batch: int, num_heads: int, num_kv_heads: int, head_dim: int, max_keys: int,
                    device: torch.device) -> int:
    """The split count for these shapes on `device` (1 on the CPU): a power of two that fits one
    wave of CTAs on the GPU, no chunk shorter than MIN_KEYS_PER_SPLIT keys of max_keys (the block
    table's capacity, not the actual seq_lens, so that the plan is CUDA-graph safe)."""
    if device.type != "cuda":
        return 1
    sms = _sm_counts.get(device)
    if sms is None:
        sms = _sm_counts[device] = torch.cuda.get_device_properties(device).multi_processor_count
    group = max(1, num_heads // max(1, num_kv_heads))
    ctas = max(1, batch * num_kv_heads * -(-group // HEADS_PER_CTA))
    limit = max(1, min(MAX_SPLITS, max_keys // MIN_KEYS_PER_SPLIT))

    def fit(slots: int) -> int:  # the largest power of two of splits within `slots` CTAs
        n = max(1, min(limit, slots // ctas))
        return 1 << (n.bit_length() - 1)

    # Measured on an H100 (benchmarks/RESULTS.md): a tail wave or more splits cost more than they
    # gain, and 32 splits beat 33 (whole blocks per chunk). Long chunks fill every CTA slot (more
    # bytes in flight); short ones, whose run time is their chain of dependent loads and the
    # merge, do better with one CTA per SM and half the partial states.
    full = fit(sms * CTAS_PER_SM.get(head_dim, 1))
    return full if max_keys // full >= LONG_SPLIT_KEYS else fit(sms)


_plans: dict[tuple, int] = {}
_no_workspace: dict[torch.device, torch.Tensor] = {}


@custom_op("decode_attention", mutates_args=("out", "lse"))
def _decode_attention(
    out: torch.Tensor,
    lse: torch.Tensor,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    k_scale_value: float,
    v_scale_value: float,
    scale: float,
    sliding_window: int,
    logits_soft_cap: float,
    num_splits: int,
    num_threads: int,
    check: bool,
) -> None:
    device = q.device
    if q.dim() != 3:
        raise ValueError(f"decode_attention: q must be [batch, num_heads, head_dim], got shape {tuple(q.shape)}")
    batch, num_heads, head_dim = q.shape
    if num_splits == 0:  # None: plan it (shapes only)
        try:
            key = (batch, num_heads, k_cache.shape[2], head_dim, block_table.shape[1] * k_cache.shape[1], device)
        except IndexError:  # k_cache or block_table of a bad rank: any plan, the contract names it
            key = (batch, num_heads, 1, head_dim, 0, device)
        num_splits = _plans.get(key)
        if num_splits is None:
            num_splits = _plans[key] = plan_num_splits(*key)
    if num_splits > 1:
        partial_out = torch.empty(batch * num_heads * num_splits * head_dim, dtype=torch.float32, device=device)
        partial_lse = torch.empty(batch * num_heads * num_splits, dtype=torch.float32, device=device)
    else:
        partial_out = partial_lse = _no_workspace.get(device)
        if partial_out is None:
            partial_out = partial_lse = _no_workspace[device] = torch.empty(0, dtype=torch.float32, device=device)
    _modules[device.type].decode_attention(
        out, lse, q, k_cache, v_cache, block_table, seq_lens, partial_out, partial_lse, k_scale, v_scale,
        k_scale_value, v_scale_value, scale, sliding_window, logits_soft_cap, num_splits, num_threads, _errors[device],
    )
    if check:
        _raise_recorded(device)


@_decode_attention.register_fake
def _(out, lse, q, k_cache, v_cache, block_table, seq_lens, k_scale, v_scale, k_scale_value, v_scale_value, scale,
      sliding_window, logits_soft_cap, num_splits, num_threads, check) -> None:
    return None


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    scale: float | None = None,
    sliding_window: int = -1,
    logits_soft_cap: float = 0.0,
    return_lse: bool = False,
    out: torch.Tensor | None = None,
    check: bool = False,
    num_splits: int | None = None,
    num_threads: int = 1,
    k_scale=None,
    v_scale=None,
):
    """Attention of one new query token per request over its paged KV cache.

    q [batch, num_heads, head_dim] (float32, float16 or bfloat16; on CUDA float32 runs a plain
    float32 kernel and needs a float32 cache; any batch stride); k_cache, v_cache [num_blocks, block_size, num_kv_heads, head_dim] of q's dtype, or
    both float8_e4m3fn (as store_kv_cache writes them; half the bytes to read): a stored value c
    stands for c * k_scale (c * v_scale), each a float or a float32 tensor of 1 or num_kv_heads
    elements on q's device (None: 1);
    block_table int32 [batch, max_blocks_per_seq]; seq_lens int32 [batch] (cached tokens, the
    current one included). head_dim 64, 128 or 256; num_heads a multiple of num_kv_heads.

    scale: default head_dim ** -0.5. sliding_window > 0: only the last sliding_window keys.
    logits_soft_cap > 0: logits = cap * tanh(scale * q.k / cap). Returns out [batch, num_heads,
    head_dim] in q's dtype (written into `out` when given) and, with return_lse, also lse float32
    [batch, num_heads] = log(sum(exp(logits))) (natural log; -inf for seq_len 0, whose out is 0).
    check (CUDA): sync and raise on a recorded bad block id or seq_len (module doc).
    num_splits: force the split-KV count (1 = no split; None = planned from the shapes).
    num_threads (CPU): threads over (request, kv head) pairs (a pool kept between calls); CUDA ignores it.
    """
    # q's device too: lse (and out) are allocated on it, and the custom op would name them.
    if type(q) is not torch.Tensor or q.device.type not in SPECS:
        expect_tensor("decode_attention", "q", q, SPECS)
    if type(check) is not bool:  # as_bool only then: a call costs a frame on the hot path
        check = as_bool("decode_attention", "check", check)
    if type(return_lse) is not bool:
        return_lse = as_bool("decode_attention", "return_lse", return_lse)
    if num_splits is not None and not (type(num_splits) is int and 1 <= num_splits <= MAX_SPLITS):
        if type(num_splits) is not int:
            raise TypeError(f"decode_attention: num_splits must be None (planned) or an int, "
                            f"got {type(num_splits).__name__} {num_splits!r}")
        raise ValueError(f"decode_attention: num_splits must be None (planned) or an int in [1, {MAX_SPLITS}], "
                         f"got {num_splits!r}")
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    if scale is None:
        scale = q.shape[-1] ** -0.5 if q.dim() == 3 and q.shape[-1] > 0 else 1.0  # the contract rejects the rest
    none = no_scale.get(q.device)
    if k_scale is None and v_scale is None and none is not None:  # the common case: no lookups
        ks = vs = none
        ksv = vsv = 1.0
    else:
        ks, ksv = cache_scale_args("decode_attention", "k_scale", k_scale, q.device)
        vs, vsv = cache_scale_args("decode_attention", "v_scale", v_scale, q.device)
    _decode_attention(out, lse, q, k_cache, v_cache, block_table, seq_lens, ks, vs, ksv, vsv, scale, sliding_window,
                      logits_soft_cap, 0 if num_splits is None else num_splits, num_threads, check)
    return (out, lse) if return_lse else out


@custom_op("merge_attention_states", mutates_args=("v", "lse"))
def _merge_attention_states(v: torch.Tensor, lse: torch.Tensor, v_a: torch.Tensor, lse_a: torch.Tensor,
                            v_b: torch.Tensor, lse_b: torch.Tensor) -> None:
    _modules[v_a.device.type].merge_attention_states(v, lse, v_a, lse_a, v_b, lse_b)


@_merge_attention_states.register_fake
def _(v, lse, v_a, lse_a, v_b, lse_b) -> None:
    return None


def merge_attention_states(v_a: torch.Tensor, lse_a: torch.Tensor, v_b: torch.Tensor, lse_b: torch.Tensor):
    """Combine two attentions of the same queries over disjoint key sets: v_a, v_b
    [..., num_heads, head_dim] (float32/float16/bfloat16), lse_a, lse_b float32 [..., num_heads]
    (natural log). Returns (v, lse) = the attention over the union: v = (e^lse_a v_a + e^lse_b v_b)
    / (e^lse_a + e^lse_b), lse = log(e^lse_a + e^lse_b); both -inf gives v = 0, lse = -inf."""
    if type(v_a) is not torch.Tensor or v_a.device.type not in SPECS:  # v, lse are allocated on its device
        expect_tensor("merge_attention_states", "v_a", v_a, SPECS)
    if v_a.dim() < 2:
        raise ValueError(f"merge_attention_states: v_a must be [..., num_heads, head_dim], got shape {tuple(v_a.shape)}")
    v = torch.empty(v_a.shape, dtype=v_a.dtype, device=v_a.device)
    lse = torch.empty(v_a.shape[:-1], dtype=torch.float32, device=v_a.device)
    if v_a.dim() == 3:  # [rows, heads, head_dim]: as the kernel takes it
        _merge_attention_states(v, lse, v_a, lse_a, v_b, lse_b)
        return v, lse
    # [*lead, heads, head_dim] -> [rows, heads, head_dim]. The contract sees [rows, ...] only, so
    # a tensor without v_a's leading dims must not pass as one that has them (v_b [6, H, D] with
    # v_a [2, 3, H, D]); a non-tensor goes on as it is and the custom op names it.
    lead = v_a.shape[:-2]
    views = []
    for t, name, own_dims in ((v, "v", 2), (lse, "lse", 1), (v_a, "v_a", 2), (lse_a, "lse_a", 1), (v_b, "v_b", 2),
                              (lse_b, "lse_b", 1)):
        if isinstance(t, torch.Tensor):
            if t.dim() != len(lead) + own_dims or t.shape[:len(lead)] != lead:
                raise ValueError(f"merge_attention_states: {name} must have the leading dims {tuple(lead)} of v_a "
                                 f"{tuple(v_a.shape)}, got shape {tuple(t.shape)}")
            t = t.reshape(math.prod(lead), *t.shape[len(lead):])
        views.append(t)
    _merge_attention_states(*views)
    return v, lse
