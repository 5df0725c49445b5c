"""The one list of kernels: each is a folder kernels/<name>/ declared with mllm_kernel_library.
The wheel, compile_commands.json, show_config and //kernels:all take it from here. VERSION must
equal mllm_kernel.__version__ (the wheel's file name is fixed at analysis time, so Starlark
needs it too); //tests/wheel:test_wheel checks the two agree."""

VERSION = "0.1.0"

KERNELS = [
    "add_constant",
    "decode_attention",
    "activation",
    "embedding",
    "kv_cache",
    "penalties",
    "prefill_attention",
    "rms_norm",
    "rope",
    "sampling",
    "softmax",
    "speculative",
]
