"""The dequantization scales of a float8 (e4m3fn) KV cache, as the ops that write it
(store_kv_cache) and read it (decode_attention) pass them to their kernels; the kernels' contract
is include/mllm_kernel/cache_scale.hpp."""

from __future__ import annotations

import torch

no_scale: dict[torch.device, torch.Tensor] = {}  # the empty float32 tensor of "no scale tensor", per device


def cache_scale_args(op: str, name: str, scale, device: torch.device) -> tuple[torch.Tensor, float]:
    """A float8 cache scale as the kernels take it: (float32 tensor [0], [1] or [kv_heads], float).
    None is 1; a float goes as the float; a tensor as the tensor (a 0-d one as [1]). The contract
    (include/mllm_kernel/cache_scale.hpp) checks the rest and names the argument."""
    none = no_scale.get(device)
    if none is None:
        none = no_scale[device] = torch.empty(0, dtype=torch.float32, device=device)
    if scale is None:
        return none, 1.0
    if isinstance(scale, torch.Tensor):
        return (scale.reshape(1) if scale.dim() == 0 else scale), 1.0
    if isinstance(scale, (int, float)) and not isinstance(scale, bool):
        return none, float(scale)
    raise TypeError(f"{op}: {name} must be None, a float or a float32 tensor, got {type(scale).__name__}")
