"""Speculative-decoding verification (kernels/speculative/speculative.{cpp,cuh}).

chain_speculative_sampling(draft_probs, draft_token_ids, target_probs, *, uniforms=None,
                           generator=None, out_accepted=None) -> (output_token_ids, accepted_counts)

Exact rejection sampling of a chain of n draft tokens per request:
  - draft j (token x) is accepted when u[j] * q(x) < p(x), i.e. with probability min(1, p(x)/q(x)),
    where q = draft_probs[b, j] and p = target_probs[b, j]. The test is strict: a token with
    p(x) = 0 is never accepted, whatever the uniform.
  - at the first rejection j, the token at position j is drawn from normalize(max(0, p - q))
    (from p itself in the degenerate case where that residual has no mass), and positions
    j + 1 .. n are -1;
  - if all n drafts are accepted, position n gets a bonus token drawn from target_probs[b, n].
The result follows the target distribution exactly, whatever the draft distribution.

Draws use column n of `uniforms` and pick the first token, in index order, whose running weight
exceeds u times the total weight; weights are integers (probabilities times 2^40, each clamped to
[0, 1]), so the CPU and CUDA give identical tokens for the same uniforms. A target row without
any mass gives token 0.

draft_probs: float32 [batch, n, vocab]; draft_token_ids: int32 / int64 [batch, n];
target_probs: float32 [batch, n + 1, vocab] (unit last stride, any other strides; the probs are
used as given, not renormalized); uniforms: float32 [batch, n + 1] in [0, 1) (drawn with torch,
from `generator` when given, if None). Returns output_token_ids [batch, n + 1] of
draft_token_ids' dtype and accepted_counts [batch] (the number of accepted drafts; int64, or
written into `out_accepted`, int32 / int64 [batch], when given).

Bad draft ids (outside [0, vocab)):
  * CPU: checked before anything is written (and uniforms outside [0, 1)); ValueError.
  * CUDA: that position counts as rejected (its id is never read), and the kernel records
    (flattened index b * n + j, id) in a per-device flag buffer; `check=True` reads it after
    the kernel (a sync) and raises ValueError, otherwise `pop_speculative_error()` does.
    Uniforms outside [0, 1) are clamped on CUDA.
"""

from __future__ import annotations

import torch

from mllm_kernel.kernels.device_errors import DeviceErrorRecord
from mllm_kernel.kernels.op_modules import DeviceModules, as_bool, custom_op, expect_tensor, op_specs

_KERNEL_NAMES = ("chain_speculative_sampling",)
EXPORTS = ("chain_speculative_sampling",)
SPECS = op_specs(__file__, _KERNEL_NAMES)
_modules = DeviceModules(SPECS)
_errors = DeviceErrorRecord(
    "chain_speculative_sampling",
    "draft_token_ids (flattened)[{index}] = {value} is out of range [0, vocab={vocab}) (recorded on {device} by "
    "this call or an earlier unchecked one; that draft was rejected without being read)",
)

pop_speculative_error = _errors.pop  # (index, value) of the first bad draft id recorded on a device, or None


@custom_op("chain_speculative_sampling", mutates_args=("out_accepted",))
def _chain(
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    uniforms: torch.Tensor,
    out_accepted: torch.Tensor,
    check: bool,
) -> torch.Tensor:
    if draft_token_ids.dim() != 2:
        raise ValueError(f"chain_speculative_sampling: draft_token_ids must be 2-D [batch, n], got shape "
                         f"{tuple(draft_token_ids.shape)}")
    batch, n = draft_token_ids.shape
    out = torch.empty(batch, n + 1, dtype=draft_token_ids.dtype, device=draft_token_ids.device)
    device = draft_token_ids.device
    _modules[device.type].chain_speculative_sampling(out, out_accepted, draft_probs, draft_token_ids, target_probs,
                                                     uniforms, _errors[device])
    if check:
        _errors.raise_recorded(device, vocab=target_probs.shape[-1])
    return out


@_chain.register_fake
def _(draft_probs, draft_token_ids, target_probs, uniforms, out_accepted, check):
    batch, n = draft_token_ids.shape
    return draft_token_ids.new_empty(batch, n + 1)


def chain_speculative_sampling(
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    *,
    uniforms: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    out_accepted: torch.Tensor | None = None,
    check: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify n draft tokens per request by rejection sampling (module doc). Returns
    (output_token_ids [batch, n + 1], accepted_counts [batch])."""
    op = "chain_speculative_sampling"
    expect_tensor(op, "draft_token_ids", draft_token_ids, SPECS)
    if draft_token_ids.dim() != 2:
        raise ValueError(f"{op}: draft_token_ids must be 2-D [batch, n], got shape {tuple(draft_token_ids.shape)}")
    batch, n = draft_token_ids.shape
    device = draft_token_ids.device
    check = check if check is True or check is False else as_bool(op, "check", check)
    if uniforms is None:
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"{op}: generator must be a torch.Generator or None, got {type(generator).__name__}")
        uniforms = torch.rand(batch, n + 1, generator=generator, device=device, dtype=torch.float32)
    elif generator is not None:
        raise ValueError(f"{op}: give uniforms or generator, not both")
    if out_accepted is None:
        out_accepted = torch.empty(batch, dtype=torch.int64, device=device)
    out = _chain(draft_probs, draft_token_ids, target_probs, uniforms, out_accepted, check)
    return out, out_accepted
