"""Hostile inputs for every public op (issue 11): a generated table of bad arguments.

Every public op of the registry (`mllm_kernel`'s top-level exports, plus the *_from_uniforms
sampling variants) gets rows of bad arguments: wrong kinds (None, str, float, list for a tensor;
a tensor, str or None for a number), wrong dtypes, ranks, shapes, strides (non-unit inner stride,
transposed), overlapping / aliased written arguments, expanded (stride 0) written arguments,
empty and meta tensors, huge ints (2**64) and non-finite floats. Each row says what must happen:

  Raises(TypeError | ValueError, names)  the call raises exactly that type (TypeError for kinds
                                         and dtypes, ValueError for values, shapes, strides,
                                         devices and overlaps); the message names the op and
                                         each of `names`; no byte of a written argument's storage
                                         changed.
  Succeeds(check)                        the call returns and its result (or the written
                                         arguments) equals the reference computed on non-aliased
                                         copies of the arguments.

Each case runs in a subprocess worker (a long-lived `python -c` that reads case ids from a pipe
and answers one JSON line each); a worker that dies (segfault, abort) or hangs is reported as
that case's failure and restarted, and the run goes on. The test prints the counts and fails on
any failure.

Adding an op: write one `@table("<public name>")` generator below that yields its rows; the
shared generators (tensor_kind_rows, dtype_rows, ...) cover the common argument kinds, and give
the spec its `verify_order` (the C++ contract's order of tensor arguments) for the device rows.

Devices (issue 11 item 5). The rows build their tensors on the CPU; a table has a device mode
and each case's tensors move there just before the call, with their layout kept (one copy per
storage: views, aliases, overlaps, gaps and stride-0 expansions stay exactly as built; meta
tensors stay meta; a torch.Generator follows the op's first tensor argument).
  cpu   (default) the table as built.
  cuda  the same rows with every tensor on cuda:0, rows whose expectation differs on CUDA
        adjusted where they are built (on_cuda(); each says why), plus device rows: each tensor
        argument in turn on the CPU among CUDA ones and on CUDA among CPU ones, and with two
        GPUs on cuda:1 among cuda:0 ones and every tensor on cuda:1. A mismatch raises
        ValueError from the contract's TensorMatcher naming the first argument, in the
        contract's order, that is not on the device of the first one (whose device also picks
        the module): the moved argument, or the next one when the moved argument is the first.
`pytest tests/test_hostile_inputs.py` runs both tables (CUDA skips without a GPU and prints its
own count line); MLLM_KERNEL_FUZZ_DEVICE=cpu|cuda runs that table only.
`python tests/test_hostile_inputs.py --list [--device cuda] [--gpus 2]` prints a table's cases
and expectations without running anything (no GPU needed); test_cuda_table_builds prepares
every CUDA case with meta tensors standing in for CUDA ones and computes its references.
"""

from __future__ import annotations

import json
import math
import os
import re
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

import mllm_kernel as mk
from mllm_kernel import kernels as registry

# ----------------------------------------------------------------------------- rows


@dataclass(frozen=True)
class Raises:
    exc: type[BaseException]
    names: tuple[str, ...] = ()  # argument names the message must contain
    # None: no byte of a written argument may change. Otherwise the call may raise after its
    # kernel ran (CUDA's checked out-of-range index): written(copies) -> {name: expected tensor}.
    written: Callable[[dict[str, Any]], dict[str, torch.Tensor]] | None = None


@dataclass(frozen=True)
class Succeeds:
    # CUDA: (op package, index, value) that the op's device-error record must hold after the
    # call (read with its pop_*_error, which also clears it); None: nothing may be recorded.
    # (op package, message prefix) for an op whose pop_*_error returns a message
    # (decode_attention: "block_table[1, 2] = -1 ..."); (op package, source, index, value) for
    # one whose record also names the argument (pop_penalties_error: "token_ids" or "counts_or_mask")
    # or the op (pop_speculative_error: "chain_speculative_sampling" or "tree_speculative_verify").
    recorded: tuple[str, int, int] | tuple[str, str] | tuple[str, str, int, int] | None = None


@dataclass
class Row:
    label: str
    mutate: Callable[[dict[str, Any]], Any]  # edits the valid arguments in place
    expect: Raises | Succeeds
    reference: Callable[[dict[str, Any]], Any] | None = None  # overrides the op's reference
    # Device rows: (device of every tensor, {argument: its own device}); None: the table's device.
    placement: tuple[str, dict[str, str]] | None = None


@dataclass
class OpSpec:
    """One public op: how to call it, valid arguments and its reference."""

    name: str  # the public function's name (the table key)
    op: str  # the op name its messages start with
    fn: Callable[..., Any]
    valid: Callable[[], dict[str, Any]]  # fresh valid arguments, in the function's order
    written: tuple[str, ...] = ()  # arguments the op writes in place
    # reference(args) -> expected result, or for ops that write in place {name: expected tensor};
    # args are non-aliased copies taken before the call.
    reference: Callable[[dict[str, Any]], Any] | None = None
    rows: list[Row] = field(default_factory=list)
    # The tensor arguments in the order the C++ contract verifies them (for the device rows);
    # `router`: the argument whose device picks the module (default the first of verify_order).
    verify_order: tuple[str, ...] = ()
    router: str | None = None
    device_base: Callable[[dict[str, Any]], Any] | None = None  # e.g. scalars -> per-row tensors
    # {result dtype: (atol, rtol)} replacing close()'s defaults, e.g. a float32 lse computed from
    # 16-bit inputs (decode_attention on CUDA).
    tolerance: dict[torch.dtype, tuple[float, float]] | None = None


SPECS: dict[str, OpSpec] = {}
GENERATORS: dict[str, Callable[[OpSpec], Iterator[Row]]] = {}

FUZZ_DEVICE_ENV = "MLLM_KERNEL_FUZZ_DEVICE"
TABLE_DEVICES = ("cpu", "cuda")
CUDA0, CUDA1 = "cuda:0", "cuda:1"
# The table being built: generators read it through on_cuda() (build_cases sets it).
_MODE = {"device": "cpu", "gpus": 0}


def on_cuda() -> bool:
    """Whether the table being built runs on CUDA (rows with a CUDA-specific expectation ask)."""
    return _MODE["device"] == "cuda"


def fuzz_device() -> str:
    device = os.environ.get(FUZZ_DEVICE_ENV, "cpu") or "cpu"
    if device not in TABLE_DEVICES:
        raise ValueError(f"{FUZZ_DEVICE_ENV}={device!r}: expected one of {TABLE_DEVICES}")
    return device


def table(name: str):
    """Registers the row generator of public op `name`."""

    def register(gen):
        GENERATORS[name] = gen
        return gen

    return register


def seeded(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(*shape, dtype=torch.float32, seed=0, scale=1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=seeded(seed)) * scale).to(dtype)


# ----------------------------------------------------------------------------- shared generators
# Each takes the argument name (and what it needs) and yields Rows; `a` in the lambdas is the
# dict of valid arguments, edited in place.

TYPE, VALUE = TypeError, ValueError


def tensor_kind_rows(name: str) -> Iterator[Row]:
    for label, bad in (("None", None), ("str", "tensor"), ("float", 1.5), ("list", [1.0, 2.0])):
        yield Row(f"{name}: {label} for a tensor", lambda a, bad=bad: a.__setitem__(name, bad), Raises(TYPE, (name,)))


def number_kind_rows(name: str, bad_value_kind: Any = "7") -> Iterator[Row]:
    yield Row(f"{name}: tensor for a number", lambda a: a.__setitem__(name, torch.ones(1)), Raises(TYPE, (name,)))
    yield Row(f"{name}: None for a number", lambda a: a.__setitem__(name, None), Raises(TYPE, (name,)))
    yield Row(f"{name}: str for a number", lambda a: a.__setitem__(name, bad_value_kind), Raises(TYPE, (name,)))


def dtype_rows(name: str, *dtypes: torch.dtype) -> Iterator[Row]:
    for dtype in dtypes:
        yield Row(f"{name}: dtype {dtype}", lambda a, d=dtype: a.__setitem__(name, a[name].to(d)), Raises(TYPE, (name,)))


def rank_rows(name: str, any_rank: bool = False) -> Iterator[Row]:
    """One dim more, one fewer and none (`any_rank`: [..., n] takes any rank >= 1, so only none)."""
    if not any_rank:
        yield Row(f"{name}: one dim more", lambda a: a.__setitem__(name, a[name].unsqueeze(-2)), Raises(VALUE, (name,)))
        yield Row(f"{name}: one dim fewer", lambda a: a.__setitem__(name, a[name][0]), Raises(VALUE, (name,)))
    yield Row(f"{name}: scalar", lambda a: a.__setitem__(name, a[name].reshape(-1)[0].clone()), Raises(VALUE, (name,)))


def resize(t: torch.Tensor, dim: int, delta: int) -> torch.Tensor:
    shape = list(t.shape)
    shape[dim] += delta
    out = torch.zeros(shape, dtype=t.dtype)
    idx = tuple(slice(0, min(a, b)) for a, b in zip(t.shape, shape))
    out[idx] = t[idx]
    return out


def shape_rows(name: str, *dims: int, names: tuple[str, ...] | None = None) -> Iterator[Row]:
    """Dim `d` one larger: a mismatch with another argument (messages name both)."""
    for d in dims:
        yield Row(f"{name}: dim {d} + 1", lambda a, d=d: a.__setitem__(name, resize(a[name], d, 1)),
                  Raises(VALUE, names or (name,)))


def non_unit_inner(t: torch.Tensor) -> torch.Tensor:
    """Same shape and values, last-dim stride 2."""
    wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
    wide[..., ::2] = t
    return wide[..., ::2]


def transposed(t: torch.Tensor) -> torch.Tensor:
    """Same shape and values, column-major in the last two dims."""
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


def stride_rows(name: str, inner: bool = True, transpose: bool = True) -> Iterator[Row]:
    if inner:
        yield Row(f"{name}: inner stride 2", lambda a: a.__setitem__(name, non_unit_inner(a[name])), Raises(VALUE, (name,)))
    if transpose:
        yield Row(f"{name}: transposed", lambda a: a.__setitem__(name, transposed(a[name])), Raises(VALUE, (name,)))


def expanded(t: torch.Tensor) -> torch.Tensor:
    """Dim 0 expanded from one entry (stride 0): every row is the same memory."""
    return t[:1].expand(t.shape)


def expanded_rows(name: str) -> Iterator[Row]:
    yield Row(f"{name}: expanded (stride 0) dim 0", lambda a: a.__setitem__(name, expanded(a[name])), Raises(VALUE, (name,)))


def meta_rows(name: str) -> Iterator[Row]:
    yield Row(f"{name}: meta tensor", lambda a: a.__setitem__(name, a[name].to("meta")), Raises(VALUE, (name,)))


def float_value_rows(name: str, bad: tuple[float, ...] = (math.nan, math.inf, -math.inf)) -> Iterator[Row]:
    for value in bad:
        yield Row(f"{name} = {value!r}", lambda a, v=value: a.__setitem__(name, v), Raises(VALUE, (name,)))


def huge_int_rows(name: str) -> Iterator[Row]:
    for value in (2**64, -(2**64)):
        yield Row(f"{name} = {value}", lambda a, v=value: a.__setitem__(name, v), Raises(VALUE, (name,)))


def set_entry(name: str, at: int, value: Any, **also: Any) -> Callable[[dict[str, Any]], None]:
    """A mutation: entry `at` of the tensor `name` (a copy) set to `value`; `also` set too."""

    def mutate(a):
        t = a[name].clone()
        t[at] = value
        a[name] = t
        a.update(also)

    return mutate


def index_value_rows(name: str, values: tuple[int, ...], at: int = 0) -> Iterator[Row]:
    """Entry `at` of the int tensor `name` set to each bad value (out of range)."""
    for value in values:
        yield Row(f"{name}[{at}] = {value}", set_entry(name, at, value), Raises(VALUE, (name,)))


def common_tensor_rows(name: str, bad_dtypes: tuple[torch.dtype, ...], strides: bool = True,
                       any_rank: bool = False) -> Iterator[Row]:
    yield from tensor_kind_rows(name)
    yield from dtype_rows(name, *bad_dtypes)
    yield from rank_rows(name, any_rank)
    yield from meta_rows(name)
    if strides:
        yield from stride_rows(name)


FLOAT_BAD = (torch.float64, torch.int32)  # dtypes no float kernel takes
INDEX_BAD = (torch.float32, torch.int16)  # dtypes no index argument takes


def succeeds(label: str, mutate: Callable[[dict[str, Any]], Any], reference=None) -> Row:
    return Row(label, mutate, Succeeds(), reference)


def raises(label: str, mutate: Callable[[dict[str, Any]], Any], exc: type[BaseException], *names: str) -> Row:
    return Row(label, mutate, Raises(exc, names))


def setter(**values) -> Callable[[dict[str, Any]], None]:
    return lambda a: a.update(values)


def checked_on_cpu_clamped_on_cuda(label: str, mutate: Callable[[dict[str, Any]], Any], *names: str) -> Row:
    """A bad value inside a per-row tensor: the CPU checks it (ValueError); CUDA clamps it in the
    kernel (checking device data would need a host sync; kernels/sampling/__init__.py), so there
    the call succeeds with the clamped value (the op's reference clamps the same way)."""
    return succeeds(label, mutate) if on_cuda() else raises(label, mutate, VALUE, *names)


# ----------------------------------------------------------------------------- references


def ref(module: str, name: str) -> Callable[..., Any]:
    return getattr(registry.cases(module), name)


# ----------------------------------------------------------------------------- rms_norm


def _rms_norm_spec() -> OpSpec:
    return OpSpec(
        "rms_norm", "rms_norm", mk.rms_norm,
        valid=lambda: {"x": randn(4, 64), "weight": randn(64, seed=1), "eps": 1e-6},
        reference=lambda a: ref("rms_norm", "ref_rms_norm")(a["x"], a["weight"], a["eps"]),
        verify_order=("x", "weight"),
    )


def zero_rows(a):
    """The documented result of an all-zero row with eps = 0: zeros (x and, fused, residual)."""
    if "residual" in a:
        r = (a["x"] + a["residual"])
        return {"x": torch.zeros_like(r), "residual": r}
    return torch.zeros_like(a["x"])


def norm_eps_rows() -> Iterator[Row]:
    yield from number_kind_rows("eps")
    yield from float_value_rows("eps", (math.nan, math.inf, -math.inf, -1e-6))
    yield raises("eps = 2**64 (a huge int)", setter(eps=2**64), VALUE, "eps")
    # eps = 0 on an all-zero row: documented result 0 (nothing to scale), never 0 * inf = NaN.
    yield succeeds("eps = 0 on all-zero rows", lambda a: (a.update(eps=0.0), a["x"].zero_(), a.get("residual", a["x"]).zero_()),
                   reference=zero_rows)
    yield succeeds("eps = 0, tiny rows (1e-18)", lambda a: (a.update(eps=0.0), a["x"].mul_(1e-18)))


@table("rms_norm")
def rms_norm_rows(spec: OpSpec) -> Iterator[Row]:
    yield from common_tensor_rows("x", FLOAT_BAD, any_rank=True)
    yield from common_tensor_rows("weight", FLOAT_BAD, strides=False)
    yield from stride_rows("weight", transpose=False)
    yield from shape_rows("x", 1, names=("weight", "x"))
    yield from shape_rows("weight", 0, names=("weight",))
    yield raises("weight float16, x float32", lambda a: a.update(weight=a["weight"].half()), TYPE, "weight")
    yield from norm_eps_rows()
    yield succeeds("x empty rows", lambda a: a.update(x=torch.empty(0, 64)))
    yield succeeds("x 3-D", lambda a: a.update(x=randn(2, 2, 64)))
    yield succeeds("x row stride 80 (a slice)", lambda a: a.update(x=randn(4, 80)[:, :64]))
    yield succeeds("x expanded (read only)", lambda a: a.update(x=expanded(a["x"])))
    yield succeeds("weight is a view of x (both read)", lambda a: a.update(weight=a["x"][1]))


# ----------------------------------------------------------------------------- fused_add_rms_norm


def _fused_spec() -> OpSpec:
    def reference(a):
        x, r = ref("rms_norm", "ref_fused")(a["x"], a["residual"], a["weight"], a["eps"])
        return {"x": x, "residual": r}

    return OpSpec(
        "fused_add_rms_norm", "fused_add_rms_norm", mk.fused_add_rms_norm,
        valid=lambda: {"x": randn(4, 64), "residual": randn(4, 64, seed=2), "weight": randn(64, seed=1), "eps": 1e-6},
        written=("x", "residual"),
        reference=reference,
        verify_order=("x", "residual", "weight"),
    )


def interleaved(rows: int, n: int, parts: int, seed: int = 0) -> list[torch.Tensor]:
    """`parts` [rows, n] views of one [rows, parts * n] tensor: disjoint, one row stride."""
    base = randn(rows, parts * n, seed=seed)
    return [base[:, i * n:(i + 1) * n] for i in range(parts)]


@table("fused_add_rms_norm")
def fused_rows(spec: OpSpec) -> Iterator[Row]:
    for name in ("x", "residual"):
        yield from common_tensor_rows(name, FLOAT_BAD, any_rank=True)
        yield from expanded_rows(name)
    yield from tensor_kind_rows("weight")
    yield from dtype_rows("weight", *FLOAT_BAD)
    yield from meta_rows("weight")
    yield from shape_rows("residual", 0, 1, names=("residual",))
    yield from shape_rows("weight", 0, names=("weight",))
    yield from norm_eps_rows()

    # Aliasing: both x and residual are written; weight is read while x is written.
    yield raises("residual is x", lambda a: a.update(residual=a["x"]), VALUE, "x", "residual")
    base = lambda: randn(6, 64, seed=3)  # noqa: E731

    def overlapping(a):
        b = base()
        a.update(x=b[:4], residual=b[2:])

    yield raises("x and residual overlap by two rows", overlapping, VALUE, "x", "residual")

    def shifted(a):  # same rows, shifted by one element: overlapping but never the same address
        b = randn(4 * 64 + 1, seed=3)
        a.update(x=b[:256].view(4, 64), residual=b[1:].view(4, 64))

    yield raises("residual is x shifted by one element", shifted, VALUE, "x", "residual")
    yield raises("weight is a view of x", lambda a: a.update(weight=a["x"][0]), VALUE, "x", "weight")
    yield raises("weight is a view of residual", lambda a: a.update(weight=a["residual"][3]), VALUE, "residual", "weight")

    def in_gap(a):  # weight in the gap between x's rows: the byte ranges intersect, no overlap
        b = randn(4, 128, seed=4)
        a.update(x=b[:, :64], weight=b[1, 64:])

    yield succeeds("weight in the row gaps of x (disjoint)", in_gap)

    def halves(a):
        x, r = interleaved(4, 64, 2, seed=5)
        a.update(x=x, residual=r)

    yield succeeds("x and residual interleaved halves of one tensor", halves)

    def halves_weight(a):
        x, r, w = interleaved(4, 64, 3, seed=6)
        a.update(x=x, residual=r, weight=w[2])

    yield succeeds("x, residual and weight interleaved thirds of one tensor", halves_weight)
    yield succeeds("x empty rows", lambda a: a.update(x=torch.empty(0, 64), residual=torch.empty(0, 64)))
    yield succeeds("x 3-D", lambda a: a.update(x=randn(2, 2, 64), residual=randn(2, 2, 64, seed=7)))


# ----------------------------------------------------------------------------- activations


def _act_spec(name: str) -> OpSpec:
    if name == "silu_and_mul":
        valid = lambda: {"x": randn(4, 128)}  # noqa: E731
        reference = lambda a: ref("activation", "ref_silu_and_mul")(a["x"])  # noqa: E731
    else:
        valid = lambda: {"x": randn(4, 128), "approximate": "none"}  # noqa: E731
        reference = lambda a: ref("activation", "ref_gelu_and_mul")(a["x"], a["approximate"])  # noqa: E731
    return OpSpec(name, name, getattr(mk, name), valid=valid, reference=reference, verify_order=("x",))


def act_rows(spec: OpSpec) -> Iterator[Row]:
    yield from common_tensor_rows("x", FLOAT_BAD, any_rank=True)
    yield raises("x odd last dim", lambda a: a.update(x=randn(4, 127)), VALUE, "x")
    yield raises("x 0-dim", lambda a: a.update(x=torch.tensor(1.0)), VALUE, "x")
    yield succeeds("x empty rows", lambda a: a.update(x=torch.empty(0, 128)))
    yield succeeds("x empty last dim", lambda a: a.update(x=torch.empty(3, 0)))
    yield succeeds("x row stride 160 (a slice)", lambda a: a.update(x=randn(4, 160)[:, :128]))
    yield succeeds("x 3-D", lambda a: a.update(x=randn(2, 3, 128)))
    yield succeeds("x expanded (read only)", lambda a: a.update(x=expanded(a["x"])))
    yield succeeds("x 1-D", lambda a: a.update(x=randn(128)))
    # Huge gates (the products stay inside float32): never NaN, e.g. from erf or exp overflow.
    yield succeeds("x huge gates (1e30)", lambda a: a.update(x=torch.cat([randn(4, 64, scale=1e30), torch.ones(4, 64)], 1)))


table("silu_and_mul")(act_rows)


@table("gelu_and_mul")
def gelu_rows(spec: OpSpec) -> Iterator[Row]:
    yield from act_rows(spec)
    yield raises("approximate = 'fast'", setter(approximate="fast"), VALUE, "approximate")
    yield raises("approximate = None", setter(approximate=None), TYPE, "approximate")
    yield raises("approximate = 1", setter(approximate=1), TYPE, "approximate")
    yield succeeds("approximate = 'tanh'", setter(approximate="tanh"))


# ----------------------------------------------------------------------------- softmax


def _softmax_spec(name: str) -> OpSpec:
    if name == "softmax":
        valid = lambda: {"x": randn(4, 64, scale=3.0), "temperature": 1.0}  # noqa: E731
        reference = lambda a: ref("softmax", "ref_softmax")(a["x"], a["temperature"])  # noqa: E731
    else:
        valid = lambda: {"x": randn(4, 64, scale=3.0)}  # noqa: E731
        reference = lambda a: ref("softmax", "ref_log_softmax")(a["x"])  # noqa: E731
    return OpSpec(name, name, getattr(mk, name), valid=valid, reference=reference, verify_order=("x",))


def softmax_common_rows() -> Iterator[Row]:
    yield from common_tensor_rows("x", FLOAT_BAD, any_rank=True)
    yield raises("x 0-dim", lambda a: a.update(x=torch.tensor(1.0)), VALUE, "x")
    yield succeeds("x empty rows", lambda a: a.update(x=torch.empty(0, 64)))
    yield succeeds("x 3-D", lambda a: a.update(x=randn(2, 3, 64)))
    yield succeeds("x 1-D", lambda a: a.update(x=randn(64)))
    yield succeeds("x row stride 80 (a slice)", lambda a: a.update(x=randn(4, 80)[:, :64]))
    yield succeeds("x expanded (read only)", lambda a: a.update(x=expanded(a["x"])))
    yield succeeds("x huge logits (1e30)", lambda a: a.update(x=randn(4, 64, scale=1e30)))
    yield succeeds("x all equal", lambda a: a.update(x=torch.full((4, 64), 3.0)))


def softmax_limit(a) -> torch.Tensor:
    """softmax(x / T) in float64 with the max subtracted before dividing: exact for any T > 0,
    the one-hot of the max (ties split evenly) when T -> 0."""
    x = a["x"].double()
    return torch.softmax((x - x.amax(-1, keepdim=True)) / a["temperature"], -1)


@table("softmax")
def softmax_rows(spec: OpSpec) -> Iterator[Row]:
    yield from softmax_common_rows()
    yield from number_kind_rows("temperature")
    yield from float_value_rows("temperature", (math.nan, math.inf, -math.inf, 0.0, -1.0))
    yield raises("temperature = 2**64 (a huge int)", setter(temperature=2**64), VALUE, "temperature")
    # The limit T -> 0 is the one-hot of the row max (ties split evenly); never NaN.
    for t in (1e-9, 1e-30, 1e-39, 5e-324):
        yield succeeds(f"temperature = {t!r} (-> one-hot of the max)",
                       lambda a, t=t: a.update(x=randn(4, 64, scale=20.0), temperature=t), reference=softmax_limit)
    yield succeeds("temperature = 1e-30, ties at the max",
                   lambda a: a.update(x=torch.tensor([[1.0, 3.0, 3.0, 0.0]]), temperature=1e-30), reference=softmax_limit)
    yield succeeds("temperature = 1e30", setter(temperature=1e30), reference=softmax_limit)


@table("log_softmax")
def log_softmax_rows(spec: OpSpec) -> Iterator[Row]:
    yield from softmax_common_rows()


# ----------------------------------------------------------------------------- sampling

SAMPLE_VOCAB = 64


def _logits(seed=0):
    return randn(4, SAMPLE_VOCAB, seed=seed, scale=3.0)


def _probs(seed=0):
    return torch.softmax(randn(4, SAMPLE_VOCAB, seed=seed, scale=3.0), -1)


def _uniforms(seed=9):
    return torch.rand(4, generator=seeded(seed))


def _sample_spec(name: str) -> OpSpec:
    cases = lambda: registry.cases("sampling")  # noqa: E731

    def at_row(value, r: int) -> float:
        return float(value[r]) if isinstance(value, torch.Tensor) else float(value)

    def clamp01(v: float) -> float:  # CUDA's fminf(fmaxf(v, 0), 1): NaN -> 0 (identity on valid values)
        return 0.0 if math.isnan(v) else min(max(v, 0.0), 1.0)

    def kept(a) -> torch.Tensor:
        """Per row (per-row parameters may differ), with the parameters CUDA clamps clamped."""
        scores = a["logits"] if name.startswith("top_k") else a["probs"]
        rows = []
        for r in range(scores.shape[0]):
            if name.startswith("top_k"):
                k, p = int(at_row(a["top_k"], r)), clamp01(at_row(a["top_p"], r))
                k = scores.shape[-1] if k <= 0 or k > scores.shape[-1] else k
                p = p if p > 0 else 2.0**-149  # top_p 0 (clamped): the top token only
                rows.append(cases().ref_top_k_top_p_weights(scores[r:r + 1], k, p))
            else:
                rows.append(cases().ref_min_p_weights(scores[r:r + 1], clamp01(at_row(a["min_p"], r))))
        return torch.cat(rows) if rows else scores.double()

    def reference(a):
        if name == "greedy_sample":
            return a["logits"].double().argmax(-1)
        if name.endswith("_from_uniforms"):
            # CUDA clamps uniforms into [0, 1 - 2^-24] (NaN -> 0); identity on valid uniforms.
            u = a["uniforms"].nan_to_num(0.0, posinf=1.0).clamp(0.0, 1.0 - 2.0**-24)
            return cases().ref_pick(kept(a), u)
        return ("member of", kept(a) > 0)  # the generator's uniforms: any kept token

    if name == "greedy_sample":
        valid = lambda: {"logits": _logits()}  # noqa: E731
    elif name == "top_k_top_p_sample":
        valid = lambda: {"logits": _logits(), "top_k": 10, "top_p": 0.9, "generator": seeded(3)}  # noqa: E731
    elif name == "top_k_top_p_sample_from_uniforms":
        valid = lambda: {"logits": _logits(), "uniforms": _uniforms(), "top_k": 10, "top_p": 0.9}  # noqa: E731
    elif name == "min_p_sample":
        valid = lambda: {"probs": _probs(), "min_p": 0.1, "generator": seeded(3)}  # noqa: E731
    else:
        valid = lambda: {"probs": _probs(), "uniforms": _uniforms(), "min_p": 0.1}  # noqa: E731
    op = name.removesuffix("_from_uniforms")
    scores = "probs" if op == "min_p_sample" else "logits"
    params = {"greedy_sample": (), "top_k_top_p_sample": ("top_k", "top_p"), "min_p_sample": ("min_p",)}[op]
    uniforms = ("uniforms",) if name.endswith("_from_uniforms") else ()
    # Device rows need the parameters as per-row tensors (scalars become tensors on the scores'
    # device in Python, before the contract sees them).
    per_row = {"top_k": lambda: torch.full((4,), 10), "top_p": lambda: torch.full((4,), 0.9),
               "min_p": lambda: torch.full((4,), 0.1)}
    return OpSpec(name, op, getattr(mk, name, None) or getattr(registry.package("sampling"), name),
                  valid=valid, reference=reference, verify_order=(scores, *uniforms, *params),
                  device_base=(lambda a: a.update({p: per_row[p]() for p in params})) if params else None)


def sample_rows_rows(name: str) -> Iterator[Row]:
    """The [batch, vocab] scores argument."""
    yield from tensor_kind_rows(name)
    yield from dtype_rows(name, *FLOAT_BAD)
    yield from meta_rows(name)
    yield raises(f"{name} 1-D", lambda a: a.update({name: a[name][0]}), VALUE, name)
    yield raises(f"{name} 3-D", lambda a: a.update({name: a[name].unsqueeze(0)}), VALUE, name)
    yield raises(f"{name} empty vocab", lambda a: a.update({name: torch.empty(4, 0)}), VALUE, name)
    yield from stride_rows(name)
    yield succeeds(f"{name} row stride 80 (a slice)", lambda a: a.update({name: torch.cat([a[name], a[name][:, :16]], 1)[:, :SAMPLE_VOCAB]}))


def uniforms_rows() -> Iterator[Row]:
    yield from tensor_kind_rows("uniforms")
    yield from dtype_rows("uniforms", torch.float64, torch.float16)
    yield from meta_rows("uniforms")
    yield raises("uniforms [batch + 1]", lambda a: a.update(uniforms=torch.rand(5)), VALUE, "uniforms")
    yield raises("uniforms [batch, 1]", lambda a: a.update(uniforms=a["uniforms"].unsqueeze(1)), VALUE, "uniforms")
    yield raises("uniforms inner stride 2", lambda a: a.update(uniforms=non_unit_inner(a["uniforms"])), VALUE, "uniforms")
    for value in (1.0, -0.5, math.nan, math.inf):
        yield checked_on_cpu_clamped_on_cuda(f"uniforms[1] = {value}", lambda a, v=value: a["uniforms"].__setitem__(1, v),
                                             "uniforms")
    yield succeeds("uniforms all 0", lambda a: a["uniforms"].zero_())
    yield succeeds("uniforms just below 1", lambda a: a["uniforms"].fill_(1 - 2**-24))


def generator_rows() -> Iterator[Row]:
    yield raises("generator = 'seed'", setter(generator="seed"), TYPE, "generator")
    yield raises("generator = 42", setter(generator=42), TYPE, "generator")
    yield succeeds("generator = None", setter(generator=None))


def top_k_param_rows() -> Iterator[Row]:
    yield raises("top_k = None", setter(top_k=None), TYPE, "top_k")
    yield raises("top_k = '5'", setter(top_k="5"), TYPE, "top_k")
    yield raises("top_k = 2.5", setter(top_k=2.5), VALUE, "top_k")
    yield from huge_int_rows("top_k")
    yield raises("top_k float32 tensor", setter(top_k=torch.full((4,), 5.0)), TYPE, "top_k")
    yield raises("top_k int64 [batch + 1]", setter(top_k=torch.full((5,), 5)), VALUE, "top_k")
    yield raises("top_k meta tensor", setter(top_k=torch.full((4,), 5, device="meta")), VALUE, "top_k")
    yield succeeds("top_k = 0 (disabled)", setter(top_k=0))
    yield succeeds("top_k = -5 (disabled)", setter(top_k=-5))
    yield succeeds("top_k = 1 (greedy)", setter(top_k=1))
    yield succeeds("top_k > vocab", setter(top_k=10**6))
    yield succeeds("top_k = 2**63 - 1", setter(top_k=2**63 - 1))
    yield succeeds("top_k per-row tensor", setter(top_k=torch.tensor([7, 0, 1, 64])))


def top_p_param_rows() -> Iterator[Row]:
    yield raises("top_p = None", setter(top_p=None), TYPE, "top_p")
    yield raises("top_p = 'all'", setter(top_p="all"), TYPE, "top_p")
    yield from float_value_rows("top_p", (math.nan, math.inf, -math.inf, 0.0, -0.5, 1.5))
    yield raises("top_p = 10**400 (an int no float holds)", setter(top_p=10**400), VALUE, "top_p")
    yield raises("top_p float64 tensor", setter(top_p=torch.full((4,), 0.5, dtype=torch.float64)), TYPE, "top_p")
    yield checked_on_cpu_clamped_on_cuda("top_p tensor with a NaN", setter(top_p=torch.tensor([0.5, math.nan, 0.5, 0.5])),
                                         "top_p")
    yield checked_on_cpu_clamped_on_cuda("top_p tensor with 0", setter(top_p=torch.tensor([0.5, 0.0, 0.5, 0.5])), "top_p")
    yield succeeds("top_p = 1e-30 (top token only)", setter(top_p=1e-30))
    yield succeeds("top_p = 5e-324 (top token only)", setter(top_p=5e-324))
    yield succeeds("top_p = 1 (disabled)", setter(top_p=1.0))
    yield succeeds("top_p per-row tensor", setter(top_p=torch.tensor([0.5, 1.0, 0.9, 0.01])))


def top_k_top_p_param_rows() -> Iterator[Row]:
    yield from top_k_param_rows()
    yield from top_p_param_rows()
    yield succeeds("top_k, top_p per-row tensors", setter(top_k=torch.full((4,), 7), top_p=torch.full((4,), 0.5)))


def min_p_param_rows() -> Iterator[Row]:
    yield raises("min_p = None", setter(min_p=None), TYPE, "min_p")
    yield raises("min_p = 'low'", setter(min_p="low"), TYPE, "min_p")
    yield from float_value_rows("min_p", (math.nan, math.inf, -math.inf, -0.1, 1.5))
    yield raises("min_p = 10**400 (an int no float holds)", setter(min_p=10**400), VALUE, "min_p")
    yield raises("min_p float64 tensor", setter(min_p=torch.full((4,), 0.5, dtype=torch.float64)), TYPE, "min_p")
    yield checked_on_cpu_clamped_on_cuda("min_p tensor with a NaN", setter(min_p=torch.tensor([0.5, math.nan, 0.5, 0.5])),
                                         "min_p")
    yield checked_on_cpu_clamped_on_cuda("min_p tensor with 2", setter(min_p=torch.tensor([0.5, 2.0, 0.5, 0.5])), "min_p")
    yield succeeds("min_p = 0 (keeps all)", setter(min_p=0.0))
    yield succeeds("min_p = 1 (keeps the max)", setter(min_p=1.0))
    yield succeeds("min_p = 1, ties at the max", lambda a: a.update(min_p=1.0, probs=torch.tensor([[0.4, 0.1, 0.4, 0.1]] * 4)))
    yield succeeds("min_p = 5e-324", setter(min_p=5e-324))


@table("greedy_sample")
def greedy_rows(spec: OpSpec) -> Iterator[Row]:
    yield from sample_rows_rows("logits")
    yield succeeds("logits all equal (ties -> index 0)", lambda a: a.update(logits=torch.zeros(4, SAMPLE_VOCAB)))
    yield succeeds("logits empty batch", lambda a: a.update(logits=torch.empty(0, SAMPLE_VOCAB)))
    yield succeeds("logits -inf everywhere", lambda a: a.update(logits=torch.full((4, SAMPLE_VOCAB), -math.inf)))


@table("top_k_top_p_sample")
def top_k_top_p_rows(spec: OpSpec) -> Iterator[Row]:
    yield from sample_rows_rows("logits")
    yield from top_k_top_p_param_rows()
    yield from generator_rows()


@table("top_k_top_p_sample_from_uniforms")
def top_k_top_p_uniform_rows(spec: OpSpec) -> Iterator[Row]:
    yield from sample_rows_rows("logits")
    yield from top_k_top_p_param_rows()
    yield from uniforms_rows()


@table("min_p_sample")
def min_p_rows(spec: OpSpec) -> Iterator[Row]:
    yield from sample_rows_rows("probs")
    yield from min_p_param_rows()
    yield from generator_rows()


@table("min_p_sample_from_uniforms")
def min_p_uniform_rows(spec: OpSpec) -> Iterator[Row]:
    yield from sample_rows_rows("probs")
    yield from min_p_param_rows()
    yield from uniforms_rows()


FILTER_OPS = ("top_k_mask_logits", "top_k_renorm_probs", "top_p_renorm_probs")


def _filter_spec(name: str) -> OpSpec:
    scores, param = ("logits", "top_k") if name == "top_k_mask_logits" else ("probs", name[:5])

    def reference(a):
        x = a[scores]
        values = a[param] if isinstance(a[param], torch.Tensor) else [a[param]] * x.shape[0]
        if param == "top_p":  # CUDA clamps into [0, 1] (NaN -> 0); 0 keeps the top token only
            values = [max(2.0**-149, 0.0 if math.isnan(float(v)) else min(max(float(v), 0.0), 1.0)) for v in values]
        return ref("sampling", "ref_filter")(name, x, [float(v) for v in values]).to(x.dtype)

    valid = lambda: {scores: _logits() if scores == "logits" else _probs(), param: 7 if param == "top_k" else 0.7}  # noqa: E731
    per_row = {"top_k": lambda: torch.full((4,), 7), "top_p": lambda: torch.full((4,), 0.7)}
    return OpSpec(name, name, getattr(mk, name), valid=valid, reference=reference, verify_order=(scores, param),
                  device_base=lambda a: a.update({param: per_row[param]()}))


@table("top_k_mask_logits")
def top_k_mask_rows(spec: OpSpec) -> Iterator[Row]:
    yield from sample_rows_rows("logits")
    yield from top_k_param_rows()
    yield succeeds("logits with ties at the k-th", lambda a: a.update(logits=torch.tensor([[1.0, 2.0, 2.0, 0.0]] * 4)))
    yield succeeds("logits -inf everywhere", lambda a: a.update(logits=torch.full((4, SAMPLE_VOCAB), -math.inf)))


@table("top_k_renorm_probs")
def top_k_renorm_rows(spec: OpSpec) -> Iterator[Row]:
    yield from sample_rows_rows("probs")
    yield from top_k_param_rows()
    yield succeeds("probs all zero (rows come back as zeros)", lambda a: a.update(probs=torch.zeros(4, SAMPLE_VOCAB)))
    yield succeeds("probs unnormalized", lambda a: a.update(probs=a["probs"] * 7))


@table("top_p_renorm_probs")
def top_p_renorm_rows(spec: OpSpec) -> Iterator[Row]:
    yield from sample_rows_rows("probs")
    yield from top_p_param_rows()
    yield succeeds("probs with ties at the threshold", lambda a: a.update(probs=torch.tensor([[0.3, 0.3, 0.3, 0.1]] * 4)))
    yield succeeds("probs unnormalized", lambda a: a.update(probs=a["probs"] * 7))


# ----------------------------------------------------------------------------- apply_rope

ROPE_MAX_POS, ROPE_ROT = 16, 16


def _rope_cache(max_pos=ROPE_MAX_POS, rot=ROPE_ROT) -> torch.Tensor:
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot))
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float64), inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], -1).float()


def rope_reference(a):
    rope = ref("rope", "ref_rope")
    rot = a["cos_sin_cache"].shape[1]
    return {name: rope(a[name], a["positions"], a["cos_sin_cache"], rot, a["is_neox"]).to(a[name].dtype)
            for name in ("q", "k")}


def rope_skipping(token: int):
    """CUDA with an out-of-range position at `token`: that token's q/k unchanged, the others rotated."""

    def reference(a):
        positions = a["positions"].clone()
        positions[token] = 0
        out = rope_reference({**a, "positions": positions})
        for name in ("q", "k"):
            out[name][token] = a[name][token]
        return out

    return reference


def _rope_spec() -> OpSpec:
    return OpSpec(
        "apply_rope", "apply_rope", mk.apply_rope,
        valid=lambda: {"q": randn(3, 4, 16), "k": randn(3, 2, 16, seed=1), "positions": torch.tensor([0, 5, 15]),
                       "cos_sin_cache": _rope_cache(), "is_neox": True, "check_positions": False},
        written=("q", "k"),
        reference=rope_reference,
        verify_order=("q", "k", "positions", "cos_sin_cache"),
    )


def qkv(tokens=3, heads=4, kv_heads=2, dim=16, seed=0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v as slices of one fused [T, (H + 2 KH) * D] tensor (token stride (H + 2 KH) * D)."""
    fused = randn(tokens, (heads + 2 * kv_heads) * dim, seed=seed)
    q = fused[:, : heads * dim].view(tokens, heads, dim)
    k = fused[:, heads * dim: (heads + kv_heads) * dim].view(tokens, kv_heads, dim)
    v = fused[:, (heads + kv_heads) * dim:].view(tokens, kv_heads, dim)
    return q, k, v


@table("apply_rope")
def rope_rows(spec: OpSpec) -> Iterator[Row]:
    for name in ("q", "k"):
        yield from common_tensor_rows(name, FLOAT_BAD)
        yield from expanded_rows(name)
        yield raises(f"{name} token stride < heads * head_dim",
                     lambda a, n=name: a.update({n: a[n].as_strided(a[n].shape, (16, 16, 1))}), VALUE, name)
        yield raises(f"{name} heads expanded (stride 0)",
                     lambda a, n=name: a.update({n: a[n][:, :1].expand(a[n].shape)}), VALUE, name)
    yield raises("k float16, q float32", lambda a: a.update(k=a["k"].half()), TYPE, "k")
    yield from shape_rows("k", 0, 2, names=("k",))
    yield from common_tensor_rows("positions", INDEX_BAD, strides=False)
    yield raises("positions int32", lambda a: a.update(positions=a["positions"].int()), TYPE, "positions")
    yield raises("positions [T + 1]", lambda a: a.update(positions=torch.tensor([0, 1, 2, 3])), VALUE, "positions")
    yield raises("positions inner stride 2", lambda a: a.update(positions=non_unit_inner(a["positions"])), VALUE, "positions")
    bad_positions = (ROPE_MAX_POS, -1, 2**62, -(2**63))
    if not on_cuda():
        yield from index_value_rows("positions", bad_positions, at=1)
    else:
        # CUDA never reads out of bounds and does not sync by default: the bad token's q/k stay
        # unchanged, the others rotate, and the device-error record holds (token, position).
        # check_positions=True reads it after the kernel and raises ValueError, the other tokens
        # already rotated (kernels/rope/__init__.py).
        for value in bad_positions:
            yield Row(f"positions[1] = {value}", set_entry("positions", 1, value), Succeeds(recorded=("rope", 1, value)),
                      rope_skipping(1))
            yield Row(f"positions[1] = {value}, check_positions=True", set_entry("positions", 1, value, check_positions=True),
                      Raises(VALUE, ("positions",), written=rope_skipping(1)))
    yield from common_tensor_rows("cos_sin_cache", (torch.float64, torch.float16, torch.bfloat16))
    yield raises("cos_sin_cache odd rot_dim", lambda a: a.update(cos_sin_cache=_rope_cache()[:, :15]), VALUE, "cos_sin_cache")
    yield raises("cos_sin_cache rot_dim > head_dim", lambda a: a.update(cos_sin_cache=_rope_cache(rot=32)), VALUE, "cos_sin_cache")
    yield raises("cos_sin_cache rot_dim 0", lambda a: a.update(cos_sin_cache=torch.empty(16, 0)), VALUE, "cos_sin_cache")
    yield raises("is_neox = 'yes'", setter(is_neox="yes"), TYPE, "is_neox")
    yield raises("is_neox = None", setter(is_neox=None), TYPE, "is_neox")
    yield raises("check_positions = 'no'", setter(check_positions="no"), TYPE, "check_positions")

    # Aliasing: q and k are written; positions and cos_sin_cache are read.
    yield raises("k is q", lambda a: a.update(k=a["q"]), VALUE, "q", "k")

    def k_inside_q(a):
        a["k"] = a["q"][:, 1:3]

    yield raises("k is heads 1..2 of q", k_inside_q, VALUE, "q", "k")

    def k_shifted(a):  # k overlaps q with an offset that is not a multiple of anything
        base = randn(3 * 64 + 40, seed=5)
        a.update(q=base.as_strided((3, 4, 16), (64, 16, 1)), k=base.as_strided((3, 2, 16), (64, 16, 1), 7))

    yield raises("k overlaps q at an element offset of 7", k_shifted, VALUE, "q", "k")

    def cache_in_q(a):
        q = randn(16, 4, 16, seed=6)
        a.update(q=q[:3], cos_sin_cache=q.view(-1)[: 16 * 16].view(16, 16))

    yield raises("cos_sin_cache is a view of q", cache_in_q, VALUE, "q", "cos_sin_cache")

    def fused(a):
        q, k, _ = qkv(seed=7)
        a.update(q=q, k=k)

    yield succeeds("q and k slices of a fused qkv tensor", fused)

    def fused_other_order(a):  # k before q in the fused row
        fused = randn(3, 6 * 16, seed=8)
        a.update(k=fused[:, :32].view(3, 2, 16), q=fused[:, 32:].view(3, 4, 16))

    yield succeeds("k before q in a fused tensor", fused_other_order)
    yield succeeds("is_neox = False (GPT-J)", setter(is_neox=False))
    yield succeeds("partial rotary (rot_dim 8)", lambda a: a.update(cos_sin_cache=_rope_cache(rot=8)))
    yield succeeds("no tokens", lambda a: a.update(q=torch.empty(0, 4, 16), k=torch.empty(0, 2, 16),
                                                    positions=torch.empty(0, dtype=torch.long)))
    yield succeeds("no kv heads", lambda a: a.update(k=torch.empty(3, 0, 16)))
    yield raises("positions expanded (stride 0)", lambda a: a.update(positions=torch.tensor([7]).expand(3)), VALUE, "positions")
    yield succeeds("cache of 2**20 positions, position 2**20 - 1",
                   lambda a: a.update(cos_sin_cache=_rope_cache(max_pos=2**20, rot=4), positions=torch.tensor([0, 2**20 - 1, 12345])))


# ----------------------------------------------------------------------------- store_kv_cache


def fp8_caches(k_scale=None, v_scale=None, **more) -> Callable[[dict[str, Any]], None]:
    """Mutation: k_cache and v_cache as float8 e4m3fn, with these scales (a value, or a callable
    that makes a fresh tensor) and other argument updates."""

    def mutate(a):
        a.update(k_cache=a["k_cache"].to(torch.float8_e4m3fn), v_cache=a["v_cache"].to(torch.float8_e4m3fn), **more)
        if k_scale is not None:
            a["k_scale"] = k_scale() if callable(k_scale) else k_scale
        if v_scale is not None:
            a["v_scale"] = v_scale() if callable(v_scale) else v_scale

    return mutate


def kv_reference(a):
    store = ref("kv_cache", "ref_store")

    def stored(x, cache, scale):  # into a float8 cache: x / scale, saturated, rounded by torch
        if cache.dtype == torch.float8_e4m3fn:
            x = (x.float() / per_head_scale(a.get(scale), cache.shape[2], x.device).float().view(1, -1, 1))
            x = x.clamp(-448, 448).to(cache.dtype)
        return store(x, cache, a["slot_mapping"])

    return {"k_cache": stored(a["k"], a["k_cache"], "k_scale"), "v_cache": stored(a["v"], a["v_cache"], "v_scale")}


def kv_skipping(token: int):
    """CUDA with an out-of-range slot at `token`: that token not stored, the others stored."""

    def reference(a):
        slots = a["slot_mapping"].clone()
        slots[token] = -1
        return kv_reference({**a, "slot_mapping": slots})

    return reference


def _kv_spec() -> OpSpec:
    return OpSpec(
        "store_kv_cache", "store_kv_cache", mk.store_kv_cache,
        valid=lambda: {"k": randn(3, 2, 8), "v": randn(3, 2, 8, seed=1), "k_cache": torch.zeros(2, 4, 2, 8),
                       "v_cache": torch.zeros(2, 4, 2, 8), "slot_mapping": torch.tensor([1, -1, 6]), "check_slots": False},
        written=("k_cache", "v_cache"),
        reference=kv_reference,
        verify_order=("k", "v", "k_cache", "v_cache", "slot_mapping"),
    )


@table("store_kv_cache")
def kv_rows(spec: OpSpec) -> Iterator[Row]:
    for name in ("k", "v"):
        yield from common_tensor_rows(name, FLOAT_BAD)
        yield from shape_rows(name, 1, 2, names=(name,))
    for name in ("k_cache", "v_cache"):
        yield from common_tensor_rows(name, FLOAT_BAD)
        yield from expanded_rows(name)
        yield from shape_rows(name, 2, 3, names=(name,))
        yield raises(f"{name} float16", lambda a, n=name: a.update({n: a[n].half()}), TYPE, name)
    yield raises("v_cache with another block count", lambda a: a.update(v_cache=torch.zeros(3, 4, 2, 8)), VALUE, "v_cache")
    yield from common_tensor_rows("slot_mapping", INDEX_BAD, strides=False)
    yield raises("slot_mapping int32", lambda a: a.update(slot_mapping=a["slot_mapping"].int()), TYPE, "slot_mapping")
    yield raises("slot_mapping [T + 1]", lambda a: a.update(slot_mapping=torch.tensor([0, 1, 2, 3])), VALUE, "slot_mapping")
    bad_slots = (8, -2, 2**62, -(2**63))
    if not on_cuda():
        yield from index_value_rows("slot_mapping", bad_slots, at=2)
    else:
        # CUDA never writes out of bounds and does not sync by default: the bad token is skipped,
        # the others are stored, and the device-error record holds (token, slot). check_slots=True
        # reads it after the kernel and raises ValueError, the other tokens already stored
        # (kernels/kv_cache/__init__.py).
        for value in bad_slots:
            yield Row(f"slot_mapping[2] = {value}", set_entry("slot_mapping", 2, value),
                      Succeeds(recorded=("kv_cache", 2, value)), kv_skipping(2))
            yield Row(f"slot_mapping[2] = {value}, check_slots=True", set_entry("slot_mapping", 2, value, check_slots=True),
                      Raises(VALUE, ("slot_mapping",), written=kv_skipping(2)))
    yield raises("check_slots = 'no'", setter(check_slots="no"), TYPE, "check_slots")

    # Aliasing: k_cache and v_cache are written; k, v and slot_mapping are read.
    yield raises("v_cache is k_cache", lambda a: a.update(v_cache=a["k_cache"]), VALUE, "k_cache", "v_cache")

    def halves(a):  # one [num_blocks, 2, block_size, KH, D] cache, k and v interleaved per block
        c = torch.zeros(2, 2, 4, 2, 8)
        a.update(k_cache=c[:, 0], v_cache=c[:, 1])

    yield raises("k_cache, v_cache interleaved per block (not contiguous)", halves, VALUE, "k_cache")

    def shifted(a):
        c = torch.zeros(2 * 4 * 2 * 8 + 8)
        a.update(k_cache=c[:128].view(2, 4, 2, 8), v_cache=c[8:].view(2, 4, 2, 8))

    yield raises("v_cache is k_cache shifted by one head", shifted, VALUE, "k_cache", "v_cache")

    def k_in_cache(a):
        a["k"] = a["k_cache"].view(-1, 2, 8)[:3]

    yield raises("k is a view of k_cache", k_in_cache, VALUE, "k", "k_cache")

    def v_in_k_cache(a):
        a["v"] = a["k_cache"].view(-1, 2, 8)[5:]

    yield raises("v is a view of k_cache", v_in_k_cache, VALUE, "v", "k_cache")

    def split(a):
        c = torch.zeros(2, 2, 4, 2, 8)
        a.update(k_cache=c[0], v_cache=c[1])

    yield succeeds("k_cache, v_cache halves of one tensor", split)

    def fused(a):
        _, k, v = qkv(heads=4, kv_heads=2, dim=8, seed=3)
        a.update(k=k, v=v)

    yield succeeds("k and v slices of a fused qkv tensor", fused)
    yield succeeds("v is k (both read)", lambda a: a.update(v=a["k"]))
    yield succeeds("all slots -1", lambda a: a.update(slot_mapping=torch.full((3,), -1)))
    yield succeeds("no tokens", lambda a: a.update(k=torch.empty(0, 2, 8), v=torch.empty(0, 2, 8),
                                                    slot_mapping=torch.empty(0, dtype=torch.long)))
    yield succeeds("empty cache, all slots -1", lambda a: a.update(k_cache=torch.zeros(0, 4, 2, 8), v_cache=torch.zeros(0, 4, 2, 8),
                                                                    slot_mapping=torch.full((3,), -1)))

    # Float8 caches: k, v quantized with their scales (include/mllm_kernel/cache_scale.hpp).
    f8 = torch.float8_e4m3fn


    yield succeeds("float8 caches, no scales", fp8_caches())
    yield succeeds("float8 caches, float scales", fp8_caches(0.5, 0.01))
    yield succeeds("float8 caches, per-head and [1] scale tensors", fp8_caches(lambda: torch.tensor([0.5, 0.25]),
                                                                         lambda: torch.tensor([0.003])))
    yield succeeds("float8 caches from float16 k, v", fp8_caches(0.5, 2.0, k=randn(3, 2, 8).half(), v=randn(3, 2, 8, seed=1).half()))
    yield succeeds("float8 caches, k holding inf, -inf and NaN (saturated, NaN kept)",
                   fp8_caches(k=torch.tensor([math.inf, -math.inf, math.nan, 1e9] * 12).view(3, 2, 8)))
    yield raises("k_cache float8, v_cache not", lambda a: a.update(k_cache=a["k_cache"].to(f8)), TYPE, "v_cache")
    yield raises("k_cache and v_cache float8_e5m2", lambda a: a.update(k_cache=a["k_cache"].to(torch.float8_e5m2),
                                                                       v_cache=a["v_cache"].to(torch.float8_e5m2)),
                 TYPE, "k_cache")
    for name in ("k_scale", "v_scale"):
        yield raises(f"{name} for a cache of k's dtype", setter(**{name: 2.0}), VALUE, name)
        for label, bad in (("nan", math.nan), ("inf", math.inf), ("0", 0.0), ("-1", -1.0), ("1e39 (inf in float32)", 1e39)):
            yield raises(f"float8 caches, {name} = {label}", fp8_caches(**{name: bad}), VALUE, name)
        yield raises(f"float8 caches, {name} of 3 elements (2 kv heads)", fp8_caches(**{name: lambda: torch.ones(3)}), VALUE, name)
        yield raises(f"float8 caches, {name} float16", fp8_caches(**{name: lambda: torch.ones(2).half()}), TYPE, name)
        yield raises(f"float8 caches, {name} = [1.0] (a list)", fp8_caches(**{name: [1.0]}), TYPE, name)
        if on_cuda():
            yield Row(f"float8 caches, {name} on the CPU", fp8_caches(**{name: lambda: torch.ones(2)}), Raises(VALUE, (name,)),
                      placement=(CUDA0, {name: "cpu"}))


# ----------------------------------------------------------------------------- embedding


def _embedding_spec() -> OpSpec:
    return OpSpec(
        "embedding", "embedding", mk.embedding,
        valid=lambda: {"ids": torch.tensor([1, 0, 7]), "table": randn(8, 16), "check": True},
        reference=lambda a: ref("embedding", "ref_embedding")(a["ids"], a["table"]),
        verify_order=("table", "ids"),
    )


def embedding_zero_filled(position: int):
    """CUDA with an out-of-range id at flattened `position`: that output row zero-filled."""

    def reference(a):
        ids = a["ids"].clone()
        ids.view(-1)[position] = 0
        out = ref("embedding", "ref_embedding")(ids, a["table"])
        out.view(-1, out.shape[-1])[position] = 0
        return out

    return reference


@table("embedding")
def embedding_rows(spec: OpSpec) -> Iterator[Row]:
    yield from tensor_kind_rows("ids")
    yield from dtype_rows("ids", *INDEX_BAD, torch.uint8)
    yield from meta_rows("ids")
    yield raises("ids inner stride 2", lambda a: a.update(ids=non_unit_inner(a["ids"])), VALUE, "ids")
    # On CUDA too: embedding checks by default (check=True reads the device-error record after the
    # kernel and raises ValueError); its output is a new tensor, so no argument was written.
    bad_ids = (8, -1, 2**62, -(2**63))
    yield from index_value_rows("ids", bad_ids, at=1)
    yield raises("ids int32 out of range", lambda a: a.update(ids=torch.tensor([1, 8], dtype=torch.int32)), VALUE, "ids")
    if on_cuda():
        # check=False on CUDA: no sync, the bad id's output row is zero-filled and the record
        # holds (position, id) (kernels/embedding/__init__.py). The CPU raises whatever check says.
        for value in bad_ids:
            yield Row(f"ids[1] = {value}, check=False", set_entry("ids", 1, value, check=False),
                      Succeeds(recorded=("embedding", 1, value)), embedding_zero_filled(1))
    yield from common_tensor_rows("table", FLOAT_BAD)
    yield raises("check = 'no'", setter(check="no"), TYPE, "check")
    yield succeeds("ids 2-D", lambda a: a.update(ids=torch.tensor([[1, 2], [3, 4]])))
    yield succeeds("ids 0-dim", lambda a: a.update(ids=torch.tensor(3)))
    yield succeeds("ids int32", lambda a: a.update(ids=a["ids"].int()))
    yield succeeds("ids empty", lambda a: a.update(ids=torch.empty(0, dtype=torch.long)))
    yield raises("ids expanded (stride 0)", lambda a: a.update(ids=torch.tensor([3]).expand(4)), VALUE, "ids")
    yield succeeds("table row stride 24 (a slice)", lambda a: a.update(table=randn(8, 24)[:, :16]))
    yield succeeds("table empty hidden", lambda a: a.update(table=torch.empty(8, 0)))
    yield raises("table empty vocab", lambda a: a.update(table=torch.empty(0, 16)), VALUE, "ids")


# ----------------------------------------------------------------------------- apply_penalties
# logits float32 [4, 32]; two specs, one per count source: "apply_penalties" with token_ids int64
# [4, 6] (repeats, and -1 as padding), "apply_penalties (counts_or_mask)" with int32 counts
# [4, 32]. repetition / frequency / presence are floats (device rows: float32 [4] tensors).
# Bad ids (>= vocab) and negative counts: the CPU raises before writing; CUDA skips the element,
# records (source, flattened index, value) and, with check=True (the default), raises ValueError
# after its kernel ran (kernels/penalties/__init__.py). Bad per-row tensor values: the CPU
# raises; CUDA uses the no-op value (repetition 1, frequency / presence 0) for them.

PEN_BATCH, PEN_VOCAB = 4, 32
PEN_PARAMS = {"repetition": 1.3, "frequency": 0.2, "presence": 0.5}
PEN_PER_ROW = {"repetition": (1.3, 0.5, 1.0, 2.0), "frequency": (0.2, -0.1, 0.0, 1.0),
               "presence": (0.5, 0.0, -0.5, 2.0)}
FLT_MAX = 3.4028234663852886e38


def _pen_ids() -> torch.Tensor:
    return torch.tensor([[3, 3, 7, -1, 31, 0], [5, -1, -1, -1, -1, -1], [1, 2, 3, 4, 5, 6], [9, 9, 9, 2, -7, 30]])


def _pen_counts() -> torch.Tensor:
    return torch.randint(0, 3, (PEN_BATCH, PEN_VOCAB), generator=seeded(4), dtype=torch.int32)


def penalties_counts(a: dict[str, Any]) -> torch.Tensor:
    """[batch, vocab] counts of the call's source, without the elements CUDA skips (ids >= vocab,
    negative counts; the CPU raises on those, so its references never see them)."""
    vocab = a["logits"].shape[-1]
    if a.get("token_ids") is not None:
        ids = a["token_ids"].long()
        return ref("penalties", "ref_counts_from_ids")(torch.where(ids >= vocab, -1, ids), vocab)
    counts = a["counts_or_mask"]
    if counts.dtype == torch.bool:
        return counts.view(torch.uint8) != 0  # True counts as 1, whatever its byte
    return counts.long().clamp_min(0)


def penalties_params(a: dict[str, Any]) -> dict[str, torch.Tensor]:
    """float64 [batch] parameters as the kernel uses them: scalars rounded to float32 (as the op
    does), bad per-row tensor values replaced by their no-op values (what CUDA does; the CPU
    raises on them, so its references never see them)."""
    batch = a["logits"].shape[0]
    out = {}
    for name in PEN_PARAMS:
        v = a[name]
        v = (v if isinstance(v, torch.Tensor) else torch.full((batch,), float(v), dtype=torch.float32)).double().cpu()
        if name == "repetition":
            out[name] = torch.where((v > 0) & (v <= FLT_MAX), v, 1.0)  # NaN fails both
        else:
            out[name] = torch.where(v.isfinite(), v, 0.0)
    return out


def penalties_reference(a: dict[str, Any]) -> dict[str, torch.Tensor]:
    logits = a["logits"]
    want = ref("penalties", "ref_penalties")(logits, penalties_counts(a), **penalties_params(a))
    return {"logits": want.to(logits.dtype)}


def _penalties_spec(source: str) -> OpSpec:
    def valid():
        a = {"logits": randn(PEN_BATCH, PEN_VOCAB, scale=3.0), "token_ids": None, "counts_or_mask": None,
             **PEN_PARAMS, "check": True}
        a[source] = _pen_ids() if source == "token_ids" else _pen_counts()
        return a

    return OpSpec(
        "apply_penalties" if source == "token_ids" else f"apply_penalties ({source})", "apply_penalties",
        mk.apply_penalties, valid=valid, written=("logits",), reference=penalties_reference,
        # `error` is left out: the op allocates it on logits' device.
        verify_order=("logits", source, *PEN_PARAMS),
        device_base=lambda a: a.update({n: torch.tensor(v) for n, v in PEN_PER_ROW.items()}),
    )


def penalties_bad_rows(label: str, mutate, name: str, index: int, value: int) -> Iterator[Row]:
    """A bad id / count (one element, so CUDA's record is deterministic): the CPU raises whatever
    check says; CUDA skips it (the spec's reference), records (name, index, value), and with
    check=True raises ValueError after its kernel ran."""
    unchecked = lambda a: (mutate(a), a.update(check=False))  # noqa: E731
    if not on_cuda():
        yield raises(label, mutate, VALUE, name)
        yield raises(f"{label}, check=False", unchecked, VALUE, name)
        return
    yield Row(label, mutate, Raises(VALUE, (name,), written=penalties_reference))
    yield Row(f"{label}, check=False", unchecked, Succeeds(recorded=("penalties", name, index, value)))


def penalties_source_rows(source: str) -> Iterator[Row]:
    """The count source argument, and giving both sources or neither."""
    other = "counts_or_mask" if source == "token_ids" else "token_ids"
    for label, bad in (("str", "tensor"), ("float", 1.5), ("list", [1, 2])):
        yield raises(f"{source}: {label} for a tensor", setter(**{source: bad}), TYPE, source)
    yield raises(f"{source} = None (neither source)", setter(**{source: None}), VALUE, "token_ids", "counts_or_mask")
    both = (lambda a: a.update(counts_or_mask=_pen_counts())) if source == "token_ids" else (
        lambda a: a.update(token_ids=_pen_ids()))
    yield raises(f"{other} given too (both sources)", both, VALUE, "token_ids", "counts_or_mask")
    bad_dtypes = (*INDEX_BAD, torch.uint8) + ((torch.bool,) if source == "token_ids" else (torch.float64,))
    yield from dtype_rows(source, *bad_dtypes)
    yield from rank_rows(source)
    yield from meta_rows(source)
    yield from stride_rows(source)
    yield from shape_rows(source, 0, names=(source,))
    if source == "counts_or_mask":
        yield from shape_rows(source, 1, names=(source,))
    yield succeeds(f"{source} row stride > its width (a slice)",
                   lambda a: a.update({source: torch.cat([a[source], a[source]], 1)[:, :a[source].shape[1]]}))
    yield succeeds(f"{source} expanded (stride 0, read only)", lambda a: a.update({source: expanded(a[source])}))


def penalty_param_rows(name: str) -> Iterator[Row]:
    positive = name == "repetition"
    for label, bad in (("None", None), ("'1.3'", "1.3"), ("[1.3]", [1.3]), ("True", True)):
        yield raises(f"{name} = {label}", setter(**{name: bad}), TYPE, name)
    yield from float_value_rows(name, (math.nan, math.inf, -math.inf) + ((0.0, -1.0, -0.0) if positive else ()))
    yield raises(f"{name} = 10**400 (an int no float holds)", setter(**{name: 10**400}), VALUE, name)
    yield raises(f"{name} = 2**128 (inf in float32)", setter(**{name: 2**128}), VALUE, name)
    yield raises(f"{name} = -1e39 (-inf in float32)", setter(**{name: -1e39}), VALUE, name)
    yield succeeds(f"{name} = 2**64 (a huge int)", setter(**{name: 2**64}))
    if positive:
        yield raises("repetition = -(2**64)", setter(repetition=-(2**64)), VALUE, name)
        yield succeeds("repetition = FLT_MAX (negative logits -> -inf)", setter(repetition=FLT_MAX))
        yield succeeds("repetition = 1e-40 (a float32 subnormal; positive logits -> inf)", setter(repetition=1e-40))
        # Positive in float64 but 0 in float32: the op checks scalars itself ("Scalars are
        # checked here"), so this must be refused on every device like repetition = 0.
        yield raises("repetition = 1e-46 (0 in float32)", setter(repetition=1e-46), VALUE, name)
    else:
        yield succeeds(f"{name} = -(2**64)", setter(**{name: -(2**64)}))
        yield succeeds(f"{name} = 1e-46 (0 in float32)", setter(**{name: 1e-46}))
    yield succeeds(f"{name} = 2 (an int)", setter(**{name: 2}))

    # float32 [batch] tensors.
    per_row = lambda: torch.tensor(PEN_PER_ROW[name])  # noqa: E731
    yield succeeds(f"{name} per-row tensor", setter(**{name: per_row()}))
    for dtype in (torch.float64, torch.float16, torch.int64):
        yield raises(f"{name} {dtype} tensor", lambda a, d=dtype: a.update({name: per_row().to(d)}), TYPE, name)
    yield raises(f"{name} [batch + 1]", lambda a: a.update({name: torch.ones(PEN_BATCH + 1)}), VALUE, name)
    yield raises(f"{name} [batch, 1]", lambda a: a.update({name: per_row().unsqueeze(1)}), VALUE, name)
    yield raises(f"{name} 0-dim tensor", lambda a: a.update({name: torch.tensor(1.0)}), VALUE, name)
    yield raises(f"{name} meta tensor", lambda a: a.update({name: per_row().to("meta")}), VALUE, name)
    yield raises(f"{name} inner stride 2", lambda a: a.update({name: non_unit_inner(per_row())}), VALUE, name)
    yield raises(f"{name} expanded (stride 0)", lambda a: a.update({name: torch.tensor([1.0]).expand(PEN_BATCH)}), VALUE, name)
    bad = (math.nan, math.inf, -math.inf) + ((0.0, -1.0) if positive else ())
    for value in bad:  # CPU: ValueError; CUDA: row 1 uses the no-op value (the spec's reference)
        yield checked_on_cpu_clamped_on_cuda(f"{name} tensor with {value!r} in row 1",
                                             lambda a, v=value: a.update({name: per_row().index_fill_(0, torch.tensor(1), v)}),
                                             name)


@table("apply_penalties")
def penalties_ids_rows(spec: OpSpec) -> Iterator[Row]:
    # logits [batch, vocab] float, unit last stride, rows not overlapping (written in place).
    yield from tensor_kind_rows("logits")
    yield from dtype_rows("logits", *FLOAT_BAD, torch.bool)
    yield from rank_rows("logits")
    yield from meta_rows("logits")
    yield from stride_rows("logits")
    yield from expanded_rows("logits")
    yield raises("logits rows overlap (row stride 16 < vocab 32)",
                 lambda a: a.update(logits=randn(80).as_strided((PEN_BATCH, PEN_VOCAB), (16, 1))), VALUE, "logits")
    yield from shape_rows("logits", 0, names=("token_ids",))
    for dtype in (torch.float16, torch.bfloat16):
        yield succeeds(f"logits {dtype}", lambda a, d=dtype: a.update(logits=a["logits"].to(d)))
    yield succeeds("logits row stride 40 (a slice)", lambda a: a.update(logits=randn(PEN_BATCH, 40, scale=3.0)[:, :PEN_VOCAB]))
    yield succeeds("logits holding inf, -inf and NaN at penalized tokens",
                   lambda a: a["logits"].__setitem__((0, [3, 7, 31, 0]), torch.tensor([math.inf, -math.inf, math.nan, 0.0])))

    yield from penalties_source_rows("token_ids")
    yield succeeds("token_ids int32", lambda a: a.update(token_ids=a["token_ids"].int()))
    yield succeeds("token_ids all padding", lambda a: a["token_ids"].fill_(-1))
    yield succeeds("token_ids padding -(2**63)", set_entry("token_ids", (0, 0), -(2**63)))
    yield succeeds("token_ids int32 padding -(2**31)", lambda a: (a.update(token_ids=a["token_ids"].int()),
                                                                  a["token_ids"].__setitem__((0, 0), -(2**31))))
    yield succeeds("token_ids one token 500 times", lambda a: a.update(token_ids=torch.full((PEN_BATCH, 500), 17)))
    yield succeeds("token_ids no columns", lambda a: a.update(token_ids=torch.empty(PEN_BATCH, 0, dtype=torch.long)))
    yield succeeds("empty batch", lambda a: a.update(logits=torch.empty(0, PEN_VOCAB),
                                                      token_ids=torch.empty(0, 6, dtype=torch.long)))
    yield succeeds("empty vocab, token_ids all padding", lambda a: a.update(logits=torch.empty(PEN_BATCH, 0),
                                                                            token_ids=torch.full((PEN_BATCH, 6), -1)))
    # vocab 0: every id >= 0 is out of range (embedding's "table empty vocab" raises too).
    yield raises("empty vocab, token_ids[0, 0] = 0", lambda a: a.update(logits=torch.empty(PEN_BATCH, 0),
                                                                        token_ids=torch.tensor([[0, -1]] * PEN_BATCH)),
                 VALUE, "token_ids")

    def slices(a):  # around CUDA's id-histogram slices (8192 tokens each), batch 2
        a.update(logits=randn(2, 20000, scale=3.0), repetition=1.5,
                 token_ids=torch.tensor([[0, 8191, 8192, 8192, 16383, 16384, 19999, -1],
                                         [8191, 8191, 8191, 1, 12000, 19998, 16384, 2]]))

    yield succeeds("vocab 20000, ids at the slice edges", slices)

    # Out-of-range ids, at token_ids[1, 0] (flattened index 6).
    for value in (PEN_VOCAB, 2**62, 2**63 - 1):
        yield from penalties_bad_rows(f"token_ids[1, 0] = {value}", set_entry("token_ids", (1, 0), value),
                                      "token_ids", 6, value)
    yield from penalties_bad_rows(
        "token_ids int32, [1, 0] = 2**31 - 1",
        lambda a: (a.update(token_ids=a["token_ids"].int()), a["token_ids"].__setitem__((1, 0), 2**31 - 1)),
        "token_ids", 6, 2**31 - 1)
    if on_cuda():  # several bad ids: the record keeps whichever came first, so only check=True
        yield Row("token_ids all out of range", lambda a: a["token_ids"].fill_(PEN_VOCAB),
                  Raises(VALUE, ("token_ids",), written=penalties_reference))
    else:
        yield raises("token_ids all out of range", lambda a: a["token_ids"].fill_(PEN_VOCAB), VALUE, "token_ids")

    for name in PEN_PARAMS:
        yield from penalty_param_rows(name)
    yield from flag_kind_rows("check")
    yield succeeds("check = 0", setter(check=0))
    yield succeeds("repetition, frequency and presence one tensor (all read)",
                   lambda a: a.update(dict.fromkeys(PEN_PARAMS, torch.full((PEN_BATCH,), 0.5))))

    # Aliasing: logits is written; token_ids and the per-row tensors are read.
    yield raises("token_ids is logits' bytes", lambda a: a.update(token_ids=a["logits"].view(torch.int32)[:, :6]),
                 VALUE, "logits", "token_ids")
    yield raises("token_ids int64 view of logits' bytes",
                 lambda a: a.update(token_ids=a["logits"].view(torch.int64)[:, :6]), VALUE, "logits", "token_ids")
    for name in PEN_PARAMS:
        yield raises(f"{name} is logits' first 4 elements", lambda a, n=name: a.update({n: a["logits"].view(-1)[:4]}),
                     VALUE, "logits", name)
        yield raises(f"{name} is logits[2, 30:34] of a wider buffer (2 in logits, 2 in its row gap)",
                     lambda a, n=name: (lambda b: a.update(logits=b[:, :PEN_VOCAB], **{n: b.view(-1)[98:102]}))(
                         randn(PEN_BATCH, PEN_VOCAB + 2, scale=3.0)), VALUE, "logits", name)

    def params_in_gap(a):  # in the gap after logits' row 0: the byte ranges intersect, no overlap
        b = randn(PEN_BATCH, PEN_VOCAB + 12, scale=3.0)
        b[0, PEN_VOCAB:] = torch.tensor([1.3] * 4 + [0.2] * 4 + [0.5] * 4)
        a.update(logits=b[:, :PEN_VOCAB], repetition=b[0, 32:36], frequency=b[0, 36:40], presence=b[0, 40:44])

    yield succeeds("repetition, frequency, presence in the row gap of logits (disjoint)", params_in_gap)

    def ids_in_gap(a):  # logits and token_ids interleaved in one int32 buffer
        b = torch.empty(PEN_BATCH, PEN_VOCAB + 6, dtype=torch.int32)
        b[:, :PEN_VOCAB] = randn(PEN_BATCH, PEN_VOCAB, scale=3.0).view(torch.int32)
        b[:, PEN_VOCAB:] = a["token_ids"]
        a.update(logits=b[:, :PEN_VOCAB].view(torch.float32), token_ids=b[:, PEN_VOCAB:])

    yield succeeds("logits and token_ids interleaved in one buffer (disjoint)", ids_in_gap)


@table("apply_penalties (counts_or_mask)")
def penalties_counts_rows(spec: OpSpec) -> Iterator[Row]:
    yield from shape_rows("logits", 0, 1, names=("counts_or_mask",))
    yield from penalties_source_rows("counts_or_mask")
    yield succeeds("counts_or_mask int64", lambda a: a.update(counts_or_mask=a["counts_or_mask"].long()))
    yield succeeds("counts_or_mask bool", lambda a: a.update(counts_or_mask=a["counts_or_mask"] > 0))
    yield succeeds("counts_or_mask bool with a byte of 2 (True counts as 1)", lambda a: a.update(
        counts_or_mask=a["counts_or_mask"].to(torch.uint8).mul_(2).view(torch.bool)))
    yield succeeds("counts_or_mask all 0", lambda a: a["counts_or_mask"].zero_())
    yield succeeds("counts_or_mask int64 2**63 - 1", lambda a: (a.update(counts_or_mask=a["counts_or_mask"].long()),
                                                                 a["counts_or_mask"].__setitem__((0, 3), 2**63 - 1)))
    yield succeeds("counts_or_mask int32 2**31 - 1", set_entry("counts_or_mask", (0, 3), 2**31 - 1))
    yield succeeds("frequency = 3e38, counts 2 (-> -inf)",
                   lambda a: a.update(frequency=3e38, counts_or_mask=torch.full((PEN_BATCH, PEN_VOCAB), 2, dtype=torch.int32)))
    yield succeeds("empty batch", lambda a: a.update(logits=torch.empty(0, PEN_VOCAB),
                                                      counts_or_mask=torch.empty(0, PEN_VOCAB, dtype=torch.int32)))
    yield succeeds("empty vocab", lambda a: a.update(logits=torch.empty(PEN_BATCH, 0),
                                                      counts_or_mask=torch.empty(PEN_BATCH, 0, dtype=torch.int32)))
    yield succeeds("logits float16, counts_or_mask bool",
                   lambda a: a.update(logits=a["logits"].half(), counts_or_mask=a["counts_or_mask"] > 0))

    def slices(a):  # around CUDA's count slices (4096 tokens each), batch 2
        c = torch.zeros(2, 9000, dtype=torch.int32)
        c[:, [0, 4095, 4096, 8191, 8192, 8999]] = torch.tensor([1, 2, 3, 1, 2, 5], dtype=torch.int32)
        a.update(logits=randn(2, 9000, scale=3.0), counts_or_mask=c, presence=1.5)

    yield succeeds("vocab 9000, counts at the slice edges", slices)

    # Negative counts, at counts_or_mask[1, 5] (flattened index 37).
    for value in (-1, -(2**63)):
        yield from penalties_bad_rows(f"counts_or_mask[1, 5] = {value}", lambda a, v=value: (
            a.update(counts_or_mask=a["counts_or_mask"].long()), a["counts_or_mask"].__setitem__((1, 5), v)),
            "counts_or_mask", 37, value)
    yield from penalties_bad_rows("counts_or_mask int32 [1, 5] = -(2**31)",
                                  set_entry("counts_or_mask", (1, 5), -(2**31)), "counts_or_mask", 37, -(2**31))
    yield from penalties_bad_rows("counts_or_mask row stride 40, [1, 5] = -1", lambda a: (
        a.update(counts_or_mask=torch.cat([a["counts_or_mask"], a["counts_or_mask"][:, :8]], 1)[:, :PEN_VOCAB]),
        a["counts_or_mask"].__setitem__((1, 5), -1)), "counts_or_mask", 37, -1)

    # Per-row tensor values are judged the same way for either source.
    for value in (math.nan, 0.0):
        yield checked_on_cpu_clamped_on_cuda(f"repetition tensor with {value!r} in row 1", lambda a, v=value: a.update(
            repetition=torch.tensor(PEN_PER_ROW["repetition"]).index_fill_(0, torch.tensor(1), v)), "repetition")
    yield checked_on_cpu_clamped_on_cuda("frequency tensor with inf in row 1", lambda a: a.update(
        frequency=torch.tensor(PEN_PER_ROW["frequency"]).index_fill_(0, torch.tensor(1), math.inf)), "frequency")

    # Aliasing.
    yield raises("counts_or_mask is logits' bytes", lambda a: a.update(counts_or_mask=a["logits"].view(torch.int32)),
                 VALUE, "logits", "counts_or_mask")
    yield raises("repetition is logits' first 4 elements", lambda a: a.update(repetition=a["logits"].view(-1)[:4]),
                 VALUE, "logits", "repetition")

    def counts_in_gap(a):  # logits and counts interleaved in one int32 buffer
        b = torch.empty(PEN_BATCH, 2 * PEN_VOCAB, dtype=torch.int32)
        b[:, :PEN_VOCAB] = randn(PEN_BATCH, PEN_VOCAB, scale=3.0).view(torch.int32)
        b[:, PEN_VOCAB:] = a["counts_or_mask"]
        a.update(logits=b[:, :PEN_VOCAB].view(torch.float32), counts_or_mask=b[:, PEN_VOCAB:])

    yield succeeds("logits and counts_or_mask interleaved in one buffer (disjoint)", counts_in_gap)

    def counts_shifted(a):  # the same buffer, counts starting one element into logits' last row
        b = torch.zeros(PEN_BATCH * PEN_VOCAB * 2, dtype=torch.int32)
        a.update(logits=b[:128].view(torch.float32).view(PEN_BATCH, PEN_VOCAB),
                 counts_or_mask=b[97:225].view(PEN_BATCH, PEN_VOCAB))

    yield raises("counts_or_mask overlaps logits' last row", counts_shifted, VALUE, "logits", "counts_or_mask")


# ----------------------------------------------------------------------------- decode_attention
# q [2, 4, 64], caches [6 blocks, block_size 4, 2 kv heads, 64], block_table int32 [2, 3] =
# [[2, 5, -1], [3, 0, 1]] (request 0 reads 2 blocks; its third entry is unused padding), seq_lens
# [5, 9] (capacity 3 * 4 = 12). Request 1's last block, block_table[1, 2], holds token 8 only.
# The CPU table runs float32; the CUDA table builds the same case in float16 (the tensor-core
# kernels; float32 runs a plain kernel there, one row below).

DECODE_BLOCKS, DECODE_CAPACITY = 6, 12


def attn_dtype() -> torch.dtype:
    """The dtype of the table's valid decode_attention case (read while the table is built)."""
    return torch.float16 if on_cuda() else torch.float32


def other_attn_dtype() -> torch.dtype:
    """A float dtype the device takes that is not attn_dtype() (a cache of another dtype than q)."""
    return torch.bfloat16 if on_cuda() else torch.float16


def _decode_valid(dtype: torch.dtype) -> dict[str, Any]:
    case = registry.cases("decode_attention").make_paged_case(
        [5, 9], num_heads=4, num_kv_heads=2, head_dim=64, block_size=4, dtype=dtype, gen=seeded(0),
        spare_blocks=1, spare_columns=0)
    return {"q": case.q, "k_cache": case.k_cache, "v_cache": case.v_cache, "block_table": case.block_table,
            "seq_lens": case.seq_lens, "return_lse": True, "out": torch.zeros(2, 4, 64, dtype=dtype), "check": False}


def per_head_scale(scale, num_kv_heads: int, device) -> torch.Tensor:
    """A float8 cache scale argument (None, a float, a tensor of 1 or num_kv_heads) per kv head."""
    if scale is None:
        return torch.ones(num_kv_heads, dtype=torch.float64, device=device)
    if isinstance(scale, torch.Tensor):
        return scale.double().to(device).reshape(-1).expand(num_kv_heads)
    return torch.full((num_kv_heads,), float(scale), dtype=torch.float64, device=device)


def dequantized(a: dict[str, Any], cache: str, scale: str) -> Any:
    """A float8 cache as the float64 values it stands for (times its scale); others as they are."""
    c = a[cache]
    if c.dtype != torch.float8_e4m3fn:
        return c
    return c.double() * per_head_scale(a.get(scale), c.shape[2], c.device).view(1, 1, -1, 1)


def decode_reference(a: dict[str, Any], **override) -> Any:
    """The float64 (out, lse) of these arguments (out alone without return_lse); `override`
    replaces arguments first (e.g. the seq_lens CUDA clamps to). Float8 caches are dequantized."""
    a = {**a, **override}
    a = {**a, "k_cache": dequantized(a, "k_cache", "k_scale"), "v_cache": dequantized(a, "v_cache", "v_scale")}
    out, lse = ref("decode_attention", "ref_decode_attention")(
        a["q"], a["k_cache"], a["v_cache"], a["block_table"], a["seq_lens"], scale=a.get("scale"),
        sliding_window=a.get("sliding_window", -1), logits_soft_cap=a.get("logits_soft_cap", 0.0))
    return (out, lse) if a.get("return_lse", False) else out


def _decode_spec() -> OpSpec:
    dtype = attn_dtype()
    return OpSpec(
        "decode_attention", "decode_attention", mk.decode_attention,
        valid=lambda: _decode_valid(dtype),
        written=("out",),
        reference=decode_reference,
        verify_order=("q", "k_cache", "v_cache", "block_table", "seq_lens", "out"),
        # float16 on CUDA: out within tests/kernels/test_decode_attention.py's OUT_TOL, and the
        # float32 lse (from float16 inputs) within its LSE_TOL. The CPU's float32 keeps the defaults.
        tolerance={torch.float16: (2e-3, 8e-3), torch.float32: (2e-3, 1e-3)} if dtype == torch.float16 else None,
    )


def with_seq_len(request: int, length: int) -> Callable[[dict[str, Any]], dict[str, torch.Tensor]]:
    """The arguments with seq_lens[request] = length (a copy)."""

    def override(a):
        lens = a["seq_lens"].clone()
        lens[request] = length
        return {"seq_lens": lens}

    return override


def decode_masked(override: Callable[[dict[str, Any]], dict[str, torch.Tensor]], written: bool = False):
    """CUDA with a bad index: the reference of what the kernel computes instead (a bad block's
    keys masked, a bad seq_len clamped), as `override` describes it; `written`: {"out": ...} for
    a checked call that raised after its kernel ran."""

    def reference(a):
        result = decode_reference(a, **override(a))
        if written:
            return {"out": (result[0] if isinstance(result, tuple) else result).to(a["out"].dtype)}
        return result

    return reference


def float_kind_rows(name: str) -> Iterator[Row]:
    """A tensor or a str for a float argument (TypeError naming it)."""
    yield raises(f"{name}: tensor for a number", setter(**{name: torch.ones(1)}), TYPE, name)
    yield raises(f"{name}: str for a number", setter(**{name: "7"}), TYPE, name)


def flag_kind_rows(name: str) -> Iterator[Row]:
    for label, bad in (("'no'", "no"), ("None", None), ("2", 2)):
        yield raises(f"{name} = {label}", setter(**{name: bad}), TYPE, name)


@table("decode_attention")
def decode_rows(spec: OpSpec) -> Iterator[Row]:
    dtype, other = attn_dtype(), other_attn_dtype()

    # q: kinds, dtypes, ranks, strides, meta.
    yield from common_tensor_rows("q", FLOAT_BAD)
    yield from dtype_rows("q", torch.bool)
    yield raises("q 4-D [1, B, H, D]", lambda a: a.update(q=a["q"].unsqueeze(0)), VALUE, "q")
    yield raises("q head_dim 96", lambda a: a.update(q=randn(2, 4, 96, dtype=dtype), out=torch.zeros(2, 4, 96, dtype=dtype),
                                                      k_cache=randn(6, 4, 2, 96, dtype=dtype, seed=1),
                                                      v_cache=randn(6, 4, 2, 96, dtype=dtype, seed=2)),
                 VALUE, "head_dim", "q")
    yield raises("q 3 heads, 2 kv heads (not a multiple)",
                 lambda a: a.update(q=a["q"][:, :3], out=torch.zeros(2, 3, 64, dtype=dtype)), VALUE, "q", "k_cache")
    yield raises("q head_dim 65 (one more than the caches)", lambda a: a.update(q=resize(a["q"], 2, 1)), VALUE, "k_cache", "q")

    def all_to(d: torch.dtype) -> Callable[[dict[str, Any]], None]:
        return lambda a: a.update({n: a[n].to(d) for n in ("q", "k_cache", "v_cache", "out")})

    yield succeeds("q, caches and out float32", all_to(torch.float32))
    if on_cuda():  # CUDA's float32 kernel is a plain one: no float8 cache behind a float32 q
        yield raises("float32 q and out, float8 caches",
                     lambda a: (all_to(torch.float32)(a), a.update(k_cache=a["k_cache"].to(torch.float8_e4m3fn),
                                                                   v_cache=a["v_cache"].to(torch.float8_e4m3fn))),
                     TYPE, "k_cache")
    for d in (torch.float16, torch.bfloat16):
        yield succeeds(f"q, caches and out {d}", all_to(d))

    # k_cache, v_cache [num_blocks, block_size, KH, D]: any block stride, the rest contiguous.
    for name in ("k_cache", "v_cache"):
        yield from common_tensor_rows(name, FLOAT_BAD)
        yield raises(f"{name} of another float dtype than q", lambda a, n=name: a.update({n: a[n].to(other)}), TYPE, name)
        yield raises(f"{name} transposed within a block (block_size <-> heads)",
                     lambda a, n=name: a.update({n: a[n].transpose(1, 2).contiguous().transpose(1, 2)}), VALUE, name)
    yield from shape_rows("k_cache", 0, 1, 2, 3, names=("k_cache",))  # blocks, block_size, heads vs v_cache; D vs q
    yield from shape_rows("v_cache", 0, 1, 2, 3, names=("v_cache",))
    yield raises("caches with block_size 0", lambda a: a.update(k_cache=torch.zeros(6, 0, 2, 64, dtype=dtype),
                                                                v_cache=torch.zeros(6, 0, 2, 64, dtype=dtype)),
                 VALUE, "block_size", "k_cache")
    yield raises("caches with 0 kv heads", lambda a: a.update(k_cache=torch.zeros(6, 4, 0, 64, dtype=dtype),
                                                              v_cache=torch.zeros(6, 4, 0, 64, dtype=dtype)),
                 VALUE, "k_cache")

    # block_table int32 [B, max_blocks] (any row stride), seq_lens int32 [B] contiguous.
    yield from common_tensor_rows("block_table", INDEX_BAD)
    yield from dtype_rows("block_table", torch.int64)
    yield raises("block_table [B + 1, 3]", lambda a: a.update(block_table=resize(a["block_table"], 0, 1)), VALUE, "block_table")
    yield from common_tensor_rows("seq_lens", INDEX_BAD, strides=False)
    yield from dtype_rows("seq_lens", torch.int64)
    yield raises("seq_lens [B + 1]", lambda a: a.update(seq_lens=torch.tensor([5, 9, 1], dtype=torch.int32)), VALUE, "seq_lens")
    yield raises("seq_lens inner stride 2", lambda a: a.update(seq_lens=non_unit_inner(a["seq_lens"])), VALUE, "seq_lens")
    yield from expanded_rows("seq_lens")

    # Bad indices among what a request reads. The CPU raises before writing (out untouched).
    # CUDA never reads out of bounds and does not sync unless check=True: a bad block's keys are
    # masked, a bad seq_len is clamped into [0, 12], and the device-error record holds the first
    # offender (pop_decode_attention_error: a message; kernels/decode_attention/__init__.py).
    # check=True reads it after the kernel and raises ValueError, out already written.
    bad_index_cases = [(f"block_table[1, 2] = {v}", set_entry("block_table", (1, 2), v), "block_table",
                        f"block_table[1, 2] = {v} ", with_seq_len(1, 8))  # block 2 holds token 8 only
                       for v in (-1, DECODE_BLOCKS, 2**31 - 1)]
    bad_index_cases += [(f"seq_lens[1] = {v}", set_entry("seq_lens", 1, v), "seq_lens", f"seq_lens[1] = {v} ",
                         with_seq_len(1, min(max(v, 0), DECODE_CAPACITY)))
                        for v in (DECODE_CAPACITY + 1, 2**31 - 1, -1, -(2**31))]
    for label, mutate, name, message, clamped in bad_index_cases:
        checked = lambda a, mutate=mutate: (mutate(a), a.update(check=True))  # noqa: E731
        if not on_cuda():
            yield raises(label, mutate, VALUE, name)
            yield raises(f"{label}, check=True", checked, VALUE, name)
        else:
            yield Row(label, mutate, Succeeds(recorded=("decode_attention", message)), decode_masked(clamped))
            yield Row(f"{label}, check=True", checked, Raises(VALUE, (name,), written=decode_masked(clamped, written=True)))
    label, mutate = "block_table[0, 1] = -1 (request 0's last block)", set_entry("block_table", (0, 1), -1)
    if not on_cuda():
        yield raises(label, mutate, VALUE, "block_table")
    else:  # block 1 of request 0 holds its token 4 only
        yield Row(label, mutate, Succeeds(recorded=("decode_attention", "block_table[0, 1] = -1 ")),
                  decode_masked(with_seq_len(0, 4)))
    # Entries no request reads may hold anything: padding past a request's blocks, blocks before
    # its sliding window.
    yield succeeds("block_table[0, 2] = -5 (unused padding)", set_entry("block_table", (0, 2), -5))
    yield succeeds("block_table[0, 2] = 2**31 - 1 (unused padding)", set_entry("block_table", (0, 2), 2**31 - 1))
    yield succeeds("block_table[1, 0] = -7 before a sliding window of 4 (unread)",
                   set_entry("block_table", (1, 0), -7, sliding_window=4))

    # out: written (contiguous, q's shape and dtype); None allocates.
    for label, bad in (("str", "tensor"), ("float", 1.5), ("list", [1.0, 2.0])):
        yield raises(f"out: {label} for a tensor", setter(out=bad), TYPE, "out")
    yield from dtype_rows("out", *FLOAT_BAD)
    yield raises("out of another float dtype than q", lambda a: a.update(out=a["out"].to(other)), TYPE, "out")
    yield from shape_rows("out", 0, 1, 2, names=("out",))
    yield from rank_rows("out")
    yield from meta_rows("out")
    yield from stride_rows("out")
    yield from expanded_rows("out")
    yield raises("out is q", lambda a: a.update(out=a["q"]), VALUE, "out", "q")

    def out_shifted_q(a):
        buf = torch.zeros(9 * 64, dtype=dtype)
        buf[64:] = a["q"].reshape(-1)
        a.update(out=buf[:512].view(2, 4, 64), q=buf[64:].view(2, 4, 64))

    yield raises("out overlaps q (shifted by one head)", out_shifted_q, VALUE, "out", "q")
    yield raises("out is block 0 of k_cache", lambda a: a.update(out=a["k_cache"][:1].view(2, 4, 64)), VALUE, "out", "k_cache")
    yield raises("out is block 5 of v_cache", lambda a: a.update(out=a["v_cache"][5:].view(2, 4, 64)), VALUE, "out", "v_cache")
    yield succeeds("out = None (allocated)", setter(out=None))

    # Numbers.
    yield from float_kind_rows("scale")
    yield from float_value_rows("scale", (0.0, -0.125, math.nan, math.inf, -math.inf))
    yield raises("scale = 10**400 (an int no float holds)", setter(scale=10**400), VALUE, "scale")
    yield raises("scale = 1e39 (inf in float32)", setter(scale=1e39), VALUE, "scale")
    yield raises("scale = 1e-46 (0 in float32)", setter(scale=1e-46), VALUE, "scale")
    yield succeeds("scale = None (head_dim ** -0.5)", setter(scale=None))
    yield succeeds("scale = 1e30 (huge logits)", setter(scale=1e30))
    yield succeeds("scale = 1e-30 (uniform weights)", setter(scale=1e-30))
    for label, bad in (("None", None), ("'7'", "7"), ("1.5", 1.5), ("a tensor", torch.ones(1))):
        yield raises(f"sliding_window = {label}", setter(sliding_window=bad), TYPE, "sliding_window")
    yield from huge_int_rows("sliding_window")
    for window in (1, 4, 0, -5, 2**62):
        yield succeeds(f"sliding_window = {window}", setter(sliding_window=window))
    yield from float_kind_rows("logits_soft_cap")
    yield raises("logits_soft_cap = None", setter(logits_soft_cap=None), TYPE, "logits_soft_cap")
    yield from float_value_rows("logits_soft_cap", (-1.0, math.nan, math.inf, -math.inf))
    yield raises("logits_soft_cap = 1e39 (inf in float32)", setter(logits_soft_cap=1e39), VALUE, "logits_soft_cap")
    yield raises("logits_soft_cap = 1e-46 (0 in float32: would turn the cap off)", setter(logits_soft_cap=1e-46),
                 VALUE, "logits_soft_cap")
    yield succeeds("logits_soft_cap = 0 (off)", setter(logits_soft_cap=0.0))
    yield succeeds("logits_soft_cap = 30, scale = 1e30 (capped huge logits)", setter(logits_soft_cap=30.0, scale=1e30))
    yield from flag_kind_rows("return_lse")
    yield succeeds("return_lse = False (out only)", setter(return_lse=False))
    yield from flag_kind_rows("check")
    yield succeeds("check = True (nothing recorded)", setter(check=True))
    for label, bad in (("'2'", "2"), ("1.5", 1.5), ("True", True)):
        yield raises(f"num_splits = {label}", setter(num_splits=bad), TYPE, "num_splits")
    for bad in (0, -1, 129, 2**64):
        yield raises(f"num_splits = {bad}", setter(num_splits=bad), VALUE, "num_splits")
    for splits in (1, 2, 128):  # 128 chunks of 9 keys: most of them empty
        yield succeeds(f"num_splits = {splits}", setter(num_splits=splits))
    for label, bad in (("None", None), ("'2'", "2"), ("1.5", 1.5)):
        yield raises(f"num_threads = {label}", setter(num_threads=bad), TYPE, "num_threads")
    yield from huge_int_rows("num_threads")
    # CUDA ignores num_threads, but refuses a negative count as the CPU does.
    yield raises("num_threads = -1", setter(num_threads=-1), VALUE, "num_threads")
    for threads in (0, 4, 2**40):
        yield succeeds(f"num_threads = {threads}", setter(num_threads=threads))

    # Float8 caches and their scales (include/mllm_kernel/cache_scale.hpp).
    f8 = torch.float8_e4m3fn


    yield succeeds("float8 caches, no scales", fp8_caches())
    yield succeeds("float8 caches, float scales", fp8_caches(0.5, 2.0))
    yield succeeds("float8 caches, per-head scale tensors", fp8_caches(lambda: torch.tensor([0.5, 0.25]),
                                                                 lambda: torch.tensor([2.0, 1.5])))
    yield succeeds("float8 caches, 0-d and [1] scale tensors", fp8_caches(lambda: torch.tensor(0.5), lambda: torch.tensor([3.0])))
    yield succeeds("float8 caches, a strided per-head scale", fp8_caches(lambda: torch.tensor([0.5, 9.0, 0.25])[::2]))
    yield succeeds("float8 caches, split", fp8_caches(0.5, 2.0, num_splits=2))
    yield raises("k_cache float8, v_cache not", lambda a: a.update(k_cache=a["k_cache"].to(f8)), TYPE, "v_cache")
    yield raises("v_cache float8, k_cache not", lambda a: a.update(v_cache=a["v_cache"].to(f8)), TYPE, "v_cache")
    yield raises("k_cache float8_e5m2", lambda a: a.update(k_cache=a["k_cache"].to(torch.float8_e5m2),
                                                           v_cache=a["v_cache"].to(torch.float8_e5m2)), TYPE, "k_cache")
    for name in ("k_scale", "v_scale"):
        yield raises(f"{name} for a cache of q's dtype", setter(**{name: 0.5}), VALUE, name)
        yield raises(f"{name} tensor for a cache of q's dtype", setter(**{name: torch.ones(2)}), VALUE, name)
        for label, bad in (("nan", math.nan), ("inf", math.inf), ("0", 0.0), ("-1", -1.0), ("1e39 (inf in float32)", 1e39),
                           ("1e-46 (0 in float32)", 1e-46)):
            yield raises(f"float8 caches, {name} = {label}", fp8_caches(**{name: bad}), VALUE, name)
        yield raises(f"float8 caches, {name} of 3 elements (2 kv heads)", fp8_caches(**{name: lambda: torch.ones(3)}), VALUE, name)
        yield raises(f"float8 caches, {name} [2, 1]", fp8_caches(**{name: lambda: torch.ones(2, 1)}), VALUE, name)
        yield raises(f"float8 caches, {name} float64", fp8_caches(**{name: lambda: torch.ones(2, dtype=torch.float64)}), TYPE, name)
        yield raises(f"float8 caches, {name} = '1'", fp8_caches(**{name: "1"}), TYPE, name)
        yield raises(f"float8 caches, {name} = True", fp8_caches(**{name: True}), TYPE, name)
        if on_cuda():
            yield Row(f"float8 caches, {name} on the CPU", fp8_caches(**{name: lambda: torch.ones(2)}), Raises(VALUE, (name,)),
                      placement=(CUDA0, {name: "cpu"}))

    # Layouts and edge cases that must work.
    def fused_kv(a):  # one [num_blocks, 2, block_size, KH, D] cache: K and V interleaved per block
        kv = torch.stack([a["k_cache"], a["v_cache"]], 1)
        a.update(k_cache=kv[:, 0], v_cache=kv[:, 1])

    yield succeeds("k_cache, v_cache halves of one [blocks, 2, bs, KH, D] tensor (block stride)", fused_kv)

    def fused_q(a):  # q = heads 0..3 of a fused [B, (H + 2 KH) * D] qkv projection
        qkv_rows = torch.zeros(2, 8 * 64, dtype=dtype)
        qkv_rows[:, :256] = a["q"].reshape(2, 256)
        qkv_rows[:, 256:] = randn(2, 256, dtype=dtype, seed=5)
        a.update(q=qkv_rows[:, :256].view(2, 4, 64))

    yield succeeds("q a slice of a fused qkv tensor (batch stride)", fused_q)

    def wide_table(a):
        wide = torch.full((2, 5), -9, dtype=torch.int32)
        wide[:, :3] = a["block_table"]
        a.update(block_table=wide[:, :3])

    yield succeeds("block_table a column slice of a wider table (row stride 5)", wide_table)
    yield succeeds("block_table expanded rows (both requests read row 0)",
                   lambda a: a.update(block_table=expanded(a["block_table"]), seq_lens=torch.tensor([5, 8], dtype=torch.int32)))
    yield succeeds("q expanded (read only)", lambda a: a.update(q=expanded(a["q"])))
    yield succeeds("k_cache expanded blocks (block stride 0, read only)", lambda a: a.update(k_cache=expanded(a["k_cache"])))
    yield succeeds("v_cache is k_cache (both read)", lambda a: a.update(v_cache=a["k_cache"]))
    yield succeeds("q is a view of k_cache (both read)", lambda a: a.update(q=a["k_cache"][:1].view(2, 4, 64)))
    yield succeeds("seq_lens all 0 (out 0, lse -inf)", lambda a: a["seq_lens"].zero_())
    yield succeeds("seq_lens [0, 12] (nothing; a full table row)",
                   lambda a: a.update(seq_lens=torch.tensor([0, 12], dtype=torch.int32)))
    yield succeeds("empty batch", lambda a: a.update(q=torch.empty(0, 4, 64, dtype=dtype), out=torch.empty(0, 4, 64, dtype=dtype),
                                                      block_table=torch.empty(0, 3, dtype=torch.int32),
                                                      seq_lens=torch.empty(0, dtype=torch.int32)))
    yield succeeds("no query heads",
                   lambda a: a.update(q=torch.empty(2, 0, 64, dtype=dtype), out=torch.empty(2, 0, 64, dtype=dtype)))
    yield succeeds("block_table without columns, seq_lens 0",
                   lambda a: a.update(block_table=torch.empty(2, 0, dtype=torch.int32), seq_lens=torch.zeros(2, dtype=torch.int32)))
    yield succeeds("caches without blocks, seq_lens 0",
                   lambda a: a.update(k_cache=torch.empty(0, 4, 2, 64, dtype=dtype), v_cache=torch.empty(0, 4, 2, 64, dtype=dtype),
                                      seq_lens=torch.zeros(2, dtype=torch.int32)))


# ----------------------------------------------------------------------------- merge_attention_states


def _merge_spec() -> OpSpec:
    return OpSpec(
        "merge_attention_states", "merge_attention_states", mk.merge_attention_states,
        valid=lambda: {"v_a": randn(3, 4, 64), "lse_a": randn(3, 4, seed=1, scale=3.0),
                       "v_b": randn(3, 4, 64, seed=2), "lse_b": randn(3, 4, seed=3, scale=3.0)},
        reference=lambda a: ref("decode_attention", "ref_merge_attention_states")(a["v_a"], a["lse_a"], a["v_b"], a["lse_b"]),
        verify_order=("v_a", "v_b", "lse_a", "lse_b"),
    )


@table("merge_attention_states")
def merge_rows(spec: OpSpec) -> Iterator[Row]:
    for name in ("v_a", "v_b"):
        yield from common_tensor_rows(name, FLOAT_BAD)
        yield from shape_rows(name, 0, 1, 2, names=("v_a", "v_b") if name == "v_a" else ("v_b",))  # v_b checked against v_a
    yield raises("v_b float16, v_a float32", lambda a: a.update(v_b=a["v_b"].half()), TYPE, "v_b")
    yield raises("v_a bfloat16, v_b float16", lambda a: a.update(v_a=a["v_a"].bfloat16(), v_b=a["v_b"].half()), TYPE, "v_b")
    yield raises("v_a 1-D", lambda a: a.update(v_a=randn(64)), VALUE, "v_a")
    yield raises("v_a heads strided (row of 2 heads' worth)", lambda a: a.update(v_a=randn(3, 4, 128)[..., :64]), VALUE, "v_a")
    for name in ("lse_a", "lse_b"):
        yield from common_tensor_rows(name, (torch.float16, torch.float64, torch.int32))
        yield from expanded_rows(name)
        yield from shape_rows(name, 0, 1, names=(name,))
    # The wrapper flattens [..., H, D] to [rows, H, D]: other leading dims must not pass.
    yield raises("v_a [3, 1, H, D], v_b [1, 3, H, D]",
                 lambda a: a.update(v_a=a["v_a"].unsqueeze(1), v_b=a["v_b"].unsqueeze(0), lse_a=a["lse_a"].unsqueeze(1),
                                    lse_b=a["lse_b"].unsqueeze(0)), VALUE, "v_b")

    yield succeeds("lse_a, lse_b both -inf (v 0, lse -inf)", lambda a: (a["lse_a"].fill_(-math.inf), a["lse_b"].fill_(-math.inf)))
    yield succeeds("lse_b -inf (v = v_a)", lambda a: a["lse_b"].fill_(-math.inf))
    yield succeeds("lse_a, lse_b 1e30 apart", lambda a: a["lse_a"].fill_(1e30))
    yield succeeds("v_a a row-strided view (6 heads a row)", lambda a: a.update(v_a=randn(3, 6, 64, seed=4)[:, 1:5]))

    def halves(a):
        t = randn(3, 2, 4, 64, seed=5)
        a.update(v_a=t[:, 0], v_b=t[:, 1])

    yield succeeds("v_a, v_b interleaved halves of one tensor", halves)
    yield succeeds("v_a expanded rows (read only)", lambda a: a.update(v_a=expanded(a["v_a"])))
    yield succeeds("v_b is v_a, lse_b is lse_a (both read)", lambda a: a.update(v_b=a["v_a"], lse_b=a["lse_a"]))
    yield succeeds("v_a float16, v_b float16", lambda a: a.update(v_a=a["v_a"].half(), v_b=a["v_b"].half()))
    yield succeeds("v_a bfloat16, v_b bfloat16", lambda a: a.update(v_a=a["v_a"].bfloat16(), v_b=a["v_b"].bfloat16()))
    yield succeeds("4-D states [2, 3, H, D]", lambda a: a.update(v_a=randn(2, 3, 4, 64), v_b=randn(2, 3, 4, 64, seed=2),
                                                                  lse_a=randn(2, 3, 4, seed=1), lse_b=randn(2, 3, 4, seed=3)))
    yield succeeds("2-D states [H, D]", lambda a: a.update({n: a[n][0] for n in ("v_a", "lse_a", "v_b", "lse_b")}))
    yield succeeds("no rows", lambda a: a.update(v_a=torch.empty(0, 4, 64), v_b=torch.empty(0, 4, 64),
                                                  lse_a=torch.empty(0, 4), lse_b=torch.empty(0, 4)))
    yield succeeds("head_dim 1", lambda a: a.update(v_a=a["v_a"][..., :1].contiguous(), v_b=a["v_b"][..., :1].contiguous()))


# ----------------------------------------------------------------------------- prefill attention
# Ragged: q [8, 4, 64] (requests of 3 and 5 queries: cu_seqlens_q [0, 3, 8]), k, v [10, 2, 64]
# (4 and 6 keys: cu_seqlens_k [0, 4, 10]). Paged: the same q over caches [6 blocks, block_size 4,
# 2 kv heads, 64], block_table [[2, 5, -1], [3, 0, 1]], seq_lens [5, 9] (capacity 12); request
# 1's block_table[1, 2] holds its key 8 only. float32 on the CPU, float16 on CUDA (attn_dtype()).
# CUDA never reads out of bounds and does not sync: bad lengths are clamped, a bad block's keys
# are masked, and the first offender is recorded (pop_prefill_attention_error: a message).


def _prefill_valid(dtype: torch.dtype) -> dict[str, Any]:
    case = registry.cases("prefill_attention").make_ragged_case([3, 5], [4, 6], 4, 2, 64, dtype, gen=seeded(0))
    return {"q": case.q, "k": case.k, "v": case.v, "cu_seqlens_q": case.cu_seqlens_q, "cu_seqlens_k": case.cu_seqlens_k,
            "causal": True, "return_lse": True, "out": torch.zeros(8, 4, 64, dtype=dtype), "check": False}


def prefill_reference(a: dict[str, Any], **override) -> Any:
    a = {**a, **override}
    out, lse = ref("prefill_attention", "ref_prefill_attention")(
        a["q"], a["k"], a["v"], a["cu_seqlens_q"], a["cu_seqlens_k"], causal=a.get("causal", True), scale=a.get("scale"),
        sliding_window=a.get("sliding_window", -1), logits_soft_cap=a.get("logits_soft_cap", 0.0))
    return (out, lse) if a.get("return_lse", False) else out


def _prefill_spec() -> OpSpec:
    dtype = attn_dtype()
    return OpSpec(
        "prefill_attention", "prefill_attention", mk.prefill_attention,
        valid=lambda: _prefill_valid(dtype), written=("out",), reference=prefill_reference,
        verify_order=("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "out"),
        tolerance={torch.float16: (2e-3, 8e-3), torch.float32: (2e-3, 1e-3)} if dtype == torch.float16 else None,
    )


def _paged_prefill_valid(dtype: torch.dtype) -> dict[str, Any]:
    case = registry.cases("decode_attention").make_paged_case(
        [5, 9], num_heads=4, num_kv_heads=2, head_dim=64, block_size=4, dtype=dtype, gen=seeded(0),
        spare_blocks=1, spare_columns=0)
    q = randn(8, 4, 64, dtype=dtype, seed=3)
    return {"q": q, "k_cache": case.k_cache, "v_cache": case.v_cache, "block_table": case.block_table,
            "cu_seqlens_q": torch.tensor([0, 3, 8], dtype=torch.int32), "seq_lens": case.seq_lens,
            "causal": True, "return_lse": True, "out": torch.zeros(8, 4, 64, dtype=dtype), "check": False}


def paged_prefill_reference(a: dict[str, Any], masked_keys: dict[int, list[int]] | None = None, **override) -> Any:
    """The float64 (out, lse); masked_keys {request: keys}: keys CUDA masks (a bad block's)."""
    a = {**a, **override}
    masks = None
    custom = a.get("custom_mask")
    cq, lens = a["cu_seqlens_q"].tolist(), a["seq_lens"].tolist()
    if custom is not None or masked_keys:
        allowed = ref("prefill_attention", "allowed_keys")
        masks, at = [], 0
        flat = None if custom is None else custom.reshape(-1).cpu()
        for b in range(len(lens)):
            len_q, len_k = cq[b + 1] - cq[b], lens[b]
            if flat is None:
                keep = allowed(len_q, len_k, a.get("causal", True))
            else:  # CUDA reads entries past the mask as 0
                part = flat[at:at + len_q * len_k]
                keep = torch.cat([part, torch.zeros(len_q * len_k - part.numel(), dtype=torch.bool)]).view(len_q, len_k)
            at += len_q * len_k
            for t in (masked_keys or {}).get(b, []):
                keep[:, t] = False
            masks.append(keep)
    table = a["block_table"].clone()  # bad ids point at block 0: masked_keys leave their keys out
    table[(table < 0) | (table >= a["k_cache"].shape[0])] = 0
    out, lse = ref("prefill_attention", "ref_paged_prefill_attention")(
        a["q"], a["k_cache"], a["v_cache"], table, a["cu_seqlens_q"], a["seq_lens"],
        causal=a.get("causal", True), custom_masks=masks, scale=a.get("scale"),
        sliding_window=a.get("sliding_window", -1), logits_soft_cap=a.get("logits_soft_cap", 0.0))
    return (out, lse) if a.get("return_lse", False) else out


def _paged_prefill_spec() -> OpSpec:
    dtype = attn_dtype()
    return OpSpec(
        "paged_prefill_attention", "paged_prefill_attention", mk.paged_prefill_attention,
        valid=lambda: _paged_prefill_valid(dtype), written=("out",), reference=paged_prefill_reference,
        verify_order=("q", "k_cache", "v_cache", "block_table", "seq_lens", "cu_seqlens_q", "out"),
        tolerance={torch.float16: (2e-3, 8e-3), torch.float32: (2e-3, 1e-3)} if dtype == torch.float16 else None,
    )


def cuda_recorded_rows(label: str, mutate, name: str, message: str, reference) -> Iterator[Row]:
    """A bad index: the CPU raises before writing; CUDA records it and computes `reference`
    (what the kernel does instead), and with check=True raises after its kernel ran."""
    checked = lambda a: (mutate(a), a.update(check=True))  # noqa: E731
    if not on_cuda():
        yield raises(label, mutate, VALUE, name)
        yield raises(f"{label}, check=True", checked, VALUE, name)
        return
    package = "prefill_attention"

    def written(a):
        result = reference(a)
        return {"out": (result[0] if isinstance(result, tuple) else result).to(a["out"].dtype)}

    yield Row(label, mutate, Succeeds(recorded=(package, message)), reference)
    yield Row(f"{label}, check=True", checked, Raises(VALUE, (name,), written=written))


def prefill_common_rows(q_names: tuple[str, ...], extra: Callable[[torch.dtype], dict[str, Any]]) -> Iterator[Row]:
    """q, out and number rows both forms share; extra(dtype) resizes the K/V arguments to a
    head_dim of 96 alongside q."""
    dtype, other = attn_dtype(), other_attn_dtype()
    yield from common_tensor_rows("q", FLOAT_BAD)
    yield from dtype_rows("q", torch.bool)
    yield raises("q 4-D", lambda a: a.update(q=a["q"].unsqueeze(0)), VALUE, "q")
    yield raises("q head_dim 96", lambda a: a.update(q=randn(8, 4, 96, dtype=dtype), out=torch.zeros(8, 4, 96, dtype=dtype),
                                                      **extra(dtype)), VALUE, "head_dim", "q")
    yield raises("q 3 heads, 2 kv heads (not a multiple)",
                 lambda a: a.update(q=a["q"][:, :3], out=torch.zeros(8, 3, 64, dtype=dtype)), VALUE, "q", *q_names)
    yield raises("q head_dim 65 (one more than k)", lambda a: a.update(q=resize(a["q"], 2, 1)), VALUE, *q_names)

    for label, bad in (("str", "tensor"), ("float", 1.5), ("list", [1.0, 2.0])):
        yield raises(f"out: {label} for a tensor", setter(out=bad), TYPE, "out")
    yield from dtype_rows("out", *FLOAT_BAD)
    yield raises("out of another float dtype than q", lambda a: a.update(out=a["out"].to(other)), TYPE, "out")
    yield from shape_rows("out", 0, 1, 2, names=("out",))
    yield from rank_rows("out")
    yield from meta_rows("out")
    yield from stride_rows("out")
    yield from expanded_rows("out")
    yield raises("out is q", lambda a: a.update(out=a["q"]), VALUE, "out", "q")
    yield succeeds("out = None (allocated)", setter(out=None))
    yield succeeds("q expanded (read only)", lambda a: a.update(q=expanded(a["q"])))

    yield from float_kind_rows("scale")
    yield from float_value_rows("scale", (0.0, -0.125, math.nan, math.inf))
    yield raises("scale = 1e39 (inf in float32)", setter(scale=1e39), VALUE, "scale")
    yield succeeds("scale = 1e30 (huge logits)", setter(scale=1e30))
    for label, bad in (("None", None), ("'7'", "7"), ("1.5", 1.5)):
        yield raises(f"sliding_window = {label}", setter(sliding_window=bad), TYPE, "sliding_window")
    yield from huge_int_rows("sliding_window")
    for window in (1, 3, 0, -5, 2**62):
        yield succeeds(f"sliding_window = {window}", setter(sliding_window=window))
    yield from float_kind_rows("logits_soft_cap")
    yield from float_value_rows("logits_soft_cap", (-1.0, math.nan, math.inf))
    yield succeeds("logits_soft_cap = 30, scale = 1e30 (capped huge logits)", setter(logits_soft_cap=30.0, scale=1e30))
    yield from flag_kind_rows("causal")
    yield succeeds("causal = False", setter(causal=False))
    yield from flag_kind_rows("return_lse")
    yield succeeds("return_lse = False (out only)", setter(return_lse=False))
    yield from flag_kind_rows("check")
    yield succeeds("check = True (nothing recorded)", setter(check=True))
    for label, bad in (("None", None), ("'2'", "2"), ("1.5", 1.5)):
        yield raises(f"num_threads = {label}", setter(num_threads=bad), TYPE, "num_threads")
    yield from huge_int_rows("num_threads")
    yield raises("num_threads = -1", setter(num_threads=-1), VALUE, "num_threads")  # on CUDA too
    for threads in (0, 3):
        yield succeeds(f"num_threads = {threads}", setter(num_threads=threads))


def cu_rows(name: str, total: int, reference) -> Iterator[Row]:
    """cu_seqlens `name` [3] = [0, n, total]: kinds, dtypes, lengths and bad prefix sums."""
    yield from common_tensor_rows(name, INDEX_BAD, strides=False)
    yield from dtype_rows(name, torch.int64)
    yield raises(f"{name} inner stride 2", lambda a: a.update({name: non_unit_inner(a[name])}), VALUE, name)
    # The two prefix sums must have the same length: the second one verified is named.
    yield raises(f"{name} of 4 entries", lambda a: a.update({name: torch.tensor([0, 1, 2, total], dtype=torch.int32)}),
                 VALUE, "cu_seqlens_k")
    # Bad prefix sums, and what CUDA computes with them clamped (rows past the clamped ends: the
    # valid out's zeros).
    first = 3 if name == "cu_seqlens_q" else 4  # the valid entry 1
    for at, value, clamped in ((1, 99, [0, total, total]), (0, -3, [0, first, total]), (2, total + 1, [0, first, total])):
        def override(a, clamped=clamped):
            return {name: torch.tensor(clamped, dtype=torch.int32)}

        yield from cuda_recorded_rows(f"{name}[{at}] = {value}", set_entry(name, at, value), name,
                                      f"{name}[{at}] = {value} ", lambda a, o=override: reference(a, **o(a)))


@table("prefill_attention")
def prefill_rows(spec: OpSpec) -> Iterator[Row]:
    dtype, other = attn_dtype(), other_attn_dtype()
    yield from prefill_common_rows(("k",), lambda d: {"k": randn(10, 2, 96, dtype=d, seed=1),
                                                      "v": randn(10, 2, 96, dtype=d, seed=2)})

    def all_to(d: torch.dtype) -> Callable[[dict[str, Any]], None]:
        return lambda a: a.update({n: a[n].to(d) for n in ("q", "k", "v", "out")})

    if on_cuda():
        yield raises("q, k, v and out float32", all_to(torch.float32), TYPE, "q")
    else:
        yield succeeds("q, k, v and out float32", all_to(torch.float32))
    yield succeeds("q, k, v and out bfloat16", all_to(torch.bfloat16))
    for name in ("k", "v"):
        yield from common_tensor_rows(name, FLOAT_BAD)
        yield raises(f"{name} of another float dtype than q", lambda a, n=name: a.update({n: a[n].to(other)}), TYPE, name)
    yield from shape_rows("k", 1, 2, names=("k",))
    yield from shape_rows("v", 0, 1, 2, names=("v",))
    yield from cu_rows("cu_seqlens_q", 8, prefill_reference)
    yield from cu_rows("cu_seqlens_k", 10, prefill_reference)
    def out_over_k(a):  # k is the first 1280 elements of out's storage
        buf = torch.zeros(2048, dtype=a["k"].dtype)
        buf[:1280] = a["k"].reshape(-1)
        a.update(k=buf[:1280].view(10, 2, 64), out=buf.view(8, 4, 64))

    yield raises("out overlaps k", out_over_k, VALUE, "out", "k")
    yield succeeds("q, k, v slices of one fused qkv tensor (token strides)", fused_qkv)
    yield succeeds("cu_seqlens_q [0, 0, 8] (a request without queries)",
                   lambda a: a.update(cu_seqlens_q=torch.tensor([0, 0, 8], dtype=torch.int32)))
    yield succeeds("cu_seqlens_k [0, 0, 10] (a request without keys: out 0, lse -inf)",
                   lambda a: a.update(cu_seqlens_k=torch.tensor([0, 0, 10], dtype=torch.int32)))
    yield succeeds("empty batch", lambda a: a.update(q=torch.empty(0, 4, 64, dtype=dtype), out=torch.empty(0, 4, 64, dtype=dtype),
                                                      k=torch.empty(0, 2, 64, dtype=dtype), v=torch.empty(0, 2, 64, dtype=dtype),
                                                      cu_seqlens_q=torch.zeros(1, dtype=torch.int32),
                                                      cu_seqlens_k=torch.zeros(1, dtype=torch.int32)))


def fused_qkv(a):
    """q, k, v as token-strided slices of one [tokens, (H + 2 KH) * D] projection (k, v padded to
    q's 8 tokens... only the first 8 tokens of k / v are shared rows: k, v keep their own 10)."""
    dtype = a["q"].dtype
    rows = torch.zeros(10, 8 * 64, dtype=dtype)
    rows[:8, :256] = a["q"].reshape(8, 256)
    rows[:, 256:384] = a["k"].reshape(10, 128)
    rows[:, 384:] = a["v"].reshape(10, 128)
    a.update(q=rows[:8, :256].view(8, 4, 64), k=rows[:, 256:384].view(10, 2, 64), v=rows[:, 384:].view(10, 2, 64))


@table("paged_prefill_attention")
def paged_prefill_rows(spec: OpSpec) -> Iterator[Row]:
    dtype, other = attn_dtype(), other_attn_dtype()
    yield from prefill_common_rows(("k_cache",), lambda d: {"k_cache": randn(6, 4, 2, 96, dtype=d, seed=1),
                                                            "v_cache": randn(6, 4, 2, 96, dtype=d, seed=2)})
    for name in ("k_cache", "v_cache"):
        yield from common_tensor_rows(name, FLOAT_BAD)
        yield raises(f"{name} of another float dtype than q", lambda a, n=name: a.update({n: a[n].to(other)}), TYPE, name)
        yield raises(f"{name} transposed within a block (block_size <-> heads)",
                     lambda a, n=name: a.update({n: a[n].transpose(1, 2).contiguous().transpose(1, 2)}), VALUE, name)
    yield from shape_rows("v_cache", 0, 1, 2, 3, names=("v_cache",))
    yield from common_tensor_rows("block_table", INDEX_BAD)
    yield from dtype_rows("block_table", torch.int64)
    yield from common_tensor_rows("seq_lens", INDEX_BAD, strides=False)
    yield raises("seq_lens [3] (batch 3, cu_seqlens_q of 2 requests)",
                 lambda a: a.update(seq_lens=torch.tensor([5, 9, 1], dtype=torch.int32)), VALUE, "seq_lens")
    yield from common_tensor_rows("cu_seqlens_q", INDEX_BAD, strides=False)
    yield raises("cu_seqlens_q of 4 entries (3 requests, seq_lens of 2)",
                 lambda a: a.update(cu_seqlens_q=torch.tensor([0, 1, 2, 8], dtype=torch.int32)), VALUE, "cu_seqlens_q")
    for at, value, clamped in ((1, 99, [0, 8, 8]), (0, -3, [0, 3, 8]), (2, 9, [0, 3, 8])):
        def override(a, clamped=clamped):
            return {"cu_seqlens_q": torch.tensor(clamped, dtype=torch.int32)}

        yield from cuda_recorded_rows(f"cu_seqlens_q[{at}] = {value}", set_entry("cu_seqlens_q", at, value),
                                      "cu_seqlens_q", f"cu_seqlens_q[{at}] = {value} ",
                                      lambda a, o=override: paged_prefill_reference(a, **o(a)))
    for value in (DECODE_CAPACITY + 1, -1, 2**31 - 1):
        clamped = min(max(value, 0), DECODE_CAPACITY)
        yield from cuda_recorded_rows(
            f"seq_lens[1] = {value}", set_entry("seq_lens", 1, value), "seq_lens", f"seq_lens[1] = {value} ",
            lambda a, c=clamped: paged_prefill_reference(a, seq_lens=torch.tensor([5, c], dtype=torch.int32)))
    for value in (-1, DECODE_BLOCKS, 2**31 - 1):  # block_table[1, 2] holds request 1's key 8
        yield from cuda_recorded_rows(
            f"block_table[1, 2] = {value}", set_entry("block_table", (1, 2), value), "block_table",
            f"block_table[1, 2] = {value} ", lambda a: paged_prefill_reference(a, masked_keys={1: [8]}))
    yield succeeds("block_table[0, 2] = -5 (unused padding)", set_entry("block_table", (0, 2), -5))

    # custom_mask: bool [sum len_q * len_k] = 3 * 5 + 5 * 9 = 60.
    def mask_of(n: int, fill: bool = True):
        return lambda a: a.update(custom_mask=torch.rand(n, generator=seeded(7)) < (0.5 if fill else 0.0))

    yield succeeds("custom_mask random (60 entries)", mask_of(60))
    yield succeeds("custom_mask all False (out 0, lse -inf)", mask_of(60, fill=False))
    for n in (59, 61):
        yield from cuda_recorded_rows(f"custom_mask of {n} entries (60 needed)", mask_of(n), "custom_mask",
                                      f"custom_mask holds {n} elements", paged_prefill_reference)
    for label, bad in (("str", "mask"), ("float", 1.5), ("list", [True])):
        yield raises(f"custom_mask: {label} for a tensor", setter(custom_mask=bad), TYPE, "custom_mask")
    yield raises("custom_mask int32", lambda a: a.update(custom_mask=torch.ones(60, dtype=torch.int32)), TYPE, "custom_mask")
    yield raises("custom_mask [3, 20] (2-D)", lambda a: a.update(custom_mask=torch.ones(3, 20, dtype=torch.bool)), VALUE,
                 "custom_mask")
    yield raises("out is block 0 of k_cache", lambda a: a.update(out=a["k_cache"].reshape(-1)[:2048].view(8, 4, 64)),
                 VALUE, "out", "k_cache")
    yield succeeds("k_cache, v_cache halves of one [blocks, 2, bs, KH, D] tensor (block stride)",
                   lambda a: a.update(**dict(zip(("k_cache", "v_cache"), torch.stack([a["k_cache"], a["v_cache"]], 1).unbind(1)))))
    yield succeeds("seq_lens all 0 (out 0, lse -inf)", lambda a: a["seq_lens"].zero_())
    yield succeeds("seq_lens [2, 3]: fewer keys than queries (early queries see nothing)",
                   lambda a: a.update(seq_lens=torch.tensor([2, 3], dtype=torch.int32)))
    yield succeeds("empty batch", lambda a: a.update(q=torch.empty(0, 4, 64, dtype=dtype), out=torch.empty(0, 4, 64, dtype=dtype),
                                                      block_table=torch.empty(0, 3, dtype=torch.int32),
                                                      seq_lens=torch.empty(0, dtype=torch.int32),
                                                      cu_seqlens_q=torch.zeros(1, dtype=torch.int32)))


# ----------------------------------------------------------------------------- speculative decoding
# chain_speculative_sampling: draft_probs [3, 2, 16], draft_token_ids int64 [3, 2], target_probs
# [3, 3, 16], uniforms [3, 3], out_accepted int64 [3] (written; -7 before the call); the outputs
# themselves are new tensors. The tree ops share one batch of two draft trees of 6 nodes
# (SPEC_PARENTS / SPEC_TOKENS) over a vocab of 8:
#   request 0: 0 -> {1, 2}, 1 -> {3, 4}, 2 -> 5        request 1: 0 -> {1, 4}, 1 -> 2 -> 3, 4 -> 5
# with target rows that give one token 0.93 each, so for the table's uniforms (and greedily) the
# walks are 0 -> 1 -> 4 (node 4 is reached as node 3's next sibling; then a bonus token) and
# 0 -> 1 -> 2 (then a correction token).
# Bad values inside tensors (kernels/speculative/__init__.py): the CPU raises before writing,
# whatever `check` says. CUDA: a bad draft id counts as a rejection there; a bad tree link or
# retrieve_index row stops the walk there (no token: -1 for a row); either is recorded
# (pop_speculative_error: (op, flattened index, value)) and check=True (the default) raises
# ValueError after the kernel ran. CUDA never reads the links and rows the walk does not reach,
# and clamps uniforms into [0, 1).

SPEC_VOCAB = 16
SPEC_PARENTS = ((-1, 0, 0, 1, 1, 2), (-1, 0, 1, 2, 0, 4))
SPEC_TOKENS = ((0, 3, 5, 1, 6, 2), (0, 4, 6, 6, 2, 7))
SPEC_NEXT_TOKEN = ((1, 3, 5, -1, -1, -1), (1, 2, 3, -1, 5, -1))  # first child (written out by hand)
SPEC_NEXT_SIBLING = ((-1, 2, -1, 4, -1, -1), (-1, 4, -1, -1, -1, -1))
SPEC_FAVOURED = ((3, 6, 0, 0, 7, 0), (4, 6, 1, 0, 0, 0))  # the token each node's target row favours
TREE_VOCAB = 8


def spec_draw(row: torch.Tensor, u: float) -> int:
    """kernels/speculative/cases.py's draw over a probability row (-1 for a row without mass)."""
    weight = ref("speculative", "ref_weight")
    return ref("speculative", "ref_draw")([weight(w) for w in row.float().tolist()], u)


def spec_uniforms(u: torch.Tensor | None, shape: tuple[int, int]) -> torch.Tensor:
    """The uniforms a kernel uses: clamped into [0, 1 - 2^-24] with NaN as 0 (CUDA's ClampUniform;
    the identity on the only uniforms the CPU takes). None (drawn from a generator): 0.5, for
    rows whose probabilities make every uniform give the same tokens (one-hot rows)."""
    u = torch.full(shape, 0.5) if u is None else u.float().cpu()
    return torch.where(u > 0, u.clamp(max=1 - 2.0**-24), torch.zeros_like(u))


def chain_reference(a: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """(output_token_ids, accepted_counts) by the module doc's rule, request by request
    (tests/kernels/test_speculative.py's reference()); a draft id outside [0, vocab) counts as
    rejected (CUDA; the CPU raises on it, so its references never see one)."""
    q, p = a["draft_probs"].float(), a["target_probs"].float()
    ids = a["draft_token_ids"].long()
    batch, n = ids.shape
    vocab = p.shape[-1]
    u = spec_uniforms(a["uniforms"], (batch, n + 1))
    out = torch.full((batch, n + 1), -1, dtype=torch.int64)
    accepted = torch.zeros(batch, dtype=torch.int64)
    for b in range(batch):
        j = 0
        while j < n:
            x = int(ids[b, j])
            if not 0 <= x < vocab or not bool(u[b, j] * q[b, j, x].clamp_min(0) < p[b, j, x]):  # float32, q >= 0
                break
            out[b, j] = x
            j += 1
        token = spec_draw(p[b, j] - q[b, j], u[b, n]) if j < n else -1  # the residual max(0, p - q)
        if token < 0:
            token = spec_draw(p[b, j], u[b, n])
        out[b, j] = max(token, 0)
        accepted[b] = j
    return out, accepted


def chain_accepted(a: dict[str, Any]) -> dict[str, torch.Tensor]:
    """out_accepted after a CUDA call that raised after its kernel ran."""
    return {"out_accepted": chain_reference(a)[1]}


def _chain_valid() -> dict[str, Any]:
    q = torch.softmax(randn(3, 2, SPEC_VOCAB, seed=30, scale=2.0), -1)
    p = torch.softmax(randn(3, 3, SPEC_VOCAB, seed=31, scale=2.0), -1)
    p[:2, :2] = 0.8 * q[:2] + 0.2 * p[:2, :2]  # requests 0 and 1 close to their drafts: accepts
    return {"draft_probs": q, "draft_token_ids": q.argmax(-1), "target_probs": p,
            "uniforms": torch.tensor([[0.3, 0.6, 0.5], [0.2, 0.95, 0.7], [0.5, 0.5, 0.25]]), "generator": None,
            "out_accepted": torch.full((3,), -7), "check": True}


def _chain_spec() -> OpSpec:
    return OpSpec(
        "chain_speculative_sampling", "chain_speculative_sampling", mk.chain_speculative_sampling,
        valid=_chain_valid, written=("out_accepted",), reference=chain_reference,
        # out_tokens (allocated on draft_token_ids' device) and error come between: never the
        # first mismatch. draft_token_ids' device picks the module.
        verify_order=("draft_probs", "draft_token_ids", "target_probs", "uniforms", "out_accepted"),
        router="draft_token_ids",
    )


def one_hot_chain(a: dict[str, Any]) -> None:
    """Mutation: one-hot draft and target rows, so that any uniforms give the same tokens: request
    0 accepts both drafts (bonus 9), request 1 rejects its second (correction 11), request 2 its
    first (correction 13)."""
    ids = torch.tensor([[1, 2], [3, 4], [5, 6]])
    target = torch.tensor([[1, 2, 9], [3, 11, 0], [13, 0, 0]])
    a.update(draft_probs=torch.nn.functional.one_hot(ids, SPEC_VOCAB).float(), draft_token_ids=ids,
             target_probs=torch.nn.functional.one_hot(target, SPEC_VOCAB).float())


def spec_bad_rows(label: str, mutate, names: tuple[str, ...], record: tuple[str, int, int] | None,
                  written=None) -> Iterator[Row]:
    """A bad value inside a tensor. CPU: ValueError before any write, whatever check says. CUDA:
    `record` ((op, flattened index, value)) when the kernel meets it: recorded, the spec's
    reference (the kernel's way around it) with check=False, ValueError after the kernel ran with
    check=True (`written`: what it wrote into written arguments); record None: the kernel never
    reads it, so the call succeeds and records nothing."""
    unchecked = lambda a: (mutate(a), a.update(check=False))  # noqa: E731
    if not on_cuda():
        yield raises(label, mutate, VALUE, *names)
        yield raises(f"{label}, check=False", unchecked, VALUE, *names)
    elif record is None:
        yield succeeds(label, mutate)
        yield succeeds(f"{label}, check=False", unchecked)
    else:
        yield Row(label, mutate, Raises(VALUE, names, written=written))
        yield Row(f"{label}, check=False", unchecked, Succeeds(recorded=("speculative", *record)))


def spec_flag_kind_rows(name: str) -> Iterator[Row]:
    for label, bad in (("'no'", "no"), ("None", None), ("2", 2), ("2**64", 2**64)):
        yield raises(f"{name} = {label}", setter(**{name: bad}), TYPE, name)


@table("chain_speculative_sampling")
def chain_rows(spec: OpSpec) -> Iterator[Row]:
    # draft_probs / target_probs: float32 [batch, n (+ 1), vocab], unit last stride, any other strides.
    for name in ("draft_probs", "target_probs"):
        yield from tensor_kind_rows(name)
        yield from dtype_rows(name, *FLOAT_BAD, torch.float16)
        yield from rank_rows(name)
        yield from meta_rows(name)
        yield from stride_rows(name)  # transposed: the vocab dim is the one of stride != 1
        yield succeeds(f"{name} dims 0 and 1 transposed in memory (any outer strides)",
                       lambda a, n=name: a.update({n: a[n].transpose(0, 1).contiguous().transpose(0, 1)}))
        yield succeeds(f"{name} position stride 20 (a slice)",
                       lambda a, n=name: a.update({n: torch.cat([a[n], a[n][..., :4]], -1)[..., :SPEC_VOCAB]}))
        yield succeeds(f"{name} expanded (stride 0) over the batch (read only)",
                       lambda a, n=name: a.update({n: expanded(a[n])}))
    yield from shape_rows("draft_probs", 0, names=("draft_probs", "draft_token_ids"))
    yield from shape_rows("draft_probs", 1, names=("draft_probs", "draft_token_ids"))
    yield from shape_rows("draft_probs", 2, names=("draft_probs", "target_probs"))
    yield from shape_rows("target_probs", 0, 2, names=("target_probs", "draft_probs"))
    yield raises("target_probs n positions (not num_draft + 1)", lambda a: a.update(target_probs=a["target_probs"][:, :2]),
                 VALUE, "target_probs", "num_draft")
    yield raises("target_probs num_draft + 2 positions", lambda a: a.update(target_probs=resize(a["target_probs"], 1, 1)),
                 VALUE, "target_probs", "num_draft")
    yield raises("empty vocab", lambda a: a.update(draft_probs=torch.empty(3, 2, 0), target_probs=torch.empty(3, 3, 0)),
                 VALUE, "target_probs")

    # draft_token_ids: int32 / int64 [batch, n], any strides.
    yield from tensor_kind_rows("draft_token_ids")
    yield from dtype_rows("draft_token_ids", *INDEX_BAD, torch.uint8, torch.bool)
    yield from rank_rows("draft_token_ids")
    yield from meta_rows("draft_token_ids")
    yield from shape_rows("draft_token_ids", 0, 1, names=("draft_token_ids",))
    yield succeeds("draft_token_ids int32", lambda a: a.update(draft_token_ids=a["draft_token_ids"].int()))
    yield succeeds("draft_token_ids transposed in memory", lambda a: a.update(draft_token_ids=transposed(a["draft_token_ids"])))
    yield succeeds("draft_token_ids inner stride 2", lambda a: a.update(draft_token_ids=non_unit_inner(a["draft_token_ids"])))
    yield succeeds("draft_token_ids expanded (stride 0, read only)",
                   lambda a: a.update(draft_token_ids=expanded(a["draft_token_ids"])))
    # Out of range at draft_token_ids[1, 0] (flattened index 2; the first draft, so CUDA always
    # meets it): request 1 is rejected there and draws its correction from the residual.
    for value in (SPEC_VOCAB, -1, 2**62, -(2**63)):
        yield from spec_bad_rows(f"draft_token_ids[1, 0] = {value}", set_entry("draft_token_ids", (1, 0), value),
                                 ("draft_token_ids",), ("chain_speculative_sampling", 2, value), chain_accepted)
    for value in (2**31 - 1, -(2**31)):
        yield from spec_bad_rows(
            f"draft_token_ids int32, [1, 0] = {value}",
            lambda a, v=value: (a.update(draft_token_ids=a["draft_token_ids"].int()), a["draft_token_ids"].__setitem__((1, 0), v)),
            ("draft_token_ids",), ("chain_speculative_sampling", 2, value), chain_accepted)
    if on_cuda():  # several bad ids: the record keeps whichever came first, so only check=True
        yield Row("draft_token_ids all out of range", lambda a: a["draft_token_ids"].fill_(SPEC_VOCAB),
                  Raises(VALUE, ("draft_token_ids",), written=chain_accepted))
    else:
        yield raises("draft_token_ids all out of range", lambda a: a["draft_token_ids"].fill_(SPEC_VOCAB), VALUE,
                     "draft_token_ids")

    # uniforms: float32 [batch, n + 1], contiguous, in [0, 1); or None (drawn).
    for label, bad in (("str", "tensor"), ("float", 0.5), ("list", [0.5, 0.5])):
        yield raises(f"uniforms: {label} for a tensor", setter(uniforms=bad), TYPE, "uniforms")
    yield from dtype_rows("uniforms", torch.float64, torch.float16)
    yield from rank_rows("uniforms")
    yield from meta_rows("uniforms")
    yield from stride_rows("uniforms")
    yield from expanded_rows("uniforms")
    yield raises("uniforms [batch, n] (not n + 1)", lambda a: a.update(uniforms=a["uniforms"][:, :2].contiguous()), VALUE,
                 "uniforms")
    yield from shape_rows("uniforms", 0, names=("uniforms",))
    for at, value in (((1, 0), 1.0), ((1, 0), -0.5), ((1, 0), math.nan), ((1, 0), math.inf), ((1, 2), math.nan),
                      ((0, 2), 1.0)):
        yield checked_on_cpu_clamped_on_cuda(f"uniforms[{at[0]}, {at[1]}] = {value}",
                                             lambda a, at=at, v=value: a["uniforms"].__setitem__(at, v), "uniforms")
    yield succeeds("uniforms all 0", lambda a: a["uniforms"].zero_())
    yield succeeds("uniforms just below 1", lambda a: a["uniforms"].fill_(1 - 2**-24))
    yield raises("uniforms and generator both given", setter(generator=seeded(3)), VALUE, "uniforms", "generator")
    yield raises("generator = 'seed'", setter(uniforms=None, generator="seed"), TYPE, "generator")
    yield raises("generator = 42", setter(uniforms=None, generator=42), TYPE, "generator")
    yield succeeds("one-hot probs, uniforms drawn from a generator", lambda a: (one_hot_chain(a), a.update(
        uniforms=None, generator=seeded(3))))
    yield succeeds("one-hot probs, uniforms drawn (no generator)", lambda a: (one_hot_chain(a), a.update(uniforms=None)))
    yield succeeds("one-hot probs, the table's uniforms", one_hot_chain)

    # out_accepted: int32 / int64 [batch], contiguous, written; None allocates.
    for label, bad in (("str", "tensor"), ("float", 1.5), ("list", [0, 0, 0])):
        yield raises(f"out_accepted: {label} for a tensor", setter(out_accepted=bad), TYPE, "out_accepted")
    yield from dtype_rows("out_accepted", torch.float32, torch.int16, torch.uint8)
    yield from rank_rows("out_accepted", any_rank=False)
    yield from meta_rows("out_accepted")
    yield from shape_rows("out_accepted", 0, names=("out_accepted",))
    yield raises("out_accepted inner stride 2", lambda a: a.update(out_accepted=non_unit_inner(a["out_accepted"])), VALUE,
                 "out_accepted")
    yield from expanded_rows("out_accepted")
    yield succeeds("out_accepted int32", lambda a: a.update(out_accepted=a["out_accepted"].int()))
    yield succeeds("out_accepted = None (allocated)", setter(out_accepted=None))

    # Aliasing: out_accepted is written; the others are read.
    yield raises("out_accepted is draft_token_ids' first 3 elements",
                 lambda a: a.update(out_accepted=a["draft_token_ids"].view(-1)[:3]), VALUE, "out_accepted", "draft_token_ids")
    for name in ("draft_probs", "target_probs", "uniforms"):
        yield raises(f"out_accepted is {name}' bytes", lambda a, n=name: a.update(
            out_accepted=a[n].reshape(-1)[:6].view(torch.int64)), VALUE, "out_accepted", name)

    def accepted_in_gap(a):  # in the gap after draft_probs' first position: no overlap
        buf = torch.zeros(3, 2, SPEC_VOCAB + 6)
        buf[..., :SPEC_VOCAB] = a["draft_probs"]
        a.update(draft_probs=buf[..., :SPEC_VOCAB], out_accepted=buf[0, 0, SPEC_VOCAB:].view(torch.int64))

    yield succeeds("out_accepted in the gap between draft_probs' rows (disjoint)", accepted_in_gap)

    def accepted_overlaps(a):  # the same buffer, out_accepted one element into the next row
        buf = torch.zeros(3, 2, SPEC_VOCAB + 4)
        buf[..., :SPEC_VOCAB] = a["draft_probs"]
        a.update(draft_probs=buf[..., :SPEC_VOCAB], out_accepted=buf.view(-1)[SPEC_VOCAB + 2:SPEC_VOCAB + 8].view(torch.int64))

    yield raises("out_accepted overlaps draft_probs' second row", accepted_overlaps, VALUE, "out_accepted", "draft_probs")
    yield succeeds("draft_probs and target_probs[:, :n] one tensor (both read)", lambda a: a.update(
        draft_probs=a["target_probs"][:, :2]))

    # Values of the probabilities (used as given: not renormalized, clamped to [0, 1], NaN as 0).
    yield succeeds("target_probs 0 at every draft (all rejected)", lambda a: a["target_probs"].scatter_(
        2, torch.cat([a["draft_token_ids"], a["draft_token_ids"][:, :1]], 1).unsqueeze(-1), 0.0))
    yield succeeds("draft_probs all 0 (q(x) = 0: accepted wherever p(x) > 0)", lambda a: a["draft_probs"].zero_())
    yield succeeds("target_probs unnormalized (x 7)", lambda a: a["target_probs"].mul_(7))
    yield succeeds("target_probs all 0 (no mass: token 0)", lambda a: a["target_probs"].zero_())
    yield succeeds("target_probs NaN, inf and -1 in each row", lambda a: a["target_probs"][..., 3:6].copy_(
        torch.tensor([math.nan, math.inf, -1.0])))
    yield succeeds("draft_probs NaN, inf and -1 in each row", lambda a: a["draft_probs"][..., 3:6].copy_(
        torch.tensor([math.nan, math.inf, -1.0])))
    yield succeeds("draft_probs = target_probs[:, :n] (all accepted)", lambda a: a.update(
        draft_probs=a["target_probs"][:, :2].clone()))

    # Sizes.
    yield succeeds("empty batch", lambda a: a.update(
        draft_probs=torch.empty(0, 2, SPEC_VOCAB), draft_token_ids=torch.empty(0, 2, dtype=torch.long),
        target_probs=torch.empty(0, 3, SPEC_VOCAB), uniforms=torch.empty(0, 3), out_accepted=torch.empty(0, dtype=torch.long)))
    yield succeeds("no drafts (n = 0: the bonus token only)", lambda a: a.update(
        draft_probs=torch.empty(3, 0, SPEC_VOCAB), draft_token_ids=torch.empty(3, 0, dtype=torch.long),
        target_probs=a["target_probs"][:, :1], uniforms=a["uniforms"][:, :1].contiguous()))
    yield succeeds("vocab 1", lambda a: a.update(draft_probs=torch.ones(3, 2, 1), target_probs=torch.ones(3, 3, 1),
                                                 draft_token_ids=torch.zeros(3, 2, dtype=torch.long)))

    def large_vocab(a):  # CUDA's draw: 40 chunks of 128 tokens
        q = torch.softmax(randn(3, 2, 5000, seed=32, scale=3.0), -1)
        p = torch.softmax(randn(3, 3, 5000, seed=33, scale=3.0), -1)
        p[:, :2] = 0.5 * q + 0.5 * p[:, :2]
        a.update(draft_probs=q, target_probs=p, draft_token_ids=q.argmax(-1))

    yield succeeds("vocab 5000", large_vocab)
    def batch_40(a):
        q = torch.softmax(randn(40, 5, SPEC_VOCAB, seed=34, scale=2.0), -1)
        p = torch.softmax(randn(40, 6, SPEC_VOCAB, seed=35, scale=2.0), -1)
        p[:, :5] = 0.8 * q + 0.2 * p[:, :5]
        a.update(draft_probs=q, draft_token_ids=q.argmax(-1), target_probs=p,
                 uniforms=torch.rand(40, 6, generator=seeded(36)), out_accepted=torch.zeros(40, dtype=torch.int32))

    yield succeeds("batch 40, n 5", batch_40)

    yield from spec_flag_kind_rows("check")
    yield succeeds("check = False", setter(check=False))
    yield succeeds("check = 0", setter(check=0))


# tree_speculative_verify: two argument forms, two table keys: sampling (target_probs [2, 6, 8],
# uniforms [2, 6]) and greedy (target_logits [12, 8], the same rows' logs).


def _tree_lists(batch_copies: int = 1) -> dict[str, torch.Tensor]:
    t = lambda rows: torch.tensor(rows).repeat(batch_copies, 1)  # noqa: E731
    return {"candidates": t(SPEC_TOKENS), "retrieve_index": torch.arange(12 * batch_copies).view(-1, 6),
            "next_token": t(SPEC_NEXT_TOKEN), "next_sibling": t(SPEC_NEXT_SIBLING)}


def _tree_probs(vocab: int = TREE_VOCAB, favoured: float = 0.93, shift: int = 0) -> torch.Tensor:
    """[2, 6, vocab]: each node's row gives its favoured token (+ shift) `favoured`, the rest an
    equal share."""
    probs = torch.full((2, 6, vocab), (1.0 - favoured) / (vocab - 1))
    probs.scatter_(2, torch.tensor(SPEC_FAVOURED).unsqueeze(-1) + shift, favoured)
    return probs


def tree_reference(a: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(accepted_index, accepted_token_ids, accepted_length) by the documented walk
    (tests/kernels/test_speculative.py's walk()). Where CUDA meets a bad link (outside [1, D), a
    node already on the path, a sibling chain longer than the tree) the walk ends with the node's
    token as the correction; at a bad row it ends without a token (-1). The CPU raises on those,
    so its references never see one."""
    cand, rows_of, first, sibling = (a[n].long().tolist() for n in ("candidates", "retrieve_index", "next_token",
                                                                         "next_sibling"))
    target = a["target_probs"] if a.get("target_probs") is not None else a["target_logits"]
    rows = target.float().reshape(-1, target.shape[-1])
    batch, nodes = a["candidates"].shape
    u = spec_uniforms(a.get("uniforms"), (batch, nodes))
    width = (nodes - 1 if a.get("max_depth") is None else a["max_depth"]) + 1
    index = torch.full((batch, width), -1, dtype=torch.int64)
    tokens = torch.full((batch, width), -1, dtype=torch.int64)
    length = torch.zeros(batch, dtype=torch.int64)
    for b in range(batch):
        path, toks, cur = [0], [], 0
        while True:
            r = rows_of[b][cur]
            if not 0 <= r < rows.shape[0]:
                token = -1
                break
            token = int(rows[r].argmax()) if a["greedy"] else max(spec_draw(rows[r], u[b, cur]), 0)
            if len(path) >= width:
                break
            c, steps, nxt = first[b][cur], 0, -1
            while c != -1:
                if not 0 < c < nodes or steps >= nodes or c in path:
                    break
                if cand[b][c] == token:
                    nxt = c
                    break
                c, steps = sibling[b][c], steps + 1
            if nxt < 0:
                break
            path.append(nxt)
            toks.append(token)
            cur = nxt
        toks.append(token)
        index[b, :len(path)] = torch.tensor(path)
        tokens[b, :len(toks)] = torch.tensor(toks)
        length[b] = len(path) - 1
    return index, tokens, length


def _tree_spec(greedy: bool) -> OpSpec:
    target = "target_logits" if greedy else "target_probs"

    def valid():
        a = {**_tree_lists(), "target_probs": None, "target_logits": None, "greedy": greedy,
             "uniforms": None if greedy else torch.linspace(0.15, 0.85, 12).view(2, 6), "generator": None,
             "max_depth": None, "check": True}
        a[target] = _tree_probs().log().view(12, TREE_VOCAB) if greedy else _tree_probs()
        return a

    return OpSpec(
        "tree_speculative_verify (greedy)" if greedy else "tree_speculative_verify", "tree_speculative_verify",
        mk.tree_speculative_verify, valid=valid, reference=tree_reference,
        # The outputs (new tensors on candidates' device) and CUDA's workspace and error come later.
        verify_order=("candidates", "retrieve_index", "next_token", "next_sibling", target)
        + (() if greedy else ("uniforms",)),
    )


def tree_link_rows(where: tuple[int, int], name: str, value: int, record: tuple[int, int] | None,
                   why: str, names: tuple[str, ...] | None = None) -> Iterator[Row]:
    """`name`[where] = value: a malformed tree. record: CUDA's (flattened index, value) when the
    walk meets it, None when it never does."""
    label = f"{name}[{where[0]}, {where[1]}] = {value} ({why})"
    yield from spec_bad_rows(label, set_entry(name, where, value), names or (name,),
                             None if record is None else ("tree_speculative_verify", *record))


TREE_LISTS = ("candidates", "retrieve_index", "next_token", "next_sibling")


def tree_argument_rows() -> Iterator[Row]:
    """The arguments both forms check alike (in the sampling form's table only)."""
    lists = TREE_LISTS
    # candidates, retrieve_index, next_token, next_sibling: [batch, D] contiguous, one dtype.
    for name in lists:
        yield from tensor_kind_rows(name)
        yield from dtype_rows(name, *INDEX_BAD)
        yield from rank_rows(name)
        yield from meta_rows(name)
        yield from stride_rows(name)
        yield from expanded_rows(name)
        if name != "candidates":
            yield raises(f"{name} int32, candidates int64", lambda a, n=name: a.update({n: a[n].int()}), TYPE, name,
                         "candidates")
            yield from shape_rows(name, 0, 1, names=(name, "candidates"))
    yield raises("candidates int32, the others int64", lambda a: a.update(candidates=a["candidates"].int()), TYPE,
                 "retrieve_index", "candidates")
    yield succeeds("all four int32", lambda a: a.update({n: a[n].int() for n in lists}))
    yield raises("no nodes (D = 0)", lambda a: a.update({n: torch.empty(2, 0, dtype=torch.long) for n in lists}), VALUE,
                 "candidates")
    yield succeeds("candidates and retrieve_index one tensor (both read)", lambda a: a.update(candidates=a["retrieve_index"]))
    yield raises("target_probs and target_logits both given", lambda a: a.update(
        target_probs=_tree_probs(), target_logits=_tree_probs().log()), VALUE, "target_probs", "target_logits")
    yield raises("neither target_probs nor target_logits", setter(target_probs=None, target_logits=None), VALUE,
                 "target_probs", "target_logits")
    # max_depth: None (D - 1) or an int in [0, D - 1] (a path holds at most D - 1 drafts).
    for label, bad in (("'2'", "2"), ("1.5", 1.5), ("2.0", 2.0), ("True", True), ("a tensor", torch.tensor(2))):
        yield raises(f"max_depth = {label}", setter(max_depth=bad), TYPE, "max_depth")
    for bad in (-1, 6, 100, 2**64, -(2**64)):  # D = 6 here
        yield raises(f"max_depth = {bad}", setter(max_depth=bad), VALUE, "max_depth")
    for name in ("greedy", "check"):
        yield from spec_flag_kind_rows(name)
    yield raises("greedy missing", lambda a: a.pop("greedy"), TYPE, "greedy")


def tree_common_rows(target: str) -> Iterator[Row]:
    """Rows of each form (`target`: the form's target argument): what the kernels do."""
    lists = TREE_LISTS
    yield succeeds("empty batch", lambda a: a.update({n: torch.empty(0, 6, dtype=torch.long) for n in lists},
                                                     **({"uniforms": torch.empty(0, 6)} if a["uniforms"] is not None else {})))
    yield succeeds("one node (the root only: D = 1)", lambda a: a.update(
        {n: a[n][:, :1].clone() for n in lists}, next_token=torch.full((2, 1), -1), next_sibling=torch.full((2, 1), -1),
        **({"uniforms": a["uniforms"][:, :1].contiguous()} if a["uniforms"] is not None else {})))
    yield succeeds("candidates out of the vocab (never match)", lambda a: a["candidates"].add_(2**40))

    # Malformed trees. The walks: request 0 0 -> 1 -> 4 (node 1's children scanned in sibling
    # order: 3, then 4), request 1 0 -> 1 -> 2; CUDA follows only the links these scans read.
    yield from tree_link_rows((0, 1), "next_token", 6, (1, 6), "out of range, on the walk")
    yield from tree_link_rows((0, 1), "next_token", -2, (1, -2), "out of range, on the walk")
    yield from tree_link_rows((0, 1), "next_token", 2**62, (1, 2**62), "out of range, on the walk")
    yield from tree_link_rows((0, 1), "next_token", 0, (1, 0), "links to the root, on the walk")
    yield from tree_link_rows((0, 3), "next_sibling", 0, (3, 0), "links to the root, on the walk")
    yield from tree_link_rows((0, 3), "next_sibling", 1, (3, 1), "a cycle through node 1, on the walk",
                              ("next_token", "next_sibling"))
    yield from tree_link_rows((0, 4), "next_token", 1, (4, 1), "a cycle back to node 1, on the walk",
                              ("next_token", "next_sibling"))
    yield from tree_link_rows((0, 4), "next_token", 4, (4, 4), "node 4 its own child, on the walk",
                              ("next_token", "next_sibling"))
    yield from tree_link_rows((1, 2), "next_token", 7, (8, 7), "out of range, request 1's walk")
    # Bad links the walk never follows: the CPU checks every link; CUDA never reads them.
    yield from tree_link_rows((0, 5), "next_token", 9, None, "out of range, off the walk")
    yield from tree_link_rows((0, 0), "next_sibling", 9, None, "the root's sibling: never followed")
    yield from tree_link_rows((1, 4), "next_sibling", 0, None, "links to the root, after the walk's match")
    yield from tree_link_rows((0, 2), "next_token", 3, None, "node 3 reached twice (from 1 and 2), off the walk",
                              ("next_token", "next_sibling"))

    def sibling_cycle(a):  # node 1's children 3 -> 4 -> 3 -> ...; node 4 no longer carries node 1's token
        set_entry("next_sibling", (0, 4), 3)(a)
        a["candidates"][0, 4] = 5

    # CUDA: the chain of siblings is longer than the tree after 6 steps, at 4 -> 3.
    yield from spec_bad_rows("a sibling cycle under node 1 (3 -> 4 -> 3), no child matching", sibling_cycle,
                             ("next_token", "next_sibling"), ("tree_speculative_verify", 4, 3))
    yield succeeds("next_sibling[0, 0] = 3 (the root's sibling: never followed)", set_entry("next_sibling", (0, 0), 3))

    # retrieve_index: rows of the target ([batch * D, vocab] here: 12 rows).
    for value in (12, -1, 2**62, -(2**63)):
        yield from spec_bad_rows(f"retrieve_index[1, 2] = {value} (on request 1's walk)",
                                 set_entry("retrieve_index", (1, 2), value), ("retrieve_index",),
                                 ("tree_speculative_verify", 8, value))
    yield from spec_bad_rows("retrieve_index[0, 0] = 12 (the root's row)", set_entry("retrieve_index", (0, 0), 12),
                             ("retrieve_index",), ("tree_speculative_verify", 0, 12))
    yield from spec_bad_rows("retrieve_index[1, 5] = 12 (off the walk)", set_entry("retrieve_index", (1, 5), 12),
                             ("retrieve_index",), None)
    yield succeeds("retrieve_index all 0 (every node reads row 0)", lambda a: a["retrieve_index"].zero_())
    yield succeeds("retrieve_index reversed", lambda a: a.update(retrieve_index=a["retrieve_index"].flip(0, 1).contiguous()))

    # Both forms: the target argument.
    for label, bad in (("str", "tensor"), ("float", 1.5), ("list", [1.0, 2.0])):
        yield raises(f"{target}: {label} for a tensor", setter(**{target: bad}), TYPE, target)
    yield from dtype_rows(target, *FLOAT_BAD)
    yield from meta_rows(target)
    yield raises(f"{target} 1-D", lambda a: a.update({target: a[target].reshape(-1)}), VALUE, target)
    yield raises(f"{target} 4-D", lambda a: a.update({target: a[target].reshape(1, 2, 6, TREE_VOCAB)}), VALUE, target)
    yield raises(f"{target} scalar", lambda a: a.update({target: a[target].reshape(-1)[0].clone()}), VALUE, target)
    rows = lambda a: a[target].reshape(12, TREE_VOCAB)  # noqa: E731
    for shape in ((12, TREE_VOCAB), (2, 6, TREE_VOCAB)):
        yield raises(f"{target} {len(shape)}-D, inner stride 2",
                     lambda a, s=shape: a.update({target: non_unit_inner(rows(a).reshape(s))}), VALUE, target)
        yield raises(f"{target} {len(shape)}-D, empty vocab", lambda a, s=shape: a.update({target: torch.empty(*s[:-1], 0)}),
                     VALUE, target)
        yield succeeds(f"{target} {len(shape)}-D", lambda a, s=shape: a.update({target: rows(a).reshape(s).clone()}))
        yield succeeds(f"{target} {len(shape)}-D, row stride 12 (a slice)", lambda a, s=shape: a.update(
            {target: torch.cat([rows(a), rows(a)[:, :4]], 1).reshape(*s[:-1], 12)[..., :TREE_VOCAB]}))
    yield raises(f"{target} [batch, D, vocab] not viewable as [batch * D, vocab]", lambda a: a.update(
        {target: a[target].reshape(2, 6, TREE_VOCAB).transpose(0, 1).contiguous().transpose(0, 1)}), VALUE, target)
    yield raises(f"{target} transposed (vocab stride 12)", lambda a: a.update(
        {target: transposed(a[target].reshape(12, TREE_VOCAB))}), VALUE, target)
    yield raises(f"{target} with no rows", lambda a: a.update({target: torch.empty(0, TREE_VOCAB)}), VALUE, "retrieve_index")
    yield succeeds(f"{target} 13 rows (one unused)", lambda a: a.update(
        {target: torch.cat([a[target].reshape(12, TREE_VOCAB), torch.zeros(1, TREE_VOCAB)])}))
    yield succeeds(f"{target} expanded (stride 0) over the nodes", lambda a: a.update(
        {target: a[target].reshape(12, TREE_VOCAB)[:1].expand(12, TREE_VOCAB)}))
    for dtype in (torch.float16, torch.bfloat16):
        yield succeeds(f"{target} {dtype}", lambda a, d=dtype: a.update({target: a[target].to(d)}))
    for depth in (0, 1, 5):
        yield succeeds(f"max_depth = {depth}", setter(max_depth=depth))
    yield succeeds("check = False", setter(check=False))

    def big_batch(a):  # 100 x 6 node rows: CUDA's walk-only plan (over 4 rows per SM)
        a.update(_tree_lists(50))
        a[target] = a[target].reshape(12, TREE_VOCAB).repeat(50, 1)
        if a["uniforms"] is not None:
            a["uniforms"] = a["uniforms"].repeat(50, 1)

    yield succeeds("batch 100 (CUDA's walk-only plan)", big_batch)
    yield from spec_bad_rows("batch 100, next_token[77, 1] = 6 (CUDA's walk-only plan)",
                             lambda a: (big_batch(a), a["next_token"].__setitem__((77, 1), 6)), ("next_token",),
                             ("tree_speculative_verify", 77 * 6 + 1, 6))
    yield from spec_bad_rows("batch 100, retrieve_index[77, 2] = 600 (CUDA's walk-only plan)",
                             lambda a: (big_batch(a), a["retrieve_index"].__setitem__((77, 2), 600)), ("retrieve_index",),
                             ("tree_speculative_verify", 77 * 6 + 2, 600))


@table("tree_speculative_verify")
def tree_sampling_rows(spec: OpSpec) -> Iterator[Row]:
    yield from tree_argument_rows()
    yield from tree_common_rows("target_probs")
    # uniforms: float32 [batch, D], contiguous, in [0, 1); or None (drawn).
    for label, bad in (("str", "tensor"), ("float", 0.5), ("list", [0.5, 0.5])):
        yield raises(f"uniforms: {label} for a tensor", setter(uniforms=bad), TYPE, "uniforms")
    yield from dtype_rows("uniforms", torch.float64, torch.float16)
    yield from rank_rows("uniforms")
    yield from meta_rows("uniforms")
    yield from stride_rows("uniforms")
    yield from expanded_rows("uniforms")
    yield from shape_rows("uniforms", 0, 1, names=("uniforms",))
    for at, value in (((0, 1), 1.0), ((0, 1), -0.5), ((0, 1), math.nan), ((0, 1), math.inf), ((1, 5), math.nan)):
        yield checked_on_cpu_clamped_on_cuda(f"uniforms[{at[0]}, {at[1]}] = {value}",
                                             lambda a, at=at, v=value: a["uniforms"].__setitem__(at, v), "uniforms")
    yield succeeds("uniforms all 0", lambda a: a["uniforms"].zero_())
    yield succeeds("uniforms just below 1", lambda a: a["uniforms"].fill_(1 - 2**-24))
    yield raises("uniforms and generator both given", setter(generator=seeded(3)), VALUE, "uniforms", "generator")
    yield raises("generator = 'seed'", setter(uniforms=None, generator="seed"), TYPE, "generator")
    yield raises("generator = 42", setter(uniforms=None, generator=42), TYPE, "generator")
    one_hot = lambda a: a.update(target_probs=_tree_probs(favoured=1.0))  # noqa: E731: any uniform, the same draws
    yield succeeds("one-hot target_probs, uniforms drawn from a generator", lambda a: (one_hot(a), a.update(
        uniforms=None, generator=seeded(3))))
    yield succeeds("one-hot target_probs, uniforms drawn (no generator)", lambda a: (one_hot(a), a.update(uniforms=None)))
    yield raises("target_logits with greedy=False", setter(target_probs=None, target_logits=_tree_probs().log()), VALUE,
                 "target_logits")
    # Values of the probabilities (used as given).
    yield succeeds("target_probs random rows", lambda a: a.update(
        target_probs=torch.softmax(randn(2, 6, TREE_VOCAB, seed=37), -1)))
    yield succeeds("target_probs all 0 (no mass: token 0)", lambda a: a["target_probs"].zero_())
    yield succeeds("target_probs NaN, inf and -1 in each row", lambda a: a["target_probs"][..., 5:8].copy_(
        torch.tensor([math.nan, math.inf, -1.0])))
    yield succeeds("target_probs unnormalized (x 7)", lambda a: a["target_probs"].mul_(7))
    yield succeeds("vocab 5000 (tokens shifted by 4000)", lambda a: (
        a.update(target_probs=_tree_probs(5000, shift=4000)), a["candidates"].add_(4000)))


@table("tree_speculative_verify (greedy)")
def tree_greedy_rows(spec: OpSpec) -> Iterator[Row]:
    yield from tree_common_rows("target_logits")
    yield raises("uniforms given (greedy)", setter(uniforms=torch.rand(2, 6)), VALUE, "uniforms")
    yield raises("generator given (greedy)", setter(generator=seeded(3)), VALUE, "generator")
    yield succeeds("target_probs instead of target_logits (greedy takes either)", lambda a: a.update(
        target_probs=_tree_probs(), target_logits=None))
    yield succeeds("greedy = 1", setter(greedy=1))
    yield succeeds("target_logits all equal (ties: token 0)", lambda a: a["target_logits"].fill_(-1.0))
    yield succeeds("target_logits -inf everywhere", lambda a: a["target_logits"].fill_(-math.inf))
    yield succeeds("target_logits NaN (the first NaN wins), inf", lambda a: a["target_logits"][:, 5:8].copy_(
        torch.tensor([math.inf, math.nan, math.nan])))
    yield succeeds("target_logits huge (1e30)", lambda a: a["target_logits"].mul_(1e30))

    def sliced(a):  # CUDA's argmax of a row in slices of >= 4096 tokens; ties across slices
        logits = randn(12, 20000, seed=38)
        logits[torch.arange(12), torch.tensor(SPEC_FAVOURED).view(-1) + 12000] = 10.0
        logits[0, 19999] = 10.0  # a tie with the root's favoured token: the first wins
        a.update(target_logits=logits)
        a["candidates"].add_(12000)

    yield succeeds("vocab 20000 (tokens shifted by 12000)", sliced)


# tree_from_parents / build_tree_attention_mask: torch functions on the parents' device.


def tree_lists_reference(a: dict[str, Any]) -> tuple[torch.Tensor, ...]:
    """(candidates, retrieve_index, next_token, next_sibling) by a plain loop (children in index
    order; tests/kernels/test_speculative.py's plain_lists())."""
    parents, tokens = a["parents"].long(), a["tokens"]
    batch, nodes = parents.shape
    first = torch.full((batch, nodes), -1, dtype=torch.int64)
    sibling = torch.full((batch, nodes), -1, dtype=torch.int64)
    for b in range(batch):
        last: dict[int, int] = {}
        for i in range(1, nodes):
            p = int(parents[b, i])
            if first[b, p] == -1:
                first[b, p] = i
            else:
                sibling[b, last[p]] = i
            last[p] = i
    return tokens.clone(), torch.arange(batch * nodes).view(batch, nodes), first, sibling


def tree_mask_reference(a: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """(mask, positions) by a plain loop (tests/kernels/test_speculative.py's plain_mask())."""
    parents, prefix_lens = a["parents"].long(), a["prefix_lens"]
    rows, positions = [], []
    for b in range(parents.shape[0]):
        nodes, prefix, pos = parents.shape[1], int(prefix_lens[b]), []
        for i in range(nodes):
            seen, j, depth = set(), i, 0
            while j != -1:
                seen.add(j)
                j = int(parents[b, j])
                depth += j != -1
            rows += [True] * prefix + [k in seen for k in range(nodes)]
            pos.append(prefix + depth)
        positions.append(pos)
    return torch.tensor(rows, dtype=torch.bool), torch.tensor(positions, dtype=torch.int64).view(-1, parents.shape[1])


def tree_mask_of_length(numel: int):
    """CUDA with a mask_numel other than the mask's length: the mask cut short or padded with False."""

    def reference(a):
        mask, positions = tree_mask_reference(a)
        out = torch.zeros(numel, dtype=torch.bool)
        out[:min(numel, mask.numel())] = mask[:numel]
        return out, positions

    return reference


def _tree_from_parents_spec() -> OpSpec:
    return OpSpec("tree_from_parents", "tree_from_parents", mk.tree_from_parents,
                  valid=lambda: {"parents": torch.tensor(SPEC_PARENTS), "tokens": torch.tensor(SPEC_TOKENS)},
                  reference=tree_lists_reference, verify_order=("parents", "tokens"))


def _tree_mask_spec() -> OpSpec:
    return OpSpec("build_tree_attention_mask", "build_tree_attention_mask", mk.build_tree_attention_mask,
                  valid=lambda: {"parents": torch.tensor(SPEC_PARENTS), "prefix_lens": torch.tensor([3, 0]),
                                 "mask_numel": None},
                  reference=tree_mask_reference, verify_order=("parents", "prefix_lens"))


def with_parents(parents: torch.Tensor) -> Callable[[dict[str, Any]], None]:
    """Mutation: these parents (and tokens of their shape, where the op takes tokens)."""

    def mutate(a):
        a["parents"] = parents
        if "tokens" in a:
            a["tokens"] = torch.arange(parents.numel()).view(parents.shape)

    return mutate


def parents_rows() -> Iterator[Row]:
    """parents: int32 / int64 [batch, D >= 1], parents[:, 0] = -1, 0 <= parents[:, i] < i."""
    yield from tensor_kind_rows("parents")
    yield from dtype_rows("parents", *INDEX_BAD, torch.bool)
    yield from rank_rows("parents")
    yield from meta_rows("parents")
    for where, value, why in (((0, 0), 0, "the root has a parent"), ((1, 0), 5, "the root has a parent"),
                              ((0, 3), 3, "its own parent"), ((0, 3), 4, "a later node: not in topological order"),
                              ((1, 5), 5, "its own parent"), ((0, 3), -1, "a second root"),
                              ((0, 3), 2**62, "out of range"), ((0, 3), -(2**63), "out of range")):
        yield raises(f"parents[{where[0]}, {where[1]}] = {value} ({why})", set_entry("parents", where, value), VALUE,
                     "parents")
    yield succeeds("parents int32", lambda a: a.update(parents=a["parents"].int()))
    yield succeeds("parents transposed in memory", lambda a: a.update(parents=transposed(a["parents"])))
    yield succeeds("parents expanded (stride 0, read only)", lambda a: a.update(parents=expanded(a["parents"])))
    yield succeeds("a chain of 40 nodes", with_parents(torch.arange(-1, 39).repeat(2, 1)))
    yield succeeds("a star of 40 nodes", with_parents(torch.cat([torch.full((2, 1), -1), torch.zeros(2, 39, dtype=torch.long)], 1)))


@table("tree_from_parents")
def tree_from_parents_rows(spec: OpSpec) -> Iterator[Row]:
    yield from parents_rows()
    # tokens: int32 / int64 of the parents' shape, on their device.
    yield from tensor_kind_rows("tokens")
    yield from dtype_rows("tokens", *INDEX_BAD, torch.bool)
    yield from rank_rows("tokens")
    yield from meta_rows("tokens")
    yield from shape_rows("tokens", 0, 1, names=("tokens",))
    yield raises("parents 0 nodes (D = 0)", lambda a: a.update(parents=torch.empty(2, 0, dtype=torch.long),
                                                                tokens=torch.empty(2, 0, dtype=torch.long)), VALUE, "parents")
    yield succeeds("tokens int32", lambda a: a.update(tokens=a["tokens"].int()))
    yield succeeds("tokens huge values (2**62)", lambda a: a["tokens"].add_(2**62))
    yield succeeds("tokens expanded (stride 0)", lambda a: a.update(tokens=expanded(a["tokens"])))
    yield succeeds("tokens is parents (both read)", lambda a: a.update(tokens=a["parents"]))
    yield succeeds("empty batch", lambda a: a.update(parents=torch.empty(0, 6, dtype=torch.long),
                                                      tokens=torch.empty(0, 6, dtype=torch.long)))
    yield succeeds("one node (D = 1)", lambda a: a.update(parents=torch.full((2, 1), -1), tokens=torch.zeros(2, 1, dtype=torch.long)))


@table("build_tree_attention_mask")
def tree_mask_rows(spec: OpSpec) -> Iterator[Row]:
    yield from parents_rows()
    yield raises("parents 0 nodes (D = 0)", lambda a: a.update(parents=torch.empty(2, 0, dtype=torch.long)), VALUE, "parents")
    # prefix_lens: int32 / int64 [batch] on the parents' device, >= 0.
    yield from tensor_kind_rows("prefix_lens")
    yield from dtype_rows("prefix_lens", *INDEX_BAD, torch.bool)
    yield from rank_rows("prefix_lens")
    yield from meta_rows("prefix_lens")
    yield from shape_rows("prefix_lens", 0, names=("prefix_lens",))
    for value in (-1, -(2**63), 2**62):
        yield raises(f"prefix_lens[0] = {value}", set_entry("prefix_lens", 0, value), VALUE, "prefix_lens")
    yield succeeds("prefix_lens int32", lambda a: a.update(prefix_lens=a["prefix_lens"].int()))
    yield succeeds("prefix_lens all 0", lambda a: a["prefix_lens"].zero_())
    yield succeeds("prefix_lens 1000", lambda a: a["prefix_lens"].fill_(1000))
    yield succeeds("prefix_lens expanded (stride 0)", lambda a: a.update(prefix_lens=torch.tensor([4]).expand(2)))
    yield succeeds("prefix_lens is a column of parents (both read)", lambda a: a.update(prefix_lens=a["parents"][:, 4]))
    yield succeeds("empty batch", lambda a: a.update(parents=torch.empty(0, 6, dtype=torch.long),
                                                      prefix_lens=torch.empty(0, dtype=torch.long)))
    yield succeeds("one node (D = 1)", lambda a: a.update(parents=torch.full((2, 1), -1)))
    # mask_numel: None (computed: a sync on CUDA), or sum(D * (prefix_lens[b] + D)) = 6 * 9 + 6 * 6 = 90.
    yield succeeds("mask_numel = 90", setter(mask_numel=90))
    for label, bad in (("'90'", "90"), ("90.0", 90.0), ("True", True), ("a tensor", torch.tensor(90))):
        yield raises(f"mask_numel = {label}", setter(mask_numel=bad), TYPE, "mask_numel")
    for bad in (-1, 2**64, -(2**64)):
        yield raises(f"mask_numel = {bad}", setter(mask_numel=bad), VALUE, "mask_numel")
    # A mask_numel that does not match prefix_lens: check=True (the default; it reads prefix_lens,
    # a sync on CUDA) raises on both devices; check=False reads nothing and gives the mask of that
    # length, cut short or padded with False (never an element read out of bounds).
    for bad in (89, 91, 0):
        label = f"mask_numel = {bad} (not 90)"
        yield raises(label, setter(mask_numel=bad), VALUE, "mask_numel")
        yield succeeds(label + ", check=False", setter(mask_numel=bad, check=False),
                       reference=tree_mask_of_length(bad))
    yield raises("check=False without mask_numel", setter(check=False), VALUE, "mask_numel")


# ----------------------------------------------------------------------------- module functions
# The public ops allocate their outputs, so `out` can only alias an input through the module
# functions themselves: these rows call them directly (the C++ contract is what must refuse).


def _module_spec(package: str, export: str, valid: Callable[[], dict[str, Any]], reference=None,
                 verify_order: tuple[str, ...] = (), cpu_extra: tuple = ()) -> OpSpec:
    def call(**a):  # the module of out's device (the CPU table: always the CPU module)
        device = a["out"].device.type
        extra = cpu_extra if device == "cpu" else ()  # e.g. the CPU module's thread count
        return getattr(registry.package(package)._modules[device], export)(*a.values(), *extra)

    return OpSpec(f"{export} (module)", export, call, valid=valid, written=("out",), reference=reference,
                  verify_order=verify_order, router="out")


def _module_out_reference(fn_name: str, package: str, ref_name: str, *inputs: str, **fixed):
    def reference(a):
        return {"out": ref(package, ref_name)(*(a[n] for n in inputs), **fixed).to(a["out"].dtype)}
    return reference


@table("rms_norm (module)")
def rms_norm_module_rows(spec: OpSpec) -> Iterator[Row]:
    yield raises("out is x", lambda a: a.update(out=a["x"]), VALUE, "out", "x")

    def out_on_weight(a):
        buf = torch.zeros(5 * 64)
        a.update(out=buf[:256].view(4, 64), weight=buf[256 - 32: 256 + 32])

    yield raises("weight overlaps out's last row", out_on_weight, VALUE, "out", "weight")
    yield raises("out expanded", lambda a: a.update(out=expanded(a["out"])), VALUE, "out")

    def halves(a):
        out, x = interleaved(4, 64, 2, seed=2)
        a.update(out=out, x=x)

    yield succeeds("out and x interleaved halves of one tensor", halves)


@table("softmax (module)")
def softmax_module_rows(spec: OpSpec) -> Iterator[Row]:
    yield raises("out is x", lambda a: a.update(out=a["x"]), VALUE, "out", "x")

    def shifted(a):
        buf = randn(4 * 64 + 3)
        a.update(out=buf[:256].view(4, 64), x=buf[3:].view(4, 64))

    yield raises("x is out shifted by 3 elements", shifted, VALUE, "out", "x")
    yield succeeds("valid", lambda a: None)


@table("silu_and_mul (module)")
def silu_module_rows(spec: OpSpec) -> Iterator[Row]:
    yield raises("out is the gate half of x", lambda a: a.update(out=a["x"][:, :64]), VALUE, "out", "x")
    yield raises("out is the up half of x", lambda a: a.update(out=a["x"][:, 64:]), VALUE, "out", "x")
    yield succeeds("valid", lambda a: None)


@table("embedding (module)")
def embedding_module_rows(spec: OpSpec) -> Iterator[Row]:
    yield raises("out is rows of table", lambda a: a.update(out=a["table"][:3]), VALUE, "out", "table")
    yield succeeds("valid", lambda a: None)


def module_specs() -> dict[str, OpSpec]:
    return {
        "rms_norm (module)": _module_spec(
            "rms_norm", "rms_norm",
            lambda: {"out": torch.zeros(4, 64), "x": randn(4, 64), "weight": randn(64, seed=1), "eps": 1e-6},
            reference=_module_out_reference("rms_norm", "rms_norm", "ref_rms_norm", "x", "weight"),
            verify_order=("x", "out", "weight")),
        "softmax (module)": _module_spec(
            "softmax", "softmax", lambda: {"out": torch.zeros(4, 64), "x": randn(4, 64), "temperature": 1.0},
            reference=_module_out_reference("softmax", "softmax", "ref_softmax", "x"), verify_order=("x", "out"),
            cpu_extra=(1,)),
        "silu_and_mul (module)": _module_spec(
            "activation", "silu_and_mul", lambda: {"out": torch.zeros(4, 64), "x": randn(4, 128)},
            reference=_module_out_reference("silu_and_mul", "activation", "ref_silu_and_mul", "x"),
            verify_order=("x", "out")),
        "embedding (module)": _module_spec(
            "embedding", "embedding",
            lambda: {"out": torch.zeros(3, 16), "ids": torch.tensor([1, 0, 7]), "table": randn(8, 16),
                     "error": torch.zeros(3, dtype=torch.int64)},
            reference=_module_out_reference("embedding", "embedding", "ref_embedding", "ids", "table"),
            # `error` is left out: only the CUDA contract verifies it (the CPU ignores it).
            verify_order=("table", "ids", "out")),
    }


# ----------------------------------------------------------------------------- the table


def op_specs() -> dict[str, OpSpec]:
    """Every public op, from the registry's exports plus the *_from_uniforms variants."""
    builders: dict[str, Callable[[], OpSpec]] = {
        "rms_norm": _rms_norm_spec,
        "fused_add_rms_norm": _fused_spec,
        "silu_and_mul": lambda: _act_spec("silu_and_mul"),
        "gelu_and_mul": lambda: _act_spec("gelu_and_mul"),
        "softmax": lambda: _softmax_spec("softmax"),
        "log_softmax": lambda: _softmax_spec("log_softmax"),
        "apply_rope": _rope_spec,
        "store_kv_cache": _kv_spec,
        "embedding": _embedding_spec,
        "apply_penalties": lambda: _penalties_spec("token_ids"),
        "apply_penalties (counts_or_mask)": lambda: _penalties_spec("counts_or_mask"),
        "decode_attention": _decode_spec,
        "merge_attention_states": _merge_spec,
        "prefill_attention": _prefill_spec,
        "paged_prefill_attention": _paged_prefill_spec,
        "chain_speculative_sampling": _chain_spec,
        "tree_speculative_verify": lambda: _tree_spec(greedy=False),
        "tree_speculative_verify (greedy)": lambda: _tree_spec(greedy=True),
        "tree_from_parents": _tree_from_parents_spec,
        "build_tree_attention_mask": _tree_mask_spec,
    }
    for name in ("greedy_sample", "top_k_top_p_sample", "top_k_top_p_sample_from_uniforms", "min_p_sample",
                 "min_p_sample_from_uniforms"):
        builders[name] = lambda name=name: _sample_spec(name)
    for name in FILTER_OPS:
        builders[name] = lambda name=name: _filter_spec(name)
    return {name: build() for name, build in builders.items()} | module_specs()


def public_ops() -> list[str]:
    return sorted(registry.exports())


def device_type(device: str) -> str:
    return device.split(":")[0]


def mismatch_named(spec: OpSpec, devices: dict[str, str]) -> str:
    """The argument a device mismatch error names: the router's device type picks the module;
    the contract verifies spec.verify_order in turn, the first argument binds the device (it must
    be of the module's type) and the first later one on another device raises."""
    module = device_type(devices[spec.router or spec.verify_order[0]])
    bound = None
    for name in spec.verify_order:
        if bound is None:
            if device_type(devices[name]) != module:
                return name
            bound = devices[name]
        elif devices[name] != bound:
            return name
    raise AssertionError(f"{spec.name}: no device mismatch in {devices}")


def device_rows(spec: OpSpec, gpus: int) -> Iterator[Row]:
    """Each tensor argument on the CPU among CUDA ones and vice versa; with two GPUs, on cuda:1
    among cuda:0 ones, and every tensor on cuda:1 (the kernel must run on its tensors' device)."""
    base = spec.device_base or (lambda a: None)
    layouts = [(CUDA0, "cpu"), ("cpu", CUDA0)] + ([(CUDA0, CUDA1)] if gpus >= 2 else [])
    if len(spec.verify_order) >= 2:
        for rest, moved in layouts:
            for name in spec.verify_order:
                devices = {n: rest for n in spec.verify_order} | {name: moved}
                yield Row(f"{name} on {moved}, the rest on {rest}", base,
                          Raises(VALUE, (mismatch_named(spec, devices),)), placement=(rest, {name: moved}))
    if gpus >= 2:
        yield Row(f"every tensor on {CUDA1}", lambda a: None, Succeeds(), placement=(CUDA1, {}))


def build_cases(device: str | None = None, gpus: int | None = None) -> dict[str, tuple[OpSpec, Row]]:
    """The table of `device` (default: $MLLM_KERNEL_FUZZ_DEVICE or cpu); `gpus` (default: the
    visible CUDA devices) decides the cuda:1 rows. Sets the mode that on_cuda() reads."""
    device = device or fuzz_device()
    if gpus is None:
        gpus = torch.cuda.device_count() if device == "cuda" else 0
    _MODE.update(device=device, gpus=gpus)
    cases = {}
    for name, spec in op_specs().items():
        rows = list(GENERATORS[name](spec))
        if device == "cuda":
            rows += device_rows(spec, gpus)
        for row in rows:
            case_id = f"{name} | {row.label}"
            assert case_id not in cases, f"duplicate case {case_id!r}"
            cases[case_id] = (spec, row)
    return cases


# ----------------------------------------------------------------------------- running one case


def storage_bytes(t: torch.Tensor) -> torch.Tensor | None:
    """A copy of every byte of t's storage (aliases and gaps included), or None for meta."""
    if not isinstance(t, torch.Tensor) or t.device.type == "meta":
        return None
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage()).clone()


def placement_of(spec: OpSpec, row: Row, args: dict[str, Any]) -> dict[str, str] | None:
    """{argument: device} for every tensor argument (None: leave everything where it is)."""
    if row.placement is None and _MODE["device"] == "cpu":
        return None
    rest, own = row.placement or ((CUDA0 if _MODE["device"] == "cuda" else "cpu"), {})
    return {n: own.get(n, rest) for n, v in args.items() if isinstance(v, torch.Tensor)}


def place(args: dict[str, Any], devices: dict[str, str], router: str, stand_in: dict[str, str] | None = None) -> dict[str, Any]:
    """The arguments with each tensor moved to devices[name], layout kept: one copy per storage
    and device, each tensor rebuilt on it with its offset, shape and strides, so aliases,
    overlaps, gaps and expansions stay as built. Meta tensors stay meta. A torch.Generator follows
    `router`'s device. `stand_in` maps devices to others (the dry run: cuda -> meta)."""
    stand_in = stand_in or {}
    copies: dict[tuple, torch.Tensor] = {}
    placed = dict(args)
    for name, t in args.items():
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            continue
        target = torch.device(stand_in.get(devices[name], devices[name]))
        if t.device == target:
            continue
        storage = t.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes(), str(t.device), str(target)) if storage.data_ptr() else (id(t),)
        raw = copies.get(key)
        if raw is None:
            raw = copies[key] = torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage).to(target)
        placed[name] = torch.empty(0, dtype=t.dtype, device=target).set_(
            raw.untyped_storage(), t.storage_offset(), t.shape, t.stride())
    target = torch.device(stand_in.get(devices.get(router, "cpu"), devices.get(router, "cpu")))
    for name, g in args.items():
        if isinstance(g, torch.Generator) and target.type != "meta" and g.device != target:
            placed[name] = torch.Generator(device=target).manual_seed(g.initial_seed())
    return placed


ERROR_RECORDS = {"rope": "pop_rope_error", "kv_cache": "pop_kv_cache_error", "embedding": "pop_embedding_error",
                 "decode_attention": "pop_decode_attention_error", "prefill_attention": "pop_prefill_attention_error",
                 "penalties": "pop_penalties_error", "speculative": "pop_speculative_error"}


def pop_records(device: str) -> dict[str, tuple[int, int] | tuple[str, int, int] | str | None]:
    """Reads and clears the CUDA device-error records of the ops that have one."""
    return {p: getattr(registry.package(p), fn)(device) for p, fn in ERROR_RECORDS.items()}


def record_matches(recorded: tuple[int, int] | tuple[str, int, int] | str | None, expected: tuple | None) -> bool:
    """(index, value) and (source, index, value) records (penalties) equal; a message record
    (decode_attention) starts with the expected prefix."""
    if isinstance(recorded, str) and expected is not None and len(expected) == 1:
        return recorded.startswith(expected[0])
    return recorded == expected


def detached_copy(value: Any) -> Any:
    """A non-aliased copy of an argument (tensors cloned, strides kept; others as they are)."""
    if isinstance(value, torch.Tensor):
        return value.clone() if value.device.type != "meta" else value
    if isinstance(value, torch.Generator):
        g = torch.Generator(device=value.device)
        g.set_state(value.get_state())
        return g
    return value


def close(actual: torch.Tensor, expected: torch.Tensor,
          tolerance: dict[torch.dtype, tuple[float, float]] | None = None) -> str | None:
    """None when actual matches expected (float dtypes within tolerance, NaNs where expected);
    `tolerance` ({dtype: (atol, rtol)}, OpSpec.tolerance) replaces the defaults of its dtypes."""
    if tuple(actual.shape) != tuple(expected.shape):
        return f"shape {tuple(actual.shape)} != expected {tuple(expected.shape)}"
    if actual.dtype in (torch.int64, torch.int32):
        return None if torch.equal(actual.cpu().long(), expected.cpu().long()) else f"{actual.tolist()} != {expected.tolist()}"
    a, e = actual.double(), expected.double()
    if bool(torch.isnan(a).any()) and not bool(torch.isnan(e).any()):
        return f"NaN in the result where the reference has none: {a.tolist()}"
    a, e = a.cpu(), e.cpu()
    tol = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}.get(actual.dtype, 1e-6)
    rtol = tol
    if actual.device.type == "cuda" and actual.dtype == torch.float32:
        rtol = 1e-4  # CUDA's float32 math (fast exp/erf): the report's float32 rtol (checks.TOL)
    if tolerance and actual.dtype in tolerance:
        tol, rtol = tolerance[actual.dtype]
    if torch.allclose(a, e, rtol=rtol, atol=tol, equal_nan=True):
        return None
    return f"max |error| {(a - e).abs().nan_to_num(math.inf).max().item():.3g} > {tol}"


def judge_success(spec: OpSpec, row: Row, copies: dict[str, Any], args: dict[str, Any], result: Any) -> str | None:
    reference = row.reference or spec.reference
    if reference is None:
        return None
    expected = reference(copies)
    if isinstance(expected, tuple) and isinstance(expected[0], str) and expected[0] == "member of":
        kept = expected[1]
        picked = kept.gather(-1, result.cpu().view(-1, 1)).view(-1)
        return None if bool(picked.all()) else f"sampled tokens {result.tolist()} outside the kept set"
    if isinstance(expected, dict):
        for name, want in expected.items():
            problem = close(args[name], want, spec.tolerance)
            if problem:
                return f"{name}: {problem}"
        return None
    if isinstance(expected, tuple):  # several results, e.g. (out, lse)
        if not isinstance(result, tuple) or len(result) != len(expected):
            return f"returned {type(result).__name__}, expected a tuple of {len(expected)}"
        for i, (got, want) in enumerate(zip(result, expected)):
            problem = close(got, want, spec.tolerance)
            if problem:
                return f"result[{i}]: {problem}"
        return None
    return close(result, expected, spec.tolerance)


def names(message: str, name: str) -> bool:
    """Whether `message` names `name` as a word ("x" in "argument 'x'", not in "softmax")."""
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", message) is not None


def prepare(spec: OpSpec, row: Row, stand_in: dict[str, str] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(arguments on their devices, non-aliased CPU copies of them for the references)."""
    torch.manual_seed(0)
    args = spec.valid()
    row.mutate(args)
    copies = {n: detached_copy(v) for n, v in args.items()}  # on the CPU, where the rows build
    devices = placement_of(spec, row, args)
    if devices is not None:
        args = place(args, devices, spec.router or (spec.verify_order or ("",))[0], stand_in)
    return args, copies


def run_case(spec: OpSpec, row: Row) -> dict[str, Any]:
    """Runs one case in this process; returns {"verdict": "raised" | "correct" | "fail", ...}."""
    args, copies = prepare(spec, row)
    cuda = _MODE["device"] == "cuda"
    if cuda:
        pop_records(CUDA0)  # records left by an earlier case
    snapshots = {n: storage_bytes(args[n]) for n in spec.written if n in args}
    try:
        result = spec.fn(**args)
        if cuda:
            torch.cuda.synchronize()  # an asynchronous CUDA error belongs to this case
    except Exception as error:  # noqa: BLE001: judging exactly which
        message = str(error).split("\n")[0][:400]  # torch appends C++ backtraces
        changed = [n for n, snap in snapshots.items() if snap is not None and not torch.equal(snap, storage_bytes(args[n]))]
        if isinstance(row.expect, Raises) and row.expect.written is not None:
            # Raised after its kernel ran: written arguments hold exactly what the op documents.
            expected = row.expect.written(copies)
            changed = [f"{n} ({problem})" for n in expected if (problem := close(args[n], expected[n], spec.tolerance))]
        if not isinstance(row.expect, Raises):
            return {"verdict": "fail", "detail": f"raised {type(error).__name__}: {message}"}
        problems = []
        if type(error) is not row.expect.exc:
            problems.append(f"raised {type(error).__name__}, expected {row.expect.exc.__name__}")
        missing = [n for n in (spec.op, *row.expect.names) if not names(message, n)]
        if missing:
            problems.append(f"message does not name {missing}")
        if changed:
            problems.append(f"written argument(s) {changed} changed although the call raised")
        if problems:
            return {"verdict": "fail", "detail": "; ".join(problems) + f" -- {type(error).__name__}: {message}"}
        return {"verdict": "raised"}
    if isinstance(row.expect, Raises):
        return {"verdict": "fail", "detail": f"returned, expected {row.expect.exc.__name__} naming {row.expect.names}"}
    problem = judge_success(spec, row, copies, args, result)
    if cuda and not problem:
        want = row.expect.recorded
        got = pop_records(CUDA0)
        for package, recorded in got.items():
            expected = tuple(want[1:]) if want and want[0] == package else None
            if not record_matches(recorded, expected):
                problem = f"{package}'s device-error record holds {recorded}, expected {expected}"
    return {"verdict": "fail", "detail": problem} if problem else {"verdict": "correct"}


def worker_main() -> None:
    """The subprocess worker: reads case ids (one a line) from stdin, answers one JSON line each
    on the original stdout; everything else printed goes to stderr."""
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    cases = build_cases()  # the table of $MLLM_KERNEL_FUZZ_DEVICE, set by the parent
    for line in sys.stdin:
        case_id = line.rstrip("\n")
        try:
            answer = run_case(*cases[case_id])
        except BaseException as error:  # noqa: BLE001: the harness itself failed on this case
            answer = {"verdict": "fail", "detail": f"harness error {type(error).__name__}: {error}"}
        exiting = False
        if _MODE["device"] == "cuda" and answer["verdict"] == "fail":
            try:  # a CUDA error is sticky: a fresh worker for the next case
                torch.cuda.synchronize()
                torch.empty(1, device=CUDA0).add_(1).item()
            except Exception:  # noqa: BLE001
                exiting = True
        # `exiting` tells the parent before it sends the next case (else that case would be
        # reported as this worker's death).
        answers.write(json.dumps({"id": case_id, **answer, **({"exiting": True} if exiting else {})}) + "\n")
        if exiting:
            os._exit(3)


# ----------------------------------------------------------------------------- the worker pool

WORKER_CODE = "import sys; sys.path[:0] = {path!r}; import {module} as t; t.worker_main()"
CASE_TIMEOUT_S = float(os.environ.get("MLLM_HOSTILE_CASE_TIMEOUT", "120"))


class Worker:
    """A long-lived `python -c` that runs cases of one table; restarted after it dies or hangs."""

    def __init__(self, device: str = "cpu"):
        self.proc: subprocess.Popen | None = None
        self.restarts = 0
        self.device = device

    def _start(self):
        here = os.path.dirname(os.path.abspath(__file__))
        code = WORKER_CODE.format(path=[here, *sys.path], module=os.path.splitext(os.path.basename(__file__))[0])
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, bufsize=1, env={**os.environ, FUZZ_DEVICE_ENV: self.device})

    def run(self, case_id: str) -> dict[str, Any]:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        proc = self.proc
        try:
            proc.stdin.write(case_id + "\n")
            proc.stdin.flush()
        except BrokenPipeError:
            pass
        ready, _, _ = select.select([proc.stdout], [], [], CASE_TIMEOUT_S)
        line = proc.stdout.readline() if ready else None
        if line:
            answer = json.loads(line)
            if answer.pop("exiting", False):  # its CUDA context is broken: it exits, a fresh one follows
                proc.wait()
                self.proc = None
                self.restarts += 1
            return answer
        if not ready:
            proc.kill()
            detail = f"hung for {CASE_TIMEOUT_S:.0f} s (worker killed)"
        else:
            rc = proc.wait()
            detail = f"worker died: {'signal ' + str(-rc) if rc < 0 else 'exit ' + str(rc)}"
        proc.wait()
        self.proc = None
        self.restarts += 1
        return {"id": case_id, "verdict": "fail", "detail": detail}

    def close(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


def run_all(case_ids: list[str], workers: int, device: str = "cpu") -> list[dict[str, Any]]:
    results: list[dict[str, Any] | None] = [None] * len(case_ids)
    next_index = iter(range(len(case_ids)))
    lock = threading.Lock()

    def loop():
        worker = Worker(device)
        try:
            while True:
                with lock:
                    i = next(next_index, None)
                if i is None:
                    return
                results[i] = worker.run(case_ids[i])
        finally:
            worker.close()

    threads = [threading.Thread(target=loop) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results  # type: ignore[return-value]


# ----------------------------------------------------------------------------- the tests


def test_every_public_op_has_rows():
    missing = sorted(set(public_ops()) - set(GENERATORS))
    assert not missing, f"public ops without rows in the hostile-input table: {missing}"


@pytest.mark.parametrize("device", TABLE_DEVICES)
def test_hostile_inputs(device):
    chosen = os.environ.get(FUZZ_DEVICE_ENV)
    if chosen and chosen != device:
        pytest.skip(f"{FUZZ_DEVICE_ENV}={chosen}")
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("the CUDA table needs a CUDA device (torch.cuda.is_available() is False)")
    cases = build_cases(device)
    ids = list(cases)
    only = os.environ.get("MLLM_HOSTILE_ONLY")  # a substring of case ids, for local runs
    if only:
        ids = [i for i in ids if only in i]
    start = time.monotonic()
    results = run_all(ids, workers=max(1, min(2, os.cpu_count() or 1)), device=device)
    failures = [r for r in results if r["verdict"] == "fail"]
    raised = sum(r["verdict"] == "raised" for r in results)
    correct = sum(r["verdict"] == "correct" for r in results)
    allowed = sum(isinstance(cases[i][1].expect, Succeeds) for i in ids)
    per_op: dict[str, list[int]] = {}
    for case_id, r in zip(ids, results):
        counts = per_op.setdefault(case_id.split(" | ")[0], [0, 0])
        counts[0] += 1
        counts[1] += r["verdict"] == "fail"
    print()
    for name, (n, bad) in sorted(per_op.items()):
        print(f"  {name:<34} {n:4d} cases  {bad:3d} failed")
    for r in failures:
        print(f"FAIL {r['id']}: {r['detail']}")
    gpus = f", {_MODE['gpus']} GPUs" if device == "cuda" else ""
    print(f"hostile inputs ({device}{gpus}): {len(ids)} cases, {raised} raised cleanly, {correct}/{allowed} allowed "
          f"successes correct, {len(failures)} failures ({time.monotonic() - start:.1f} s)")
    assert not failures, f"{len(failures)} of {len(ids)} hostile-input ({device}) cases failed (listed above)"


def dry_run(device: str, gpus: int | None = None, stand_in: dict[str, str] | None = None) -> dict[str, tuple[OpSpec, Row]]:
    """Builds a table and prepares every case without calling an op: mutations, placement (with
    `stand_in` devices, e.g. meta for CUDA), the references of successes and of partial writes."""
    cases = build_cases(device, gpus)
    for case_id, (spec, row) in cases.items():
        try:
            _, copies = prepare(spec, row, stand_in)
            if isinstance(row.expect, Succeeds) and (row.reference or spec.reference):
                (row.reference or spec.reference)(copies)
            if isinstance(row.expect, Raises) and row.expect.written is not None:
                row.expect.written(copies)
        except Exception as error:
            raise AssertionError(f"{case_id}: {type(error).__name__}: {error}") from error
    return cases


def test_cuda_table_builds():
    """The CUDA table (with the cuda:1 rows of two GPUs) builds and prepares on any machine."""
    cases = dry_run("cuda", gpus=2, stand_in={CUDA0: "meta", CUDA1: "meta"})
    cpu = build_cases("cpu")
    assert set(cpu) <= set(cases), sorted(set(cpu) - set(cases))[:5]
    device_cases = [i for i, (_, row) in cases.items() if row.placement is not None]
    assert device_cases and all(isinstance(cases[i][1].expect, Succeeds) or cases[i][1].expect.names for i in device_cases)
    differs = [i for i in cpu if type(cpu[i][1].expect) is not type(cases[i][1].expect)]
    print(f"\nCUDA table: {len(cases)} cases ({len(cpu)} of the CPU table, {len(differs)} of them expected to "
          f"succeed on CUDA; {len(device_cases)} device rows; {len(cases) - len(cpu) - len(device_cases)} CUDA-only rows)")


def list_cases(device: str, gpus: int | None = None) -> None:
    for case_id, (_, row) in build_cases(device, gpus).items():
        e = row.expect
        if isinstance(e, Raises):
            what = f"raises {e.exc.__name__} naming {', '.join(e.names) or '(the op)'}" + (
                " (may write)" if e.written else "")
        else:
            what = "succeeds" + (f", records {e.recorded}" if e.recorded else "")
        print(f"{case_id}  ->  {what}")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--list", action="store_true", help="print the table's cases and expectations; run nothing")
    parser.add_argument("--device", choices=TABLE_DEVICES, default=None, help=f"default: ${FUZZ_DEVICE_ENV} or cpu")
    parser.add_argument("--gpus", type=int, default=None, help="with --list: GPUs to assume (default: visible)")
    options = parser.parse_args()
    if options.list:
        list_cases(options.device or fuzz_device(), options.gpus)
        raise SystemExit(0)
    if options.device:
        os.environ[FUZZ_DEVICE_ENV] = options.device
    raise SystemExit(pytest.main([__file__, "-v", "-s"]))
