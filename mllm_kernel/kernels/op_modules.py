"""What every op wrapper needs between a user's tensors and its compiled modules."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from mllm_kernel.jit_utils import JitSpec, cache_once


class DeviceModules:
    """An op's modules by device type, from its SPECS ({"cpu": JitSpec, "cuda": JitSpec}).

    `modules("cuda")` builds or loads the module once per process (thread-safe) and then returns
    it; `modules.for_tensor(op, t)` does that for t's device, and raises for other devices.
    """

    def __init__(self, specs: Mapping[str, JitSpec]):
        self._specs = specs
        self._load = cache_once(lambda device_type: specs[device_type].load())

    def __call__(self, device_type: str) -> Any:
        return self._load(device_type)

    def device_type(self, op: str, t: torch.Tensor) -> str:
        """t's device type, or a ValueError naming `op` if no module runs there."""
        if t.device.type not in self._specs:
            supported = " or ".join(self._specs)
            raise ValueError(f"{op}: unsupported device {t.device}; expected a {supported} tensor")
        return t.device.type

    def for_tensor(self, op: str, t: torch.Tensor) -> Any:
        return self._load(self.device_type(op, t))


def rows_view(op: str, name: str, t: torch.Tensor) -> torch.Tensor:
    """t [..., n] as a [rows, n] view, never a copy (1-D: one row). The kernels check strides."""
    if t.dim() == 0:
        raise ValueError(f"{op}: {name} must have at least 1 dim [..., n], got a scalar")
    if t.dim() == 2:
        return t
    try:
        return t.view(math.prod(t.shape[:-1]), t.shape[-1])
    except RuntimeError as error:
        raise ValueError(
            f"{op}: {name} with shape {tuple(t.shape)} and strides {t.stride()} cannot be "
            "viewed as [rows, n] without a copy; pass a contiguous tensor"
        ) from error
