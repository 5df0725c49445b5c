"""chain_speculative_sampling and apply_penalties: ours against FlashInfer and torch.

    python3 benchmarks/bench_speculative.py [--device cuda|cpu] [--batches 1,16,64] [--drafts 1,3,7]
                                            [--vocabs 32000,151936] [--iters 30] [--json PATH]
                                            [--ops chain,tree,penalties]

From the repository root it measures the checkout's mllm_kernel; copy it (with gpu_timing.py) out
of the checkout to measure an installed wheel. FlashInfer is optional.

- chain: draft_probs [B, n, V] and target_probs [B, n + 1, V] float32, int32 draft ids drawn from
  the draft probs; half of each batch has target close to draft (most drafts accepted), half
  unrelated (early rejections). Ours gets the uniforms (reproducible); FlashInfer
  `chain_speculative_sampling` draws its own (philox). Eager: torch ops (gather, compare, the
  first rejection by argmax, the residual row, cumsum and searchsorted). Before timing, the
  accepted counts of ours and eager must be equal for the same uniforms (the accept test is
  the same float32 comparison), and ours must equal the CPU kernel's tokens.
- tree: tree_speculative_verify, greedy, over bfloat16 target logits [B * D, V], for random trees of D
  = 8, 26, 63 nodes (at most 4 children a node); each child carries its parent row's argmax with
  probability 0.7, so paths run deep (our walk reads one row per accepted level, in sequence).
  SGLang verifies a tree with one thread per request after torch takes the argmax of every node's
  row; the "all-rows argmax" column times that argmax alone (torch.argmax over B * D rows), a lower
  bound of its cost. Before timing, ours must equal a plain Python walk over those argmaxes.
- penalties: apply_penalties from token ids [B, L] (repetition 1.1, frequency 0.3, presence 0.4)
  against torch (scatter_add counts, then masked arithmetic over the row; the way engines do it
  without a kernel). In place on both sides, so values drift over replays: checked in the tests.

CUDA: gpu_timing.time_graph (CUDA-graph replays, median) over enough input sets that one replay
reads >= 4x the L2 cache. CPU: median wall time of --iters calls after warm-up, torch with one
thread (ours is single-threaded).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if (REPO / "mllm_kernel").is_dir() and str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from mllm_kernel.kernels.penalties import apply_penalties  # noqa: E402
from mllm_kernel.kernels.penalties.cases import (  # noqa: E402
    FREQUENCY,
    PRESENCE,
    REPETITION,
    eager_penalties_from_ids,
)
from mllm_kernel.kernels.speculative.cases import eager_chain  # noqa: E402
from mllm_kernel.kernels.speculative import (  # noqa: E402
    chain_speculative_sampling,
    tree_from_parents,
    tree_speculative_verify,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))

try:
    import flashinfer.sampling as fis
except Exception:  # noqa: BLE001 - no FlashInfer column
    fis = None


def chain_inputs(batch, n, vocab, device, gen):
    q = torch.softmax(torch.randn(batch, n, vocab, device=device, generator=gen) * 3, -1)
    p = torch.softmax(torch.randn(batch, n + 1, vocab, device=device, generator=gen) * 3, -1)
    half = batch // 2
    p[:half, :n] = 0.9 * q[:half] + 0.1 * p[:half, :n]
    ids = torch.multinomial(q.view(-1, vocab), 1, generator=gen).view(batch, n).int()
    u = torch.rand(batch, n + 1, device=device, generator=gen)
    return q, ids, p, u


def time_cpu(fn, iters: int) -> float:
    for _ in range(3):
        fn()
    samples = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1e6


def timer(device: str, iters: int):
    if device == "cpu":
        return lambda calls: (time_cpu(calls[0], iters), "wall")
    from gpu_timing import time_graph

    return lambda calls: time_graph(calls, iters)


def num_sets(device: str, set_bytes: int) -> int:
    if device == "cpu":
        return 1
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return max(1, min(16, math.ceil(4 * l2 / set_bytes)))


def bench_chain(batch, n, vocab, device, iters) -> dict:
    gen = torch.Generator(device=device).manual_seed(batch * 131 + n * 7 + vocab)
    sets = [chain_inputs(batch, n, vocab, device, gen) for _ in range(num_sets(device, batch * (2 * n + 1) * vocab * 4))]
    q, ids, p, u = sets[0]
    ours, acc = chain_speculative_sampling(q, ids, p, uniforms=u)
    want, want_acc = eager_chain(q, ids, p, u)
    if not torch.equal(acc, want_acc):
        raise AssertionError("chain: accepted counts differ from the torch version")
    if device == "cuda":
        cpu = chain_speculative_sampling(q.cpu(), ids.cpu(), p.cpu(), uniforms=u.cpu())
        if not (torch.equal(cpu[0], ours.cpu()) and torch.equal(cpu[1], acc.cpu())):
            raise AssertionError("chain: CUDA tokens differ from the CPU kernel's")
    time_it = timer(device, iters)
    row = {"op": "chain_speculative_sampling", "batch": batch, "n": n, "vocab": vocab,
           "accepted_mean": float(acc.float().mean())}
    outs = [torch.empty(batch, dtype=torch.int64, device=device) for _ in sets]
    row["ours_us"], row["ours_how"] = time_it([
        (lambda s=s, o=o: chain_speculative_sampling(s[0], s[1], s[2], uniforms=s[3], out_accepted=o, check=False))
        for s, o in zip(sets, outs)])
    row["eager_us"], _ = time_it([(lambda s=s: eager_chain(*s)) for s in sets])
    if fis is not None and device == "cuda":
        try:
            fis.chain_speculative_sampling(q, ids, p)
            row["fi_us"], row["fi_how"] = time_it([(lambda s=s: fis.chain_speculative_sampling(s[0], s[1], s[2]))
                                                    for s in sets])
        except Exception as error:  # noqa: BLE001 - the peer's column stays empty
            row["fi_error"] = f"{type(error).__name__}: {str(error)[:200]}"
    return row


def random_tree(batch, nodes, vocab, logits, gen_cpu):
    """Parents (at most 4 children each, topological order) and tokens: a child carries its
    parent row's argmax with probability 0.7, else a random token."""
    parents = torch.full((batch, nodes), -1, dtype=torch.int64)
    tokens = torch.zeros(batch, nodes, dtype=torch.int64)
    best = logits.view(batch, nodes, vocab).argmax(-1).cpu()
    for b in range(batch):
        children = [0] * nodes
        for i in range(1, nodes):
            options = [j for j in range(i) if children[j] < 4]
            j = options[int(torch.randint(len(options), (), generator=gen_cpu))]
            parents[b, i], children[j] = j, children[j] + 1
            hit = torch.rand((), generator=gen_cpu) < 0.7
            tokens[b, i] = best[b, j] if hit else torch.randint(vocab, (), generator=gen_cpu)
    return parents, tokens


def plain_greedy_walk(lists, best):
    candidates, _, first, sibling = (t.cpu().tolist() for t in lists)
    lengths = []
    for b, row_best in enumerate(best.cpu().tolist()):
        cur, depth = 0, 0
        while True:
            c, nxt = first[b][cur], -1
            while c != -1:
                if candidates[b][c] == row_best[cur]:
                    nxt = c
                    break
                c = sibling[b][c]
            if nxt < 0:
                break
            cur, depth = nxt, depth + 1
        lengths.append(depth)
    return lengths


def bench_tree(batch, nodes, vocab, device, iters) -> dict:
    gen = torch.Generator(device=device).manual_seed(batch * 7 + nodes + vocab)
    gen_cpu = torch.Generator().manual_seed(batch + nodes)
    sets = []
    for _ in range(num_sets(device, batch * nodes * vocab * 2)):
        logits = (torch.randn(batch * nodes, vocab, device=device, generator=gen) * 3).to(torch.bfloat16)
        parents, tokens = random_tree(batch, nodes, vocab, logits, gen_cpu)
        sets.append((logits, tuple(t.to(device) for t in tree_from_parents(parents, tokens))))
    logits, lists = sets[0]
    index, toks, length = tree_speculative_verify(*lists, target_logits=logits, greedy=True)
    want = plain_greedy_walk(lists, logits.view(batch, nodes, vocab).argmax(-1))
    if length.cpu().tolist() != want:
        raise AssertionError("tree: accepted lengths differ from a plain walk")
    time_it = timer(device, iters)
    row = {"op": "tree_speculative_verify", "batch": batch, "nodes": nodes, "vocab": vocab,
           "accepted_mean": float(length.float().mean())}
    row["ours_us"], row["ours_how"] = time_it(
        [(lambda s=s: tree_speculative_verify(*s[1], target_logits=s[0], greedy=True, check=False)) for s in sets])
    row["argmax_all_us"], _ = time_it([(lambda s=s: s[0].argmax(-1)) for s in sets])
    return row


def bench_penalties(batch, vocab, num_ids, dtype, device, iters) -> dict:
    gen = torch.Generator(device=device).manual_seed(batch + vocab + num_ids)
    logits = (torch.randn(batch, vocab, device=device, generator=gen) * 3).to(dtype)
    ids = torch.randint(0, vocab, (batch, num_ids), device=device, generator=gen)
    mine, theirs = logits.clone(), logits.clone()
    time_it = timer(device, iters)
    row = {"op": "apply_penalties", "batch": batch, "vocab": vocab, "ids": num_ids,
           "dtype": str(dtype).removeprefix("torch.")}
    row["ours_us"], row["ours_how"] = time_it(
        [lambda: apply_penalties(mine, ids, None, REPETITION, FREQUENCY, PRESENCE, False)])
    row["eager_us"], _ = time_it([lambda: eager_penalties_from_ids(theirs, ids, vocab)])
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--ops", default="chain,tree,penalties")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--drafts", default="1,3,7")
    ap.add_argument("--vocabs", default="32000,151936")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(1)
    batches = [int(b) for b in args.batches.split(",")]
    vocabs = [int(v) for v in args.vocabs.split(",")]
    rows = []
    ops = args.ops.split(",")
    if "chain" in ops:
        print(f"{'batch':>5} {'n':>2} {'vocab':>7} {'acc':>5} {'ours us':>9} {'FI us':>9} {'eager us':>9} "
              f"{'vs FI':>6} {'vs eager':>8}")
        for batch in batches:
            for n in [int(d) for d in args.drafts.split(",")]:
                for vocab in vocabs:
                    r = bench_chain(batch, n, vocab, args.device, args.iters)
                    rows.append(r)
                    fi = r.get("fi_us")
                    vs_fi = "" if fi is None else f"{fi / r['ours_us']:.2f}x"
                    print(f"{batch:>5} {n:>2} {vocab:>7} {r['accepted_mean']:>5.2f} {r['ours_us']:>9.1f} "
                          f"{fi if fi is None else round(fi, 1)!s:>9} {r['eager_us']:>9.1f} "
                          f"{vs_fi:>6} "
                          f"{r['eager_us'] / r['ours_us']:>7.2f}x", flush=True)
    if "tree" in ops:
        print(f"\n{'batch':>5} {'nodes':>5} {'vocab':>7} {'acc':>5} {'ours us':>9} {'all-rows argmax us':>19} {'ratio':>6}")
        for batch in batches:
            for nodes in (8, 26, 63):
                for vocab in vocabs:
                    r = bench_tree(batch, nodes, vocab, args.device, args.iters)
                    rows.append(r)
                    print(f"{batch:>5} {nodes:>5} {vocab:>7} {r['accepted_mean']:>5.2f} {r['ours_us']:>9.1f} "
                          f"{r['argmax_all_us']:>19.1f} {r['argmax_all_us'] / r['ours_us']:>5.2f}x", flush=True)
    if "penalties" in ops:
        print(f"\n{'batch':>5} {'vocab':>7} {'ids':>5} {'dtype':>8} {'ours us':>9} {'eager us':>9} {'vs eager':>8}")
        for batch in batches:
            for vocab in vocabs:
                for num_ids in (512, 4096):
                    for dtype in (torch.float32, torch.bfloat16):
                        r = bench_penalties(batch, vocab, num_ids, dtype, args.device, args.iters)
                        rows.append(r)
                        print(f"{batch:>5} {vocab:>7} {num_ids:>5} {r['dtype']:>8} {r['ours_us']:>9.1f} "
                              f"{r['eager_us']:>9.1f} {r['eager_us'] / r['ours_us']:>7.2f}x", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
