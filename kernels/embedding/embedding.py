"""Embedding lookup: out = table[ids] (kernels/embedding/embedding.{cpp,cuh}).

Out-of-range ids (< 0 or >= vocab) are never read and never silently returned:
  * CPU: every id is checked before anything is written; ValueError names the position.
  * CUDA: the kernel writes zeros for that row and records (position, id) in a per-device int64
    flag buffer. `embedding(ids, table)` checks by default: it reads the flag right after the
    kernel, which SYNCS the current stream, and raises ValueError. `check=False` skips that
    read (no sync); the flag then stays set until `pop_embedding_error()` (which syncs) or the
    next checked call reads it. While a CUDA graph is being captured the read is skipped (a
    sync is illegal there) and the flag stays set. The flag buffer is allocated on the first
    CUDA call per device, so call once before capturing a graph.
"""

from __future__ import annotations

import torch

from mllm_kernel.kernels.op_modules import DeviceModules, custom_op, op_specs
from mllm_kernel.kernels.device_errors import DeviceErrorRecord

SPECS = op_specs("embedding", ("embedding",))


_module = DeviceModules(SPECS)


# ----------------------------------------------------------------------------- CUDA error record
_errors = DeviceErrorRecord("embedding")


def pop_embedding_error(device: torch.device | str | int | None = None) -> tuple[int, int] | None:
    """See DeviceErrorRecord.pop: (index, value) of the first bad element recorded by a CUDA call
    on `device` since the last read, or None; clears the record. Syncs the current stream."""
    return _errors.pop(device)


# ----------------------------------------------------------------------------- op


@custom_op("embedding")
def _embedding_op(ids: torch.Tensor, table: torch.Tensor, check: bool) -> torch.Tensor:
    if not ids.is_contiguous():
        raise ValueError(f"embedding: ids must be contiguous, got shape {tuple(ids.shape)} strides {ids.stride()}")
    if table.dim() != 2:
        raise ValueError(f"embedding: table must be 2-D [vocab, hidden], got shape {tuple(table.shape)}")
    out = torch.empty((*ids.shape, table.shape[1]), dtype=table.dtype, device=table.device)
    flat_ids, flat_out = ids.view(-1), out.view(-1, table.shape[1])
    device = table.device
    if device.type == "cpu":
        _module("cpu").embedding(flat_out, flat_ids, table)
    elif device.type == "cuda":
        error = _errors.buffer(device)
        _module("cuda").embedding(flat_out, flat_ids, table, error)
        if check and not torch.cuda.is_current_stream_capturing():
            recorded = pop_embedding_error(device)  # syncs the stream
            if recorded is not None:
                position, token_id = recorded
                raise ValueError(
                    f"embedding: ids (flattened)[{position}] = {token_id} is out of range "
                    f"[0, vocab_size={table.shape[0]}) (recorded on {device} by this call or an "
                    "earlier unchecked one; its output row was zero-filled)"
                )
    else:
        raise ValueError(f"embedding: unsupported device {device} (expected cpu or cuda)")
    return out


@_embedding_op.register_fake
def _(ids, table, check):
    return table.new_empty((*ids.shape, table.shape[1]))


def embedding(ids: torch.Tensor, table: torch.Tensor, check: bool = True) -> torch.Tensor:
    """table[ids]: ids int32/int64 of any shape (contiguous), table [vocab, hidden]
    (float32/float16/bfloat16, any row stride) -> [*ids.shape, hidden] of table's dtype.

    check (CUDA): read the out-of-range flag after the kernel, which syncs the stream; see the
    module doc. The CPU path always checks (no sync involved).
    """
    return _embedding_op(ids, table, bool(check))
