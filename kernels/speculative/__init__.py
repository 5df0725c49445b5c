"""Speculative-decoding verification (kernels/speculative/speculative.{cpp,cuh}): chain rejection
sampling, draft-tree verification, and the tree's attention mask.

chain_speculative_sampling(draft_probs, draft_token_ids, target_probs, *, uniforms=None,
                           generator=None, out_accepted=None, check=True)
    -> (output_token_ids, accepted_counts)

Exact rejection sampling of a chain of n draft tokens per request:
  - draft j (token x) is accepted when u[j] * q(x) < p(x), i.e. with probability min(1, p(x)/q(x)),
    where q = draft_probs[b, j] (clamped at 0) and p = target_probs[b, j]. The test is strict: a
    token with p(x) = 0 is never accepted, whatever the uniform.
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
used as given, not renormalized; vocab < 2^24, so 64-bit weight sums cannot overflow); uniforms: float32 [batch, n + 1] in [0, 1) (drawn with torch,
from `generator` when given, if None). Returns output_token_ids [batch, n + 1] of
draft_token_ids' dtype and accepted_counts [batch] (the number of accepted drafts; int64, or
written into `out_accepted`, int32 / int64 [batch], when given).

Bad draft ids (outside [0, vocab)):
  * CPU: checked before anything is written (and uniforms outside [0, 1)); ValueError.
  * CUDA: that position counts as rejected (its id is never read), and the kernel records
    (flattened index b * n + j, id) in a per-device flag buffer; `check=True` reads it after
    the kernel (a sync) and raises ValueError, otherwise `pop_speculative_error()` does.
    Uniforms outside [0, 1) are clamped on CUDA.

tree_speculative_verify(candidates, retrieve_index, next_token, next_sibling, target_probs=None, *,
                        target_logits=None, greedy, uniforms=None, generator=None, max_depth=None,
                        check=True) -> (accepted_index, accepted_token_ids, accepted_length)

The draft tree of each request is given as first-child / next-sibling lists over D nodes (SGLang's
layout; `tree_from_parents` builds them): node 0 is the root (the last verified token), nodes
1..D-1 are draft tokens with ids candidates[b, i]; next_token[b, i] / next_sibling[b, i] are node
i's first child / next sibling (a local node index) or -1; retrieve_index[b, i] is node i's row
of the target ([rows, vocab] or [batch, D, vocab] viewed as [batch * D, vocab]).
From the root, at each node on the path the target picks a token: its argmax (greedy) or a draw
from its probabilities with the node's uniform u[b, i] (the same integer-weight draw as the chain
op). If a child of the node carries that token (the first one, in sibling order), the child is
accepted and the walk goes on from it; otherwise the token is the correction (or, at a leaf or at
max_depth, the bonus) token and the walk ends. With one-hot draft tokens (EAGLE / Medusa trees)
this is exactly the rejection rule tried sibling by sibling (accept x with probability p(x), else
renormalize p without x and try the next sibling, else draw from what is left), done with one
uniform per node: the output follows the target distribution whatever the tree.
Outputs, in candidates' dtype: accepted_index [batch, max_depth + 1] (the local node indices of
the path from the root, -1 padded), accepted_token_ids [batch, max_depth + 1] (the accepted draft
tokens then the correction / bonus token, -1 padded), accepted_length [batch] (accepted drafts,
the root excluded). max_depth (in [0, D - 1], default D - 1: always enough) caps the path.
Sampling mode needs target_probs (float32 / float16 / bfloat16 rows, used as given, vocab <
2^24); greedy takes either. On the CPU a malformed tree (links outside [-1, D) or pointing at the
root, a node reached twice), a row index out of range or a uniform outside [0, 1) raises before
any write. CUDA checks only what its walk uses. A bad link it follows, a repeated node on its
path, or the row of a node on its path out of range is recorded, and the walk stops there. This
uses its own flag buffer, allocated on the first call per device, so call the op once before
capturing a graph; the `check` rule is the chain op's, and `pop_speculative_error()` reads both.
Problems off the path go unnoticed on CUDA.

tree_from_parents(parents, tokens, *, check=True) -> (candidates, retrieve_index, next_token,
next_sibling): parents [batch, D] int32 / int64 with parents[:, 0] = -1 and 0 <= parents[:, i] < i
(nodes in topological order); children are ordered by node index. torch ops on the parents'
device. check reads the parents (a sync on CUDA) and raises on bad ones; check=False does not
(capturable), and bad parents then give wrong lists, never an out-of-bounds access.

build_tree_attention_mask(parents, prefix_lens, *, mask_numel=None, check=True) -> (mask, positions): the
bool mask that paged_prefill_attention's custom_mask takes when the D tree nodes are the new
queries over prefix_lens[b] cached tokens: request b's [D, prefix_lens[b] + D] block, flattened
query-major and concatenated; node i sees the whole prefix, its ancestors and itself.
positions [batch, D] int64: prefix_lens[b] + depth of the node (the root at prefix_lens[b]).
The mask's length, sum of D * (prefix_lens[b] + D), depends on prefix_lens. check=True (the
default) reads parents and prefix_lens (a sync on CUDA) and raises on bad values or a mask_numel
that does not match. check=False reads nothing on the host and needs mask_numel; it can be
captured in a CUDA graph. Bad values then give a wrong mask, never an out-of-bounds access, and
entries past the real total are False.
"""

from __future__ import annotations

import numbers

import torch

from mllm_kernel.kernels.device_errors import DeviceErrorRecord
from mllm_kernel.kernels.op_modules import DeviceModules, as_bool, custom_op, expect_tensor, op_specs

_KERNEL_NAMES = ("chain_speculative_sampling", "tree_speculative_verify")
_TREE_PICKS_PER_NODE = 16  # speculative.hpp's kTreePicksPerNode
EXPORTS = ("chain_speculative_sampling", "tree_speculative_verify", "tree_from_parents", "build_tree_attention_mask")
SPECS = op_specs(__file__, _KERNEL_NAMES)
_modules = DeviceModules(SPECS)
_errors = DeviceErrorRecord(
    "chain_speculative_sampling",
    "draft_token_ids (flattened)[{index}] = {value} is out of range [0, vocab={vocab}) (recorded on {device} by "
    "this call or an earlier unchecked one; that draft was rejected without being read)",
)
_tree_errors = DeviceErrorRecord(
    "tree_speculative_verify",
    "node (flattened)[{index}] has a bad link or row, {value}: a next_token / next_sibling outside [1, D) or "
    "repeating a node of the path, or a retrieve_index outside [0, target rows) (recorded on {device} by this call "
    "or an earlier unchecked one; the walk stopped there)",
)


def pop_speculative_error(device=None) -> tuple[str, int, int] | None:
    """(op, index, value) of the first bad element recorded on a CUDA device by
    chain_speculative_sampling (a draft id) or tree_speculative_verify (a node), or None; clears
    that record. Syncs the current stream."""
    for op, record in (("chain_speculative_sampling", _errors), ("tree_speculative_verify", _tree_errors)):
        found = record.pop(device)
        if found is not None:
            return (op, *found)
    return None


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


# ----------------------------------------------------------------------------- trees


@custom_op("tree_speculative_verify",
           mutates_args=("accepted_index", "accepted_token_ids", "accepted_length"))
def _tree(
    accepted_index: torch.Tensor,
    accepted_token_ids: torch.Tensor,
    accepted_length: torch.Tensor,
    candidates: torch.Tensor,
    retrieve_index: torch.Tensor,
    next_token: torch.Tensor,
    next_sibling: torch.Tensor,
    target: torch.Tensor,
    uniforms: torch.Tensor,
    greedy: bool,
    check: bool,
) -> None:
    device = candidates.device
    # CUDA's per-node picks: up to 16 slices of a row (speculative.cuh, kTreePicksPerNode).
    picks = torch.empty(candidates.numel() * _TREE_PICKS_PER_NODE if device.type == "cuda" else 0, dtype=torch.int64,
                        device=device)
    _modules[device.type].tree_speculative_verify(accepted_index, accepted_token_ids, accepted_length, candidates,
                                                  retrieve_index, next_token, next_sibling, target, uniforms, greedy,
                                                  picks, _tree_errors[device])
    if check:
        _tree_errors.raise_recorded(device)


@_tree.register_fake
def _(accepted_index, accepted_token_ids, accepted_length, candidates, retrieve_index, next_token, next_sibling,
      target, uniforms, greedy, check):
    return None


def _target_rows(op: str, name: str, target, device: torch.device) -> torch.Tensor:
    """The target as [rows, vocab] (a [batch, D, vocab] one viewed so), checked here so that errors
    name target_probs / target_logits (the C++ contract calls it `target`)."""
    expect_tensor(op, name, target, SPECS)
    if target.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"{op}: {name} must be float32, float16 or bfloat16, got {target.dtype}")
    if target.dim() not in (2, 3):
        raise ValueError(f"{op}: {name} must be [rows, vocab] or [batch, D, vocab], got shape {tuple(target.shape)}")
    if target.device != device:
        raise ValueError(f"{op}: {name} is on {target.device}, the tree on {device}")
    if target.shape[-1] == 0:
        raise ValueError(f"{op}: {name} has an empty vocab dim (shape {tuple(target.shape)})")
    if target.shape[-1] > 1 and target.stride(-1) != 1:
        raise ValueError(f"{op}: {name} must have a unit last stride, got strides {target.stride()}")
    if target.dim() == 3:
        if target.shape[0] > 1 and target.shape[1] > 1 and target.stride(0) != target.shape[1] * target.stride(1):
            raise ValueError(f"{op}: {name} [batch, D, vocab] must be viewable as [batch * D, vocab], got strides "
                             f"{target.stride()}")
        target = target.reshape(-1, target.shape[-1])
    return target


def tree_speculative_verify(
    candidates: torch.Tensor,
    retrieve_index: torch.Tensor,
    next_token: torch.Tensor,
    next_sibling: torch.Tensor,
    target_probs: torch.Tensor | None = None,
    *,
    target_logits: torch.Tensor | None = None,
    greedy: bool,
    uniforms: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    max_depth: int | None = None,
    check: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Verify each request's draft tree against the target (module doc). Returns (accepted_index
    [batch, max_depth + 1], accepted_token_ids [batch, max_depth + 1], accepted_length [batch])."""
    op = "tree_speculative_verify"
    expect_tensor(op, "candidates", candidates, SPECS)
    if candidates.dim() != 2:
        raise ValueError(f"{op}: candidates must be 2-D [batch, num_nodes], got shape {tuple(candidates.shape)}")
    batch, nodes = candidates.shape
    greedy = greedy if greedy is True or greedy is False else as_bool(op, "greedy", greedy)
    check = check if check is True or check is False else as_bool(op, "check", check)
    if (target_probs is None) == (target_logits is None):
        raise ValueError(f"{op}: give exactly one of target_probs and target_logits")
    if target_logits is not None and not greedy:
        raise ValueError(f"{op}: sampling (greedy=False) needs target_probs, got target_logits")
    for list_name, t in (("retrieve_index", retrieve_index), ("next_token", next_token), ("next_sibling", next_sibling)):
        if isinstance(t, torch.Tensor) and t.device != candidates.device:  # before the target, in contract order
            raise ValueError(f"{op}: {list_name} is on {t.device}, candidates on {candidates.device}")
    name = "target_probs" if target_logits is None else "target_logits"
    target = _target_rows(op, name, target_probs if target_logits is None else target_logits, candidates.device)
    if max_depth is None:
        max_depth = nodes - 1
    elif isinstance(max_depth, bool) or not isinstance(max_depth, numbers.Integral):
        raise TypeError(f"{op}: max_depth must be an int, got {type(max_depth).__name__}")
    elif not 0 <= max_depth < max(nodes, 1):
        raise ValueError(f"{op}: max_depth must be in [0, num_nodes - 1 = {nodes - 1}] (a path holds at most "
                         f"num_nodes - 1 drafts), got {max_depth}")
    if greedy:
        if uniforms is not None or generator is not None:
            raise ValueError(f"{op}: greedy verification takes no uniforms or generator")
        uniforms = torch.empty(0, dtype=torch.float32, device=candidates.device)
    elif uniforms is None:
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"{op}: generator must be a torch.Generator or None, got {type(generator).__name__}")
        uniforms = torch.rand(batch, nodes, generator=generator, device=candidates.device, dtype=torch.float32)
    elif generator is not None:
        raise ValueError(f"{op}: give uniforms or generator, not both")
    accepted_index = torch.empty(batch, max_depth + 1, dtype=candidates.dtype, device=candidates.device)
    accepted_tokens = torch.empty_like(accepted_index)
    accepted_length = torch.empty(batch, dtype=candidates.dtype, device=candidates.device)
    _tree(accepted_index, accepted_tokens, accepted_length, candidates, retrieve_index, next_token, next_sibling,
          target, uniforms, greedy, check)
    return accepted_index, accepted_tokens, accepted_length


def _int_tensor(op: str, name: str, t, dims: int) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{op}: {name} must be int32 or int64, got {t.dtype}")
    if t.dim() != dims:
        raise ValueError(f"{op}: {name} must be {dims}-D, got shape {tuple(t.shape)}")
    if t.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{op}: {name} is on unsupported device {str(t.device)!r}; expected a cpu or cuda tensor")


def _check_parents(op: str, parents, check: bool) -> None:
    """parents: int32 / int64 [batch, D >= 1]; with check, parents[:, 0] = -1 and 0 <= parents[:, i] < i
    (reads the values: a sync on CUDA)."""
    _int_tensor(op, "parents", parents, 2)
    if parents.shape[1] == 0:
        raise ValueError(f"{op}: parents needs the root column (D >= 1), got shape {tuple(parents.shape)}")
    if not check:
        return
    index = torch.arange(parents.shape[1], device=parents.device)
    ok = (parents[:, 0] == -1).all() & ((parents[:, 1:] >= 0) & (parents[:, 1:] < index[1:])).all()
    if not bool(ok):
        raise ValueError(f"{op}: parents must have parents[:, 0] = -1 and 0 <= parents[:, i] < i (topological "
                         "order)")


def _parent_links(parents: torch.Tensor) -> torch.Tensor:
    """int64 parents with every value in [0, D) (the root, and anything out of range, point at
    the node itself), so the gathers below never index out of bounds whatever the input."""
    index = torch.arange(parents.shape[1], device=parents.device)
    p = parents.long()
    return torch.where((p >= 0) & (p < index), p, index)


def tree_from_parents(parents: torch.Tensor, tokens: torch.Tensor, *, check: bool = True):
    """(candidates, retrieve_index, next_token, next_sibling) of the trees given by parent indices
    (module doc); children in node-index order. tokens [batch, D]: the node token ids. check=False
    skips reading the parents (no sync; bad parents then give wrong but in-bounds lists)."""
    op = "tree_from_parents"
    check = check if check is True or check is False else as_bool(op, "check", check)
    _check_parents(op, parents, check)
    _int_tensor(op, "tokens", tokens, 2)
    if tokens.shape != parents.shape:
        raise ValueError(f"{op}: tokens must have the parents' shape {tuple(parents.shape)}, got {tuple(tokens.shape)}")
    if tokens.device != parents.device:
        raise ValueError(f"{op}: tokens is on {tokens.device}, parents on {parents.device}")
    batch, nodes = parents.shape
    dtype, device = tokens.dtype, parents.device
    index = torch.arange(nodes, device=device)
    p = _parent_links(parents)
    # Node i's first child: the smallest j with parent i; its next sibling: the smallest j > i
    # with the same parent. [batch, D, D] comparisons: trees are small (D <= a few hundred).
    later = index.view(1, 1, nodes) > index.view(1, nodes, 1)
    is_child = (p.unsqueeze(1) == index.view(1, nodes, 1)) & later  # [b, i, j]: j's parent is i
    sibling = (p.unsqueeze(1) == p.unsqueeze(2)) & later & (index > 0).view(1, 1, nodes)
    sibling[:, 0, :] = False  # the root has no siblings
    none = torch.full((), nodes, device=device)

    def first(mask):
        found = torch.where(mask, index.view(1, 1, nodes), none).amin(-1)
        return torch.where(found == nodes, -1, found).to(dtype)

    retrieve = (torch.arange(batch, device=device).view(batch, 1) * nodes + index).to(dtype)
    return tokens.clone(), retrieve, first(is_child), first(sibling)


_MAX_PREFIX = 2**31 - 1  # attention lengths are int32


def build_tree_attention_mask(parents: torch.Tensor, prefix_lens: torch.Tensor, *, mask_numel: int | None = None,
                              check: bool = True):
    """(mask, positions) of the draft trees over their cached prefixes (module doc). check=False
    skips reading parents and prefix_lens (no sync, capturable with mask_numel given); bad values
    then give a wrong mask, never an out-of-bounds access: entries past the real total are False."""
    op = "build_tree_attention_mask"
    check = check if check is True or check is False else as_bool(op, "check", check)
    _check_parents(op, parents, check)
    _int_tensor(op, "prefix_lens", prefix_lens, 1)
    if prefix_lens.shape[0] != parents.shape[0]:
        raise ValueError(f"{op}: prefix_lens must be [batch = {parents.shape[0]}], got shape "
                         f"{tuple(prefix_lens.shape)}")
    if prefix_lens.device != parents.device:
        raise ValueError(f"{op}: prefix_lens is on {prefix_lens.device}, parents on {parents.device}")
    if mask_numel is not None:
        if isinstance(mask_numel, bool) or not isinstance(mask_numel, int):
            raise TypeError(f"{op}: mask_numel must be an int or None, got {type(mask_numel).__name__}")
        if not 0 <= mask_numel < 2**62:
            raise ValueError(f"{op}: mask_numel must be in [0, 2^62), got {mask_numel}")
    elif not check:
        raise ValueError(f"{op}: check=False needs mask_numel (the mask's length would need the host to read "
                         "prefix_lens)")
    batch, nodes = parents.shape
    device = parents.device
    prefix = prefix_lens.long()
    if check:
        low, high = (int(v) for v in torch.stack([prefix.min(), prefix.max()]).tolist()) if batch else (0, 0)
        if low < 0 or high > _MAX_PREFIX:
            raise ValueError(f"{op}: prefix_lens must be in [0, 2^31 - 1], got values in [{low}, {high}]")
    prefix = prefix.clamp(0, _MAX_PREFIX)
    row = prefix + nodes
    sizes = nodes * row
    starts = torch.cumsum(sizes, 0) - sizes
    if check:
        total = int(sizes.sum())
        if mask_numel is not None and mask_numel != total:
            raise ValueError(f"{op}: mask_numel = {mask_numel}, but the trees over prefix_lens need {total}")
        mask_numel = total
    index = torch.arange(nodes, device=device)
    # ancestor-or-self by pointer doubling: after k rounds, the 2^k nearest ancestors are marked.
    p = _parent_links(parents)
    anc = (index.view(1, nodes, 1) == index.view(1, 1, nodes)) | (p.unsqueeze(-1) == index.view(1, 1, nodes))
    depth = (p != index).long()
    jump = p
    for _ in range(max(1, (nodes - 1).bit_length())):
        anc = anc | anc.gather(1, jump.unsqueeze(-1).expand(batch, nodes, nodes))
        depth = depth + depth.gather(1, jump)
        jump = jump.gather(1, jump)
    e = torch.arange(mask_numel, device=device)
    if batch == 0:
        return torch.zeros(mask_numel, dtype=torch.bool, device=device), prefix.unsqueeze(1) + depth
    b = (torch.searchsorted(starts, e, right=True) - 1).clamp(0, batch - 1)
    local = e - starts[b]
    i, k = local // row[b], local % row[b]
    inside = i < nodes  # False past the last request's block (check=False with a larger mask_numel)
    i = i.clamp(max=nodes - 1)
    j = (k - prefix[b]).clamp(0, nodes - 1)
    mask = inside & ((k < prefix[b]) | anc[b, i, j])
    return mask, prefix.unsqueeze(1) + depth
