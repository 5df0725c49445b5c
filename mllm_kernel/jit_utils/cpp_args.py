"""Turning Python values into C++ template-argument text."""

from __future__ import annotations

import math
import re

# Keyed by str(torch.dtype) so that this module does not need to import torch.
_TORCH_DTYPE_TO_CPP = {
    "torch.float32": "fp32_t",
    "torch.float16": "fp16_t",
    "torch.bfloat16": "bf16_t",
    "torch.float64": "fp64_t",
    "torch.int8": "int8_t",
    "torch.int16": "int16_t",
    "torch.int32": "int32_t",
    "torch.int64": "int64_t",
    "torch.uint8": "uint8_t",
    "torch.bool": "bool",
    "torch.float8_e4m3fn": "fp8_e4m3_t",
    "torch.float8_e5m2": "fp8_e5m2_t",
}

_CPP_NAME = re.compile(r"^(::)?[A-Za-z_][A-Za-z0-9_]*(::[A-Za-z_][A-Za-z0-9_]*)*$")
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1


def _is_torch_dtype(value: object) -> bool:
    cls = type(value)
    return cls.__module__ == "torch" and cls.__name__ == "dtype"


def _cpp_arg(index: int, value: object) -> str:
    if isinstance(value, bool):  # before int: bool is an int subclass
        return "true" if value else "false"
    if isinstance(value, int):
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise ValueError(f"argument {index}: {value} does not fit in int64")
        if value == _INT64_MIN:  # the literal 9223372036854775808 itself does not fit
            return f"({_INT64_MIN + 1} - 1)"
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"argument {index}: {value} has no C++ literal")
        # repr is the shortest text that round-trips; it always has a '.' or an exponent, so
        # the compiler reads it as a double.
        return repr(value)
    if _is_torch_dtype(value):
        cpp = _TORCH_DTYPE_TO_CPP.get(str(value))
        if cpp is None:
            raise TypeError(f"argument {index}: dtype {value} has no mllm_kernel C++ type")
        return cpp
    if isinstance(value, str):
        if not _CPP_NAME.match(value):
            raise TypeError(f"argument {index}: {value!r} is not a C++ identifier or qualified name")
        return value
    raise TypeError(f"argument {index}: cannot turn {type(value).__name__} into a C++ template argument")


def make_cpp_args(*args: object) -> str:
    """`make_cpp_args(16, torch.float16, True)` -> "16, fp16_t, true"."""
    return ", ".join(_cpp_arg(index, value) for index, value in enumerate(args))
