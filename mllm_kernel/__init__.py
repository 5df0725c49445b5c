"""mllm-kernel: CPU (Highway) and CUDA kernels for LLM inference, called from PyTorch through
apache-tvm-ffi, prebuilt in the wheel and JIT-compiled on first use otherwise.

The ops come from the registry of kernel packages (mllm_kernel.kernels: each declares its
EXPORTS) and are imported on first access, so `import mllm_kernel.jit_utils` stays light.
"""

from importlib import import_module

__version__ = "0.1.0"


def __getattr__(name: str):
    if name.startswith("__") and name != "__all__":  # dunder probes (copy, pickle, pytest)
        raise AttributeError(f"module 'mllm_kernel' has no attribute {name!r}")
    kernels = import_module("mllm_kernel.kernels")

    if name == "__all__":
        return ["__version__", *kernels.exports()]
    op_package = kernels.exports().get(name)
    if op_package is None:
        raise AttributeError(f"module 'mllm_kernel' has no attribute {name!r}")
    value = getattr(kernels.package(op_package), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__():
    return sorted({*globals(), *import_module("mllm_kernel.kernels").exports()})
