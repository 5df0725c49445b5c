"""The reference engine (mllm_kernel.engine) against Hugging Face transformers on the same weights.

Greedy tokens must equal transformers' generate(). Where they differ, the first difference must be
a near tie in transformers' own logits (the gap between its token and ours within `tie_tol`):
then both are right and the rest of the sequences is not comparable. float32 runs on the CPU and
on CUDA (there the prompt's attention runs as decode_attention rows: the prefill kernels are half
precision); bfloat16 logits are checked against transformers in float32, no further off than
transformers' own bfloat16 logits are.
"""
import os
import sys
import tempfile

import pytest
import torch

transformers = pytest.importorskip("transformers")

from mllm_kernel.engine import Engine, ModelConfig  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
NEW_TOKENS = 32


def tiny_llama(**overrides):
    # head_dim 64 (an attention kernel size), GQA 4:2, a wide init so that logits are well spread.
    kw = dict(hidden_size=256, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=997, max_position_embeddings=512, initializer_range=0.08,
              rms_norm_eps=1e-5)
    kw.update(overrides)
    return transformers.LlamaConfig(**kw)


def tiny_qwen2(**overrides):
    kw = dict(hidden_size=256, intermediate_size=320, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=1, vocab_size=751, max_position_embeddings=512, initializer_range=0.08,
              tie_word_embeddings=True, rope_theta=1e6)
    kw.update(overrides)
    return transformers.Qwen2Config(**kw)


def hf_model(config, state, device, dtype=torch.float32):
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    model.load_state_dict({k: v.float() for k, v in state.items()}, strict=not config.tie_word_embeddings)
    return model.to(device=device, dtype=dtype).eval()


def hf_generate(model, prompt, n, device):
    ids = torch.tensor([prompt], device=device)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                         do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@torch.no_grad()
def hf_logits(model, tokens, device):
    """float32 logits [len(tokens), vocab] of a full forward over tokens."""
    return model(torch.tensor([tokens], device=device)).logits[0].float()


def check_greedy(model, prompt, ours, device, tie_tol):
    ref = hf_generate(model, prompt, len(ours), device)
    if ours == ref:
        return
    i = next(j for j, (a, b) in enumerate(zip(ours, ref)) if a != b)
    logits = hf_logits(model, prompt + ref[:i], device)[-1]
    gap = (logits[ref[i]] - logits[ours[i]]).item()
    assert gap <= tie_tol, (f"prompt of {len(prompt)} tokens: token {i} is {ours[i]}, transformers says {ref[i]} "
                            f"(its logits differ by {gap:.3g} > {tie_tol}); ours {ours}, transformers {ref}")


def random_prompts(lengths, vocab):
    return [torch.randint(0, vocab, (n,)).tolist() for n in lengths]


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_batch1_float32_matches_transformers(device):
    engine = Engine.from_config(tiny_llama(), seed=int(torch.randint(0, 1 << 30, ())), device=device, max_batch=1,
                                dtype=torch.float32)
    model = hf_model(tiny_llama(), engine.state_dict(), device)
    for prompt in random_prompts([1, 45], engine.config.vocab_size):
        check_greedy(model, prompt, engine.generate([prompt], NEW_TOKENS)[0], device, tie_tol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_mixed_batch_continuous_float32_matches_transformers(device):
    """7 prompts of mixed lengths through 3 batch slots and a cache of 9 pages of 5 tokens: requests
    wait for a slot or for pages, finish at different steps (max_new_tokens per prompt) and long
    prompts are prefilled in chunks of at most 40 tokens, beside decoding requests."""
    config = tiny_llama(num_key_value_heads=1)
    engine = Engine.from_config(config, seed=int(torch.randint(0, 1 << 30, ())), device=device, max_batch=3,
                                block_size=5, num_blocks=19, max_prefill_tokens=40, dtype=torch.float32)
    model = hf_model(config, engine.state_dict(), device)
    prompts = random_prompts([13, 1, 61, 7, 2, 33, 50], config.vocab_size)
    counts = [NEW_TOKENS, 9, 20, NEW_TOKENS, 1, 17, 3]
    outputs = engine.generate(prompts, counts)
    assert [len(o) for o in outputs] == counts
    for prompt, ours in zip(prompts, outputs):
        check_greedy(model, prompt, ours, device, tie_tol=1e-4)
    assert engine.blocks.num_free == 19, "pages were not all returned"


def test_qwen2_from_pretrained_safetensors_matches_transformers():
    """A tiny random Qwen2 (q/k/v biases, tied embeddings) written by transformers' save_pretrained,
    loaded by Engine.from_pretrained."""
    config = tiny_qwen2()
    torch.manual_seed(int(torch.randint(0, 1 << 30, ())))
    model = transformers.Qwen2ForCausalLM(config).eval()
    with torch.no_grad():  # transformers initializes biases at 0: make them count
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0.0, 0.5)
    with tempfile.TemporaryDirectory() as path:
        model.save_pretrained(path)
        assert any(f.endswith(".safetensors") for f in os.listdir(path))
        engine = Engine.from_pretrained(path, device="cpu", max_batch=2)
    assert engine.config.qkv_bias and engine.config.tie_word_embeddings
    prompts = random_prompts([30, 4, 17], config.vocab_size)
    for prompt, ours in zip(prompts, engine.generate(prompts, NEW_TOKENS)):
        check_greedy(model, prompt, ours, "cpu", tie_tol=1e-4)


def test_llama3_rope_scaling_and_save_pretrained_roundtrip():
    config = tiny_llama(rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 64})
    engine = Engine.from_config(config, seed=3, device="cpu")
    with tempfile.TemporaryDirectory() as path:
        engine.save_pretrained(path)
        model = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa").eval()
        again = Engine.from_pretrained(path, device="cpu")
    assert model.config.rope_parameters["rope_type"] == "llama3"
    prompt = random_prompts([100], config.vocab_size)[0]  # past original_max_position: scaling matters
    ours = engine.generate([prompt], NEW_TOKENS)[0]
    assert again.generate([prompt], NEW_TOKENS)[0] == ours
    check_greedy(model, prompt, ours, "cpu", tie_tol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_bfloat16_logits_within_transformers_bfloat16_error(device):
    """Prefill and decode logits of a mixed batch in bfloat16, against transformers in float32 on
    the engine's tokens: no further off than transformers' own bfloat16 run (x2, + 0.02)."""
    config = tiny_llama()
    engine = Engine.from_config(config, seed=int(torch.randint(0, 1 << 30, ())), device=device,
                                dtype=torch.bfloat16, max_batch=2, max_prefill_tokens=64)
    ref32 = hf_model(config, engine.state_dict(), device)
    ref16 = hf_model(config, engine.state_dict(), device, torch.bfloat16)
    prompts = random_prompts([70, 3, 24], config.vocab_size)
    tokens, logits = engine.generate(prompts, 12, return_logits=True)
    for prompt, new, ours in zip(prompts, tokens, logits):
        seq = prompt + new[:-1]
        want = hf_logits(ref32, seq, device)[len(prompt) - 1:]
        theirs = hf_logits(ref16, seq, device)[len(prompt) - 1:]
        our_err = (ours.to(device) - want).abs().max().item()
        their_err = (theirs - want).abs().max().item()
        assert our_err <= 2 * their_err + 0.02, f"bf16 logits off by {our_err:.3g}; transformers bf16: {their_err:.3g}"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_cuda_graph_decode_equals_eager():
    config = tiny_llama()
    kw = dict(seed=5, device="cuda", dtype=torch.bfloat16, max_batch=6)
    graphed, eager = Engine.from_config(config, **kw), Engine.from_config(config, cuda_graphs=False, **kw)
    prompts = random_prompts([9, 40, 1, 22, 5], config.vocab_size)
    counts = [16, 5, 16, 9, 12]
    a, la = graphed.generate(prompts, counts, return_logits=True)
    b, lb = eager.generate(prompts, counts, return_logits=True)
    assert sorted(graphed._graphs), "no decode graph was captured"
    # A graph runs a padded bucket, so its GEMMs may round differently from eager's: logits agree
    # to bf16 rounding, tokens until a near tie (then the sequences part).
    for x, y, ta, tb in zip(la, lb, a, b):
        steps = next((i for i, (p, q) in enumerate(zip(ta, tb)) if p != q), len(ta))
        torch.testing.assert_close(x[:steps + 1], y[:steps + 1], rtol=0.02, atol=0.02)
        if steps < len(ta):
            assert (y[steps, tb[steps]] - y[steps, ta[steps]]).item() <= 0.05, f"tokens part at step {steps}"


@pytest.mark.parametrize("device", DEVICES)
def test_sampling_top_k_top_p_min_p(device):
    """Sampled tokens come from the allowed set of transformers' logits at each step (teacher-forced
    on the engine's tokens), the same seed repeats the same tokens, and top_k=1 is greedy."""
    config = tiny_llama()  # float32: no ties among the logits (bfloat16 rounding makes them common)
    engine = Engine.from_config(config, seed=11, device=device, dtype=torch.float32, max_batch=4)
    model = hf_model(config, engine.state_dict(), device)
    prompts = random_prompts([6, 31, 2], config.vocab_size)
    greedy = engine.generate(prompts, 8)
    assert engine.generate(prompts, 8, temperature=0.8, top_k=1, seed=1) == greedy
    slack, mass_slack = 1e-4, 1e-3  # the engine's own rounding: logits, mass at a nucleus boundary
    for kw in (dict(top_k=5), dict(top_p=0.3), dict(min_p=0.4), dict(top_k=20, top_p=0.6, min_p=0.2)):
        tokens = engine.generate(prompts, 10, temperature=0.7, seed=2, **kw)
        assert tokens == engine.generate(prompts, 10, temperature=0.7, seed=2, **kw), "same seed, other tokens"
        for prompt, new in zip(prompts, tokens):
            logits = hf_logits(model, prompt + new[:-1], device)[len(prompt) - 1:] / 0.7
            for step, t in enumerate(new):
                row = logits[step]
                if "top_k" in kw:  # at most k-1 tokens strictly above it
                    assert (row > row[t] + slack).sum() < kw["top_k"], (kw, step)
                probs = row.double().softmax(-1)
                if "top_p" in kw:  # the mass strictly above it is below top_p
                    assert probs[row > row[t] + slack].sum() < kw["top_p"] + mass_slack, (kw, step)
                if "min_p" in kw and len(kw) == 1:
                    assert probs[t] >= kw["min_p"] * probs.max() * (1 - slack) - 1e-6, (kw, step)


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="model_type 'gpt2' is not supported"):
        ModelConfig.from_hf(transformers.GPT2Config().to_dict())
    with pytest.raises(ValueError, match="hidden_act"):
        ModelConfig.from_hf(tiny_llama(hidden_act="gelu"))
    with pytest.raises(ValueError, match="head_dim"):
        ModelConfig.from_hf(tiny_llama(num_attention_heads=8))  # head_dim 32
    with pytest.raises(ValueError, match="rope_type"):
        ModelConfig.from_hf(tiny_llama(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}))
    with pytest.raises(ValueError, match="use_sliding_window"):
        ModelConfig.from_hf(tiny_qwen2(use_sliding_window=True, sliding_window=16))
    engine = Engine.from_config(tiny_llama(), device="cpu", max_batch=2, max_seq_len=64)
    with pytest.raises(ValueError, match=r"prompt_token_ids\[1\] holds 997"):
        engine.generate([[1, 2], [997]], 4)
    with pytest.raises(ValueError, match="prompt 0 is empty"):
        engine.generate([[]], 4)
    with pytest.raises(ValueError, match="exceeds max_seq_len 64"):
        engine.generate([[1] * 60], 10)
    with pytest.raises(ValueError, match="top_p must be in"):
        engine.generate([[1]], 4, temperature=1.0, top_p=0.0)
    with pytest.raises(ValueError, match="temperature"):
        engine.generate([[1]], 4, temperature=-1.0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.generate([[1]], 0)
    with pytest.raises(ValueError, match="tensors missing"):
        Engine(engine.config, {}, device="cpu")
    with pytest.raises(ValueError, match="dtype must be one of"):
        Engine.from_config(tiny_llama(), device="cpu", dtype=torch.float64)
    assert engine.generate([[5, 6, 7]], 3) is not None  # the engine still works after the errors


def test_stop_token_ends_a_request():
    engine = Engine.from_config(tiny_llama(), seed=2, device="cpu", max_batch=2)
    prompts = random_prompts([8, 3], engine.config.vocab_size)
    full = engine.generate(prompts, 12)
    stop = full[0][4]
    cut = engine.generate(prompts, 12, stop_token_ids=[stop])
    for f, c in zip(full, cut):
        n = f.index(stop) + 1 if stop in f else len(f)
        assert c == f[:n]


def test_pages_come_back_after_an_error(monkeypatch):
    engine = Engine.from_config(tiny_llama(), seed=4, device="cpu", max_batch=2)
    prompts = random_prompts([9, 3, 20], engine.config.vocab_size)
    want = engine.generate(prompts, 6)
    decode, calls = engine._decode_step, []

    def failing(requests):
        if len(calls) == 3:
            raise RuntimeError("injected failure")
        calls.append(len(requests))
        return decode(requests)

    monkeypatch.setattr(engine, "_decode_step", failing)
    with pytest.raises(RuntimeError, match="injected failure"):
        engine.generate(prompts, 6)
    assert engine.blocks.num_free == engine.blocks.num_blocks, "pages leaked by the failed call"
    monkeypatch.undo()
    assert engine.generate(prompts, 6) == want


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
