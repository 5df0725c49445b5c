"""JIT runtime: compile kernel sources into tvm-ffi modules on first use, cached on disk.

spec.py: JitSpec (what a module is made of, its keys and location); build.py: compiling,
publishing, verifying and loading; jit.py: jit / load_cpu_jit / load_cuda_jit and the registry.
Importing this package does not import torch.
"""

from .cache import ensure_private_dir, file_lock
from .compile import CudaArch, cuda_arch_list, gencode_flags, parse_cuda_arch_list
from .config import cache_root, highway_root, include_root, source_roots
from .cpp_args import CppArgs, make_cpp_args
from .jit import jit, load_cpu_jit, load_cuda_jit, make_spec, register_spec, registered_specs
from .key import RUNTIME_FORMAT_VERSION, compute_key
from .memo import cache_once
from .spec import JitSpec, resolve_source
from . import build  # noqa: E402,I001 (JitSpec.build/load use it; import it with the package)

__all__ = [
    "CppArgs",
    "CudaArch",
    "JitSpec",
    "RUNTIME_FORMAT_VERSION",
    "cache_once",
    "cache_root",
    "compute_key",
    "cuda_arch_list",
    "ensure_private_dir",
    "file_lock",
    "gencode_flags",
    "highway_root",
    "include_root",
    "jit",
    "load_cpu_jit",
    "load_cuda_jit",
    "make_cpp_args",
    "make_spec",
    "parse_cuda_arch_list",
    "register_spec",
    "registered_specs",
    "resolve_source",
    "source_roots",
]
