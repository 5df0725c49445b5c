"""The reference engine (mllm_kernel.engine) end to end, against Hugging Face transformers.

    python3 benchmarks/bench_engine.py [--layers 4] [--batches 1,16,64] [--prompts 512,4096]
                                       [--new 64] [--reps 3] [--flashinfer] [--json PATH]
    python3 benchmarks/bench_engine.py --sampled --no-hf   # ours vs FlashInfer's sampler in the loop

Model: Llama-3-8B's layer shapes (hidden 4096, 32 q / 8 kv heads of 128, MLP 14336, vocab 128256,
llama3 rope) with --layers layers and seeded random weights, bfloat16 on CUDA. Prompts: random
token ids, all of one length per row of the table (so transformers needs no padding).

For each (prompt length, batch) and each contender:
  prefill s  = median wall time of generate(prompts, 1 new token)
  decode tok/s = batch * new / (median time of generate(prompts, new + 1) - prefill s)
Contenders: ours with CUDA-graph decode (the default), ours eager, ours eager with FlashInfer's
paged decode / prefill attention swapped in (--flashinfer; its wrappers plan on the host every
step, so it runs eager), and transformers' generate() (eager, sdpa attention) on the same
weights. `match` is how many of the first 32 greedy tokens of request 0 equal transformers'.

--sampled instead times top-p decoding (temperature 0.7, top_p 0.9) with our sampler and with
FlashInfer's (softmax + top_p_sampling_from_probs) in the same graphed loop.

Then a profiler trace of eager decode steps splits a step's GPU time into GEMMs (cuBLAS), our
kernels and the rest (torch's small ops), and host overhead = graphed step wall time - GPU time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's mllm_kernel first

from mllm_kernel.engine import Engine, ModelConfig  # noqa: E402
from mllm_kernel.engine.model import Attention  # noqa: E402


def llama3_8b_shaped(layers: int) -> dict:
    return {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": layers,
            "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256, "rms_norm_eps": 1e-5,
            "max_position_embeddings": 131072, "initializer_range": 0.02,
            "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}


class FlashInferAttention(Attention):
    """FlashInfer's paged attention in the engine's loop: one plan per step (not per layer)."""

    def __init__(self, engine: Engine):
        import flashinfer

        c = engine.config
        self.shape = (c.num_heads, c.num_kv_heads, c.head_dim, engine.blocks.block_size)
        ws = torch.empty(256 << 20, dtype=torch.uint8, device=engine.device)
        self.decode_w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
        self.prefill_w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
        self.dtype, self.planned = engine.dtype, None

    def _pages(self, batch):
        """indptr, page ids and last-page lengths, built on the host as FlashInfer's plan() wants
        them (one copy of seq_lens and the block table per step)."""
        bs = self.shape[3]
        seq_lens, table = batch.seq_lens.cpu(), batch.block_table.cpu()
        pages = (seq_lens + bs - 1) // bs
        indptr = torch.zeros(pages.numel() + 1, dtype=torch.int32)
        indptr[1:] = torch.cumsum(pages, 0)
        indices = table[torch.arange(table.shape[1])[None, :] < pages[:, None]]
        return indptr, indices, (seq_lens - (pages - 1) * bs).to(torch.int32)

    def prefill(self, q, k_cache, v_cache, batch):
        if self.planned is not batch:
            h, kvh, d, bs = self.shape
            self.prefill_w.plan(batch.cu_seqlens_q.cpu(), *self._pages(batch), h, kvh, d, bs, causal=True,
                                q_data_type=self.dtype)
            self.planned = batch
        return self.prefill_w.run(q.contiguous(), (k_cache, v_cache))

    def decode(self, q, k_cache, v_cache, batch):
        if self.planned is not batch:
            h, kvh, d, bs = self.shape
            self.decode_w.plan(*self._pages(batch), h, kvh, d, bs, q_data_type=self.dtype)
            self.planned = batch
        return self.decode_w.run(q.contiguous(), (k_cache, v_cache))


def timed(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def engine_runner(engine: Engine, graphs: bool, attention: Attention):
    def run(prompts, n):
        engine.cuda_graphs, engine.model.attention = graphs, attention
        return engine.generate(prompts, n)
    run.attention = attention
    return run


def hf_runner(model):
    def run(prompts, n):
        ids = torch.tensor(prompts, device="cuda")
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                             do_sample=False, eos_token_id=None, pad_token_id=0)
        return out[:, ids.shape[1]:].tolist()
    return run


def categorize(name: str) -> str:
    if "mllm_kernel" in name:
        return "ours"
    lowered = name.lower()
    if any(s in lowered for s in ("gemm", "nvjet", "cutlass", "xmma", "cublas", "sm90_", "splitk")):
        return "gemm"
    if "flashinfer" in lowered:
        return "flashinfer"
    return "other"


def decode_gpu_time_by_category(fn, steps: int) -> dict[str, float]:
    """CUDA kernel time (s) per category and per decode step while fn (a generate call with one
    prefill and `steps` decode steps) runs: the kernels from the first decode attention kernel of
    step 1 to that of step `steps` (whole steps, no prefill), divided by steps - 1."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    starts = sorted(e.time_range.start for e in kernels if "decode" in e.name.lower())
    if not starts or len(starts) % steps:  # the trace lost kernels: say so rather than divide wrong
        print(f"    profile: {len(starts)} decode attention kernels for {steps} steps; no breakdown")
        return None
    begin, end = starts[0], starts[len(starts) // steps * (steps - 1)]
    kernels = [e for e in kernels if begin <= e.time_range.start < end]
    steps -= 1
    totals = {"gemm": 0.0, "ours": 0.0, "flashinfer": 0.0, "other": 0.0}
    by_name: dict[str, float] = {}
    for e in kernels:
        us = e.time_range.elapsed_us()
        totals[categorize(e.name)] += us * 1e-6 / steps
        by_name[e.name[:90]] = by_name.get(e.name[:90], 0.0) + us / steps
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:6]
    print("    top kernels per step: " + "; ".join(f"{us:.0f} us {name}" for name, us in top))
    return totals


def flashinfer_sample(logits, s, generator):
    """The engine's sampling step with FlashInfer's kernels: softmax with temperature, then
    top_p_sampling_from_probs (its sampling module; top-k from logits needs its radix top-k module)."""
    import flashinfer.sampling as fis

    assert s.temperature > 0 and s.top_k == 0 and s.min_p == 0, "only the top-p configuration is wired"
    probs = fis.softmax(logits, temperature=s.temperature)
    try:
        return fis.top_p_sampling_from_probs(probs, s.top_p, generator=generator)
    except TypeError:  # a FlashInfer without the generator argument
        return fis.top_p_sampling_from_probs(probs, s.top_p)


def sampled_rows(engine: Engine, config: ModelConfig, prompt_lens, batches, args) -> None:
    from mllm_kernel.engine import engine as engine_module

    ours = engine_module._sample
    samplers = {"ours (graphs), top_p sampling": ours, "ours + FlashInfer sampling (graphs)": flashinfer_sample}
    engine.cuda_graphs = True
    print(f"{'prompt':>6} {'batch':>5}  {'sampler (temperature 0.7, top_p 0.9)':<40} {'decode tok/s':>12} {'ms/step':>8}")
    for plen in prompt_lens:
        for b in batches:
            prompts = torch.randint(0, config.vocab_size, (b, plen)).tolist()
            for name, sampler in samplers.items():
                engine_module._sample = sampler
                try:
                    run = lambda n: engine.generate(prompts, n, temperature=0.7, top_p=0.9, seed=0)  # noqa: E731
                    run(3)
                    prefill = timed(lambda: run(1), args.reps)
                    full = timed(lambda: run(args.new + 1), args.reps)
                finally:
                    engine_module._sample = ours
                step = (full - prefill) / args.new
                print(f"{plen:>6} {b:>5}  {name:<40} {b / step:>12.0f} {step * 1e3:>8.3f}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batches", default="1,16,64")
    p.add_argument("--prompts", default="512,4096")
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--flashinfer", action="store_true")
    p.add_argument("--no-hf", action="store_true")
    p.add_argument("--sampled", action="store_true", help="only: top-p sampling, ours against FlashInfer's")
    p.add_argument("--json")
    args = p.parse_args(argv)
    batches = [int(x) for x in args.batches.split(",")]
    prompt_lens = [int(x) for x in args.prompts.split(",")]
    config = ModelConfig.from_hf(llama3_8b_shaped(args.layers))
    torch.manual_seed(0)
    t0 = time.perf_counter()
    engine = Engine.from_config(config, seed=0, device="cuda", dtype=torch.bfloat16, max_batch=max(batches),
                                max_seq_len=max(prompt_lens) + args.new + 1,
                                # one prefill step for the whole batch, as transformers does: no decode
                                # step runs beside a prefill chunk, so decode steps are all full batches
                                max_prefill_tokens=max(batches) * max(prompt_lens))
    print(f"# {torch.cuda.get_device_name()}; {args.layers} layers of Llama-3-8B's shapes, bf16; engine built in "
          f"{time.perf_counter() - t0:.1f}s; {engine.blocks.num_blocks} pages of {engine.blocks.block_size}")
    if args.sampled:  # temperature 0.7, top_p 0.9: our sampler against FlashInfer's in the same loop
        sampled_rows(engine, config, prompt_lens, batches, args)
        return 0

    contenders = {"ours (graphs)": engine_runner(engine, True, engine.model.attention),
                  "ours (eager)": engine_runner(engine, False, engine.model.attention)}
    if args.flashinfer:
        contenders["ours + FlashInfer attn (eager)"] = engine_runner(engine, False, FlashInferAttention(engine))
    if not args.no_hf:
        import transformers

        with torch.device("cuda"):
            hf = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**config.to_hf()),
                                                               dtype=torch.bfloat16, attn_implementation="sdpa")
        hf.load_state_dict(engine.state_dict())
        contenders["transformers (sdpa)"] = hf_runner(hf.eval())

    if not args.no_hf:  # accuracy: request 0's first-token logits against transformers in float32
        with torch.device("cuda"):
            hf32 = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**config.to_hf()),
                                                                 dtype=torch.float32, attn_implementation="sdpa")
        hf32.load_state_dict({k: v.float() for k, v in engine.state_dict().items()})
        attentions = {"ours": engine.model.attention}
        if args.flashinfer:
            attentions["FlashInfer"] = contenders["ours + FlashInfer attn (eager)"].attention
        for plen in prompt_lens:
            prompt = torch.randint(0, config.vocab_size, (1, plen))
            with torch.no_grad():
                want = hf32(prompt.cuda()).logits[0, -1].float()
                errs = {"transformers bf16": (hf(prompt.cuda()).logits[0, -1].float() - want).abs().max().item()}
            for name, attention in attentions.items():
                engine.cuda_graphs, engine.model.attention = False, attention
                got = engine.generate(prompt.tolist(), 1, return_logits=True)[1][0][0].cuda()
                errs[name] = (got - want).abs().max().item()
            print(f"# prompt {plen}: max |logit - transformers float32| of the first new token (logit std "
                  f"{want.std().item():.2f}): " + ", ".join(f"{k} {v:.3f}" for k, v in errs.items()))
        del hf32
        engine.model.attention = attentions["ours"]

    rows = []
    print(f"{'prompt':>6} {'batch':>5}  {'contender':<32} {'prefill ms':>10} {'decode tok/s':>12} {'ms/step':>8} {'match':>5}")
    for plen in prompt_lens:
        for b in batches:
            prompts = torch.randint(0, config.vocab_size, (b, plen)).tolist()
            reference = None
            for name, run in contenders.items():
                run([q[:16] for q in prompts], 3)  # warm-up: module loads, graph capture of this bucket
                first = run(prompts, 33)[0][:32]
                reference = reference or (first if name.startswith("transformers") else None)
                prefill = timed(lambda: run(prompts, 1), args.reps)
                full = timed(lambda: run(prompts, args.new + 1), args.reps)
                step = (full - prefill) / args.new
                rows.append({"prompt": plen, "batch": b, "contender": name, "prefill_s": prefill,
                             "decode_tok_s": b / step, "step_s": step, "first32": first})
            hf_tokens = reference
            for r in rows[-len(contenders):]:
                match = "-"
                if hf_tokens is not None:
                    agree = next((i for i, (x, y) in enumerate(zip(r["first32"], hf_tokens)) if x != y), 32)
                    match = r["match"] = agree
                print(f"{plen:>6} {b:>5}  {r['contender']:<32} {r['prefill_s'] * 1e3:>10.1f} "
                      f"{r['decode_tok_s']:>12.0f} {r['step_s'] * 1e3:>8.2f} {match:>5}")

    # Where a decode step goes: the kernels of eager decode steps (profiler); graphed wall time.
    breakdown = []
    for plen in prompt_lens:
        for b in batches:
            prompts = torch.randint(0, config.vocab_size, (b, plen)).tolist()
            eager = contenders["ours (eager)"]
            n = 16
            per_step = decode_gpu_time_by_category(lambda: eager(prompts, n + 1), n)
            if per_step is None:
                continue
            graphed = next(r for r in rows if r["prompt"] == plen and r["batch"] == b
                           and r["contender"] == "ours (graphs)")["step_s"]
            eager_step = next(r for r in rows if r["prompt"] == plen and r["batch"] == b
                              and r["contender"] == "ours (eager)")["step_s"]
            gpu = sum(per_step.values())
            breakdown.append({"prompt": plen, "batch": b, **{k + "_s": v for k, v in per_step.items()},
                              "graphed_step_s": graphed, "eager_step_s": eager_step})
            print(f"step {plen:>5}x{b:<3}: GEMM {per_step['gemm'] * 1e3:.2f} ms, ours {per_step['ours'] * 1e3:.2f} ms, "
                  f"other {per_step['other'] * 1e3:.2f} ms (GPU {gpu * 1e3:.2f}); wall graphed {graphed * 1e3:.2f} ms "
                  f"(host + gaps {(graphed - gpu) * 1e3:.2f}), eager {eager_step * 1e3:.2f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "breakdown": breakdown,
                                               "device": torch.cuda.get_device_name()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
