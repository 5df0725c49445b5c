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
# Already-rendered literals: integers (decimal / hex, optional u/l suffixes), floating point
# (optional exponent and f/l suffix), and our own spelling of INT64_MIN.
_CPP_LITERAL = re.compile(
    r"^-?(?:(?:0[xX][0-9A-Fa-f]+|[0-9]+)[uU]?[lL]{0,2}[uU]?"
    r"|(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+(?=[eE]))(?:[eE][+-]?[0-9]+)?[fFlL]?)$"
)
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
_INT64_MIN_TEXT = f"({_INT64_MIN + 1} - 1)"  # the literal 9223372036854775808 itself does not fit


def _is_torch_dtype(value: object) -> bool:
    cls = type(value)
    return cls.__module__ == "torch" and cls.__name__ == "dtype"


def _cpp_arg(index: int, value: object) -> str:
    if isinstance(value, bool):  # before int: bool is an int subclass
        return "true" if value else "false"
    if isinstance(value, int):
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise ValueError(f"argument {index}: {value} does not fit in int64")
        return _INT64_MIN_TEXT if value == _INT64_MIN else str(value)
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
        # Type / qualified names ("fp16_t", "ns::T") and rendered literals ("16", "1.5f"), so that
        # the items of make_cpp_args(...) can be passed on again (`*args`).
        if not (_CPP_NAME.match(value) or _CPP_LITERAL.match(value) or value == _INT64_MIN_TEXT):
            raise TypeError(f"argument {index}: {value!r} is not a C++ literal, identifier or qualified name")
        return value
    raise TypeError(f"argument {index}: cannot turn {type(value).__name__} into a C++ template argument")


class CppArgs(tuple):
    """Rendered C++ template arguments: a tuple of str items that formats as the joined list.

    `args = make_cpp_args(16, torch.float16)`: f"f<{args}>" == "f<16, fp16_t>", `*args` passes
    "16", "fp16_t" on (to load_cpu_jit, which accepts rendered arguments), and args == "16, fp16_t".
    """

    __slots__ = ()

    def __str__(self) -> str:
        return ", ".join(self)

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)

    def __repr__(self) -> str:
        return f"CppArgs({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):  # what make_cpp_args returned before: keep comparisons working
            return str(self) == other
        return tuple.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = tuple.__hash__


def make_cpp_args(*args: object) -> CppArgs:
    """`make_cpp_args(16, torch.float16, True)` -> CppArgs formatting as "16, fp16_t, true".

    Accepts int, float, bool, torch.dtype, C++ names and already-rendered C++ literals; a
    CppArgs argument contributes its items."""
    rendered: list[str] = []
    for value in args:
        if isinstance(value, CppArgs):
            rendered.extend(value)
        else:
            rendered.append(_cpp_arg(len(rendered), value))
    return CppArgs(rendered)
