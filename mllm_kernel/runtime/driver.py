"""The C++ side of the runtime (driver.cpp): a CPU tvm-ffi module of driver-API calls, prebuilt
into the wheel like the kernels' modules (so no compiler is needed to launch anything), or
JIT-compiled with the C++ compiler where it is not."""

from __future__ import annotations

import functools
import os
import threading
from pathlib import Path
from typing import Any

from mllm_kernel.jit_utils import JitSpec

_FOLDER = Path(os.path.abspath(__file__)).parent  # not resolve(): under Bazel, stay in runfiles

# (export name, C++ function) of driver.cpp. (Not `get_function` & co.: tvm-ffi's Module has
# methods of its own under such names, which would shadow the exports.)
_FUNCTIONS = {
    "driver_version": "DriverVersion",
    "primary_context": "PrimaryContext",
    "device_attribute": "DeviceAttribute",
    "module_load": "LoadModule",
    "module_unload": "UnloadModule",
    "module_function": "GetFunction",
    "function_attribute": "FunctionAttribute",
    "set_function_attribute": "SetFunctionAttribute",
    "param_info": "ParamInfo",
    "launch": "Launch",
    "launch_entry": "LaunchEntryAddress",
    "stream_synchronize": "StreamSynchronize",
}

SPEC = JitSpec(
    name="runtime_driver",
    device="cpu",
    cpp_files=(str(_FOLDER / "driver.cpp"),),
    cpp_wrappers=tuple((export, f"mllm_kernel::runtime::{symbol}") for export, symbol in _FUNCTIONS.items()),
    extra_ldflags=("-ldl",),
    highway=False,  # plain C++: loading it hashes no Highway headers
)
SPECS = [SPEC]  # what the wheel prebuilds (tools/kernel.bzl's prebuilt_modules)

# CUfunction_attribute / CUdevice_attribute values (driver_api.hpp has the same)
FUNC_MAX_THREADS_PER_BLOCK = 0
FUNC_SHARED_SIZE_BYTES = 1
FUNC_LOCAL_SIZE_BYTES = 3
FUNC_NUM_REGS = 4
FUNC_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
FUNC_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14
DEVICE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97


@functools.cache
def module() -> Any:
    loaded = SPEC.load()
    # A launch is a few microseconds: keep the GIL instead of releasing and retaking it (as
    # CuPy's launches do). Calls that wait (module loads, synchronize) still release it.
    loaded.launch.release_gil = False
    return loaded


@functools.cache
def launch_function() -> Any:
    """launch(record_address): the CPython extension _launch (built by Bazel, shipped in the
    wheel: about 0.3 µs less per call), else the driver module's tvm-ffi `launch`."""
    try:
        from . import _launch
    except ImportError:
        return module().launch
    _launch.set_entry(module().launch_entry())
    return _launch.launch


@functools.cache
def launcher_base() -> type:
    """CompiledKernel's base class: the CPython extension's Launcher, whose C __call__ launches
    without a Python frame (kernel.py's fast path), else object."""
    try:
        from . import _launch
    except ImportError:
        return object
    return _launch.Launcher


_contexts: dict[int, int] = {}
_contexts_lock = threading.Lock()


def primary_context(device: int) -> int:
    """The primary context of `device` (torch's), retained once per process."""
    context = _contexts.get(device)
    if context is None:
        with _contexts_lock:
            context = _contexts.get(device)
            if context is None:
                context = _contexts[device] = module().primary_context(device)
    return context
