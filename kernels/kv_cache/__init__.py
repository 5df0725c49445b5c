"""store_kv_cache: scatter k/v into paged KV caches (kernels/kv_cache/kv_cache.{cpp,cuh}).

Caches are [num_blocks, block_size, kv_heads, head_dim]; token t goes to the flat slot
slot_mapping[t] = block * block_size + offset; slot -1 skips the token (padding).

float8 caches: with k_cache / v_cache of dtype float8_e4m3fn, k and v (float32/float16/
bfloat16) are stored as x / scale, rounded to nearest and saturated to +-448 (NaN stays NaN);
decode_attention reads them back as c * scale. k_scale / v_scale: a float, or a float32 tensor of
1 (per tensor) or kv_heads (per head) elements on the cache's device (include/mllm_kernel/
cache_scale.hpp).

Out-of-range slots (< -1 or >= num_blocks * block_size), never written:
  * CPU: every slot is checked before anything is written; ValueError names the token.
  * CUDA: the token is skipped and the kernel records (token, slot) in a per-device int64 flag
    buffer, without a host sync. `check_slots=True` (a debug path, off by default because it
    syncs the stream) reads that flag right after the kernel and raises ValueError. Otherwise
    call `pop_kv_cache_error()` whenever convenient (it syncs). While a CUDA graph is being
    captured the read is skipped (a sync is illegal there); the flag stays set for a later
    read. The flag buffer is allocated on the first CUDA call per device, so call once before
    capturing a graph.
"""

from __future__ import annotations

import torch

from mllm_kernel.kernels.cache_scale import cache_scale_args, no_scale
from mllm_kernel.kernels.device_errors import DeviceErrorRecord
from mllm_kernel.kernels.op_modules import DeviceModules, as_bool, custom_op, op_specs

EXPORTS = ("store_kv_cache",)
SPECS = op_specs(__file__, EXPORTS)
_modules = DeviceModules(SPECS)
_errors = DeviceErrorRecord(
    "store_kv_cache",
    "slot_mapping[{index}] = {value} is out of range [-1, num_blocks * block_size = {num_slots}) "
    "(recorded on {device} by this call or an earlier unchecked one; that token was not stored)",
)

pop_kv_cache_error = _errors.pop  # (index, value) of the first bad element recorded on a device, or None


@custom_op("store_kv_cache", mutates_args=("k_cache", "v_cache"))
def _store_kv_cache(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    k_scale_value: float,
    v_scale_value: float,
    check_slots: bool,
) -> None:
    device = k.device
    _modules[device.type].store_kv_cache(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale, k_scale_value,
                                         v_scale_value, _errors[device])
    if check_slots:
        _errors.raise_recorded(device, num_slots=k_cache.shape[0] * k_cache.shape[1])


@_store_kv_cache.register_fake
def _(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale, k_scale_value, v_scale_value, check_slots) -> None:
    return None


def store_kv_cache(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    check_slots: bool = False,
    *,
    k_scale=None,
    v_scale=None,
) -> None:
    """k_cache/v_cache.view(-1, kv_heads, head_dim)[slot_mapping[t]] = k[t]/v[t], in place.

    k, v: [tokens, kv_heads, head_dim], any token stride (e.g. slices of a fused qkv tensor),
    heads and head_dim contiguous. k_cache, v_cache: contiguous [num_blocks, block_size,
    kv_heads, head_dim] of k's dtype (float32/float16/bfloat16), or float8_e4m3fn: then k / k_scale
    and v / v_scale are stored (module doc). slot_mapping: int64 [tokens], -1 skips a token.
    check_slots: CUDA only, see the module doc.
    """
    if type(check_slots) is not bool:  # as_bool only then: a call costs a frame on the hot path
        check_slots = as_bool("store_kv_cache", "check_slots", check_slots)
    if k_scale is None and v_scale is None:  # the common case: no scale tensors to look up
        none = no_scale.get(k.device) if isinstance(k, torch.Tensor) else None
        if none is not None:
            _store_kv_cache(k, v, k_cache, v_cache, slot_mapping, none, none, 1.0, 1.0, check_slots)
            return
    device = k.device if isinstance(k, torch.Tensor) else torch.device("cpu")  # the custom op names a non-tensor k
    ks, ksv = cache_scale_args("store_kv_cache", "k_scale", k_scale, device)
    vs, vsv = cache_scale_args("store_kv_cache", "v_scale", v_scale, device)
    _store_kv_cache(k, v, k_cache, v_cache, slot_mapping, ks, vs, ksv, vsv, check_slots)
