"""Token sampling (kernels/sampling/sampling.cpp, sampling.cuh).

- greedy_sample(logits): argmax per row (ties -> lowest index, like torch.argmax).
- top_k_top_p_sample(logits, top_k, top_p, generator=None): sample from softmax(logits)
  restricted to the top-k logits (ties at the k-th value kept; top_k <= 0 disables), then to
  the smallest descending-probability prefix whose mass, relative to the top-k set, is >= top_p
  (ties kept; top_p >= 1 disables; the top token always stays).
- min_p_sample(probs, min_p, generator=None): sample from probs restricted to
  p >= min_p * max(p), renormalized.
- top_k_mask_logits(logits, top_k): a new tensor with the logits below each row's k-th largest
  set to -inf (ties kept).
- top_k_renorm_probs(probs, top_k) / top_p_renorm_probs(probs, top_p): a new tensor with the
  probabilities that top-k / top-p (the rules above, top-p relative to the row's total mass)
  keep, divided by their sum, and 0 elsewhere; a row that keeps no mass comes back as zeros.

num_threads (CPU; CUDA ignores it): rows run on that many threads (a pool kept between calls); results
do not depend on it.

The uniforms are drawn here with torch (one float32 per row, from `generator` when given) and
the kernel picks the first token, in index order, whose running kept weight exceeds u * total.
So a seeded generator makes sampling deterministic, and CPU and CUDA agree for the same
uniforms up to float rounding at CDF boundaries. The *_from_uniforms variants take the
uniforms directly.

logits / probs: [batch, vocab] float32 / float16 / bfloat16, unit last stride (a row stride is
fine). Per-row parameters: int64 top_k, float32 top_p / min_p, shape [batch], on the logits'
device. Ranges of per-row parameters are checked on CPU; on CUDA they are clamped in the kernel
(checking device data would need a host sync).
"""

from __future__ import annotations

import math

import torch

from mllm_kernel.kernels.op_modules import DeviceModules, custom_op, expect_tensor, op_specs

_KERNEL_NAMES = ("greedy_sample", "top_k_top_p_sample", "min_p_sample", "top_k_mask_logits", "top_k_renorm_probs",
                 "top_p_renorm_probs")
# The *_from_uniforms forms are public too: with the uniforms given, sampling is reproducible in
# tests and across devices.
EXPORTS = _KERNEL_NAMES + ("top_k_top_p_sample_from_uniforms", "min_p_sample_from_uniforms")
SPECS = op_specs(__file__, _KERNEL_NAMES)
_modules = DeviceModules(SPECS)


def _check_rows(x: torch.Tensor, op: str, name: str) -> int:
    expect_tensor(op, name, x, SPECS)
    _check_2d(op, name, x)
    return x.shape[0]


def _check_2d(op: str, name: str, x: torch.Tensor) -> None:
    if x.dim() != 2:
        raise ValueError(f"{op}: {name} must be 2-D [batch, vocab], got shape {tuple(x.shape)}")


def _empty_tokens(x: torch.Tensor) -> torch.Tensor:
    return torch.empty(x.shape[0], dtype=torch.int64, device=x.device)


# ----------------------------------------------------------------------------- custom ops
# The bodies allocate inline rather than through _empty_tokens: one Python frame less per call.


# The CPU modules take a thread count last; the CUDA ones do not.


@custom_op("greedy_sample")
def _greedy_op(logits: torch.Tensor, num_threads: int) -> torch.Tensor:
    if logits.dim() != 2:
        raise ValueError(f"greedy_sample: logits must be 2-D [batch, vocab], got shape {tuple(logits.shape)}")
    out = torch.empty(logits.shape[0], dtype=torch.int64, device=logits.device)
    if logits.device.type == "cpu":
        _modules["cpu"].greedy_sample(out, logits, num_threads)
    else:
        _modules[logits.device.type].greedy_sample(out, logits)
    return out


@_greedy_op.register_fake
def _(logits: torch.Tensor, num_threads: int) -> torch.Tensor:
    return _empty_tokens(logits)


@custom_op("top_k_top_p_sample")
def _top_k_top_p_op(
    logits: torch.Tensor, uniforms: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, num_threads: int
) -> torch.Tensor:
    if logits.dim() != 2:
        raise ValueError(f"top_k_top_p_sample: logits must be 2-D [batch, vocab], got shape {tuple(logits.shape)}")
    out = torch.empty(logits.shape[0], dtype=torch.int64, device=logits.device)
    if logits.device.type == "cpu":
        _modules["cpu"].top_k_top_p_sample(out, logits, uniforms, top_k, top_p, num_threads)
    else:
        _modules[logits.device.type].top_k_top_p_sample(out, logits, uniforms, top_k, top_p)
    return out


@_top_k_top_p_op.register_fake
def _(logits, uniforms, top_k, top_p, num_threads):
    return _empty_tokens(logits)


@custom_op("min_p_sample")
def _min_p_op(probs: torch.Tensor, uniforms: torch.Tensor, min_p: torch.Tensor, num_threads: int) -> torch.Tensor:
    if probs.dim() != 2:
        raise ValueError(f"min_p_sample: probs must be 2-D [batch, vocab], got shape {tuple(probs.shape)}")
    out = torch.empty(probs.shape[0], dtype=torch.int64, device=probs.device)
    if probs.device.type == "cpu":
        _modules["cpu"].min_p_sample(out, probs, uniforms, min_p, num_threads)
    else:
        _modules[probs.device.type].min_p_sample(out, probs, uniforms, min_p)
    return out


@_min_p_op.register_fake
def _(probs, uniforms, min_p, num_threads):
    return _empty_tokens(probs)


def _filtered(op: str, scores: str, x: torch.Tensor, param: torch.Tensor, num_threads: int) -> torch.Tensor:
    """A filter's body: a new [batch, vocab] tensor from x and its per-row parameter."""
    _check_2d(op, scores, x)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.device.type == "cpu":
        getattr(_modules["cpu"], op)(out, x, param, num_threads)
    else:
        getattr(_modules[x.device.type], op)(out, x, param)
    return out


# Separate functions: the custom op names arguments in its messages by these parameter names.
@custom_op("top_k_mask_logits")
def _top_k_mask_op(logits: torch.Tensor, top_k: torch.Tensor, num_threads: int) -> torch.Tensor:
    return _filtered("top_k_mask_logits", "logits", logits, top_k, num_threads)


@custom_op("top_k_renorm_probs")
def _top_k_renorm_op(probs: torch.Tensor, top_k: torch.Tensor, num_threads: int) -> torch.Tensor:
    return _filtered("top_k_renorm_probs", "probs", probs, top_k, num_threads)


@custom_op("top_p_renorm_probs")
def _top_p_renorm_op(probs: torch.Tensor, top_p: torch.Tensor, num_threads: int) -> torch.Tensor:
    return _filtered("top_p_renorm_probs", "probs", probs, top_p, num_threads)


@_top_k_mask_op.register_fake
@_top_k_renorm_op.register_fake
@_top_p_renorm_op.register_fake
def _(x, param, num_threads):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


# ----------------------------------------------------------------------------- parameters


def _per_row(value, batch: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A scalar becomes a [batch] tensor; a tensor is passed through (the C++ side checks it)."""
    if isinstance(value, torch.Tensor):
        return value
    return torch.full((batch,), value, dtype=dtype, device=device)


def _scalar_top_k(top_k, op: str = "top_k_top_p_sample") -> int:
    if isinstance(top_k, torch.Tensor):
        return top_k
    if isinstance(top_k, float):
        raise ValueError(f"{op}: top_k must be an int or an int64 tensor, got {top_k!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, int):
        raise TypeError(f"{op}: top_k must be an int or an int64 tensor, got {type(top_k).__name__}")
    if not -(2**63) <= top_k < 2**63:
        raise ValueError(f"{op}: top_k = {top_k} is out of range for a 64-bit integer")
    return top_k


def _scalar_in_range(value, op: str, name: str, low: float, low_inclusive: bool):
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{op}: {name} must be a float or a float32 tensor, got {type(value).__name__}")
    try:
        value = float(value)
    except OverflowError:
        raise ValueError(f"{op}: {name} = {value} is out of range for a float") from None
    ok_low = value >= low if low_inclusive else value > low
    if not (ok_low and value <= 1.0) or math.isnan(value):
        interval = f"{'[' if low_inclusive else '('}{low:g}, 1]"
        raise ValueError(f"{op}: {name} must be in {interval}, got {value}")
    return value


# The smallest positive float32: a positive top_p below it would round to 0 in the kernels' float32
# parameter; it keeps the top token only, exactly as any top_p below the top token's probability.
_MIN_TOP_P = 2.0**-149


def _top_k_top_p_params(logits: torch.Tensor, top_k, top_p) -> tuple[torch.Tensor, torch.Tensor]:
    """Scalar top_k / top_p checked and expanded to per-row tensors (tensors pass through)."""
    batch = _check_rows(logits, "top_k_top_p_sample", "logits")
    top_k = _scalar_top_k(top_k)
    top_p = _scalar_in_range(top_p, "top_k_top_p_sample", "top_p", 0.0, low_inclusive=False)
    if not isinstance(top_p, torch.Tensor):
        top_p = max(top_p, _MIN_TOP_P)
    return _per_row(top_k, batch, logits.device, torch.int64), _per_row(top_p, batch, logits.device, torch.float32)


def _min_p_param(probs: torch.Tensor, min_p) -> torch.Tensor:
    batch = _check_rows(probs, "min_p_sample", "probs")
    min_p = _scalar_in_range(min_p, "min_p_sample", "min_p", 0.0, low_inclusive=True)
    return _per_row(min_p, batch, probs.device, torch.float32)


def _uniforms(op: str, name: str, x: torch.Tensor, generator) -> torch.Tensor:
    """One float32 uniform in [0, 1) per row of x, from `generator` when given."""
    batch = _check_rows(x, op, name)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"{op}: generator must be a torch.Generator or None, got {type(generator).__name__}")
    return torch.rand(batch, generator=generator, device=x.device, dtype=torch.float32)


def _threads(op: str, num_threads) -> None:
    """Raises the error for a num_threads that is not an int >= 1, on every device (CUDA ignores
    the value, but a bad one is still refused)."""
    if type(num_threads) is not int:
        raise TypeError(f"{op}: num_threads must be an int >= 1, got {type(num_threads).__name__} {num_threads!r}")
    raise ValueError(f"{op}: num_threads must be >= 1, got {num_threads}")


# ----------------------------------------------------------------------------- public API
# With per-row tensors (an engine's decode step), greedy_sample and the *_from_uniforms functions
# reach the module in three Python frames; scalar parameters and drawing the uniforms add one each.


def greedy_sample(logits: torch.Tensor, *, num_threads: int = 1) -> torch.Tensor:
    """argmax of each row of logits [batch, vocab] -> int64 [batch]."""
    if type(num_threads) is not int or num_threads < 1:
        _threads("greedy_sample", num_threads)
    return _greedy_op(logits, num_threads)


def top_k_top_p_sample_from_uniforms(logits: torch.Tensor, uniforms: torch.Tensor, top_k, top_p, *,
                                     num_threads: int = 1) -> torch.Tensor:  # fmt: skip
    """top_k_top_p_sample with the float32 [batch] uniforms in [0, 1) given."""
    if type(top_k) is not torch.Tensor or type(top_p) is not torch.Tensor:
        top_k, top_p = _top_k_top_p_params(logits, top_k, top_p)
    if type(num_threads) is not int or num_threads < 1:
        _threads("top_k_top_p_sample", num_threads)
    return _top_k_top_p_op(logits, uniforms, top_k, top_p, num_threads)


def top_k_top_p_sample(logits: torch.Tensor, top_k, top_p, generator=None, *, num_threads: int = 1) -> torch.Tensor:
    """Sample one token per row of logits [batch, vocab] from softmax(logits) restricted by
    top-k (int or int64 [batch]; <= 0 disables) then top-p (float or float32 [batch] in (0, 1];
    1 disables). Returns int64 [batch]."""
    uniforms = _uniforms("top_k_top_p_sample", "logits", logits, generator)
    return top_k_top_p_sample_from_uniforms(logits, uniforms, top_k, top_p, num_threads=num_threads)


def min_p_sample_from_uniforms(probs: torch.Tensor, uniforms: torch.Tensor, min_p, *,
                               num_threads: int = 1) -> torch.Tensor:  # fmt: skip
    """min_p_sample with the float32 [batch] uniforms in [0, 1) given."""
    if type(min_p) is not torch.Tensor:
        min_p = _min_p_param(probs, min_p)
    if type(num_threads) is not int or num_threads < 1:
        _threads("min_p_sample", num_threads)
    return _min_p_op(probs, uniforms, min_p, num_threads)


def min_p_sample(probs: torch.Tensor, min_p, generator=None, *, num_threads: int = 1) -> torch.Tensor:
    """Sample one token per row of probs [batch, vocab] (already normalized) among the tokens
    with p >= min_p * max(p) (min_p: float or float32 [batch] in [0, 1]). Returns int64 [batch]."""
    uniforms = _uniforms("min_p_sample", "probs", probs, generator)
    return min_p_sample_from_uniforms(probs, uniforms, min_p, num_threads=num_threads)


def top_k_mask_logits(logits: torch.Tensor, top_k, *, num_threads: int = 1) -> torch.Tensor:
    """logits [batch, vocab] with every logit below its row's k-th largest set to -inf (ties
    kept); top_k: int or int64 [batch], <= 0 or >= vocab keeps the row. Returns a new tensor."""
    if type(top_k) is not torch.Tensor:
        batch = _check_rows(logits, "top_k_mask_logits", "logits")
        top_k = _per_row(_scalar_top_k(top_k, "top_k_mask_logits"), batch, logits.device, torch.int64)
    if type(num_threads) is not int or num_threads < 1:
        _threads("top_k_mask_logits", num_threads)
    return _top_k_mask_op(logits, top_k, num_threads)


def top_k_renorm_probs(probs: torch.Tensor, top_k, *, num_threads: int = 1) -> torch.Tensor:
    """probs [batch, vocab] kept by top-k (ties kept), divided by their sum, 0 elsewhere; top_k:
    int or int64 [batch], <= 0 or >= vocab keeps the row. Returns a new tensor."""
    if type(top_k) is not torch.Tensor:
        batch = _check_rows(probs, "top_k_renorm_probs", "probs")
        top_k = _per_row(_scalar_top_k(top_k, "top_k_renorm_probs"), batch, probs.device, torch.int64)
    if type(num_threads) is not int or num_threads < 1:
        _threads("top_k_renorm_probs", num_threads)
    return _top_k_renorm_op(probs, top_k, num_threads)


def top_p_renorm_probs(probs: torch.Tensor, top_p, *, num_threads: int = 1) -> torch.Tensor:
    """probs [batch, vocab] of the smallest descending prefix whose mass is >= top_p of the row's
    mass (ties kept), divided by their sum, 0 elsewhere; top_p: float or float32 [batch] in
    (0, 1]. Returns a new tensor."""
    if type(top_p) is not torch.Tensor:
        batch = _check_rows(probs, "top_p_renorm_probs", "probs")
        top_p = _scalar_in_range(top_p, "top_p_renorm_probs", "top_p", 0.0, low_inclusive=False)
        top_p = _per_row(max(top_p, _MIN_TOP_P), batch, probs.device, torch.float32)
    if type(num_threads) is not int or num_threads < 1:
        _threads("top_p_renorm_probs", num_threads)
    return _top_p_renorm_op(probs, top_p, num_threads)
