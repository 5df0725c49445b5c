"""What every op wrapper needs between a user's tensors and its compiled modules."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from mllm_kernel.jit_utils import JitSpec, cache_once


def op_specs(folder: str, exports: Iterable[str]) -> dict[str, JitSpec]:
    """An op folder's SPECS by the kernels/<op>/ layout: <folder>.cpp defines
    mllm_kernel::cpu::<name> and <folder>.cuh mllm_kernel::gpu::<name> for each exported name."""
    exports = tuple(exports)
    return {
        "cpu": JitSpec(
            name=folder,
            device="cpu",
            cpp_files=(f"{folder}/{folder}.cpp",),
            cpp_wrappers=tuple((name, f"mllm_kernel::cpu::{name}") for name in exports),
        ),
        "cuda": JitSpec(
            name=folder,
            device="cuda",
            cuda_files=(f"{folder}/{folder}.cuh",),
            cuda_wrappers=tuple((name, f"mllm_kernel::gpu::{name}") for name in exports),
        ),
    }


class DeviceModules:
    """An op's modules by device type, from its SPECS ({"cpu": JitSpec, "cuda": JitSpec}).

    `modules("cuda")` builds or loads the module once per process (thread-safe) and then returns
    it; `modules.for_tensor(op, t)` does that for t's device, and raises for other devices.
    """

    def __init__(self, specs: Mapping[str, JitSpec]):
        self._specs = specs
        self._load = cache_once(lambda device_type: specs[device_type].load())
        self._loaded: dict[str, Any] = {}  # lock-free reads once loaded (a call costs ~0.1 us)

    def __call__(self, device_type: str) -> Any:
        module = self._loaded.get(device_type)
        if module is None:
            module = self._loaded[device_type] = self._load(device_type)
        return module

    def device_type(self, op: str, t: torch.Tensor) -> str:
        """t's device type, or a ValueError naming `op` if no module runs there."""
        if t.device.type not in self._specs:
            supported = " or ".join(self._specs)
            raise ValueError(f"{op}: unsupported device {t.device}; expected a {supported} tensor")
        return t.device.type

    def for_tensor(self, op: str, t: torch.Tensor) -> Any:
        return self(self.device_type(op, t))


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


def _plain_eager_call(args: tuple) -> bool:
    """True when torch.library's dispatch adds nothing: outside torch.compile and any Python
    dispatch or function mode, with plain tensors only (no FakeTensor or other subclass)."""
    if torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() > 0:
        return False
    if torch._C._is_torch_function_mode_enabled():
        return False
    for a in args:  # a loop, not all(...): this runs on every call
        if isinstance(a, torch.Tensor) and type(a) is not torch.Tensor:
            return False
    return True


class CustomOp:
    """A torch.library custom op (so torch.compile traces it without a graph break) whose
    plain eager calls skip the dispatcher: that costs ~20 us per call, several times a small
    kernel. The direct path bumps the version counters of the mutated arguments, as torch's
    in-place ops do, so autograd still sees the mutation."""

    def __init__(self, name: str, fn: Callable[..., Any], mutates_args: Iterable[str]):
        mutates_args = tuple(mutates_args)
        self._fn = fn
        self._op = torch.library.custom_op(f"mllm_kernel::{name}", fn, mutates_args=mutates_args)
        params = list(inspect.signature(fn).parameters)
        self._mutated = tuple(params.index(arg) for arg in mutates_args)

    def register_fake(self, fake: Callable[..., Any]) -> Callable[..., Any]:
        return self._op.register_fake(fake)

    def __call__(self, *args: Any) -> Any:
        if not _plain_eager_call(args):
            return self._op(*args)
        result = self._fn(*args)
        for index in self._mutated:
            torch.autograd.graph.increment_version(args[index])
        return result


def custom_op(name: str, *, mutates_args: Iterable[str] = ()) -> Callable[[Callable[..., Any]], CustomOp]:
    """Decorator: `@custom_op("rms_norm")` registers mllm_kernel::rms_norm (see CustomOp).
    Callers pass arguments positionally."""
    return lambda fn: CustomOp(name, fn, mutates_args)
