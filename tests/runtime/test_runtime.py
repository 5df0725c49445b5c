"""mllm_kernel.runtime: signatures, compiling and caching cubins (nvcc and NVRTC), argument
conversion and its errors (these run without a GPU), and launches on a GPU (skipped without one).

References are computed in float64 with torch in the test; outputs are poisoned before launches.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from mllm_kernel import runtime
from mllm_kernel.runtime import compile_kernel, compiler, load_cubin, parse_signature
from mllm_kernel.runtime.kernel import KernelArgumentError
from mllm_kernel.runtime.signature import SignatureError

ARCH = "sm_90a"  # compile-only tests name an arch: no GPU needed
HAS_GPU = torch.cuda.is_available()
gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")


def _has_nvrtc() -> bool:
    try:
        runtime.nvrtc.library()
        return True
    except FileNotFoundError:
        return False


needs_nvrtc = pytest.mark.skipif(not _has_nvrtc(), reason="no NVRTC library (nvidia-cuda-nvrtc wheel)")

ADD = r"""
// __global__ void not_a_kernel(int x)   (in a comment: must be ignored)
extern "C" __global__ void __launch_bounds__(256) vector_add(const float* __restrict__ a, const float *b,
                                                             float* __restrict__ out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}
"""


@pytest.fixture
def cache(tmp_path):
    return tmp_path / "cache"


# ----------------------------------------------------------------------------- signatures


SIGNATURES = [
    ("const float* __restrict__ x", ("x", "const float*", True, 1)),
    ("float const *x", ("x", "const float*", True, 1)),
    ("float* const x", ("x", "float*", False, 1)),
    ("unsigned n", ("n", "unsigned", False, 0)),
    ("unsigned int n", ("n", "unsigned int", False, 0)),
    ("long long m", ("m", "long long", False, 0)),
    ("std::int64_t m", ("m", "int64_t", False, 0)),
    ("const __nv_bfloat16 s", ("s", "__nv_bfloat16", False, 0)),
    ("double** pp", ("pp", "double**", False, 2)),
    ("char c[]", ("c", "char*", False, 1)),
    ("float4* v", ("v", "float4*", False, 1)),
    ("unsigned int", ("arg0", "unsigned int", False, 0)),
    ("float*", ("arg0", "float*", False, 1)),
]


@pytest.mark.parametrize("declaration,expected", SIGNATURES)
def test_parse_param(declaration, expected):
    (param,) = parse_signature(f'extern "C" __global__ void k({declaration}) {{}}', "k")
    assert (param.name, param.spelling, param.const, param.pointer_depth) == expected


def test_parse_signature_forms():
    source = textwrap.dedent(
        """
        #define UNUSED 1
        /* extern "C" __global__ void fake(int); */
        extern "C" {
        __global__ void in_block(int a, const float* b) {}
        }
        extern "C" __global__ __launch_bounds__(128, 2) void attributed(float* y) {}
        extern "C" __global__ void no_params() {}
        extern "C" __global__ void void_params(void) {}
        __global__ void mangled(int x) {}
        """
    )
    assert [p.name for p in parse_signature(source, "in_block")] == ["a", "b"]
    assert [p.spelling for p in parse_signature(source, "attributed")] == ["float*"]
    assert parse_signature(source, "no_params") == [] == parse_signature(source, "void_params")
    with pytest.raises(SignatureError, match='not declared extern "C"'):
        parse_signature(source, "mangled")
    with pytest.raises(SignatureError, match=r"no __global__ function named 'fake'.*attributed, in_block"):
        parse_signature(source, "fake")
    with pytest.raises(SignatureError, match="reference"):
        parse_signature('extern "C" __global__ void r(float& x) {}', "r")
    with pytest.raises(SignatureError, match="twice"):
        parse_signature('extern "C" __global__ void d(int x, float x) {}', "d")


# ----------------------------------------------------------------------------- compiling and the cache


def test_compile_without_gpu_and_cache(cache, capfd):
    first = compiler.build_cubin(ADD, arch=ARCH, cache_dir=cache, label="vector_add")
    assert first.image[:4] == b"\x7fELF" and not first.cached and first.compiler == "nvcc"
    assert first.path.parent.parent == cache / "cubin"
    again = compiler.build_cubin(ADD, arch=ARCH, cache_dir=cache)
    assert again.cached and again.path == first.path and again.image == first.image
    assert "compiling" in capfd.readouterr().err  # the first call said it compiles, loudly

    # Anything that changes the cubin changes the key: source, options, arch.
    changed = {
        "source": compiler.build_cubin(ADD.replace("a[i] + b[i]", "a[i] - b[i]"), arch=ARCH, cache_dir=cache),
        "options": compiler.build_cubin(ADD, arch=ARCH, options=["-DVARIANT=2"], cache_dir=cache),
        "arch": compiler.build_cubin(ADD, arch="sm_80", cache_dir=cache),
    }
    paths = {first.path} | {c.path for c in changed.values()}
    assert len(paths) == 4 and not any(c.cached for c in changed.values())


def test_cache_hit_in_a_new_process(cache):
    compiler.build_cubin(ADD, arch=ARCH, cache_dir=cache)
    script = (
        "import sys; from mllm_kernel.runtime import compiler; "
        f"c = compiler.build_cubin(sys.stdin.read(), arch={ARCH!r}, cache_dir={str(cache)!r}); print(c.cached)"
    )
    result = subprocess.run([sys.executable, "-c", script], input=ADD, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "True" and "compiling" not in result.stderr


def test_header_change_recompiles(cache, tmp_path):
    include = tmp_path / "inc"
    include.mkdir()
    (include / "scale.h").write_text("#define SCALE 2.0f\n")
    source = '#include "scale.h"\nextern "C" __global__ void s(float* x) { x[threadIdx.x] *= SCALE; }\n'
    first = compiler.build_cubin(source, arch=ARCH, options=[f"-I{include}"], cache_dir=cache)
    (include / "scale.h").write_text("#define SCALE 3.0f\n")
    second = compiler.build_cubin(source, arch=ARCH, options=[f"-I{include}"], cache_dir=cache)
    assert second.path != first.path and not second.cached


def test_source_from_a_path(cache, tmp_path):
    path = tmp_path / "add.cu"
    path.write_text(ADD)
    kernel = compile_kernel(path, "vector_add", grid=4, block=256, arch=ARCH, cache_dir=cache)
    assert [p.name for p in kernel.params] == ["a", "b", "out", "n"] and kernel.cubin[:4] == b"\x7fELF"
    assert kernel.compiler == "nvcc" and kernel.path.is_file()
    with pytest.raises(FileNotFoundError, match="neither CUDA source"):
        compile_kernel(str(tmp_path / "missing.cu"), "vector_add", arch=ARCH, cache_dir=cache)


def test_verbose_prints_command_and_resources(cache, capfd):
    compile_kernel(ADD, "vector_add", arch=ARCH, cache_dir=cache, verbose=True)
    err = capfd.readouterr().err
    assert "nvcc" in err and "-cubin" in err and re.search(r"Used \d+ registers", err)
    compile_kernel(ADD, "vector_add", arch=ARCH, cache_dir=cache, verbose=True)  # cached: still reported
    err = capfd.readouterr().err
    assert "cached" in err and re.search(r"Used \d+ registers", err) and "compiled by nvcc" in err


def test_fatbin_for_several_archs(cache):
    cubin = compiler.build_cubin(ADD, arch="sm_80 sm_90a compute_90", cache_dir=cache)
    assert cubin.image[:4] != b"\x7fELF" and len(cubin.image) > 0  # a fatbin container


def test_compile_errors(cache):
    with pytest.raises(SignatureError):  # reported before anything is compiled
        compile_kernel(ADD, "vector_sub", arch=ARCH, cache_dir=cache)
    assert not cache.exists()
    with pytest.raises(RuntimeError, match="(?s)nvcc failed.*undeclared"):
        compile_kernel('extern "C" __global__ void k(int n) { undeclared = n; }', "k", arch=ARCH, cache_dir=cache)
    assert not [p for p in (cache / "cubin").iterdir() if p.is_dir()]  # a failed compile leaves nothing
    with pytest.raises(ValueError, match="arch="):
        compile_kernel(ADD, "vector_add", arch="hopper", cache_dir=cache)
    with pytest.raises(ValueError, match="compiler must be"):
        compile_kernel(ADD, "vector_add", arch=ARCH, cache_dir=cache, compiler="clang")
    with pytest.raises(TypeError, match="source must be"):
        compile_kernel(42, "vector_add", arch=ARCH, cache_dir=cache)


@needs_nvrtc
def test_nvrtc(cache, capfd):
    by_nvrtc = compiler.build_cubin(ADD, arch=ARCH, cache_dir=cache, compiler="nvrtc", verbose=True)
    assert by_nvrtc.image[:4] == b"\x7fELF" and by_nvrtc.compiler == "nvrtc"
    err = capfd.readouterr().err
    assert "NVRTC" in err and re.search(r"Used \d+ registers", err)
    by_nvcc = compiler.build_cubin(ADD, arch=ARCH, cache_dir=cache, compiler="nvcc")
    assert by_nvcc.path != by_nvrtc.path  # the compiler's identity is part of the key
    assert compiler.build_cubin(ADD, arch=ARCH, cache_dir=cache, compiler="nvrtc").cached
    fp16 = '#include <cuda_fp16.h>\nextern "C" __global__ void h(__half* x) { x[0] = __float2half(1.0f); }\n'
    assert compiler.build_cubin(fp16, arch=ARCH, cache_dir=cache, compiler="nvrtc").image[:4] == b"\x7fELF"
    with pytest.raises(ValueError, match="one sm_XX target"):
        compiler.build_cubin(ADD, arch="sm_80 sm_90a", cache_dir=cache, compiler="nvrtc")
    with pytest.raises(RuntimeError, match="NVRTC: compiling"):
        compiler.build_cubin('extern "C" __global__ void k() { nope; }', arch=ARCH, cache_dir=cache, compiler="nvrtc")


@needs_nvrtc
def test_nvrtc_identity_is_its_content_not_its_path(tmp_path, monkeypatch):
    """The same libnvrtc (and builtins) copied elsewhere keys the same cubins; another file does not."""
    from mllm_kernel.runtime import nvrtc

    _, original = nvrtc.library()
    here = nvrtc.identity()
    assert original not in here and "sha256" in here
    folder = tmp_path / "another" / "lib"
    folder.mkdir(parents=True)
    for name in [original, *glob.glob(os.path.join(os.path.dirname(original), "libnvrtc-builtins.so.*"))]:
        shutil.copy(name, folder / os.path.basename(name))
    copy = folder / os.path.basename(original)
    monkeypatch.setenv("MLLM_KERNEL_NVRTC", str(copy))
    nvrtc.library.cache_clear()
    try:
        assert nvrtc.library()[1] == os.path.realpath(copy)
        assert nvrtc.identity() == here
        with open(copy, "ab") as file:  # another compiler: a changed file, a new stat
            file.write(b"\0")
        os.utime(copy, ns=(1, 1))
        assert nvrtc.identity() != here
    finally:
        nvrtc.library.cache_clear()


@needs_nvrtc
def test_no_nvcc_falls_back_to_nvrtc(cache, monkeypatch, capfd):
    monkeypatch.setenv("MLLM_KERNEL_NVCC", "/nonexistent/nvcc")
    cubin = compiler.build_cubin(ADD, arch=ARCH, cache_dir=cache, verbose=True)
    assert cubin.compiler == "nvrtc" and "NVRTC" in capfd.readouterr().err


def test_no_compiler_at_all(cache, monkeypatch):
    monkeypatch.setenv("MLLM_KERNEL_NVCC", "/nonexistent/nvcc")
    monkeypatch.setenv("MLLM_KERNEL_NVRTC", "/nonexistent/libnvrtc.so")
    runtime.nvrtc.library.cache_clear()
    try:
        with pytest.raises(FileNotFoundError, match="no CUDA compiler"):
            compiler.build_cubin(ADD, arch=ARCH, cache_dir=cache)
    finally:
        runtime.nvrtc.library.cache_clear()


# ----------------------------------------------------------------------------- argument checks (no GPU needed)

SCALARS = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
extern "C" __global__ void scalars(double* out, signed char i8, unsigned char u8, short i16, unsigned short u16,
                                   int i32, unsigned u32, long long i64, unsigned long long u64, float f32,
                                   double f64, bool b, __half f16, __nv_bfloat16 bf16) {
  if (threadIdx.x != 0) return;
  out[0] = i8; out[1] = u8; out[2] = i16; out[3] = u16; out[4] = i32; out[5] = u32; out[6] = (double)i64;
  out[7] = (double)u64; out[8] = f32; out[9] = f64; out[10] = b ? 1.0 : 0.0; out[11] = __half2float(f16);
  out[12] = __bfloat162float(bf16);
}
"""
SCALAR_VALUES = [-128, 255, -32768, 65535, -(2**31), 2**32 - 1, -(2**63), 2**64 - 1, 1.5e38, -1e300, True, -65504.0, 3.0e38]


@pytest.fixture(scope="module")
def scalars_kernel(tmp_path_factory):
    return compile_kernel(SCALARS, "scalars", block=32, arch=ARCH if not HAS_GPU else None,
                          cache_dir=tmp_path_factory.mktemp("cache"))  # fmt: skip


@pytest.mark.parametrize(
    "index,bad,message",
    [
        (1, -129, r"outside \[-128, 127\]"),
        (2, 256, r"outside \[0, 255\]"),
        (5, 2**31, r"outside \[-2147483648, 2147483647\]"),
        (7, 2**63, r"outside"),
        (8, -1, r"outside \[0, 18446744073709551615\]"),
        (5, 1.0, r"argument 5 \(i32: int\) must be an int \(int\), got 1.0 \(float\)"),
        (9, 1e39, "overflows"),
        (12, 70000.0, "overflows"),
        (13, 3.5e38, "overflows"),
        (11, 2, "must be a bool"),
        (9, "1.0", "must be a number"),
    ],
)
def test_scalar_errors(scalars_kernel, index, bad, message):
    args = [np.empty(13)] + list(SCALAR_VALUES)  # (a NumPy output: checked without a GPU)
    args[index] = bad
    with pytest.raises(KernelArgumentError, match=message):
        scalars_kernel(*args)


def test_pointer_errors(cache):
    kernel = compile_kernel(ADD, "vector_add", grid=1, block=256, arch=ARCH, cache_dir=cache)
    a = torch.ones(8)
    with pytest.raises(KernelArgumentError, match=r"takes 4 arguments \(a, b, out, n\), got 3"):
        kernel(a, a, a)
    with pytest.raises(KernelArgumentError, match=r"argument 0 \(a: const float\*\) must be a CUDA tensor.*on cpu"):
        kernel(a, a, a, 8)
    with pytest.raises(KernelArgumentError, match=r"argument 1 \(b: const float\*\).*float32.*got a NumPy array of float64"):
        kernel(np.ones(8, np.float32), np.ones(8), np.ones(8, np.float32), 8)
    readonly = np.ones(8, np.float32)
    readonly.flags.writeable = False
    with pytest.raises(KernelArgumentError, match=r"argument 2 \(out\) is a read-only NumPy array"):
        kernel(readonly, readonly, readonly, 8)
    with pytest.raises(KernelArgumentError, match=r"argument 2 \(out: float\*\).*got a list"):
        kernel(readonly, readonly, [1.0], 8)
    if not HAS_GPU:
        host = np.ones(8, np.float32)
        with pytest.raises(RuntimeError, match="no CUDA device to launch on"):
            kernel(host, host, host, 8)
    with pytest.raises(ValueError, match=r"block=\(0, 1\): dimension x must be in \[1, 1024\]"):
        compile_kernel(ADD, "vector_add", block=(0, 1), arch=ARCH, cache_dir=cache)
    with pytest.raises(ValueError, match=r"grid=.*dimension y must be in \[1, 65535\]"):
        compile_kernel(ADD, "vector_add", grid=(1, 70000), arch=ARCH, cache_dir=cache)
    with pytest.raises(ValueError, match="not a multiple of cluster"):
        compile_kernel(ADD, "vector_add", grid=(3,), cluster=(2,), arch=ARCH, cache_dir=cache)


def test_fast_path_falls_back(cache, monkeypatch):
    """The fast path (the extension's fast_launch; torch's CUDA stream query is forced here)
    declines anything off it, and the general path names the problem."""
    from mllm_kernel.runtime import kernel as kernel_module

    monkeypatch.setattr(kernel_module, "_get_raw_stream", lambda device: 0)
    for source, name in ((ADD, "vector_add"), (SCALARS, "scalars")):
        kernel = compile_kernel(source, name, block=32, arch=ARCH, cache_dir=cache)
        if os.environ.get("MLLM_KERNEL_EXPECT_FATBIN") == "1":
            assert kernel._plan is not None
        with pytest.raises(KernelArgumentError, match=r"must be a CUDA tensor.*on cpu"):
            kernel(torch.ones(8), *([1] * (len(kernel.params) - 1)))
        with pytest.raises(KernelArgumentError, match=f"takes {len(kernel.params)} arguments"):
            kernel(torch.ones(8))
    add = compile_kernel(ADD, "vector_add", block=32, arch=ARCH, cache_dir=cache)
    host = np.ones(1, np.float32)
    with pytest.raises(KernelArgumentError, match=r"argument 3 \(n: int\).*got 1.5"):
        add(host, host, host, 1.5)


def test_launch_extension(cache):
    """Under Bazel (and in the wheel) launches go through the CPython extension _launch; its
    errors come back from driver.cpp as RuntimeError (here: no driver on a machine without GPU)."""
    from mllm_kernel.runtime import driver

    if os.environ.get("MLLM_KERNEL_EXPECT_FATBIN") != "1":
        pytest.skip("the extension is a Bazel build output")
    from mllm_kernel.runtime import _launch

    assert driver.launch_function() is _launch.launch
    if not HAS_GPU:
        kernel = compile_kernel(ADD, "vector_add", block=32, arch=ARCH, cache_dir=cache)
        with pytest.raises(RuntimeError, match="libcuda.so.1"):
            driver.launch_function()(kernel._record().address)


def _fast_record(kernel, args, context=0x1111_2222_3333, function=0x4444_5555_6666, stream=2**64 - 8):
    """The record _launch.fast_launch would launch (ints standing for tensors' data pointers),
    or None where it declines."""
    from mllm_kernel.runtime import _launch

    plan = list(kernel._plan)
    plan[1] = [kernel._value_spec(context, function)]  # loaded on device 0
    plan[4] = lambda device: stream  # torch's current stream
    return _launch.record_of(tuple(plan), tuple(args), None, 0)


def _packed_record(kernel, args, context=0x1111_2222_3333, function=0x4444_5555_6666, stream=2**64 - 8):
    """The record the general path packs with struct for the same launch (kernelParams as offsets)."""
    from mllm_kernel.runtime import kernel as kernel_module

    values = [kernel_module._bf16_bits(v) if kind == kernel_module._BF16 else v for v, kind in zip(args, kernel._kinds)]
    record = kernel_module._Record(kernel._layout, kernel._offsets, kernel._default_head())
    head = (*kernel.grid, *kernel.block, kernel.dynamic_shared_mem_bytes, *kernel.cluster)
    kernel._packer.pack_into(record.buffer, 0, *head, record.params_offset, 0, context, function, stream, *values)
    struct.pack_into(f"={len(kernel._offsets)}Q", record.buffer, record.params_offset, *kernel._offsets)
    return bytes(record.buffer)


def test_fast_launch_builds_the_packed_record(cache, monkeypatch):
    """The common launch goes through _launch.fast_launch, which checks the arguments and builds
    the launch record in C. Its record must be the general path's, byte for byte, for every
    scalar type (integer extremes, bool, float, double, half and bfloat16 with their rounding),
    and it must decline (launching nothing) what the general path converts or rejects."""
    if os.environ.get("MLLM_KERNEL_EXPECT_FATBIN") != "1":
        pytest.skip("the extension is a Bazel build output")
    from mllm_kernel.runtime import _launch
    from mllm_kernel.runtime import kernel as kernel_module

    monkeypatch.setattr(kernel_module, "_get_raw_stream", lambda device: 0)  # a CPU-only torch has none
    kernel, out = compile_kernel(SCALARS, "scalars", block=32, arch=ARCH, cache_dir=cache), 0xDEAD_BEEF_0000
    assert kernel._plan is not None
    assert _fast_record(kernel, [out, *SCALAR_VALUES]) == _packed_record(kernel, [out, *SCALAR_VALUES])
    # half and bfloat16: ties, subnormals, the largest values, signed zero
    for value in (0.1, -1 / 3, 2049.0, 2051.0, 1e-7, 2.0**-24, 1.5 * 2.0**-24, 6.1e-5, 65504.0, -0.0, 1.00048828125,
                  1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, 3.3895313892515355e38, 1e-40):  # fmt: skip
        args = [out, *SCALAR_VALUES]
        args[13] = value
        if abs(value) <= 65504.0:
            args[12] = value
        assert _fast_record(kernel, args) == _packed_record(kernel, args), value
    for index, declined in ((1, 128), (2, -1), (8, -1), (8, 2**64), (5, True), (5, 2.0), (9, 1), (10, float("nan")),
                            (12, 65520.0), (13, float("inf")), (11, 1), (5, np.int32(1)), (9, 1e39)):  # fmt: skip
        args = [out, *SCALAR_VALUES]
        args[index] = declined
        assert _fast_record(kernel, args) is None, (index, declined)
    assert _fast_record(kernel, [out, *SCALAR_VALUES[:-1]]) is None  # one argument short
    assert _fast_record(kernel, [np.empty(13), *SCALAR_VALUES]) is None  # a NumPy array is copied: general path
    assert _fast_record(kernel, [torch.empty(13, dtype=torch.float64), *SCALAR_VALUES]) is None  # a CPU tensor
    with pytest.raises(TypeError, match="expected"):
        _launch.record_of(None, (), None, 0)
    if hasattr(torch.Tensor, "__dlpack_c_exchange_api__"):  # torch >= 2.10: tensors read through DLPack's C API
        def code(type_code, bits):  # DLPack's DLDataType (code, bits, lanes 1), packed as the extension packs it
            return struct.pack("=I", type_code | bits << 8 | 1 << 16)

        float32, bfloat16, boolean, int64 = code(2, 32), code(4, 16), code(6, 8), code(0, 64)
        assert kernel_module._exchange_dtypes(((torch.float32, torch.bfloat16), None, (torch.bool, torch.int64))) == (
            float32 + bfloat16, None, boolean + int64)
        assert kernel._plan[6] is not None


# ----------------------------------------------------------------------------- the shipped cubins


def test_prebuilt_cubins_run_without_a_compiler(tmp_path):
    """The shipped fatbin loads and (on a GPU) runs in a process where no compiler can be found."""
    from mllm_kernel.runtime import prebuilt_kernels

    if os.environ.get("MLLM_KERNEL_EXPECT_FATBIN") == "1":
        assert prebuilt_kernels.origin() == "fatbin"
    if prebuilt_kernels.origin() != "fatbin":
        pytest.skip("no built fatbin beside the package (a source checkout)")
    script = textwrap.dedent(
        """
        import shutil, torch
        from mllm_kernel.runtime import compiler, prebuilt_kernels
        assert shutil.which("nvcc") is None
        try:
            compiler.pick_compiler("auto")
            raise SystemExit("a compiler was found")
        except FileNotFoundError:
            pass
        kernel = prebuilt_kernels.kernel("mllm_axpby_f32")
        assert [p.spelling for p in kernel.params] == ["const float*", "float*", "float", "float", "long long"]
        if torch.cuda.is_available():
            x = torch.randn(100_003, device="cuda")
            y = torch.randn(100_003, device="cuda")
            expected = 2.5 * x.double() - 0.5 * y.double()
            prebuilt_kernels.axpby(2.5, x, -0.5, y)
            torch.testing.assert_close(y.double(), expected, rtol=1e-6, atol=1e-6)
            print("ran on the GPU")
        print("ok")
        """
    )
    env = {k: v for k, v in os.environ.items() if k not in ("MLLM_KERNEL_NVCC", "CUDA_HOME", "CUDA_PATH")}
    env.update(PATH="/usr/bin:/bin", MLLM_KERNEL_NVRTC="/nonexistent/libnvrtc.so", MLLM_KERNEL_CACHE_DIR=str(tmp_path))
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr + result.stdout
    assert "ok" in result.stdout and (("ran on the GPU" in result.stdout) == HAS_GPU)


def test_load_cubin_needs_a_signature(cache, tmp_path):
    cubin = compiler.build_cubin(ADD, arch=ARCH, cache_dir=cache)
    with pytest.raises(ValueError, match="records no parameter types"):
        load_cubin(cubin.image, "vector_add")
    (tmp_path / "add.cubin").write_bytes(cubin.image)
    with pytest.raises(ValueError, match="keep add.cu beside add.cubin"):
        load_cubin(tmp_path / "add.cubin", "vector_add")
    (tmp_path / "add.cu").write_text(ADD)
    kernel = load_cubin(tmp_path / "add.cubin", "vector_add", block=128)
    assert [p.name for p in kernel.params] == ["a", "b", "out", "n"] and kernel.cubin == cubin.image


def test_fatbin_holds_the_configured_archs():
    from mllm_kernel.runtime import prebuilt_kernels

    cuobjdump = os.environ.get("CUOBJDUMP")
    if not cuobjdump or prebuilt_kernels.origin() != "fatbin":
        pytest.skip("needs the Bazel-built fatbin and cuobjdump")
    listing = subprocess.run([os.path.abspath(cuobjdump), "--list-elf", str(prebuilt_kernels.FATBIN)],
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
    for arch in os.environ["EXPECTED_ARCHS"].split(","):
        if arch.startswith("sm_"):
            assert f".{arch}." in listing, listing


# ----------------------------------------------------------------------------- launches (GPU)


@gpu
def test_vector_add_tensors_and_streams(cache):
    n = 4099
    kernel = compile_kernel(ADD, "vector_add", grid=(n + 255) // 256, block=256, cache_dir=cache)
    a = torch.randn(n, device="cuda")
    b = torch.randn(n, device="cuda")
    expected = a.double() + b.double()
    out = torch.full((n,), float("nan"), device="cuda")
    kernel(a, b, out, n)
    kernel.synchronize()
    torch.testing.assert_close(out.double(), expected, rtol=1e-6, atol=1e-6)
    for _ in range(3):  # later calls take the generated fast path: fresh data each time
        a.normal_()
        out.fill_(float("nan"))
        kernel(a, b, out, n)
        torch.testing.assert_close(out.double(), a.double() + b.double(), rtol=1e-6, atol=1e-6)
    a.copy_(expected.float() - b)

    stream = torch.cuda.Stream()
    out.fill_(float("nan"))
    torch.cuda.current_stream().synchronize()
    torch.cuda._sleep(20_000_000)  # the default stream is busy; the side stream must not wait for it
    kernel(a, b, out, n, stream=stream)
    kernel.synchronize(stream=stream)
    torch.testing.assert_close(out.double(), expected, rtol=1e-6, atol=1e-6)
    out.fill_(float("nan"))
    torch.cuda.synchronize()
    kernel(a, b, out, n, stream=stream.cuda_stream)  # a raw CUstream handle
    kernel.synchronize(stream=stream.cuda_stream)
    torch.testing.assert_close(out.double(), expected, rtol=1e-6, atol=1e-6)
    with pytest.raises(KernelArgumentError, match=r"argument 2 \(out: float\*\).*torch.float16"):
        kernel(a, b, out.half(), n)
    with pytest.raises(TypeError, match="stream must be"):
        kernel(a, b, out, n, stream="default")
    assert kernel.num_regs > 0 and kernel.max_threads_per_block >= 256 and kernel.shared_mem_bytes == 0


@gpu
def test_fast_path_views_grad_and_current_stream(cache):
    """The fast path reads each tensor's device, dtype and data pointer (through torch's DLPack
    exchange API where torch has one) and torch's current stream: views start at their offset,
    tensors that require grad launch too, and a launch inside `torch.cuda.stream(s)` runs on s."""
    n = 1000
    kernel = compile_kernel(ADD, "vector_add", grid=4, block=256, cache_dir=cache)
    if os.environ.get("MLLM_KERNEL_EXPECT_FATBIN") == "1" and hasattr(torch.Tensor, "__dlpack_c_exchange_api__"):
        assert kernel._plan[6] is not None  # the exchange API reads the tensors
    base = torch.randn(3 * n + 7, device="cuda")
    a, b = base[7 : n + 7], base[n + 7 : 2 * n + 7]  # storage offsets 7 and n + 7 elements
    out = torch.full((n + 3,), float("nan"), device="cuda")
    for _ in range(3):
        kernel(a, b, out[3:], n)
        torch.testing.assert_close(out[3:].double(), a.double() + b.double(), rtol=1e-6, atol=1e-6)
        assert out[:3].isnan().all()
        base.normal_()
    grad = torch.randn(n, device="cuda", requires_grad=True)
    kernel(grad, b, out[3:], n)
    torch.testing.assert_close(out[3:].double(), grad.detach().double() + b.double(), rtol=1e-6, atol=1e-6)

    side = torch.cuda.Stream()
    out.fill_(float("nan"))
    torch.cuda.synchronize()
    torch.cuda._sleep(50_000_000)  # the default stream is busy: a launch queued there would not be done
    with torch.cuda.stream(side):
        kernel(a, b, out[3:], n)
    side.synchronize()
    torch.testing.assert_close(out[3:].double(), a.double() + b.double(), rtol=1e-6, atol=1e-6)
    torch.cuda.synchronize()
    with pytest.raises(KernelArgumentError, match=r"argument 1 \(b: const float\*\).*torch.bfloat16"):
        kernel(a, b.bfloat16(), out, n)


@gpu
def test_launches_from_many_threads(cache):
    """Each thread packs its launches into its own record: no thread sees another's arguments."""
    from concurrent.futures import ThreadPoolExecutor

    n = 3001
    kernel = compile_kernel(ADD, "vector_add", grid=(n + 255) // 256, block=256, cache_dir=cache)

    def work(seed: int) -> bool:
        generator = torch.Generator(device="cuda").manual_seed(seed)
        ok = True
        for _ in range(50):
            a = torch.randn(n, device="cuda", generator=generator)
            b = torch.randn(n, device="cuda", generator=generator)
            out = torch.full((n,), float("nan"), device="cuda")
            kernel(a, b, out, n)
            torch.cuda.current_stream().synchronize()
            ok &= bool(torch.equal(out, a + b))
        return ok

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(work, range(8)))


@gpu
def test_numpy_arguments(cache):
    n = 1000
    kernel = compile_kernel(ADD, "vector_add", grid=4, block=256, cache_dir=cache)
    rng = np.random.default_rng(0)
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)[::-1]  # not contiguous: copied contiguous
    a.flags.writeable = False  # const float*: input only, never written back
    out = np.full(n, np.nan, np.float32)
    kernel(a, b, out, n)
    np.testing.assert_allclose(out.astype(np.float64), a.astype(np.float64) + b.astype(np.float64), rtol=1e-6, atol=1e-6)
    mixed = torch.full((n,), float("nan"), device="cuda")
    kernel(a, torch.from_numpy(b.copy()).cuda(), mixed, n)
    torch.testing.assert_close(mixed.cpu().double(), torch.from_numpy(a.astype(np.float64) + b.astype(np.float64)))


@gpu
def test_scalars_of_each_type(scalars_kernel):
    out = torch.full((13,), float("nan"), dtype=torch.float64, device="cuda")
    scalars_kernel(out, *SCALAR_VALUES)
    got = out.cpu().tolist()
    expected = [float(v) for v in SCALAR_VALUES]
    expected[8] = float(torch.tensor(1.5e38, dtype=torch.float32))
    expected[12] = float(torch.tensor(3.0e38, dtype=torch.float32).to(torch.bfloat16).float())
    expected[7] = float(2**64 - 1)
    assert got == expected
    scalars_kernel(out, *[np.int8(-3), np.uint8(3), 0, 0, np.int32(7), 0, 0, 0, np.float32(0.25), 2, False, 1, -0.0])
    assert out.cpu().tolist()[:5] == [-3.0, 3.0, 0.0, 0.0, 7.0] and out[8].item() == 0.25 and out[9].item() == 2.0


REDUCE = r"""
extern "C" __global__ void block_sums(const float* __restrict__ x, float* __restrict__ sums, int n) {
  extern __shared__ float partial[];   // blockDim.x floats
  float value = 0.0f;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) value += x[i];
  partial[threadIdx.x] = value;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) sums[blockIdx.x] = partial[0];
}
"""


@gpu
def test_shared_memory_reduction(cache):
    kernel = compile_kernel(REDUCE, "block_sums", grid=37, block=256, shared_mem_bytes=256 * 4, cache_dir=cache)
    x = torch.randn(123_457, device="cuda")
    sums = torch.full((37,), float("nan"), device="cuda")
    kernel(x, sums, x.numel())
    torch.testing.assert_close(sums.double().sum(), x.double().sum(), rtol=1e-4, atol=1e-3)
    host = np.full(64, np.nan, np.float32)  # NumPy output, other launch shape
    kernel(x.cpu().numpy(), host, x.numel(), grid=64, block=512, shared_mem_bytes=512 * 4)
    assert abs(float(host.astype(np.float64).sum()) - x.double().sum().item()) < 1e-2


BIG_SHARED = r"""
extern "C" __global__ void reverse_in_shared(const float* __restrict__ x, float* __restrict__ y, int n) {
  extern __shared__ float buffer[];
  for (int i = threadIdx.x; i < n; i += blockDim.x) buffer[i] = x[i];
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = buffer[n - 1 - i];
}
"""


@gpu
def test_more_than_48k_shared_memory(cache):
    n = 50_000  # 200,000 bytes of dynamic shared memory
    kernel = compile_kernel(BIG_SHARED, "reverse_in_shared", grid=1, block=1024, shared_mem_bytes=n * 4, cache_dir=cache)
    x = torch.randn(n, device="cuda")
    y = torch.full((n,), float("nan"), device="cuda")
    kernel(x, y, n)
    torch.testing.assert_close(y, x.flip(0), rtol=0, atol=0)
    with pytest.raises(ValueError, match="exceeds the .* bytes a block may use"):
        kernel(x, y, n, shared_mem_bytes=1 << 20)


MISC = r"""
struct Pair { int count; float scale; };
extern "C" __global__ void by_value(Pair pair, float* out) { out[threadIdx.x] = pair.count * pair.scale; }
extern "C" __global__ void gather(const float* const* rows, float* out) { out[threadIdx.x] = rows[threadIdx.x][1]; }
extern "C" __global__ void copy4(const float4* x, float4* y) { y[threadIdx.x] = x[threadIdx.x]; }
extern "C" __global__ void fill_static(float* out) {
  __shared__ float tile[1000];
  tile[threadIdx.x] = threadIdx.x;
  __syncthreads();
  out[threadIdx.x] = tile[999 - threadIdx.x];
}
extern "C" __global__ void cluster_rank(unsigned* out) {
  unsigned rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  if (threadIdx.x == 0) out[blockIdx.x] = rank;
}
"""


@gpu
def test_structs_pointer_arrays_alignment_static_shared(cache):
    by_value = compile_kernel(MISC, "by_value", block=4, cache_dir=cache)
    out = torch.full((4,), float("nan"), device="cuda")
    by_value(struct.pack("=if", 3, 2.5), out)
    assert out.tolist() == [7.5] * 4
    with pytest.raises(KernelArgumentError, match="bytes of length 8"):
        by_value(b"\0" * 4, out)

    gather = compile_kernel(MISC, "gather", block=3, cache_dir=cache)
    rows = [torch.randn(5, device="cuda") for _ in range(3)]
    addresses = torch.tensor([r.data_ptr() for r in rows], dtype=torch.int64, device="cuda")
    out = torch.full((3,), float("nan"), device="cuda")
    gather(addresses, out)
    assert out.tolist() == [r[1].item() for r in rows]

    copy4 = compile_kernel(MISC, "copy4", block=8, cache_dir=cache)
    x = torch.randn(33, device="cuda")
    y = torch.full((32,), float("nan"), device="cuda")
    copy4(x[:32], y)
    assert torch.equal(x[:32], y)
    with pytest.raises(KernelArgumentError, match="16-byte aligned"):
        copy4(x[1:], y)

    fill = compile_kernel(MISC, "fill_static", block=1000, cache_dir=cache)
    assert fill.shared_mem_bytes == 4000
    out = torch.full((1000,), float("nan"), device="cuda")
    fill(out)
    assert out.tolist() == [float(999 - i) for i in range(1000)]
    with pytest.raises(ValueError, match="more than 1024 threads"):
        fill(out, block=(1024, 2))


@gpu
@pytest.mark.skipif(HAS_GPU and torch.cuda.get_device_capability()[0] < 9, reason="clusters need sm_90")
def test_cluster_launch(cache):
    kernel = compile_kernel(MISC, "cluster_rank", grid=8, block=32, cluster=(4,), cache_dir=cache)
    out = torch.full((8,), 99, dtype=torch.int32, device="cuda").view(torch.uint32) if hasattr(torch, "uint32") else None
    if out is None:
        pytest.skip("torch has no uint32")
    kernel(out)
    assert out.view(torch.int32).tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    kernel(out, cluster=(2,))
    assert out.view(torch.int32).tolist() == [0, 1] * 4


@gpu
def test_load_cubin_bytes(cache):
    cubin = compiler.build_cubin(ADD, cache_dir=cache)
    kernel = load_cubin(cubin.image, "vector_add", ADD, grid=1, block=256)
    a, b = torch.randn(100, device="cuda"), torch.randn(100, device="cuda")
    out = torch.full((100,), float("nan"), device="cuda")
    kernel(a, b, out, 100)
    torch.testing.assert_close(out.double(), a.double() + b.double())
    wrong = load_cubin(cubin.image, "vector_add", 'extern "C" __global__ void vector_add(const float* a, int n)')
    with pytest.raises(RuntimeError, match="declares 2 parameters but the compiled kernel has 4"):
        wrong(a, 1)
    missing = load_cubin(cubin.image, "other", 'extern "C" __global__ void other(int n)')
    with pytest.raises(RuntimeError, match="no kernel of that name"):
        missing(1)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
