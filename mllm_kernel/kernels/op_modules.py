"""What every op package needs between a user's tensors and its compiled modules.

An op package (kernels/<op>/__init__.py) declares

    SPECS = op_specs(__file__, ("rms_norm", "fused_add_rms_norm"))   # a JitSpec per device
    _modules = DeviceModules(SPECS)                                   # _modules["cuda"] loads once

    @custom_op("rms_norm")
    def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor: ...

and a public function that fills in defaults and calls the custom op positionally. A plain eager
call then runs: public function -> CustomOp.__call__ -> op body -> module function (three Python
frames, one device lookup).
"""

from __future__ import annotations

import inspect
import math
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from mllm_kernel.jit_utils import JitSpec, cache_once


def op_specs(package_file: str, exports: Iterable[str]) -> dict[str, JitSpec]:
    """An op folder's SPECS by the kernels/<op>/ layout: <op>.cpp defines mllm_kernel::cpu::<name>
    and <op>.cuh mllm_kernel::gpu::<name> for each exported name. `package_file` is the package's
    __file__: the sources are its siblings, wherever the package lives (checkout or wheel)."""
    folder = Path(os.path.abspath(package_file)).parent  # not resolve(): under Bazel, stay in runfiles
    op = folder.name
    exports = tuple(exports)
    return {
        "cpu": JitSpec(
            name=op,
            device="cpu",
            cpp_files=(str(folder / f"{op}.cpp"),),
            cpp_wrappers=tuple((name, f"mllm_kernel::cpu::{name}") for name in exports),
        ),
        "cuda": JitSpec(
            name=op,
            device="cuda",
            cuda_files=(str(folder / f"{op}.cuh"),),
            cuda_wrappers=tuple((name, f"mllm_kernel::gpu::{name}") for name in exports),
        ),
    }


class UnsupportedDevice(ValueError):
    """No module of this op runs on the tensor's device; CustomOp names the op in the message."""


class DeviceModules(dict):
    """An op's loaded modules by device type ("cpu", "cuda"), from its SPECS.

    `modules[t.device.type]` is a plain dict lookup once the module is loaded; the first lookup
    builds or loads it (once per process, thread-safe); other devices raise UnsupportedDevice.
    """

    def __init__(self, specs: Mapping[str, JitSpec]):
        super().__init__()
        self.specs = specs
        self._load = cache_once(lambda device_type: specs[device_type].load())

    def __missing__(self, device_type: str) -> Any:
        if device_type not in self.specs:
            supported = " or ".join(self.specs)
            raise UnsupportedDevice(f"unsupported device {device_type!r}; expected a {supported} tensor")
        module = self[device_type] = self._load(device_type)
        return module


def as_bool(op: str, name: str, value: Any) -> bool:
    """A flag argument: bool (or an int 0/1); anything else (e.g. the str "no", which bool()
    would turn into True) is a TypeError naming the op and the argument."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise TypeError(f"{op}: {name} must be a bool, got {type(value).__name__} {value!r}")


def rows_view(op: str, name: str, t: torch.Tensor) -> torch.Tensor:
    """t [..., n] as a [rows, n] view, never a copy (1-D: one row). The kernels check strides."""
    if t.dim() == 2:
        return t
    if t.dim() == 0:
        raise ValueError(f"{op}: {name} must have at least 1 dim [..., n], got a scalar")
    try:
        return t.view(math.prod(t.shape[:-1]), t.shape[-1])
    except RuntimeError as error:
        raise ValueError(
            f"{op}: {name} with shape {tuple(t.shape)} and strides {t.stride()} cannot be "
            "viewed as [rows, n] without a copy; pass a contiguous tensor"
        ) from error


# ----------------------------------------------------------------------------- argument kinds

_INT64 = (-(2**63), 2**63 - 1)


def _expected_kind(annotation: Any) -> tuple[type, ...] | None:
    """The Python types a parameter annotated `annotation` accepts (None: not checked)."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    text = text.replace("typing.", "").replace("torch.", "")
    return {
        "Tensor": (torch.Tensor,),
        "Optional[Tensor]": (torch.Tensor, type(None)),
        "Tensor | None": (torch.Tensor, type(None)),
        "float": (float, int),
        "int": (int,),
        "bool": (bool, int),
        "str": (str,),
    }.get(text)


def _kind_name(kinds: tuple[type, ...]) -> str:
    if float in kinds:
        kinds = tuple(k for k in kinds if k is not int)  # an int is a float here; say "a float"
    names = {torch.Tensor: "a torch.Tensor", type(None): "None", float: "a float", int: "an int",
             bool: "a bool", str: "a str"}
    return " or ".join(dict.fromkeys(names[k] for k in kinds))


class ArgumentKinds:
    """The parameter kinds of an op body, checked only after a call failed: a wrong kind
    (None or a number for a tensor, a tensor for a number) then becomes a TypeError naming the op
    and the argument, and an int outside int64 a ValueError, instead of the AttributeError or
    OverflowError that the body happened to raise. Costs nothing on the success path."""

    def __init__(self, op: str, fn: Callable[..., Any], devices: Iterable[str] = ("cpu", "cuda")):
        self.op = op
        self.devices = tuple(devices)
        self.params = [(p.name, _expected_kind(p.annotation)) for p in inspect.signature(fn).parameters.values()]

    def explain(self, args: tuple) -> Exception | None:
        """The error to raise for `args`, or None if every argument has the right kind."""
        for (name, kinds), value in zip(self.params, args):
            if kinds is None:
                continue
            if not isinstance(value, kinds) or (bool not in kinds and int in kinds and isinstance(value, bool)):
                return TypeError(f"{self.op}: {name} must be {_kind_name(kinds)}, got {type(value).__name__}")
            if isinstance(value, torch.Tensor) and value.device.type not in self.devices:
                return ValueError(f"{self.op}: {name} is on unsupported device {str(value.device)!r}; expected a "
                                  f"{' or '.join(self.devices)} tensor")
            if isinstance(value, float) and int not in kinds and not math.isfinite(value):
                continue  # finite-ness is the op's business (it names the argument itself)
            if isinstance(value, int) and not isinstance(value, bool) and not _INT64[0] <= value <= _INT64[1]:
                return ValueError(f"{self.op}: {name} = {value} is out of range for a 64-bit integer")
        return None


# ----------------------------------------------------------------------------- custom op

class CustomOp:
    """A torch.library custom op (so torch.compile traces it without a graph break) whose
    plain eager calls skip the dispatcher: that costs ~20 us per call, several times a small
    kernel. The direct path bumps the version counters of the mutated arguments, as torch's
    in-place ops do, so autograd still sees the mutation."""

    def __init__(self, name: str, fn: Callable[..., Any], mutates_args: Iterable[str]):
        mutates_args = tuple(mutates_args)
        self.name = name
        self._fn = fn
        self._op = torch.library.custom_op(f"mllm_kernel::{name}", fn, mutates_args=mutates_args)
        params = list(inspect.signature(fn).parameters)
        self._mutated = tuple(params.index(arg) for arg in mutates_args)
        self._kinds = ArgumentKinds(name, fn)

    def register_fake(self, fake: Callable[..., Any]) -> Callable[..., Any]:
        return self._op.register_fake(fake)

    def __call__(self, *args: Any) -> Any:
        # The dispatcher adds nothing outside torch.compile and any Python dispatch or function
        # mode, with plain tensors only (no FakeTensor or other subclass). Inlined: this is the
        # hot path of every op, and each helper call would cost a Python frame.
        # is_compiling() first: TorchDynamo folds it to True and never traces the rest.
        plain = not (
            torch.compiler.is_compiling()
            or torch._C._len_torch_dispatch_stack() > 0
            or torch._C._is_torch_function_mode_enabled()
        )
        if plain:
            for a in args:
                if isinstance(a, torch.Tensor) and type(a) is not torch.Tensor:
                    plain = False
                    break
        try:
            if not plain:
                return self._op(*args)
            result = self._fn(*args)
        except UnsupportedDevice as error:
            raise self._kinds.explain(args) or ValueError(f"{self.name}: {error}") from None
        except (AttributeError, TypeError, OverflowError, RuntimeError) as error:
            better = self._kinds.explain(args)
            if better is None:
                raise
            raise better from error
        for index in self._mutated:
            torch.autograd.graph.increment_version(args[index])
        return result


def custom_op(name: str, *, mutates_args: Iterable[str] = ()) -> Callable[[Callable[..., Any]], CustomOp]:
    """Decorator: `@custom_op("rms_norm")` registers mllm_kernel::rms_norm (see CustomOp).
    Callers pass arguments positionally."""
    return lambda fn: CustomOp(name, fn, mutates_args)


def expect_tensor(op: str, name: str, value: Any, specs: Mapping[str, JitSpec]) -> None:
    """For public functions that work on an argument before their custom op runs: a TypeError
    unless `value` is a tensor, a ValueError unless its device has a module."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(value).__name__}")
    if value.device.type not in specs:
        raise ValueError(f"{op}: {name} is on unsupported device {str(value.device)!r}; expected a "
                         f"{' or '.join(specs)} tensor")
