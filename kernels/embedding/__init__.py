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

from mllm_kernel.kernels.device_errors import DeviceErrorRecord
from mllm_kernel.kernels.op_modules import DeviceModules, as_bool, custom_op, op_specs

EXPORTS = ("embedding",)
SPECS = op_specs(__file__, EXPORTS)
_modules = DeviceModules(SPECS)
_errors = DeviceErrorRecord(
    "embedding",
    "ids (flattened)[{index}] = {value} is out of range [0, vocab_size={vocab}) (recorded on {device} "
    "by this call or an earlier unchecked one; its output row was zero-filled)",
)

pop_embedding_error = _errors.pop  # (index, value) of the first bad element recorded on a device, or None


@custom_op("embedding")
def _embedding(ids: torch.Tensor, table: torch.Tensor, check: bool) -> torch.Tensor:
    if not ids.is_contiguous():
        raise ValueError(f"embedding: ids must be contiguous, got shape {tuple(ids.shape)} strides {ids.stride()}")
    if table.dim() != 2:
        raise ValueError(f"embedding: table must be 2-D [vocab, hidden], got shape {tuple(table.shape)}")
    out = torch.empty((*ids.shape, table.shape[1]), dtype=table.dtype, device=table.device)
    device = table.device
    module = _modules[device.type]
    module.embedding(out.view(ids.numel(), table.shape[1]), ids.view(-1), table, _errors[device])
    if check:
        _errors.raise_recorded(device, vocab=table.shape[0])
    return out


@_embedding.register_fake
def _(ids, table, check):
    return table.new_empty((*ids.shape, table.shape[1]))


def embedding(ids: torch.Tensor, table: torch.Tensor, check: bool = True) -> torch.Tensor:
    """table[ids]: ids int32/int64 of any shape (contiguous), table [vocab, hidden]
    (float32/float16/bfloat16, any row stride) -> [*ids.shape, hidden] of table's dtype.

    check (CUDA): read the out-of-range flag after the kernel, which syncs the stream; see the
    module doc. The CPU path always checks (no sync involved).
    """
    # as_bool only for non-bools: a call per flag would cost a Python frame on the hot path.
    return _embedding(ids, table, check if type(check) is bool else as_bool("embedding", "check", check))
