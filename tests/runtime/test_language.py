"""mllm_kernel.runtime.language: translation to CUDA C (always), the errors and their line numbers
(always), compiling the generated sources with nvcc (skipped without nvcc) and launches on a GPU
(skipped without one).

References are computed in float64 with torch in the test; outputs are poisoned before launches.
"""

from __future__ import annotations

import inspect
import os
import re
import shutil
import subprocess
import sys
import types

import pytest
import torch

import mllm_kernel.runtime.language as ll
from mllm_kernel.runtime.language import PASSES, KernelError, codegen_cuda, ll_kernel

NVCC = shutil.which(os.environ.get("MLLM_KERNEL_NVCC") or "nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="no nvcc")
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

BLOCK = 256
NEG_INF = float("-inf")
HALF = 0.5


# ----------------------------------------------------------------------------- kernels


@ll_kernel(backend="cuda", is_entry=True)
def my_kernel(a: ll.Tensor[ll.float32], b: ll.Tensor[ll.float32], n: ll.int32) -> ll.void:
    idx = ll.blockIdx_x() * 256 + ll.threadIdx_x()
    if idx < n:
        b[idx] = a[idx] * 2.0


@ll.kernel
def block_sum(x: ll.Tensor[ll.float32], out: ll.Tensor[ll.float32], n: ll.int32) -> ll.void:
    """One partial sum per block: a tree reduction in shared memory."""
    s = ll.shared_array(ll.float32, BLOCK)
    tid = ll.threadIdx_x()
    i = ll.blockIdx_x() * BLOCK + tid
    s[tid] = x[i] if i < n else 0.0
    ll.syncthreads()
    stride = BLOCK // 2
    while stride > 0:
        if tid < stride:
            s[tid] += s[tid + stride]
        ll.syncthreads()
        stride //= 2
    if tid == 0:
        out[ll.blockIdx_x()] = s[0]


@ll.kernel
def row_sums(x: ll.Tensor[ll.float32], out: ll.Tensor[ll.float32], every3: ll.Tensor[ll.float32], rows: ll.int32,
             cols: ll.int32) -> ll.void:  # fmt: skip
    r = ll.blockIdx_x() * ll.blockDim_x() + ll.threadIdx_x()
    if r >= rows:
        return
    acc = 0.0
    for j in range(cols):
        acc += x[r * cols + j]
    out[r] = acc
    acc = 0.0
    for j in range(cols - 1, -1, -3):  # x[r, cols-1::-3]
        acc = acc + x[r * cols + j]
    every3[r] = acc


@ll.kernel
def bf16_affine(x: ll.Tensor[ll.bfloat16], y: ll.Tensor[ll.bfloat16], alpha: ll.float32, n: ll.int32) -> ll.void:
    i = ll.blockIdx_x() * ll.blockDim_x() + ll.threadIdx_x()
    if i < n:
        y[i] = x[i] * alpha + 1.0


@ll.kernel
def divmod_kernel(a: ll.Tensor[ll.int32], b: ll.Tensor[ll.int32], q: ll.Tensor[ll.int32], r: ll.Tensor[ll.int32],
                  a64: ll.Tensor[ll.int64], q64: ll.Tensor[ll.int64], r64: ll.Tensor[ll.int64],
                  fx: ll.Tensor[ll.float32], fy: ll.Tensor[ll.float32], fq: ll.Tensor[ll.float32],
                  fr: ll.Tensor[ll.float32], n: ll.int32) -> ll.void:  # fmt: skip
    i = ll.blockIdx_x() * ll.blockDim_x() + ll.threadIdx_x()
    if i < n:
        q[i] = a[i] // b[i]
        r[i] = a[i] % b[i]
        q64[i] = a64[i] // b[i]
        r64[i] = a64[i] % b[i]
        fq[i] = fx[i] // fy[i]
        fr[i] = fx[i] % fy[i]


SM_BLOCK = 128


@ll.kernel
def softmax_rows(x: ll.Tensor[ll.float32], y: ll.Tensor[ll.float32], cols: ll.int32) -> ll.void:
    red = ll.shared_array(ll.float32, SM_BLOCK)
    tid = ll.threadIdx_x()
    base = ll.int64(ll.blockIdx_x()) * cols
    m = NEG_INF
    for j in range(tid, cols, SM_BLOCK):
        m = ll.max(m, x[base + j])
    red[tid] = m
    ll.syncthreads()
    stride = SM_BLOCK // 2
    while stride > 0:
        if tid < stride:
            red[tid] = ll.max(red[tid], red[tid + stride])
        ll.syncthreads()
        stride >>= 1
    m = red[0]
    ll.syncthreads()
    total = 0.0
    for j in range(tid, cols, SM_BLOCK):
        e = ll.exp(x[base + j] - m)
        y[base + j] = e
        total += e
    red[tid] = total
    ll.syncthreads()
    stride = SM_BLOCK // 2
    while stride > 0:
        if tid < stride:
            red[tid] += red[tid + stride]
        ll.syncthreads()
        stride >>= 1
    total = red[0]
    for j in range(tid, cols, SM_BLOCK):
        y[base + j] = y[base + j] / total


@ll.kernel
def constructs(a: ll.Tensor[ll.int32], h: ll.Tensor[ll.float16], u8: ll.Tensor[ll.uint8], flags: ll.Tensor[ll.bool_],
               d: ll.Tensor[ll.float64], u: ll.uint32, n: ll.int64) -> ll.void:  # fmt: skip
    i = ll.threadIdx_x()
    x: ll.float32 = 0
    for k in range(n):
        q = a[k] // 3 + a[k] % -3 + (a[k] << 2) - (a[k] >> 1) + (a[k] & 7 | 8 ^ a[k]) + ~a[k]
        x += ll.float32(q) / 2 + q ** 2 + abs(q) + ll.abs(-2.5) + max(q, 1, 2) + ll.min(x, 3)
        if 0 <= q < 10 and not q == 5 or q != -1:
            continue
        elif q > 100:
            break
        else:
            pass
    while x > 1.0:
        x = x * HALF
    h[i] = ll.sqrt(x) + ll.log(2.0) + ll.exp(x) - ll.float16(x) if i % 2 == 0 else h[i] * 0.25
    u8[i] = ll.uint8(i + 300)
    flags[i] = x > 0.5 or flags[i]
    v = u + 1
    v = v >> 1
    d[i] = d[i] ** 0.5 + x + ll.float64(0.1) + i / 3
    double = 2.0  # a C keyword as a Python name
    new = double * 2
    d[i] += new + ll.float64(v) + ll.float64(ll.int64(n) * 3000000000)


@ll.kernel
def all_dtypes(a: ll.Tensor[ll.float64], b: ll.Tensor[ll.float16], c: ll.Tensor[ll.bfloat16], d: ll.Tensor[ll.int64],
               e: ll.Tensor[ll.uint32], f: ll.Tensor[ll.int8], g: ll.Tensor[ll.uint8], h: ll.Tensor[ll.bool_],
               s1: ll.float32, s2: ll.float64, s3: ll.int64, s4: ll.uint32, s5: ll.int8, s6: ll.uint8,
               s7: ll.bool_) -> ll.void:  # fmt: skip
    f[0] = s5
    h[0] = s7


GOOD = [my_kernel, block_sum, row_sums, bf16_affine, divmod_kernel, softmax_rows, constructs, all_dtypes]


# ----------------------------------------------------------------------------- translation


def test_seed_example_source():
    src = my_kernel.source()
    assert 'extern "C" __global__ void my_kernel(const float* __restrict__ a, float* __restrict__ b, int n) {' in src
    assert "b[idx] = a[idx] * 2.0f;" in src
    assert "#include" not in src
    assert my_kernel.__name__ == "my_kernel"
    ir = my_kernel.parse()
    for p in PASSES["cuda"]:
        ir = p(ir) or ir
    assert codegen_cuda(ir) == src == my_kernel.source(PASSES["cuda"], codegen_cuda)


def test_passes_are_real_functions():
    assert isinstance(PASSES["cuda"], list) and all(inspect.isfunction(p) for p in PASSES["cuda"])
    ir = my_kernel.translate()
    assert [(p.name, str(p.type), p.written) for p in ir.params] == [
        ("a", "Tensor[float32]", False), ("b", "Tensor[float32]", True), ("n", "int32", False)]  # fmt: skip
    assert ir.locals == {"idx": ll.int32}
    with pytest.raises(ValueError, match="typed"):
        codegen_cuda(my_kernel.parse())  # no passes ran
    # a pass of one's own runs in the given order, and may change the IR
    seen = []

    def rename(ir):
        seen.append(ir.typed)
        ir.params[0].written = True

    src = my_kernel.source([*PASSES["cuda"], rename])
    assert seen == [True] and "void my_kernel(float* __restrict__ a," in src


def test_signature_types_and_const():
    src = all_dtypes.source()
    assert ('void all_dtypes(const double* __restrict__ a, const __half* __restrict__ b, '
            'const __nv_bfloat16* __restrict__ c, const long long* __restrict__ d, const unsigned int* __restrict__ e, '
            'signed char* __restrict__ f, const unsigned char* __restrict__ g, bool* __restrict__ h, float s1, '
            'double s2, long long s3, unsigned int s4, signed char s5, unsigned char s6, bool s7)') in src
    assert "#include <cuda_fp16.h>" in src and "#include <cuda_bf16.h>" in src
    bf = bf16_affine.source()
    assert "#include <cuda_bf16.h>" in bf and "cuda_fp16.h" not in bf
    assert "y[i] = __float2bfloat16(__bfloat162float(x[i]) * alpha + 1.0f);" in bf


def test_reduction_source():
    src = block_sum.source()
    assert "__shared__ float s[256];" in src
    assert src.index("__shared__ float s[256];") < src.index("tid = (int)threadIdx.x;")
    assert "__syncthreads();" in src and "while (stride > 0) {" in src
    assert "stride = 128;" in src  # BLOCK // 2 folded
    assert "s[tid] = i < n ? x[i] : 0.0f;" in src
    assert "s[tid] = s[tid] + s[tid + stride];" in src
    assert "const float* __restrict__ x, float* __restrict__ out" in src


def test_loops_source():
    src = row_sums.source()
    assert "for (int ll_i0 = 0, ll_stop0 = cols; ll_i0 < ll_stop0; ++ll_i0) {" in src
    assert "for (int ll_i1 = cols - 1; ll_i1 > -1; ll_i1 -= 3) {" in src
    assert "j = ll_i1;" in src and "return;" in src


def test_python_semantics_helpers():
    src = divmod_kernel.source()
    assert "q[i] = ll_floordiv<int>(a[i], b[i]);" in src
    assert "r[i] = ll_mod<int>(a[i], b[i]);" in src
    assert "q64[i] = ll_floordiv<long long>(a64[i], (long long)b[i]);" in src
    assert "fq[i] = floorf(fx[i] / fy[i]);" in src and "fr[i] = ll_fmod(fx[i], fy[i]);" in src
    assert "ll_powi" not in src  # only the helpers used


def test_constructs_source():
    src = constructs.source()
    for fragment in [
        "float x;", "long long k;", "x = 0.0f;",
        "for (long long ll_i0 = 0LL, ll_stop0 = n; ll_i0 < ll_stop0; ++ll_i0) {",
        "ll_floordiv<int>(a[k], 3) + ll_mod<int>(a[k], -3) + (a[k] << 2) - (a[k] >> 1) + ((a[k] & 7) | (8 ^ a[k])) + ~a[k]",  # noqa: E501
        "x = x + ((float)q / 2.0f + (float)ll_powi<int>(q, 2) + (float)abs(q) + fabsf(-2.5f) + (float)max(max(q, 1), 2) + fminf(x, 3.0f));",  # noqa: E501
        "if (((0 <= q) && (q < 10) && !(q == 5)) || (q != -1)) {", "continue;", "} else if (q > 100) {",
        "break;", "} else {", "while (x > 1.0f) {", "x = x * 0.5f;",
        "h[i] = __float2half(ll_mod<int>(i, 2) == 0 ? sqrtf(x) + logf(2.0f) + expf(x) - __half2float(__float2half(x)) : __half2float(h[i]) * 0.25f);",
        "u8[i] = (unsigned char)(i + 300);", "flags[i] = (x > 0.5f) || flags[i];", "v = u + 1u;", "v = v >> 1u;",
        "pow(d[i], 0.5) + (double)x + 0.1 + (double)((float)i / 3.0f)", "v_double = 2.0f;", "v_new = v_double * 2.0f;",
        "(double)(n * 3000000000LL)",
    ]:  # fmt: skip
        assert fragment in src, fragment
    assert "const int* __restrict__ a" in src and "__half* __restrict__ h" in src and "bool* __restrict__ flags" in src


def test_translation_is_lazy_and_reads_constants_then():
    # Decorating never raises; a module constant defined after the kernel is seen at translation.
    assert "s[256]" in block_sum.source()
    assert "LATER_CONSTANT" not in globals()

    @ll.kernel
    def uses_later(out: ll.Tensor[ll.int32]) -> ll.void:
        out[0] = LATER_CONSTANT  # noqa: F821

    with pytest.raises(KernelError, match="unknown name 'LATER_CONSTANT'"):
        uses_later.source()
    globals()["LATER_CONSTANT"] = 7
    try:
        assert "out[0] = 7;" in uses_later.source()
    finally:
        del globals()["LATER_CONSTANT"]


def test_closure_constants_and_aliases():
    scale = 3

    @ll.kernel
    def closure(out: ll.Tensor[ll.float32], n: ll.int32) -> ll.void:
        out[0] = float(n * scale) + min(n, scale)

    assert "out[0] = (float)(n * 3) + (float)min(n, 3);" in closure.source()


def test_decorator_arguments_and_misuse():
    with pytest.raises(ValueError, match="backend"):
        ll.kernel(backend="triton")(my_kernel.__wrapped__)
    with pytest.raises(ValueError, match="entry"):
        ll_kernel(is_entry=False)(my_kernel.__wrapped__)
    with pytest.raises(TypeError, match="build it first"):
        my_kernel(1, 2, 3)
    with pytest.raises(RuntimeError, match="inside an @ll.kernel"):
        ll.threadIdx_x()
    with pytest.raises(RuntimeError, match="inside an @ll.kernel"):
        ll.float32(1.0)
    with pytest.raises(TypeError):
        ll.Tensor[float]
    assert issubclass(ll.KernelTypeError, KernelError) and issubclass(ll.KernelTypeError, TypeError)
    assert issubclass(ll.KernelSyntaxError, KernelError) and issubclass(ll.KernelSyntaxError, SyntaxError)


def test_build_calls_compile_kernel(monkeypatch, capsys):
    calls = []
    fake = types.ModuleType("mllm_kernel.runtime")
    fake.compile_kernel = lambda source, name, **kw: calls.append((source, name, kw)) or "compiled"
    monkeypatch.setitem(sys.modules, "mllm_kernel.runtime", fake)
    k = my_kernel.build(PASSES["cuda"], codegen_cuda, grid=(4, 1, 1), block=(256, 1, 1), shared_mem_bytes=0,
                        arch="sm_90a", verbose=True)  # fmt: skip
    assert k == "compiled"
    source, name, kw = calls[0]
    assert name == "my_kernel" and source == my_kernel.source()
    assert kw == dict(grid=(4, 1, 1), block=(256, 1, 1), shared_mem_bytes=0, arch="sm_90a", options=(),
                      cache_dir=None, verbose=True, cluster=None)  # fmt: skip
    assert source in capsys.readouterr().out
    my_kernel.build(codegen=lambda ir: "// custom " + ir.name, grid=(1,), block=(32,), options=("-lineinfo",))
    assert calls[1][0] == "// custom my_kernel" and calls[1][2]["options"] == ("-lineinfo",)


def test_module_imports_without_torch():
    code = "import sys; sys.modules['torch'] = None; import mllm_kernel.runtime.language as ll; print(ll.float32)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "float32"


# ----------------------------------------------------------------------------- errors
# Each kernel below fails to translate; OFFSET is its offending line counted from the decorator.


def helper(x):
    return x


@ll.kernel
def e_store_float(a: ll.Tensor[ll.float32], b: ll.Tensor[ll.int32]) -> ll.void:
    i = ll.threadIdx_x()
    b[i] = a[i] * 2.0


@ll.kernel
def e_unknown_name(a: ll.Tensor[ll.float32]) -> ll.void:
    a[0] = foo + 1  # noqa: F821


@ll.kernel
def e_listcomp(a: ll.Tensor[ll.float32]) -> ll.void:
    xs = [i for i in range(3)]  # noqa: F841


@ll.kernel
def e_missing_annotation(a, n: ll.int32) -> ll.void:
    pass


@ll.kernel
def e_unknown_annotation(a: ll.Tensor[ll.float32], n: int) -> ll.void:
    pass


@ll.kernel
def e_no_return_annotation(a: ll.Tensor[ll.float32]):
    pass


@ll.kernel
def e_bad_return(a: ll.Tensor[ll.float32]) -> ll.int32:
    pass


@ll.kernel
def e_builtin_args(a: ll.Tensor[ll.float32]) -> ll.void:
    i = ll.threadIdx_x()
    a[i] = ll.exp(a[i], 2.0)


@ll.kernel
def e_sreg_args(a: ll.Tensor[ll.float32]) -> ll.void:
    a[ll.threadIdx_x(0)] = 1.0


@ll.kernel
def e_float_to_int_local(a: ll.Tensor[ll.float32]) -> ll.void:
    i = 0
    i = a[0]


@ll.kernel
def e_augassign_float(a: ll.Tensor[ll.float32]) -> ll.void:
    i = 0
    i += 0.5


@ll.kernel
def e_index_scalar(a: ll.Tensor[ll.int32], n: ll.int32) -> ll.void:
    a[0] = n[0]


@ll.kernel
def e_store_scalar_param(a: ll.Tensor[ll.int32], n: ll.int32) -> ll.void:
    n[0] = a[0]


@ll.kernel
def e_range_step(a: ll.Tensor[ll.int32], n: ll.int32, k: ll.int32) -> ll.void:
    for i in range(0, n, k):
        a[i] = 0


@ll.kernel
def e_range_zero(a: ll.Tensor[ll.int32], n: ll.int32) -> ll.void:
    for i in range(0, n, 0):
        a[i] = 0


@ll.kernel
def e_for_list(a: ll.Tensor[ll.int32]) -> ll.void:
    for i in [1, 2]:
        a[i] = 0


@ll.kernel
def e_return_value(a: ll.Tensor[ll.int32]) -> ll.void:
    return 1


@ll.kernel
def e_tensor_value(a: ll.Tensor[ll.float32], b: ll.Tensor[ll.float32]) -> ll.void:
    b[0] = a + 1


@ll.kernel
def e_python_call(a: ll.Tensor[ll.float32]) -> ll.void:
    a[0] = helper(1.0)


@ll.kernel
def e_shared_use(a: ll.Tensor[ll.float32]) -> ll.void:
    ll.shared_array(ll.float32, 4)


@ll.kernel
def e_shared_size(a: ll.Tensor[ll.float32], n: ll.int32) -> ll.void:
    s = ll.shared_array(ll.float32, n)
    a[0] = s[0]


@ll.kernel
def e_multi_index(a: ll.Tensor[ll.float32]) -> ll.void:
    a[0, 1] = 1.0


@ll.kernel
def e_float_index(a: ll.Tensor[ll.float32]) -> ll.void:
    a[0] = a[1.5]


@ll.kernel
def e_bitwise_float(a: ll.Tensor[ll.float32]) -> ll.void:
    a[0] = a[1] & 3


@ll.kernel
def e_string(a: ll.Tensor[ll.float32]) -> ll.void:
    x = "hello"  # noqa: F841


@ll.kernel
def e_before_assigned(a: ll.Tensor[ll.float32]) -> ll.void:
    a[0] = y
    y = 1.0  # noqa: F841


@ll.kernel
def e_while_else(a: ll.Tensor[ll.float32]) -> ll.void:
    while a[0] > 0.0:
        a[0] = 0.0
    else:
        pass


@ll.kernel
def e_lambda(a: ll.Tensor[ll.float32]) -> ll.void:
    f = lambda v: v  # noqa: E731, F841


@ll.kernel
def e_tuple_assign(a: ll.Tensor[ll.float32]) -> ll.void:
    x, y = 1, 2


@ll.kernel
def e_int_pow(a: ll.Tensor[ll.int32], n: ll.int32) -> ll.void:
    a[0] = 2 ** n


@ll.kernel
def e_f64_into_f32(a: ll.Tensor[ll.float32], d: ll.Tensor[ll.float64]) -> ll.void:
    a[0] = d[0] * 2.0


@ll.kernel
def e_const_range(a: ll.Tensor[ll.uint8]) -> ll.void:
    a[0] = 300


@ll.kernel
def e_is(a: ll.Tensor[ll.float32]) -> ll.void:
    if a[0] is a[1]:
        pass


@ll.kernel
def e_keyword(a: ll.Tensor[ll.float32]) -> ll.void:
    a[0] = ll.exp(x=1.0)


@ll.kernel
def e_half_scalar(a: ll.Tensor[ll.float32], s: ll.float16) -> ll.void:
    pass


@ll.kernel
def e_assign_tensor(a: ll.Tensor[ll.float32]) -> ll.void:
    a = 1.0  # noqa: F841


@ll.kernel
def e_void_value(a: ll.Tensor[ll.float32]) -> ll.void:
    x = ll.syncthreads()  # noqa: F841


@ll.kernel
def e_multiline(a: ll.Tensor[ll.float32]) -> ll.void:
    a[0] = (1.0 +
            bar)  # noqa: F821


@ll.kernel
def e_nested(a: ll.Tensor[ll.float32], n: ll.int32) -> ll.void:
    for i in range(n):
        if i > 2:
            while True:
                a[i] = ll.sqrt()


ERRORS = [
    (e_store_float, 3, re.escape("storing a float32 value into b (Tensor[int32]) needs an explicit cast, e.g. ll.int32(...)")),  # noqa: E501
    (e_unknown_name, 2, "unknown name 'foo'"),
    (e_listcomp, 2, "unsupported syntax: list comprehension"),
    (e_missing_annotation, 1, "parameter 'a' has no annotation"),
    (e_unknown_annotation, 1, "parameter 'n' has an unknown annotation 'int'"),
    (e_no_return_annotation, 1, "return annotation must be '-> ll.void', got none"),
    (e_bad_return, 1, "return annotation must be '-> ll.void', got 'll.int32'"),
    (e_builtin_args, 3, re.escape("ll.exp() takes 1 argument, got 2")),
    (e_sreg_args, 2, re.escape("ll.threadIdx_x() takes 0 arguments, got 1")),
    (e_float_to_int_local, 3, re.escape("assigning a float32 value to i (int32) needs an explicit cast, e.g. ll.int32(...)")),  # noqa: E501
    (e_augassign_float, 3, re.escape("assigning a float32 value to i (int32) needs an explicit cast")),
    (e_index_scalar, 2, "indexing a scalar: 'n' is int32"),
    (e_store_scalar_param, 2, "storing into scalar parameter 'n'"),
    (e_range_step, 2, re.escape("range() step must be an integer constant")),
    (e_range_zero, 2, re.escape("range() step must not be zero")),
    (e_for_list, 2, re.escape("unsupported syntax: for loops iterate over range(...) only")),
    (e_return_value, 2, "a kernel returns nothing"),
    (e_tensor_value, 2, re.escape("'a' (Tensor[float32]) cannot be used as a value")),
    (e_python_call, 2, "unsupported call: 'helper' is not a kernel builtin"),
    (e_shared_use, 2, "must be assigned directly to a name"),
    (e_shared_size, 2, "size must be a positive integer constant"),
    (e_multi_index, 2, "multi-dimensional indexing"),
    (e_float_index, 2, "an index must be an integer, got float32"),
    (e_bitwise_float, 2, "operator '&' needs integers, got float32 and int32"),
    (e_string, 2, "unsupported constant 'hello'"),
    (e_before_assigned, 2, "'y' is used before it is assigned"),
    (e_while_else, 2, "unsupported syntax: while ... else"),
    (e_lambda, 2, "unsupported syntax: lambda"),
    (e_tuple_assign, 2, "unsupported syntax: assignment to a tuple"),
    (e_int_pow, 2, re.escape("'**' on integers needs a constant exponent")),
    (e_f64_into_f32, 2, re.escape("storing a float64 value into a (Tensor[float32]) needs an explicit cast, e.g. ll.float32(...)")),  # noqa: E501
    (e_const_range, 2, "the constant 300 .* does not fit in uint8"),
    (e_is, 2, "unsupported syntax: operator 'is'"),
    (e_keyword, 2, "takes no keyword arguments"),
    (e_half_scalar, 1, "scalar parameter 's' cannot be float16"),
    (e_assign_tensor, 2, "cannot assign to tensor parameter 'a'"),
    (e_void_value, 2, re.escape("ll.syncthreads() returns nothing")),
    (e_multiline, 3, "unknown name 'bar'"),
    (e_nested, 5, re.escape("ll.sqrt() takes 1 argument, got 0")),
]


@pytest.mark.parametrize("kernel, offset, message", ERRORS, ids=[e[0].__name__ for e in ERRORS])
def test_errors_name_file_and_line(kernel, offset, message):
    lines, first = inspect.getsourcelines(kernel.__wrapped__)
    line = first + offset
    with pytest.raises(KernelError) as info:
        kernel.source()
    text = str(info.value)
    assert text.startswith(f"{__file__}:{line}: "), (text, line)
    assert re.search(message, text), text


def test_error_kinds():
    with pytest.raises(ll.KernelTypeError):
        e_store_float.source()
    with pytest.raises(ll.KernelSyntaxError):
        e_listcomp.source()
    with pytest.raises(KernelError):  # .build() translates first: compile_kernel is never reached
        e_store_float.build(grid=(1,), block=(1,))


# ----------------------------------------------------------------------------- nvcc


@needs_nvcc
@pytest.mark.parametrize("kernel", GOOD, ids=[k.__name__ for k in GOOD])
def test_generated_source_compiles(kernel, tmp_path):
    cu = tmp_path / f"{kernel.__name__}.cu"
    cu.write_text(kernel.source())
    proc = subprocess.run([NVCC, "-cubin", "-arch=sm_90a", "-o", str(tmp_path / "k.cubin"), str(cu)],
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stderr + "\n" + kernel.source()
    assert "error" not in proc.stderr


# ----------------------------------------------------------------------------- GPU


def _cdiv(a, b):
    return (a + b - 1) // b


@gpu
@pytest.mark.parametrize("n", [1000, 4099])
def test_gpu_vector_scale(n):
    a = torch.randn(n, device="cuda")
    b = torch.full((n + 7,), float("nan"), device="cuda")
    b[n:] = 123.0
    k = my_kernel.build(grid=(_cdiv(n, 256), 1, 1), block=(256, 1, 1), arch=None)
    k(a, b, n)
    k.synchronize()
    torch.testing.assert_close(b[:n].double(), a.double() * 2.0)
    assert (b[n:] == 123.0).all()  # nothing past n was written


@gpu
@pytest.mark.parametrize("n", [1000, 4099])
def test_gpu_block_sum(n):
    x = torch.randn(n, device="cuda")
    blocks = _cdiv(n, BLOCK)
    out = torch.full((blocks,), float("nan"), device="cuda")
    k = block_sum.build(grid=(blocks, 1, 1), block=(BLOCK, 1, 1), arch=None)
    k(x, out, n)
    k.synchronize()
    padded = torch.zeros(blocks * BLOCK, dtype=torch.float64, device="cuda")
    padded[:n] = x.double()
    torch.testing.assert_close(out.double(), padded.view(blocks, BLOCK).sum(1), rtol=1e-5, atol=1e-4)


@gpu
def test_gpu_for_loops():
    rows, cols = 37, 1000
    x = torch.randn(rows, cols, device="cuda")
    out = torch.full((rows,), float("nan"), device="cuda")
    every3 = torch.full((rows,), float("nan"), device="cuda")
    k = row_sums.build(grid=(2, 1, 1), block=(32, 1, 1), arch=None)
    k(x, out, every3, rows, cols)
    k.synchronize()
    torch.testing.assert_close(out.double(), x.double().sum(1), rtol=1e-5, atol=1e-3)
    picked = torch.tensor(list(range(cols - 1, -1, -3)), device="cuda")  # Python's range, as the kernel's loop
    torch.testing.assert_close(every3.double(), x.double()[:, picked].sum(1), rtol=1e-5, atol=1e-3)


@gpu
@pytest.mark.parametrize("n", [1000, 4099])
def test_gpu_bfloat16(n):
    x = torch.randn(n, device="cuda").to(torch.bfloat16)
    y = torch.full((n,), float("nan"), device="cuda", dtype=torch.bfloat16)
    alpha = 0.37
    k = bf16_affine.build(grid=(_cdiv(n, 128), 1, 1), block=(128, 1, 1), arch=None)
    k(x, y, alpha, n)
    k.synchronize()
    ref = (x.double() * alpha + 1.0).to(torch.bfloat16)
    torch.testing.assert_close(y.double(), ref.double(), rtol=1.6e-2, atol=1e-6)


@gpu
def test_gpu_floor_division_and_modulo_follow_python():
    n = 4099
    a = torch.randint(-1000, 1000, (n,), dtype=torch.int32, device="cuda")
    b = torch.randint(-37, 38, (n,), dtype=torch.int32, device="cuda")
    b[b == 0] = 7
    a[:4] = torch.tensor([-7, 7, -7, 7], dtype=torch.int32)
    b[:4] = torch.tensor([2, -2, -2, 2], dtype=torch.int32)
    a64 = a.long() * 3_000_000_000
    fx = torch.randn(n, device="cuda") * 10
    fy = torch.randn(n, device="cuda")
    fy[fy.abs() < 0.1] = 0.5
    q, r = (torch.full((n,), -12345, dtype=torch.int32, device="cuda") for _ in range(2))
    q64, r64 = (torch.full((n,), -12345, dtype=torch.int64, device="cuda") for _ in range(2))
    fq, fr = (torch.full((n,), float("nan"), device="cuda") for _ in range(2))
    k = divmod_kernel.build(grid=(_cdiv(n, 256), 1, 1), block=(256, 1, 1), arch=None)
    k(a, b, q, r, a64, q64, r64, fx, fy, fq, fr, n)
    k.synchronize()
    assert q[:4].tolist() == [-7 // 2, 7 // -2, -7 // -2, 7 // 2] and r[:4].tolist() == [-7 % 2, 7 % -2, -7 % -2, 7 % 2]
    assert torch.equal(q, torch.div(a, b, rounding_mode="floor")) and torch.equal(r, torch.remainder(a, b))
    assert torch.equal(q64, torch.div(a64, b.long(), rounding_mode="floor"))
    assert torch.equal(r64, torch.remainder(a64, b.long()))
    # float // and %: compare where the float32 quotient is not within rounding of an integer
    exact_q = torch.floor(fx.double() / fy.double())
    safe = ((fx.double() / fy.double()) - exact_q).abs().clamp(max=0.5) > 1e-4
    safe &= ((fx.double() / fy.double()) - exact_q - 1).abs() > 1e-4
    torch.testing.assert_close(fq.double()[safe], exact_q[safe])
    torch.testing.assert_close(fr.double()[safe], torch.remainder(fx.double(), fy.double())[safe], rtol=1e-4, atol=1e-4)


@gpu
@pytest.mark.parametrize("cols", [1000, 4099])
def test_gpu_softmax_rows(cols):
    rows = 33
    x = torch.randn(rows, cols, device="cuda") * 4
    y = torch.full((rows, cols), float("nan"), device="cuda")
    k = softmax_rows.build(grid=(rows, 1, 1), block=(SM_BLOCK, 1, 1), arch=None)
    k(x, y, cols)
    k.synchronize()
    torch.testing.assert_close(y.double(), torch.softmax(x.double(), dim=-1), rtol=1e-5, atol=1e-7)


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-q"]))
