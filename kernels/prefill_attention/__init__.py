"""Prefill attention: many query tokens per request, over ragged K/V or the paged KV cache
(kernels/prefill_attention/prefill_attention.{cpp,cuh}).

A batch is ragged: request i's queries are rows cu_seqlens_q[i]:cu_seqlens_q[i + 1] of q. Its
len_k keys are rows cu_seqlens_k[i]:cu_seqlens_k[i + 1] of k / v (prefill_attention) or the
first seq_lens[i] tokens of its block_table row in decode_attention's cache layout
(paged_prefill_attention). Query j of a request sits at position j + len_k - len_q (the causal
diagonal is aligned to the bottom right, as in FlashAttention: chunked prefill and prefix caching
put the new tokens last). Causal: it sees keys t <= its position. custom_mask (paged): a bool
mask over (query, key) pairs per request replaces the causal rule (tree verification of draft
tokens). sliding_window W > 0 keeps only the W keys ending at the query's position. A query
without any key gets out 0 and lse -inf. Query head h reads KV head h // (num_heads // num_kv_heads).

Bad lengths (a cu_seqlens not starting at 0, decreasing or past its tensor; a seq_len outside
[0, max_blocks_per_seq * block_size]), bad block ids and a custom_mask of the wrong size:
  * CPU: checked before anything is written; ValueError names the argument and the entry.
  * CUDA: never read out of bounds. The kernel clamps lengths, masks bad blocks' keys, treats a
    missing mask entry as 0, and records the first offender in a per-device flag buffer (no
    host sync). `check=True` reads it right after the kernel (it SYNCS) and raises ValueError;
    inside CUDA-graph capture the read is skipped. Call once before capturing a graph (the first
    call per device allocates the flag buffer).
"""

from __future__ import annotations

import torch

from mllm_kernel.kernels.device_errors import DeviceErrorRecord
from mllm_kernel.kernels.op_modules import DeviceModules, as_bool, custom_op, expect_tensor, op_specs

EXPORTS = ("prefill_attention", "paged_prefill_attention")
SPECS = op_specs(__file__, EXPORTS)
_modules = DeviceModules(SPECS)
_errors = DeviceErrorRecord("prefill_attention", "")  # formatted by _describe_error

# The kernel's error encoding (prefill_attention.cuh, record): index = what << 56 | request << 32 |
# entry, with `what` one of these.
_WHAT = {1: "cu_seqlens_q", 2: "cu_seqlens_k", 3: "seq_lens", 4: "block_table", 5: "custom_mask"}


def _describe_error(index: int, value: int) -> str:
    what, request, entry = index >> 56, (index >> 32) & 0xFFFFFF, index & 0xFFFFFFFF
    name = _WHAT.get(what, "?")
    if name in ("cu_seqlens_q", "cu_seqlens_k"):
        return (f"{name}[{entry}] = {value} breaks the prefix sums (they must start at 0, never decrease and "
                "end at the row count of q, or of k and v); the kernel clamped the requests' rows")
    if name == "seq_lens":
        return (f"seq_lens[{request}] = {value} is outside [0, max_blocks_per_seq * block_size]; "
                "the kernel clamped it")
    if name == "block_table":
        return (f"block_table[{request}, {entry}] = {value} is not a block id in [0, num_blocks); "
                "the kernel masked that block's keys")
    return (f"custom_mask holds {value} elements, but the requests' [len_q, len_k] blocks need {entry}; "
            "the kernel treated missing entries as 0")


def pop_prefill_attention_error(device=None) -> str | None:
    """The first bad length, block id or mask size that a CUDA prefill attention recorded on
    `device` since the last read (a message; None if none), clearing it. Syncs the stream."""
    recorded = _errors.pop(device)
    return None if recorded is None else _describe_error(*recorded)


def _raise_recorded(op: str, device: torch.device) -> None:
    if device.type == "cpu" or torch.cuda.is_current_stream_capturing():
        return
    recorded = _errors.pop(device)
    if recorded is not None:
        raise ValueError(f"{op}: {_describe_error(*recorded)} (recorded on {device} by this call or an earlier "
                         "unchecked one)")


_no_mask: dict[torch.device, torch.Tensor] = {}
_no_workspace: dict[torch.device, torch.Tensor] = {}
BLOCK_M = 128  # query rows per CUDA work item (prefill_attention.cuh kBlockM)


def _workspace(q: torch.Tensor, cu_seqlens_q) -> torch.Tensor:
    """CUDA: the plan's int32 workspace (prefill_attention.cuh WorkspaceInts), from shapes only.
    CPU: an empty tensor (unused)."""
    if q.device.type == "cpu" or q.dim() != 3 or not isinstance(cu_seqlens_q, torch.Tensor) or cu_seqlens_q.dim() != 1:
        ws = _no_workspace.get(q.device)
        if ws is None:
            ws = _no_workspace[q.device] = torch.empty(0, dtype=torch.int32, device=q.device)
        return ws  # the contract names a bad q or cu_seqlens_q
    batch = max(0, cu_seqlens_q.shape[0] - 1)
    max_work = -(-q.shape[0] // BLOCK_M) + batch
    return torch.empty(6 * batch + 2 + 2 * max_work, dtype=torch.int32, device=q.device)


@custom_op("prefill_attention", mutates_args=("out", "lse"))
def _prefill_attention(out: torch.Tensor, lse: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, scale: float, causal: bool,
                       sliding_window: int, logits_soft_cap: float, num_threads: int, check: bool) -> None:
    _modules[q.device.type].prefill_attention(out, lse, q, k, v, cu_seqlens_q, cu_seqlens_k,
                                              _workspace(q, cu_seqlens_q), scale, causal, sliding_window,
                                              logits_soft_cap, num_threads, _errors[q.device])
    if check:
        _raise_recorded("prefill_attention", q.device)


@_prefill_attention.register_fake
def _(out, lse, q, k, v, cu_seqlens_q, cu_seqlens_k, scale, causal, sliding_window, logits_soft_cap, num_threads,
      check) -> None:
    return None


@custom_op("paged_prefill_attention", mutates_args=("out", "lse"))
def _paged_prefill_attention(out: torch.Tensor, lse: torch.Tensor, q: torch.Tensor, k_cache: torch.Tensor,
                             v_cache: torch.Tensor, block_table: torch.Tensor, cu_seqlens_q: torch.Tensor,
                             seq_lens: torch.Tensor, custom_mask: torch.Tensor, scale: float, causal: bool,
                             sliding_window: int, logits_soft_cap: float, num_threads: int, check: bool) -> None:
    _modules[q.device.type].paged_prefill_attention(out, lse, q, k_cache, v_cache, block_table, cu_seqlens_q,
                                                    seq_lens, custom_mask, _workspace(q, cu_seqlens_q), scale, causal,
                                                    sliding_window, logits_soft_cap, num_threads, _errors[q.device])
    if check:
        _raise_recorded("paged_prefill_attention", q.device)


@_paged_prefill_attention.register_fake
def _(out, lse, q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, custom_mask, scale, causal, sliding_window,
      logits_soft_cap, num_threads, check) -> None:
    return None


def _outputs(op: str, q, out):
    # q's device: out and lse are allocated on it, and the custom op would name them.
    if type(q) is not torch.Tensor or q.device.type not in SPECS:
        expect_tensor(op, "q", q, SPECS)
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    return out, lse


def _scale(q: torch.Tensor, scale):
    if scale is not None:
        return scale
    return q.shape[-1] ** -0.5 if q.dim() == 3 and q.shape[-1] > 0 else 1.0  # the contract rejects the rest


def prefill_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    *,
    causal: bool = True,
    scale: float | None = None,
    sliding_window: int = -1,
    logits_soft_cap: float = 0.0,
    return_lse: bool = False,
    out: torch.Tensor | None = None,
    check: bool = False,
    num_threads: int = 1,
):
    """Attention of a ragged batch of query tokens over ragged keys (module doc for the masking).

    q [total_q, num_heads, head_dim] (float16/bfloat16 on CUDA, float32 too on the CPU; any token
    stride); k, v [total_k, num_kv_heads, head_dim] of q's dtype; cu_seqlens_q, cu_seqlens_k
    int32 [batch + 1] prefix sums of the requests' query and key counts. head_dim 64, 128 or 256.
    scale: default head_dim ** -0.5. logits_soft_cap > 0: logits = cap * tanh(scale * q.k / cap).
    Returns out [total_q, num_heads, head_dim] in q's dtype (written into `out` when given) and,
    with return_lse, lse float32 [total_q, num_heads] (natural log). check (CUDA): sync and raise
    on recorded bad lengths. num_threads (CPU): worker threads (a pool kept between calls).
    """
    out, lse = _outputs("prefill_attention", q, out)
    if type(causal) is not bool:
        causal = as_bool("prefill_attention", "causal", causal)
    if type(check) is not bool:
        check = as_bool("prefill_attention", "check", check)
    if type(return_lse) is not bool:
        return_lse = as_bool("prefill_attention", "return_lse", return_lse)
    _prefill_attention(out, lse, q, k, v, cu_seqlens_q, cu_seqlens_k, _scale(q, scale), causal, sliding_window,
                       logits_soft_cap, num_threads, check)
    return (out, lse) if return_lse else out


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    causal: bool = True,
    custom_mask: torch.Tensor | None = None,
    scale: float | None = None,
    sliding_window: int = -1,
    logits_soft_cap: float = 0.0,
    return_lse: bool = False,
    out: torch.Tensor | None = None,
    check: bool = False,
    num_threads: int = 1,
):
    """Attention of a ragged batch of new query tokens over each request's paged KV cache (the
    new tokens' K/V already stored; module doc for the masking).

    q [total_q, num_heads, head_dim]; k_cache, v_cache [num_blocks, block_size, num_kv_heads,
    head_dim] of q's dtype (store_kv_cache's layout); block_table int32 [batch, max_blocks_per_seq];
    cu_seqlens_q int32 [batch + 1]; seq_lens int32 [batch] (all cached tokens, the new ones
    included). custom_mask: bool [sum of len_q * len_k], request i's [len_q, len_k] block
    query-major, concatenated in request order; it replaces the causal rule. Other arguments and
    the result as prefill_attention.
    """
    out, lse = _outputs("paged_prefill_attention", q, out)
    if type(causal) is not bool:
        causal = as_bool("paged_prefill_attention", "causal", causal)
    if type(check) is not bool:
        check = as_bool("paged_prefill_attention", "check", check)
    if type(return_lse) is not bool:
        return_lse = as_bool("paged_prefill_attention", "return_lse", return_lse)
    if custom_mask is None:
        mask = _no_mask.get(q.device)
        if mask is None:
            mask = _no_mask[q.device] = torch.empty(0, dtype=torch.uint8, device=q.device)
    elif type(custom_mask) is torch.Tensor and custom_mask.dtype == torch.bool:
        if custom_mask.dim() != 1:
            raise ValueError(f"paged_prefill_attention: custom_mask must be 1-D (the requests' [len_q, len_k] "
                             f"blocks flattened and concatenated), got shape {tuple(custom_mask.shape)}")
        mask = custom_mask.view(torch.uint8)
    elif type(custom_mask) is torch.Tensor:
        raise TypeError(f"paged_prefill_attention: custom_mask must be a torch.bool tensor, got {custom_mask.dtype}")
    else:
        raise TypeError(f"paged_prefill_attention: custom_mask must be None or a torch.bool tensor, "
                        f"got {type(custom_mask).__name__}")
    _paged_prefill_attention(out, lse, q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, mask,
                             _scale(q, scale), causal, sliding_window, logits_soft_cap, num_threads, check)
    return (out, lse) if return_lse else out
