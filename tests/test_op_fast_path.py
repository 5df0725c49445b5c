"""The generic custom-op path of every public op (mllm_kernel/kernels/op_modules.py): how many
Python frames a plain eager call takes, and the typed errors for arguments of the wrong kind."""

import os
import sys

import pytest
import torch

import mllm_kernel as mk
from mllm_kernel.kernels import op_modules
from mllm_kernel.kernels.sampling import min_p_sample_from_uniforms, top_k_top_p_sample_from_uniforms

OUR_DIRS = tuple(
    os.path.dirname(os.path.abspath(p)) for p in (mk.__file__, os.path.dirname(op_modules.__file__))
)


def our_frames(fn) -> list[str]:
    """The Python functions of this library that one call of fn runs, in call order."""
    seen = []

    def profile(frame, event, arg):
        if event == "call":
            filename = os.path.abspath(frame.f_code.co_filename)
            if "mllm_kernel" in filename or f"{os.sep}kernels{os.sep}" in filename:
                seen.append(f"{os.path.basename(filename)}:{frame.f_code.co_name}")

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen


def _cases():
    x, w = torch.randn(2, 64), torch.randn(64)
    cache = torch.randn(16, 8)
    q, k = torch.randn(2, 2, 8), torch.randn(2, 1, 8)
    pos = torch.tensor([0, 3])
    kc = torch.zeros(2, 4, 1, 8)
    q64, kc64, lse = torch.randn(2, 4, 64), torch.randn(3, 4, 2, 64), torch.randn(2, 4)
    return {
        "rms_norm": lambda: mk.rms_norm(x, w),
        "fused_add_rms_norm": lambda: mk.fused_add_rms_norm(x, x.clone(), w),
        "silu_and_mul": lambda: mk.silu_and_mul(x),
        "gelu_and_mul": lambda: mk.gelu_and_mul(x),
        "softmax": lambda: mk.softmax(x),
        "log_softmax": lambda: mk.log_softmax(x),
        "greedy_sample": lambda: mk.greedy_sample(x),
        "top_k_top_p_sample_from_uniforms": lambda: top_k_top_p_sample_from_uniforms(
            x, torch.rand(2), torch.tensor([5, 5]), torch.tensor([0.9, 0.9])),
        "min_p_sample_from_uniforms": lambda: min_p_sample_from_uniforms(
            x.softmax(-1), torch.rand(2), torch.tensor([0.1, 0.1])),
        "apply_rope": lambda: mk.apply_rope(q, k, pos, cache),
        "store_kv_cache": lambda: mk.store_kv_cache(k, k.clone(), kc, kc.clone(), torch.tensor([1, 5])),
        "embedding": lambda: mk.embedding(torch.tensor([1, 0]), x),
        "decode_attention": lambda: mk.decode_attention(
            q64, kc64, kc64, torch.tensor([[0, 1], [2, 0]], dtype=torch.int32), torch.tensor([5, 3], dtype=torch.int32)),
        "merge_attention_states": lambda: mk.merge_attention_states(q64, lse, q64, lse),
    }


@pytest.mark.parametrize("op", sorted(_cases()))
def test_public_call_reaches_the_module_in_at_most_four_frames(op):
    call = _cases()[op]
    call()  # first call loads the module
    frames = our_frames(call)
    assert 1 <= len(frames) <= 4, frames


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: mk.rms_norm(None, torch.ones(4)), "rms_norm: x must be a torch.Tensor, got NoneType"),
        (lambda: mk.rms_norm(torch.ones(2, 4), "w"), "rms_norm: weight must be a torch.Tensor, got str"),
        (lambda: mk.rms_norm(torch.ones(2, 4), torch.ones(4), None), "rms_norm: eps must be a float, got NoneType"),
        (lambda: mk.fused_add_rms_norm(torch.ones(2, 4), 3, torch.ones(4)),
         "fused_add_rms_norm: residual must be a torch.Tensor, got int"),
        (lambda: mk.silu_and_mul([1.0, 2.0]), "silu_and_mul: x must be a torch.Tensor, got list"),
        (lambda: mk.softmax(torch.ones(2, 4), "hot"), "softmax: temperature must be a float, got str"),
        (lambda: mk.greedy_sample(None), "greedy_sample: logits must be a torch.Tensor, got NoneType"),
        (lambda: mk.top_k_top_p_sample(torch.ones(2, 4), None, 0.5), "top_k_top_p_sample: top_k must be an int"),
        (lambda: mk.apply_rope(torch.ones(1, 1, 2), None, torch.zeros(1, dtype=torch.long), torch.ones(4, 2)),
         "apply_rope: k must be a torch.Tensor, got NoneType"),
        (lambda: mk.embedding(None, torch.ones(3, 2)), "embedding: ids must be a torch.Tensor, got NoneType"),
    ],
)
def test_wrong_argument_kinds_raise_type_error_naming_op_and_argument(call, message):
    with pytest.raises(TypeError, match=message.replace("(", r"\(")):
        call()


def test_out_of_range_ints_raise_value_error():
    with pytest.raises(ValueError, match="top_k"):
        mk.top_k_top_p_sample(torch.ones(2, 4), 2**64, 0.5)


def test_unsupported_device_names_the_op():
    with pytest.raises(ValueError, match="silu_and_mul: x is on unsupported device 'meta'"):
        mk.silu_and_mul(torch.ones(2, 4, device="meta"))


def test_kernel_errors_pass_through_unchanged():
    # A dtype error raised by the C++ contract is already a TypeError naming op and argument.
    with pytest.raises(TypeError, match="rms_norm: argument 'weight'"):
        mk.rms_norm(torch.ones(2, 4), torch.ones(4, dtype=torch.float64))


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-v"]))
