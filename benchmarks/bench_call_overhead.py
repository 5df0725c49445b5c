"""Host time per call of small ops (decode-sized inputs), where Python overhead, not the kernel,
sets the speed: our public function (plain eager calls skip torch.library's dispatcher), the raw
tvm-ffi module call it ends in (preallocated output: the floor), their difference (what our Python
layer costs), the same op through torch.library's dispatcher, and the torch eager equivalent.

Per call = wall time of a loop of calls, synchronized once at the end, / calls; median of 7
loops after a warm-up. Usage: python3 benchmarks/bench_call_overhead.py [--device cpu|cuda]
"""

import argparse
import importlib
import statistics
import time

import torch
import torch.nn.functional as F

import mllm_kernel as mk


def _op_package(package: str):
    """The op's Python module in this layout (mllm_kernel.kernels.<op>) or the previous one
    (mllm_kernel.kernels.<op>.<op>), so that the same script measures before and after."""
    try:
        return importlib.import_module(f"mllm_kernel.kernels.{package}.{package}")
    except ImportError:
        return importlib.import_module(f"mllm_kernel.kernels.{package}")


def registered_op(package: str, op: str):
    """The op through torch.library's dispatcher."""
    module = _op_package(package)
    return getattr(module, f"_{op}", None) or getattr(module, f"_{op}_op")


def raw_module(package: str, device: str):
    """The op's loaded tvm-ffi module: its functions are the raw FFI calls, without any Python."""
    module = _op_package(package)
    return module._modules[device] if hasattr(module, "_modules") else module._module(device)


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
    norm, fused = registered_op("rms_norm", "rms_norm")._op, registered_op("rms_norm", "fused_add_rms_norm")._op
    silu, soft = registered_op("activation", "silu_and_mul")._op, registered_op("softmax", "softmax")._op
    raw_norm, raw_act, raw_soft = (raw_module(p, device) for p in ("rms_norm", "activation", "softmax"))
    out_x, out_h, out_l = torch.empty_like(x), torch.empty_like(h[:, :4096]), torch.empty_like(logits)
    eager_norm = lambda: x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(dtype) * w  # noqa: E731
    return [
        ("rms_norm 1x4096", lambda: mk.rms_norm(x, w), lambda: norm(x, w, 1e-6),
         lambda: raw_norm.rms_norm(out_x, x, w, 1e-6), eager_norm),
        ("fused_add_rms_norm 1x4096", lambda: mk.fused_add_rms_norm(x, r, w), lambda: fused(x, r, w, 1e-6),
         lambda: raw_norm.fused_add_rms_norm(x, r, w, 1e-6), lambda: (r.add_(x), eager_norm())),
        ("silu_and_mul 1x8192", lambda: mk.silu_and_mul(h), lambda: silu(h),
         lambda: raw_act.silu_and_mul(out_h, h), lambda: F.silu(h[:, :4096]) * h[:, 4096:]),
        ("softmax 4x32000", lambda: mk.softmax(logits), lambda: soft(logits, 1.0),
         lambda: raw_soft.softmax(out_l, logits, 1.0), lambda: torch.softmax(logits, -1)),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"),
                        default="cuda" if torch.cuda.is_available() else "cpu")
    device = parser.parse_args().device
    if device == "cpu":
        torch.set_num_threads(1)
    print(f"device: {torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}, torch {torch.__version__}")
    print(f"{'op':28} {'ours µs':>9} {'raw ffi µs':>11} {'overhead µs':>12} {'torch.library µs':>17} "
          f"{'torch eager µs':>15}")
    for name, ours, dispatched, raw, eager in cases(device):
        t_ours, t_raw = per_call_us(ours, device), per_call_us(raw, device)
        print(f"{name:28} {t_ours:9.2f} {t_raw:11.2f} {t_ours - t_raw:12.2f} "
              f"{per_call_us(dispatched, device):17.2f} {per_call_us(eager, device):15.2f}")


if __name__ == "__main__":
    main()
