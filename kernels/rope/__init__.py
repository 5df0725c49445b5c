"""Rotary position embedding (RoPE), in place on q and k (kernels/rope/rope.{cpp,cuh}).

cos_sin_cache is float32 [max_pos, rot_dim]: columns [0, rot_dim/2) hold cos, the rest sin.
Math runs in float32 whatever q's dtype. rot_dim <= head_dim (partial rotary: only the first
rot_dim dims of each head rotate).

Out-of-range positions (< 0 or >= max_pos), never read out of bounds:
  * CPU: every position is checked before anything is written; ValueError names the token.
  * CUDA: the token's q/k are left untouched and the kernel records (token, position) in a
    per-device int64 flag buffer, without a host sync. `check_positions=True` (a debug path,
    off by default because it syncs the stream) reads that flag right after the kernel and
    raises ValueError. Otherwise call `pop_rope_error()` whenever convenient (it syncs).
    While a CUDA graph is being captured the read is skipped (a sync is illegal there); the
    flag stays set for a later `pop_rope_error()` / checked call. The flag buffer is allocated
    on the first CUDA call per device, so call once before capturing a graph.
"""

from __future__ import annotations

import torch

from mllm_kernel.kernels.device_errors import DeviceErrorRecord
from mllm_kernel.kernels.op_modules import DeviceModules, as_bool, custom_op, op_specs

EXPORTS = ("apply_rope",)
SPECS = op_specs(__file__, EXPORTS)
_modules = DeviceModules(SPECS)
_errors = DeviceErrorRecord(
    "apply_rope",
    "positions[{index}] = {value} is out of range [0, max_pos={max_pos}) (recorded on {device} by "
    "this call or an earlier unchecked one; that token's q/k were left unchanged)",
)

pop_rope_error = _errors.pop  # (index, value) of the first bad element recorded on a device, or None


@custom_op("apply_rope", mutates_args=("q", "k"))
def _apply_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
    check_positions: bool,
) -> None:
    device = q.device
    _modules[device.type].apply_rope(q, k, positions, cos_sin_cache, is_neox, _errors[device])
    if check_positions:
        _errors.raise_recorded(device, max_pos=cos_sin_cache.shape[0])


@_apply_rope.register_fake
def _(q, k, positions, cos_sin_cache, is_neox, check_positions) -> None:
    return None


def apply_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    is_neox: bool = True,
    check_positions: bool = False,
) -> None:
    """Rotate q [tokens, heads, head_dim] and k [tokens, kv_heads, head_dim] in place.

    positions: int64 [tokens]. cos_sin_cache: float32 [max_pos, rot_dim] (cos | sin).
    is_neox: rotate halves, pairs (i, i + rot_dim/2); False: GPT-J, pairs (2i, 2i+1).
    q/k: float32/float16/bfloat16 (same dtype); any token stride (e.g. slices of a fused qkv
    tensor), heads and head_dim contiguous. check_positions: CUDA only, see the module doc.
    """
    if type(is_neox) is not bool or type(check_positions) is not bool:  # a call costs a frame: only then
        is_neox = as_bool("apply_rope", "is_neox", is_neox)
        check_positions = as_bool("apply_rope", "check_positions", check_positions)
    _apply_rope(q, k, positions, cos_sin_cache, is_neox, check_positions)
