"""Repetition, frequency and presence penalties, in place on logits (kernels/penalties/penalties.{cpp,cuh}).

apply_penalties(logits, token_ids=None, counts_or_mask=None, repetition=1.0, frequency=0.0,
                presence=0.0, check=True) -> logits

Each token v of row b with count c > 0 (its occurrences in token_ids[b], or counts_or_mask[b, v])
gets, in float32 and rounded once to the logits' dtype:
    x = x / repetition if x > 0 else x * repetition
    x = x - (frequency * c + presence)
Tokens with c = 0 are left untouched (not even rewritten). This is the rule of HF transformers'
repetition penalty and OpenAI's frequency / presence penalties. vLLM applies repetition over prompt
and output tokens but frequency / presence over output tokens only: call twice for that, once with
the union mask and repetition alone, once with the output counts and frequency / presence alone.

Exactly one count source:
  token_ids       int32 / int64 [batch, L] (any row stride, unit last stride): the tokens seen;
                  repeats count; ids < 0 are padding and ignored.
  counts_or_mask  [batch, vocab] int32 / int64 counts, or bool (True counts as 1), unit last
                  stride: an engine's running counts.
logits: [batch, vocab] float32 / float16 / bfloat16, unit last stride. repetition / frequency /
presence: a float, or a float32 [batch] tensor on the logits' device. repetition must be > 0;
all must be finite. Scalars are checked here, tensors by the CPU kernel; the CUDA kernel cannot
read device values without a host sync, so there a bad per-row value acts as its no-op value
(repetition 1, frequency / presence 0).

Bad ids (>= vocab) and negative counts, never read or written out of bounds:
  * CPU: every one is checked before anything is written; ValueError names the element.
  * CUDA: the element is skipped and the kernel records (flattened index, value) in a per-device
    int64 flag buffer. `check=True` (the default) reads that flag right after the kernel, which
    syncs the stream, and raises ValueError; `check=False` skips the read, and the flag stays
    set until `pop_penalties_error()` (which syncs) or the next checked call. While a CUDA graph
    is captured the read is skipped. The flag buffer is allocated on the first CUDA call per
    device, so call once before capturing a graph.
"""

from __future__ import annotations

import ctypes
import math
import numbers
from typing import Optional

import torch

from mllm_kernel.kernels.device_errors import DeviceErrorRecord
from mllm_kernel.kernels.op_modules import DeviceModules, as_bool, custom_op, expect_tensor, op_specs

_KERNEL_NAMES = ("apply_penalties_ids", "apply_penalties_counts")
EXPORTS = ("apply_penalties",)
SPECS = op_specs(__file__, _KERNEL_NAMES)
_modules = DeviceModules(SPECS)
# One record per count source, so a message names the right argument.
_SKIPPED = " (recorded on {device} by this call or an earlier unchecked one; that element was skipped)"
_id_errors = DeviceErrorRecord(
    "apply_penalties", "token_ids (flattened)[{index}] = {value} is out of range [0, vocab={vocab}) "
    "(ids < 0 are padding)" + _SKIPPED)
_count_errors = DeviceErrorRecord("apply_penalties", "counts_or_mask (flattened)[{index}] = {value} is negative" + _SKIPPED)


def pop_penalties_error(device=None) -> tuple[str, int, int] | None:
    """(source, index, value) of the first bad element recorded on a CUDA device ("token_ids" or
    "counts_or_mask"), or None; clears that record. Syncs the current stream."""
    for source, record in (("token_ids", _id_errors), ("counts_or_mask", _count_errors)):
        found = record.pop(device)
        if found is not None:
            return (source, *found)
    return None


@custom_op("apply_penalties", mutates_args=("logits",))
def _apply(
    logits: torch.Tensor,
    token_ids: Optional[torch.Tensor],
    counts_or_mask: Optional[torch.Tensor],
    repetition: torch.Tensor,
    frequency: torch.Tensor,
    presence: torch.Tensor,
    check: bool,
) -> None:
    module = _modules[logits.device.type]
    if token_ids is not None:
        module.apply_penalties_ids(logits, token_ids, repetition, frequency, presence, _id_errors[logits.device])
        if check:
            _id_errors.raise_recorded(logits.device, vocab=logits.shape[1])
    else:
        module.apply_penalties_counts(logits, counts_or_mask, repetition, frequency, presence,
                                      _count_errors[logits.device])
        if check:
            _count_errors.raise_recorded(logits.device)


@_apply.register_fake
def _(logits, token_ids, counts_or_mask, repetition, frequency, presence, check) -> None:
    return None


def _per_row(value, name: str, logits: torch.Tensor, positive: bool) -> torch.Tensor:
    """A scalar (checked here) becomes a float32 [batch] tensor; a tensor passes through (the C++
    side checks its dtype, shape and device, and on the CPU its values)."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"apply_penalties: {name} must be a float or a float32 tensor, got {type(value).__name__}")
    try:
        value = float(value)
    except OverflowError:
        raise ValueError(f"apply_penalties: {name} = {value} is out of range for a float") from None
    if not math.isfinite(value) or (positive and value <= 0.0):
        expected = "a positive finite number" if positive else "a finite number"
        raise ValueError(f"apply_penalties: {name} must be {expected}, got {value}")
    if abs(value) > 3.4028234663852886e38 or (positive and ctypes.c_float(value).value == 0.0):
        raise ValueError(f"apply_penalties: {name} = {value} is out of range for float32")
    return torch.full((logits.shape[0],), value, dtype=torch.float32, device=logits.device)


def apply_penalties(
    logits: torch.Tensor,
    token_ids: torch.Tensor | None = None,
    counts_or_mask: torch.Tensor | None = None,
    repetition=1.0,
    frequency=0.0,
    presence=0.0,
    check: bool = True,
) -> torch.Tensor:
    """Penalize, in place, the logits [batch, vocab] of the tokens counted by token_ids [batch, L]
    (ids < 0: padding) or counts_or_mask [batch, vocab] (exactly one of the two); see the module
    doc for the rule. repetition / frequency / presence: floats or float32 [batch]. Returns logits."""
    op = "apply_penalties"
    expect_tensor(op, "logits", logits, SPECS)
    if logits.dim() != 2:
        raise ValueError(f"{op}: logits must be 2-D [batch, vocab], got shape {tuple(logits.shape)}")
    if (token_ids is None) == (counts_or_mask is None):
        raise ValueError(f"{op}: give exactly one of token_ids and counts_or_mask, got "
                         f"{'both' if token_ids is not None else 'neither'}")
    check = check if check is True or check is False else as_bool(op, "check", check)
    repetition = _per_row(repetition, "repetition", logits, positive=True)
    frequency = _per_row(frequency, "frequency", logits, positive=False)
    presence = _per_row(presence, "presence", logits, positive=False)
    _apply(logits, token_ids, counts_or_mask, repetition, frequency, presence, check)
    return logits
