"""Host time per call of small ops (decode-sized inputs), where Python overhead, not the kernel,
sets the speed: our public function (plain eager calls skip torch.library's dispatcher), the
same op through torch.library's dispatcher, and the torch eager equivalent.

Per call = wall time of a loop of calls, synchronized once at the end, / calls; median of 7
loops after a warm-up. Usage: python3 benchmarks/bench_call_overhead.py [--device cpu|cuda]
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import mllm_kernel as mk
from mllm_kernel.kernels.activation import activation
from mllm_kernel.kernels.rms_norm import rms_norm
from mllm_kernel.kernels.softmax import softmax


def per_call_us(fn, device: str, calls: int = 2000) -> float:
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(200):
        fn()
    sync()
    samples = []
    for _ in range(7):
        start = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        sync()
        samples.append((time.perf_counter_ns() - start) / calls / 1e3)
    return statistics.median(samples)


def cases(device: str):
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    x = torch.randn(1, 4096, device=device, dtype=dtype)
    r, w = torch.randn_like(x), torch.randn(4096, device=device, dtype=dtype)
    h = torch.randn(1, 2 * 4096, device=device, dtype=dtype)
    logits = torch.randn(4, 32000, device=device, dtype=dtype)
    eager_norm = lambda: x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(dtype) * w  # noqa: E731
    return [
        ("rms_norm 1x4096", lambda: mk.rms_norm(x, w), lambda: rms_norm._rms_norm_op._op(x, w, 1e-6), eager_norm),
        ("fused_add_rms_norm 1x4096", lambda: mk.fused_add_rms_norm(x, r, w),
         lambda: rms_norm._fused_add_rms_norm_op._op(x, r, w, 1e-6), lambda: (r.add_(x), eager_norm())),
        ("silu_and_mul 1x8192", lambda: mk.silu_and_mul(h), lambda: activation._silu_and_mul_op._op(h),
         lambda: F.silu(h[:, :4096]) * h[:, 4096:]),
        ("softmax 4x32000", lambda: mk.softmax(logits), lambda: softmax._softmax_op._op(logits, 1.0),
         lambda: torch.softmax(logits, -1)),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"),
                        default="cuda" if torch.cuda.is_available() else "cpu")
    device = parser.parse_args().device
    if device == "cpu":
        torch.set_num_threads(1)
    print(f"device: {torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}, torch {torch.__version__}")
    print(f"{'op':28} {'ours µs':>9} {'torch.library µs':>17} {'torch eager µs':>15}")
    for name, ours, dispatched, eager in cases(device):
        print(f"{name:28} {per_call_us(ours, device):9.2f} {per_call_us(dispatched, device):17.2f} "
              f"{per_call_us(eager, device):15.2f}")


if __name__ == "__main__":
    main()
