"""A few steps of the engine on a small random Llama, with the match against transformers.

    python3 -m mllm_kernel.engine.demo [--device cpu|cuda]

Prints decode tokens per second and how many greedy tokens equal transformers' generate() on the
same weights: float32 (on the CPU and on CUDA: all of them, unless a near tie), and on CUDA also
bfloat16, where rounding makes greedy paths part after a while (the logits error says how close).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from .engine import Engine

DEMO_CONFIG = {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 4,
               "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 32000,
               "max_position_embeddings": 2048, "initializer_range": 0.05, "rms_norm_eps": 1e-5}


def run(device: str, dtype=torch.float32, batch: int = 4, prompt_len: int = 24, new_tokens: int = 16) -> list[str]:
    """The demo's report lines (raises when transformers is missing)."""
    import transformers

    engine = Engine.from_config(DEMO_CONFIG, seed=0, device=device, dtype=dtype, max_batch=batch, max_seq_len=256)
    prompts = torch.randint(0, DEMO_CONFIG["vocab_size"], (batch, prompt_len), generator=torch.Generator().manual_seed(0)).tolist()
    engine.generate(prompts, 2)  # warm-up: module loads, CUDA graph capture
    t = time.perf_counter()
    engine.generate(prompts, 1)
    prefill = time.perf_counter() - t
    t = time.perf_counter()
    ours, logits = engine.generate(prompts, new_tokens, return_logits=True)
    decode = time.perf_counter() - t - prefill

    with torch.device(device):
        hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**engine.config.to_hf())).to(torch.float32).eval()
    hf.load_state_dict({k: v.float() for k, v in engine.state_dict().items()})
    ids = torch.tensor(prompts, device=device)
    with torch.no_grad():
        ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                          min_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
        ref_logits = hf(torch.tensor([prompts[0] + ours[0][:-1]], device=device)).logits[0, prompt_len - 1:].float()
    ref = ref[:, prompt_len:].tolist()
    equal = sum(next((i for i, (a, b) in enumerate(zip(o, r)) if a != b), len(o)) for o, r in zip(ours, ref))
    err = (logits[0].to(device) - ref_logits).abs().max().item()
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    return [f"engine: random Llama ({DEMO_CONFIG['num_hidden_layers']} layers, hidden {DEMO_CONFIG['hidden_size']}, "
            f"vocab {DEMO_CONFIG['vocab_size']}) on {name}, {str(dtype).replace('torch.', '')}, batch {batch} x "
            f"{prompt_len}-token prompts",
            f"  decode {batch * (new_tokens - 1) / decode:.0f} tokens/s ({decode / (new_tokens - 1) * 1e3:.2f} ms/step), "
            f"prefill {prefill * 1e3:.1f} ms",
            f"  greedy tokens equal to transformers' generate() before the first difference: {equal}/{batch * new_tokens}; "
            f"request 0 logits max |ours - transformers float32| = {err:.2e}"]


def report(device: str) -> list[str]:
    """bfloat16 (the speed) and float32 (the exact match) on CUDA; float32 on the CPU."""
    dtypes = (torch.bfloat16, torch.float32) if device == "cuda" else (torch.float32,)
    return [line for dtype in dtypes for line in run(device, dtype)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    print("\n".join(report(p.parse_args(argv).device)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
