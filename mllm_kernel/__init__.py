"""mllm-kernel: CPU (Highway) and CUDA kernels for LLM inference, called from PyTorch through
apache-tvm-ffi, prebuilt in the wheel and JIT-compiled on first use otherwise.

The ops are imported on first access (so `import mllm_kernel.jit_utils` stays light): each
line of _OPS maps a public name to the kernel folder (kernels/<folder>/<folder>.py) defining it.
"""

from importlib import import_module

__version__ = "0.1.0"

_OPS = {
    "rms_norm": "rms_norm",
    "fused_add_rms_norm": "rms_norm",
    "apply_rope": "rope",
    "silu_and_mul": "activation",
    "gelu_and_mul": "activation",
    "softmax": "softmax",
    "log_softmax": "softmax",
    "greedy_sample": "sampling",
    "top_k_top_p_sample": "sampling",
    "min_p_sample": "sampling",
    "store_kv_cache": "kv_cache",
    "embedding": "embedding",
}

__all__ = ["__version__", *_OPS]


def __getattr__(name: str):
    kernel = _OPS.get(name)
    if kernel is None:
        raise AttributeError(f"module 'mllm_kernel' has no attribute {name!r}")
    value = getattr(import_module(f"mllm_kernel.kernels.{kernel}.{kernel}"), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__():
    return sorted(list(globals()) + list(_OPS))
