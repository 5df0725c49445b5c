"""mllm_kernel.runtime.language: a small Python kernel language, translated to CUDA C.

    import mllm_kernel.runtime.language as ll

    @ll.kernel
    def scale(a: ll.Tensor[ll.float32], b: ll.Tensor[ll.float32], n: ll.int32) -> ll.void:
        idx = ll.blockIdx_x() * 256 + ll.threadIdx_x()
        if idx < n:
            b[idx] = a[idx] * 2.0

    print(scale.source())                                  # the CUDA C text
    k = scale.build(grid=(4, 1, 1), block=(256, 1, 1))    # through mllm_kernel.runtime.compile_kernel
    k(a, b, n); k.synchronize()

Pipeline: Kernel.parse() reads the function's source (inspect + ast) into a KernelIR; the passes
of PASSES["cuda"] check the signature, type every expression and find the tensors the kernel
stores into; codegen_cuda(ir) prints the CUDA C. Translation is lazy: errors (KernelError, whose
message starts with "file:line: " of the offending line) come from .source() / .build(), never
from decoration, so module-level constants may be defined after the kernel; their values are read
at each translation.

The language, in short:
- Parameters: ll.Tensor[dtype] (a flat device pointer, emitted `const` unless the kernel stores
  into it) or a scalar dtype. The return annotation must be ll.void.
- Values are bool, int8/uint8/int32/uint32/int64, float32/float64. float16/bfloat16 live only in
  memory: loads give float32, stores convert from float32.
- Constants (literals, module-level numbers) are "weak": `x + 1` keeps x's type and `2.0` is
  float32 except next to a float64. Other types meet by promotion: anything with a float is float
  (float64 if either is), then int64 wins; int32 with uint32 gives int64; bool/int8/uint8 compute
  as int32. `/` gives a float; `//` and `%` follow Python (floor) semantics.
- Implicit conversions only widen (int -> float, int32 -> int64, float32 -> float64); anything
  else stored into a tensor or a local needs a cast such as ll.int32(x) (C truncation).
- A local's type is fixed by its first assignment (int8/uint8 widen to int32) or declared with
  `x: ll.float32 = 0`; it must be assigned above its first use. `and`/`or`/`not` give bool.
- `for i in range(...)` with a constant step: start/stop are evaluated once and assigning to i in
  the body does not change the iteration, as in Python.
"""

from __future__ import annotations

import ast
import builtins
import copy
import inspect
import math
import operator
import textwrap
import types
from dataclasses import dataclass, field

__all__ = [
    "KernelError", "KernelSyntaxError", "KernelTypeError", "KernelIR", "Kernel", "kernel", "ll_kernel",
    "PASSES", "codegen_cuda", "check_signature", "infer_types", "find_written_tensors", "Tensor", "void",
    "float32", "float64", "float16", "bfloat16", "int32", "int64", "uint32", "int8", "uint8", "bool_",
]  # fmt: skip


class KernelError(Exception):
    """A kernel that cannot be translated; the message starts with "file:line: "."""


class KernelTypeError(KernelError, TypeError):
    """A type error in a kernel."""


class KernelSyntaxError(KernelError, SyntaxError):
    """A construct the kernel language does not support."""


# ----------------------------------------------------------------------------- types


class DType:
    """A scalar type. Inside a kernel `ll.int32(x)` is a cast; outside, calling it is an error."""

    def __init__(self, name: str, ctype: str, kind: str, bits: int):
        self.name, self.ctype, self.kind, self.bits = name, ctype, kind, bits  # kind: bool/int/uint/float

    is_float = property(lambda self: self.kind == "float")
    is_int = property(lambda self: self.kind in ("int", "uint"))

    @property
    def value(self) -> DType:
        """The type a load gives: float16/bfloat16 compute as float32."""
        return float32 if self.is_float and self.bits == 16 else self

    def __repr__(self):
        return "ll.bool_" if self is bool_ else f"ll.{self.name}"

    def __str__(self):
        return self.name

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self!r}(...) is a cast for use inside an @ll.kernel function")


float32 = DType("float32", "float", "float", 32)
float64 = DType("float64", "double", "float", 64)
float16 = DType("float16", "__half", "float", 16)
bfloat16 = DType("bfloat16", "__nv_bfloat16", "float", 16)
int8 = DType("int8", "signed char", "int", 8)
uint8 = DType("uint8", "unsigned char", "uint", 8)
int32 = DType("int32", "int", "int", 32)
uint32 = DType("uint32", "unsigned int", "uint", 32)
int64 = DType("int64", "long long", "int", 64)
bool_ = DType("bool", "bool", "bool", 8)


@dataclass(frozen=True)
class TensorType:
    dtype: DType

    def __str__(self):
        return f"Tensor[{self.dtype}]"


class Tensor:
    """`ll.Tensor[ll.float32]`: a parameter that is a flat device array."""

    def __class_getitem__(cls, dtype):
        if not isinstance(dtype, DType):
            raise TypeError(f"ll.Tensor[...] takes an ll dtype such as ll.float32, got {dtype!r}")
        return TensorType(dtype)


@dataclass(frozen=True)
class SharedArray:
    name: str
    dtype: DType
    size: int

    def __str__(self):
        return f"shared_array({self.dtype}, {self.size})"


class _Void:
    def __repr__(self):
        return "ll.void"

    __str__ = __repr__


void = _Void()


def _widen(t: DType) -> DType:
    """The type arithmetic on t computes in (C's integer promotion)."""
    return int32 if t.kind == "bool" or (t.is_int and t.bits < 32) else t


def _promote(a: DType, b: DType) -> DType:
    if a.is_float or b.is_float:
        return float64 if float64 in (a, b) else float32
    a, b = _widen(a), _widen(b)
    return a if a is b else int64  # int64 with anything, or int32 with uint32


def _weak(node) -> bool:
    """A constant int that fits int32: it takes the type of what it meets."""
    return type(getattr(node, "ll_const", None)) is int and node.ll_type is int32


def _common(ta: DType, weak_a: bool, tb: DType, weak_b: bool) -> DType:
    """The type two operands meet in (a weak side takes the other's type)."""
    if weak_a and not weak_b and tb.kind != "bool":
        return tb
    if weak_b and not weak_a and ta.kind != "bool":
        return ta
    return ta if ta is tb else _promote(ta, tb)


def _int_fits(v: int, t: DType) -> bool:
    lo = 0 if t.kind == "uint" else -(1 << (t.bits - 1))
    return lo <= v < lo + (1 << t.bits)


def _convertible(src: DType, dst: DType) -> bool:
    """May a src value be stored into dst without a cast (a widening)?"""
    if src is dst or src.kind == "bool" and dst.kind != "bool":
        return True
    if dst.kind == "bool" or src.is_float and not dst.is_float:
        return False
    if dst.is_float:
        return src.is_int or src.bits <= dst.bits
    if dst.kind == "int":
        return src.bits < dst.bits or src.kind == "int" and src.bits == dst.bits
    return src.kind == "uint" and src.bits <= dst.bits


# ----------------------------------------------------------------------------- builtins


def _device_only(name: str):
    def builtin(*args, **kwargs):
        raise RuntimeError(f"ll.{name}() can only be used inside an @ll.kernel function")

    builtin.__name__ = builtin.__qualname__ = name
    return builtin


_SREGS = {}
for _reg in ("threadIdx", "blockIdx", "blockDim", "gridDim"):
    for _axis in "xyz":
        globals()[f"{_reg}_{_axis}"] = _f = _device_only(f"{_reg}_{_axis}")
        _SREGS[_f] = f"{_reg}.{_axis}"
del _reg, _axis, _f
syncthreads = _device_only("syncthreads")
shared_array = _device_only("shared_array")
exp, log, sqrt, rsqrt = (_device_only(n) for n in ("exp", "log", "sqrt", "rsqrt"))
tanh, sin, cos = (_device_only(n) for n in ("tanh", "sin", "cos"))
abs, max, min = (_device_only(n) for n in ("abs", "max", "min"))  # noqa: A001 (Python's: builtins.*)
_MATH1 = {f: (f.__name__ + "f", f.__name__) for f in (exp, log, sqrt, rsqrt, tanh, sin, cos)}  # float, double
# Python's own abs/min/max/float/int/bool mean the same inside a kernel.
_ALIASES = {builtins.abs: abs, builtins.max: max, builtins.min: min, builtins.float: float32,
            builtins.int: int32, builtins.bool: bool_}  # fmt: skip

_HELPERS = {
    "ll_floordiv": "template <typename T> __device__ __forceinline__ T ll_floordiv(T a, T b) {\n"
                   "  T q = a / b;\n  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;\n}",
    "ll_mod": "template <typename T> __device__ __forceinline__ T ll_mod(T a, T b) {\n"
              "  T r = a % b;\n  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;\n}",
    "ll_fmod": "__device__ __forceinline__ float ll_fmod(float a, float b) {\n"
               "  float r = fmodf(a, b);\n  return (r != 0.0f && ((r < 0.0f) != (b < 0.0f))) ? r + b : r;\n}\n"
               "__device__ __forceinline__ double ll_fmod(double a, double b) {\n"
               "  double r = fmod(a, b);\n  return (r != 0.0 && ((r < 0.0) != (b < 0.0))) ? r + b : r;\n}",
    "ll_powi": "template <typename T> __device__ __forceinline__ T ll_powi(T x, int n) {\n"
               "  T r = 1;\n  for (int k = 0; k < n; ++k) r *= x;\n  return r;\n}",
}  # fmt: skip

_UNSUPPORTED = {
    "ListComp": "list comprehension", "SetComp": "set comprehension", "DictComp": "dict comprehension",
    "GeneratorExp": "generator expression", "Lambda": "lambda", "List": "list", "Tuple": "tuple", "Dict": "dict",
    "Set": "set", "JoinedStr": "f-string", "Starred": "starred expression", "NamedExpr": "assignment expression",
    "Await": "await", "Yield": "yield", "YieldFrom": "yield from", "Slice": "slice", "With": "with statement",
    "Try": "try statement", "FunctionDef": "nested function", "ClassDef": "class definition", "Raise": "raise",
    "Global": "global statement", "Nonlocal": "nonlocal statement", "Delete": "del statement", "Assert": "assert",
    "Import": "import", "ImportFrom": "import", "Match": "match statement", "AsyncFor": "async for",
    "AsyncWith": "async with", "AsyncFunctionDef": "async function", "MatMult": "operator '@'",
    "Is": "operator 'is'", "IsNot": "operator 'is not'", "In": "operator 'in'", "NotIn": "operator 'not in'",
}  # fmt: skip

_C_RESERVED = set("""auto case char const default delete do double enum extern float goto inline int long
register restrict short signed sizeof static struct switch typedef union unsigned void volatile asm catch
class constexpr decltype explicit export friend mutable namespace new noexcept nullptr operator private
protected public template this throw true false typeid typename using virtual bool half and or not xor
bitand bitor compl threadIdx blockIdx blockDim gridDim warpSize abs llabs max min fmaxf fminf fmax fmin
fabsf fabs floorf floor fmodf fmod powf pow expf exp logf log sqrtf sqrt rsqrtf rsqrt tanhf tanh sinf
sin cosf cos main""".split())  # fmt: skip


_POW_SHIFT = (ast.Pow, ast.LShift, ast.RShift)  # folded for exponents / shift counts 0..64 only
_FOLD = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
         ast.Mod: operator.mod, ast.Pow: operator.pow, ast.LShift: operator.lshift, ast.RShift: operator.rshift,
         ast.BitAnd: operator.and_, ast.BitOr: operator.or_, ast.BitXor: operator.xor}  # fmt: skip


def _arity(fn) -> int | None:
    """Argument count of a kernel builtin (-1: two or more), None if fn is none."""
    try:
        if fn in _SREGS or fn is syncthreads:
            return 0
        return 1 if isinstance(fn, DType) or fn in _MATH1 or fn is abs else -1 if fn in (max, min) else None
    except TypeError:  # unhashable
        return None


# ----------------------------------------------------------------------------- IR


@dataclass
class Param:
    name: str
    type: DType | TensorType
    written: bool = False  # a tensor the kernel stores into (else emitted const)


@dataclass
class KernelIR:
    """One kernel being translated: its AST (passes annotate the nodes with ll_* attributes), its
    parameters, locals and shared arrays, and where its source lies."""

    name: str
    tree: ast.FunctionDef
    filename: str
    first_line: int  # file line of the tree's line 1
    env: dict  # names the function sees: builtins, its globals, its closure
    cnames: dict = field(default_factory=dict)  # Python name -> C identifier
    params: list = field(default_factory=list)
    locals: dict = field(default_factory=dict)  # name -> DType, in order of declaration
    shared: dict = field(default_factory=dict)  # name -> SharedArray
    typed: bool = False

    def error(self, node, message: str, cls=KernelTypeError) -> KernelError:
        line = self.first_line + getattr(node, "lineno", 1) - 1
        return cls(f"{self.filename}:{line}: {message}")

    def unsupported(self, node, what: str | None = None) -> KernelError:
        what = what or _UNSUPPORTED.get(type(node).__name__, type(node).__name__)
        return self.error(node, f"unsupported syntax: {what}", KernelSyntaxError)

    def resolve(self, node, scope=()):
        """The Python object a Name/Attribute chain outside the kernel's scope names."""
        if isinstance(node, ast.Attribute):
            base = self.resolve(node.value, scope)
            if not hasattr(base, node.attr):
                raise self.error(node, f"unknown name '{ast.unparse(node)}'")
            return getattr(base, node.attr)
        if not isinstance(node, ast.Name):
            raise self.unsupported(node)
        if node.id in scope:
            raise self.unsupported(node, f"attribute or call of the kernel value '{node.id}'")
        if node.id not in self.env:
            raise self.error(node, f"unknown name '{node.id}'")
        return self.env[node.id]


def _annotation(ir: KernelIR, node):
    """DType, TensorType, void, or None for anything else."""
    try:
        if isinstance(node, ast.Subscript):
            if ir.resolve(node.value) is not Tensor:
                return None
            dtype = ir.resolve(node.slice)
            return TensorType(dtype) if isinstance(dtype, DType) else None
        obj = ir.resolve(node)
    except KernelError:
        return None
    return obj if isinstance(obj, (DType, TensorType, _Void)) else None


# ----------------------------------------------------------------------------- passes


_USE = "use ll.Tensor[dtype] or a dtype such as ll.int32"


def check_signature(ir: KernelIR) -> KernelIR:
    """Pass: read the parameters' annotations into ir.params; the return annotation is ll.void."""
    f, args = ir.tree, ir.tree.args
    if args.posonlyargs or args.vararg or args.kwonlyargs or args.kwarg or args.defaults:
        raise ir.error(f, "kernel parameters must be plain positional parameters (no defaults, /, *, **)")
    if f.returns is None or _annotation(ir, f.returns) is not void:
        got = "none" if f.returns is None else f"'{ast.unparse(f.returns)}'"
        raise ir.error(f.returns or f, f"a kernel's return annotation must be '-> ll.void', got {got}")
    ir.params = []
    for arg in args.args:
        if arg.annotation is None:
            raise ir.error(arg, f"parameter '{arg.arg}' has no annotation: {_USE}")
        t = _annotation(ir, arg.annotation)
        if not isinstance(t, (DType, TensorType)):
            raise ir.error(arg, f"parameter '{arg.arg}' has an unknown annotation '{ast.unparse(arg.annotation)}': {_USE}")
        if isinstance(t, DType) and t.value is not t:
            raise ir.error(arg, f"scalar parameter '{arg.arg}' cannot be {t}: pass a float32")
        ir.params.append(Param(arg.arg, t))
    return ir


class _Typer:
    """Types every expression (node.ll_type; constants also get node.ll_const) and checks statements."""

    def __init__(self, ir: KernelIR):
        self.ir = ir
        self.scope = {p.name: p.type for p in ir.params}  # name -> DType | TensorType | SharedArray
        self.assigned = {n.id for n in ast.walk(ir.tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}

    def block(self, stmts):
        for stmt in stmts:
            handler = getattr(self, "s_" + type(stmt).__name__, None)
            if handler is None:
                raise self.ir.unsupported(stmt)
            handler(stmt)

    # statements
    def s_Assign(self, node):
        if len(node.targets) != 1:
            raise self.ir.unsupported(node, "chained assignment (a = b = ...)")
        target = node.targets[0]
        if isinstance(target, ast.Name) and self.callee(node.value, quiet=True) is shared_array:
            return self.declare_shared(target, node.value)
        self.store(target, node.value)

    def s_AnnAssign(self, node):
        t = _annotation(self.ir, node.annotation)
        if not isinstance(node.target, ast.Name) or node.value is None:
            raise self.ir.unsupported(node, "annotated assignment other than 'x: ll.float32 = value'")
        if not isinstance(t, DType) or t.value is not t:
            what = ast.unparse(node.annotation)
            raise self.ir.error(node, f"a local's annotation must be a dtype such as ll.float32, not '{what}'")
        name = node.target.id
        if name in self.scope and self.scope[name] is not t:
            raise self.ir.error(node, f"'{name}' is already {self.scope[name]}; it cannot be redeclared {t}")
        self.value(node.value)
        self.check_assign(node.value, t, "assigning", f"to {name} ({t})")
        if name not in self.scope:
            self.scope[name] = self.ir.locals[name] = t
        node.target.ll_type = t

    def s_AugAssign(self, node):
        load = copy.deepcopy(node.target)
        for n in ast.walk(load):
            if hasattr(n, "ctx"):
                n.ctx = ast.Load()
        node.ll_value = ast.copy_location(ast.BinOp(left=load, op=node.op, right=node.value), node)
        self.store(node.target, node.ll_value)

    def s_If(self, node):
        self.value(node.test)
        self.block(node.body)
        self.block(node.orelse)

    def s_While(self, node):
        if node.orelse:
            raise self.ir.unsupported(node, "while ... else")
        self.value(node.test)
        self.block(node.body)

    def s_For(self, node):
        ir, it = self.ir, node.iter
        if node.orelse:
            raise ir.unsupported(node, "for ... else")
        if not isinstance(node.target, ast.Name):
            raise ir.unsupported(node.target, "for loop target other than a name")
        if not isinstance(it, ast.Call) or self.callee(it, quiet=True) is not builtins.range:
            raise ir.unsupported(it, "for loops iterate over range(...) only")
        if it.keywords or not 1 <= len(it.args) <= 3:
            raise ir.error(it, f"range() takes 1 to 3 positional arguments, got {len(it.args) + len(it.keywords)}")
        for arg in it.args:
            if not self.value(arg).is_int:
                raise ir.error(arg, f"range() arguments must be integers, got {arg.ll_type}")
        step = it.args[2] if len(it.args) == 3 else None
        node.ll_step = 1 if step is None else getattr(step, "ll_const", None)
        if not isinstance(node.ll_step, int) or isinstance(node.ll_step, bool):
            raise ir.error(step, "range() step must be an integer constant")
        if node.ll_step == 0:
            raise ir.error(step, "range() step must not be zero")
        t = _widen(self.common(*it.args[:2]) if len(it.args) > 1 else it.args[0].ll_type)
        name, current = node.target.id, self.scope.get(node.target.id)
        if current is None:
            self.scope[name] = self.ir.locals[name] = current = t
        elif not isinstance(current, DType) or not current.is_int or not _convertible(t, current):
            raise ir.error(node.target, f"loop variable '{name}' is {current}, which cannot hold a {t} range")
        node.ll_type = current
        self.block(node.body)

    def s_Return(self, node):
        if node.value is not None:
            raise self.ir.error(node, "a kernel returns nothing: use a bare 'return'")

    def s_Expr(self, node):
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            node.ll_skip = True  # a docstring
        elif isinstance(node.value, ast.Call):
            self.expr(node.value)
        else:
            raise self.ir.unsupported(node, "expression statement other than a call")

    def s_Pass(self, node):
        pass

    s_Break = s_Continue = s_Pass

    # assignments
    def declare_shared(self, target, call):
        ir, name = self.ir, target.id
        if call.keywords or len(call.args) != 2:
            got = len(call.args) + len(call.keywords)
            raise ir.error(call, f"ll.shared_array() takes 2 positional arguments (dtype, size), got {got}")
        dtype = _annotation(ir, call.args[0])
        if not isinstance(dtype, DType):
            what = ast.unparse(call.args[0])
            raise ir.error(call, f"ll.shared_array()'s first argument must be a dtype such as ll.float32, not '{what}'")
        self.value(call.args[1])
        size = getattr(call.args[1], "ll_const", None)
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise ir.error(call, "ll.shared_array()'s size must be a positive integer constant")
        if name in self.scope:
            raise ir.error(target, f"'{name}' is already defined; a shared array needs a name of its own")
        self.scope[name] = self.ir.shared[name] = SharedArray(name, dtype, size)
        target.ll_shared = True

    def store(self, target, value):
        ir = self.ir
        if isinstance(target, ast.Subscript):
            dtype = self.subscript(target, store=True)
            what = f"into {target.value.id} ({self.scope[target.value.id]})"
            self.value(value)
            return self.check_assign(value, dtype.value, "storing", what)
        if not isinstance(target, ast.Name):
            raise ir.unsupported(target, f"assignment to a {type(target).__name__.lower()}")
        name, current = target.id, self.scope.get(target.id)
        if isinstance(current, TensorType):
            raise ir.error(target, f"cannot assign to tensor parameter '{name}': store into its elements instead")
        if isinstance(current, SharedArray):
            raise ir.error(target, f"cannot assign to shared array '{name}': store into its elements instead")
        t = self.value(value)
        if current is None:
            self.scope[name] = self.ir.locals[name] = current = _widen(t) if t.is_int else t
        else:
            self.check_assign(value, current, "assigning", f"to {name} ({current})")
        target.ll_type = current

    def check_assign(self, value, dst: DType, verb: str, what: str):
        src, c = value.ll_type, getattr(value, "ll_const", None)
        if type(c) is int and dst.is_int:
            if not _int_fits(c, dst):
                raise self.ir.error(value, f"{verb} the constant {c} {what}: it does not fit in {dst}")
            return
        if type(c) in (int, float) and dst.is_float:  # a constant takes the type it is stored as
            return
        if not _convertible(src, dst):
            raise self.ir.error(value, f"{verb} a {src} value {what} needs an explicit cast, e.g. {dst!r}(...)")

    # expressions
    def value(self, node) -> DType:
        t = self.expr(node)
        if t is void:
            raise self.ir.error(node, f"{ast.unparse(node)} returns nothing; it cannot be used as a value")
        return t

    def expr(self, node):
        handler = getattr(self, "e_" + type(node).__name__, None)
        if handler is None:
            raise self.ir.unsupported(node)
        node.ll_type = handler(node)
        return node.ll_type

    def constant(self, node, v):
        if isinstance(v, bool):
            node.ll_const = v
            return bool_
        if isinstance(v, int):
            if not _int_fits(v, int64):
                raise self.ir.error(node, f"integer constant {v} does not fit in int64")
            node.ll_const = v
            return int32 if _int_fits(v, int32) else int64
        if isinstance(v, float):
            node.ll_const = v
            return float32
        what = repr(v) if isinstance(v, (str, bytes, complex, type(None))) else f"'{ast.unparse(node)}'"
        raise self.ir.error(node, f"unsupported constant {what}: kernels compute with numbers only")

    def e_Constant(self, node):
        return self.constant(node, node.value)

    def e_Name(self, node):
        name, t = node.id, self.scope.get(node.id)
        if t is None:
            if name in self.assigned:
                raise self.ir.error(node, f"'{name}' is used before it is assigned")
            return self.constant(node, self.ir.resolve(node))
        if not isinstance(t, DType):
            raise self.ir.error(node, f"'{name}' ({t}) cannot be used as a value: index it, e.g. {name}[i]")
        return t

    def e_Attribute(self, node):
        return self.constant(node, self.ir.resolve(node, self.scope))

    def common(self, a, b) -> DType:
        return _common(a.ll_type, _weak(a), b.ll_type, _weak(b))

    def e_BinOp(self, node):
        ir, op = self.ir, type(node.op)
        lt, rt = self.value(node.left), self.value(node.right)
        lc, rc = getattr(node.left, "ll_const", None), getattr(node.right, "ll_const", None)
        if type(lc) is int and type(rc) is int and op in _FOLD:  # integer constant folding
            if (rc != 0) if op in (ast.FloorDiv, ast.Mod) else (0 <= rc <= 64 or op not in _POW_SHIFT):
                return self.constant(node, _FOLD[op](lc, rc))
        t = self.common(node.left, node.right)
        if op in (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod):
            return _widen(t)
        if op is ast.Div:
            return t if t.is_float else float32
        if op is ast.Pow:
            node.ll_powi = rc if type(rc) is int and 0 <= rc <= 64 else None
            if node.ll_powi is not None:
                return _widen(lt)
            if not t.is_float:
                raise ir.error(node, "'**' on integers needs a constant exponent between 0 and 64")
            return t
        if op in (ast.LShift, ast.RShift, ast.BitAnd, ast.BitOr, ast.BitXor):
            if lt.is_float or rt.is_float:
                raise ir.error(node, f"operator '{_OPS[op][0]}' needs integers, got {lt} and {rt}")
            return t if t is bool_ and op not in (ast.LShift, ast.RShift) else _widen(t)
        raise ir.unsupported(node, _UNSUPPORTED.get(type(node.op).__name__))

    def e_UnaryOp(self, node):
        t, c, op = self.value(node.operand), getattr(node.operand, "ll_const", None), type(node.op)
        if op is ast.Not:
            return bool_
        if op is ast.Invert and t.is_float:
            raise self.ir.error(node, f"operator '~' needs an integer, got {t}")
        if c is not None:
            return self.constant(node, -c if op is ast.USub else +c if op is ast.UAdd else ~c)
        return _widen(t)

    def e_BoolOp(self, node):
        for v in node.values:
            self.value(v)
        return bool_

    def e_Compare(self, node):
        operands = [node.left, *node.comparators]
        for v in operands:
            self.value(v)
        for op in node.ops:
            if type(op) not in _OPS:
                raise self.ir.unsupported(node, _UNSUPPORTED.get(type(op).__name__))
        node.ll_cmp = [self.common(a, b) for a, b in zip(operands, operands[1:])]
        return bool_

    def e_IfExp(self, node):
        self.value(node.test)
        self.value(node.body)
        self.value(node.orelse)
        return self.common(node.body, node.orelse)

    def e_Subscript(self, node):
        return self.subscript(node).value

    def subscript(self, node, store=False) -> DType:
        ir, base, index = self.ir, node.value, node.slice
        if not isinstance(base, ast.Name):
            raise ir.error(node, f"only tensor parameters and shared arrays can be indexed, not '{ast.unparse(base)}'")
        t = self.scope.get(base.id)
        if isinstance(t, DType):
            if store and base.id in (p.name for p in ir.params):
                raise ir.error(node, f"storing into scalar parameter '{base.id}' ({t}): only tensors and shared arrays "
                                     "can be indexed")  # fmt: skip
            raise ir.error(node, f"indexing a scalar: '{base.id}' is {t}, not a tensor")
        if t is None:
            if base.id not in self.assigned:
                ir.resolve(base)  # unknown name?
            raise ir.error(node, f"only tensor parameters and shared arrays can be indexed, not '{base.id}'")
        if isinstance(index, ast.Tuple):
            raise ir.error(node, "multi-dimensional indexing is not supported: tensors are flat, use one index")
        if isinstance(index, ast.Slice):
            raise ir.unsupported(index)
        if not self.value(index).is_int:
            raise ir.error(index, f"an index must be an integer, got {index.ll_type}")
        node.ll_storage = t.dtype
        return t.dtype

    def callee(self, node, quiet=False):
        """The Python object a call's function names (after aliases); quiet: None if unresolvable."""
        try:
            fn = self.ir.resolve(node.func, self.scope) if isinstance(node, ast.Call) else None
        except KernelError:
            if quiet:
                return None
            raise
        return _ALIASES.get(fn, fn) if isinstance(fn, (type, types.BuiltinFunctionType)) else fn

    def e_Call(self, node):
        ir, fn = self.ir, self.callee(node)
        name = f"ll.{fn}" if isinstance(fn, DType) else f"ll.{getattr(fn, '__name__', fn)}"
        if fn is shared_array:
            raise ir.error(node, "ll.shared_array(...) must be assigned directly to a name: s = ll.shared_array(dtype, n)")
        if fn is builtins.range:
            raise ir.error(node, "range() is only supported as the iterable of a for loop")
        arity = _arity(fn)
        if arity is None:
            raise ir.error(node, f"unsupported call: '{ast.unparse(node.func)}' is not a kernel builtin")
        if node.keywords:
            raise ir.error(node, f"{name}() takes no keyword arguments")
        if arity >= 0 and len(node.args) != arity:
            raise ir.error(node, f"{name}() takes {arity} argument{'s' * (arity != 1)}, got {len(node.args)}")
        if arity < 0 and len(node.args) < 2:
            raise ir.error(node, f"{name}() takes at least 2 arguments, got {len(node.args)}")
        args = [self.value(a) for a in node.args]
        node.ll_builtin = fn
        if fn in _SREGS:
            return int32
        if fn is syncthreads:
            return void
        if isinstance(fn, DType):
            return fn.value
        if fn in _MATH1:
            return float64 if args[0] is float64 else float32
        if fn is abs:
            return _widen(args[0])
        t, weak = args[0], _weak(node.args[0])  # max / min
        for a in node.args[1:]:
            t, weak = _common(t, weak, a.ll_type, _weak(a)), weak and _weak(a)
        return _widen(t)


def infer_types(ir: KernelIR) -> KernelIR:
    """Pass: type every expression and check every statement (after check_signature)."""
    _Typer(ir).block(ir.tree.body)
    ir.typed = True
    return ir


def find_written_tensors(ir: KernelIR) -> KernelIR:
    """Pass: mark the tensor parameters the kernel stores into (the others are emitted const)."""
    written = set()
    for node in ast.walk(ir.tree):
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        for target in targets if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) else ():
            if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
                written.add(target.value.id)
    for p in ir.params:
        p.written = isinstance(p.type, TensorType) and p.name in written
    return ir


PASSES = {"cuda": [check_signature, infer_types, find_written_tensors]}


# ----------------------------------------------------------------------------- CUDA C


# C precedence levels (higher binds tighter)
_PRIMARY, _UNARY, _MUL, _ADD, _SHIFT, _REL, _EQ, _BAND, _BXOR, _BOR, _LAND, _LOR, _COND = range(16, 3, -1)
_OPS = {ast.Add: ("+", _ADD), ast.Sub: ("-", _ADD), ast.Mult: ("*", _MUL), ast.Div: ("/", _MUL),
        ast.Mod: ("%", _MUL), ast.FloorDiv: ("//", _MUL), ast.Pow: ("**", _MUL), ast.LShift: ("<<", _SHIFT),
        ast.RShift: (">>", _SHIFT), ast.BitAnd: ("&", _BAND), ast.BitXor: ("^", _BXOR), ast.BitOr: ("|", _BOR),
        ast.Lt: ("<", _REL), ast.LtE: ("<=", _REL), ast.Gt: (">", _REL), ast.GtE: (">=", _REL),
        ast.Eq: ("==", _EQ), ast.NotEq: ("!=", _EQ)}  # fmt: skip
_CONFUSING = {_SHIFT, _BAND, _BXOR, _BOR, _LAND, _LOR}  # mixed with other operators: always parenthesized


def _paren(text: str, prec: int, need: int, parent: int | None = None) -> str:
    confusing = parent in _CONFUSING and prec != parent and prec < _UNARY
    return f"({text})" if prec < need or confusing else text


class _Emitter:
    def __init__(self, ir: KernelIR):
        self.ir, self.lines, self.helpers, self.headers, self.loops = ir, [], {}, set(), 0

    def ctype(self, t: DType) -> str:
        if t is float16:
            self.headers.add("cuda_fp16.h")
        elif t is bfloat16:
            self.headers.add("cuda_bf16.h")
        return t.ctype

    def helper(self, name: str) -> str:
        self.helpers[name] = _HELPERS[name]
        return name

    def line(self, depth: int, text: str):
        self.lines.append("  " * depth + text)

    # statements
    def block(self, stmts, depth):
        for stmt in stmts:
            getattr(self, "s_" + type(stmt).__name__)(stmt, depth)

    def assign(self, target, value, depth):
        if isinstance(target, ast.Name):
            return self.line(depth, f"{self.ir.cnames[target.id]} = {self.as_type(value, target.ll_type)[0]};")
        dtype = target.ll_storage
        text = self.as_type(value, dtype.value)[0]
        if dtype.value is not dtype:
            self.ctype(dtype)
            text = f"__float2{'half' if dtype is float16 else 'bfloat16'}({text})"
        self.line(depth, f"{self.subscript(target)} = {text};")

    def s_Assign(self, node, depth):
        if not getattr(node.targets[0], "ll_shared", False):
            self.assign(node.targets[0], node.value, depth)

    def s_AnnAssign(self, node, depth):
        self.assign(node.target, node.value, depth)

    def s_AugAssign(self, node, depth):
        self.assign(node.target, node.ll_value, depth)

    def s_If(self, node, depth):
        head = "if"
        while True:
            self.line(depth, f"{head} ({self.expr(node.test)[0]}) {{")
            self.block(node.body, depth + 1)
            if len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If):
                node, head = node.orelse[0], "} else if"
                continue
            if node.orelse:
                self.line(depth, "} else {")
                self.block(node.orelse, depth + 1)
            return self.line(depth, "}")

    def s_While(self, node, depth):
        self.line(depth, f"while ({self.expr(node.test)[0]}) {{")
        self.block(node.body, depth + 1)
        self.line(depth, "}")

    def s_For(self, node, depth):
        t, args, step, k = node.ll_type, node.iter.args, node.ll_step, self.loops
        self.loops += 1
        start = self.as_type(args[0], t)[0] if len(args) > 1 else self.literal(0, t)[0]
        stop_node = args[1] if len(args) > 1 else args[0]
        i, stop = f"ll_i{k}", self.as_type(stop_node, t)[0]
        init = f"{t.ctype} {i} = {start}"
        if getattr(stop_node, "ll_const", None) is None:  # evaluated once, as Python does
            init, stop = f"{init}, ll_stop{k} = {stop}", f"ll_stop{k}"
        inc = {1: f"++{i}", -1: f"--{i}"}.get(step, f"{i} {'+' if step > 0 else '-'}= {builtins.abs(step)}")
        self.line(depth, f"for ({init}; {i} {'<' if step > 0 else '>'} {stop}; {inc}) {{")
        self.line(depth + 1, f"{self.ir.cnames[node.target.id]} = {i};")
        self.block(node.body, depth + 1)
        self.line(depth, "}")

    def s_Expr(self, node, depth):
        if not getattr(node, "ll_skip", False):
            self.line(depth, self.expr(node.value)[0] + ";")

    def s_Pass(self, node, depth):
        if not isinstance(node, ast.Pass):
            self.line(depth, f"{type(node).__name__.lower()};")  # break; continue; return;

    s_Break = s_Continue = s_Return = s_Pass

    # expressions: (text, C precedence)
    def literal(self, v, t: DType):
        if t is bool_:
            return ("true" if v else "false"), _PRIMARY
        if t.is_float:
            v = float(v)
            if math.isnan(v) or math.isinf(v):  # no literal for these: the bit patterns
                bits = ("7fffffff" if t is float32 else "7ff8000000000000") if math.isnan(v) else \
                    ("7f800000" if t is float32 else "7ff0000000000000")
                text = f"__int_as_float(0x{bits})" if t is float32 else f"__longlong_as_double(0x{bits}LL)"
                return (f"-{text}", _UNARY) if v < 0 else (text, _PRIMARY)
            text = repr(v) + ("f" if t is float32 else "")
        else:
            lo = 0 if t.kind == "uint" else -(1 << (t.bits - 1))
            v = (int(v) - lo) % (1 << t.bits) + lo  # C's conversion to a narrower int
            suffix = "LL" if t is int64 else "u" if t is uint32 else ""
            if t.kind == "int" and t.bits >= 32 and v == -(1 << (t.bits - 1)):
                return f"({v + 1}{suffix} - 1)", _PRIMARY
            text = f"{v}{suffix}"
        return text, _UNARY if text.startswith("-") else _PRIMARY

    def as_type(self, node, t: DType):
        c = getattr(node, "ll_const", None)
        if c is not None:
            return self.literal(c, t)
        text, prec = self.expr(node)
        if node.ll_type is t:
            return text, prec
        return f"({self.ctype(t)}){_paren(text, prec, _UNARY)}", _UNARY

    def expr(self, node):
        c = getattr(node, "ll_const", None)
        if c is not None:
            return self.literal(c, node.ll_type)
        return getattr(self, "e_" + type(node).__name__)(node)

    def e_Name(self, node):
        return self.ir.cnames[node.id], _PRIMARY

    def binary(self, sym, prec, left, right):
        (lt, lp), (rt, rp) = left, right
        return f"{_paren(lt, lp, prec, prec)} {sym} {_paren(rt, rp, prec + 1, prec)}", prec

    def e_BinOp(self, node):
        t, op = node.ll_type, type(node.op)
        if op is ast.Pow and node.ll_powi is not None:
            return f"{self.helper('ll_powi')}<{t.ctype}>({self.as_type(node.left, t)[0]}, {node.ll_powi})", _PRIMARY
        left, right = self.as_type(node.left, t), self.as_type(node.right, t)
        sym, prec = _OPS[op]
        if op is ast.Pow:
            return f"{'powf' if t is float32 else 'pow'}({left[0]}, {right[0]})", _PRIMARY
        if op in (ast.FloorDiv, ast.Mod) and t.kind != "uint":
            if t.is_float and op is ast.FloorDiv:
                return f"{'floorf' if t is float32 else 'floor'}({self.binary('/', _MUL, left, right)[0]})", _PRIMARY
            name = self.helper("ll_fmod" if t.is_float else "ll_floordiv" if op is ast.FloorDiv else "ll_mod")
            return f"{name}{'' if t.is_float else f'<{t.ctype}>'}({left[0]}, {right[0]})", _PRIMARY
        return self.binary("/" if sym == "//" else sym, prec, left, right)

    def e_UnaryOp(self, node):
        op = type(node.op)
        if op is ast.Not:
            text, prec = self.expr(node.operand)
            return f"!{_paren(text, prec, _UNARY)}", _UNARY
        text, prec = self.as_type(node.operand, node.ll_type)
        if op is ast.UAdd:
            return text, prec
        text = _paren(text, prec, _UNARY)
        return f"{'-' if op is ast.USub else '~'}{'(' + text + ')' if text[0] in '-+~' else text}", _UNARY

    def e_BoolOp(self, node):
        sym, prec = ("&&", _LAND) if isinstance(node.op, ast.And) else ("||", _LOR)
        parts = [self.expr(v) for v in node.values]
        return f" {sym} ".join(_paren(t, p, prec, prec) for t, p in parts), prec  # associative

    def e_Compare(self, node):
        operands = [node.left, *node.comparators]
        parts = [self.binary(*_OPS[type(op)], self.as_type(a, t), self.as_type(b, t))
                 for op, a, b, t in zip(node.ops, operands, operands[1:], node.ll_cmp)]  # fmt: skip
        if len(parts) == 1:
            return parts[0]
        return " && ".join(_paren(t, p, _LAND + 1, _LAND) for t, p in parts), _LAND

    def e_IfExp(self, node):
        t = node.ll_type
        cond, a, b = self.expr(node.test), self.as_type(node.body, t), self.as_type(node.orelse, t)
        return f"{_paren(*cond, _COND + 1)} ? {_paren(*a, _COND + 1)} : {_paren(*b, _COND)}", _COND

    def subscript(self, node) -> str:
        return f"{self.ir.cnames[node.value.id]}[{self.expr(node.slice)[0]}]"

    def e_Subscript(self, node):
        text, dtype = self.subscript(node), node.ll_storage
        if dtype.value is not dtype:
            self.ctype(dtype)
            return f"{'__half2float' if dtype is float16 else '__bfloat162float'}({text})", _PRIMARY
        return text, _PRIMARY

    def e_Call(self, node):
        fn, t = node.ll_builtin, node.ll_type
        if fn in _SREGS:
            return f"(int){_SREGS[fn]}", _UNARY
        if fn is syncthreads:
            return "__syncthreads()", _PRIMARY
        arg = node.args[0]
        if isinstance(fn, DType):
            if fn.value is fn:
                return self.as_type(arg, t)
            text = self.as_type(arg, float32)[0]
            kind = "half" if fn is float16 else "bfloat16"
            self.ctype(fn)
            return f"__{kind}2float(__float2{kind}({text}))", _PRIMARY
        if fn in _MATH1:
            return f"{_MATH1[fn][t is float64]}({self.as_type(arg, t)[0]})", _PRIMARY
        if fn is abs:
            if t.kind == "uint":
                return self.as_type(arg, t)
            name = {float32: "fabsf", float64: "fabs", int64: "llabs"}.get(t, "abs")
            return f"{name}({self.as_type(arg, t)[0]})", _PRIMARY
        name = {float32: "f{}f", float64: "f{}"}.get(t, "{}").format(fn.__name__)  # max / min
        text = self.as_type(arg, t)[0]
        for a in node.args[1:]:
            text = f"{name}({text}, {self.as_type(a, t)[0]})"
        return text, _PRIMARY


def codegen_cuda(ir: KernelIR) -> str:
    """The CUDA C source of a kernel that the passes of PASSES["cuda"] have checked and typed."""
    if not ir.typed:
        raise ValueError("codegen_cuda needs a KernelIR that the passes of PASSES['cuda'] have typed")
    e = _Emitter(ir)
    e.block(ir.tree.body, 1)
    params = []
    for p in ir.params:
        if isinstance(p.type, TensorType):
            params.append(f"{'' if p.written else 'const '}{e.ctype(p.type.dtype)}* __restrict__ {ir.cnames[p.name]}")
        else:
            params.append(f"{e.ctype(p.type)} {ir.cnames[p.name]}")
    decls = [f"  __shared__ {e.ctype(s.dtype)} {ir.cnames[s.name]}[{s.size}];" for s in ir.shared.values()]
    decls += [f"  {t.ctype} {ir.cnames[name]};" for name, t in ir.locals.items()]
    out = [f"// Generated by mllm_kernel.runtime.language from {ir.name} ({ir.filename}:{ir.first_line})."]
    out += [f"#include <{h}>" for h in sorted(e.headers)]
    out += [""] + [f"{text}\n" for text in e.helpers.values()]
    out += [f'extern "C" __global__ void {ir.name}({", ".join(params)}) {{', *decls, *e.lines, "}", ""]
    return "\n".join(out)


# ----------------------------------------------------------------------------- kernels


class Kernel:
    """A function decorated with @ll.kernel. .source() translates it; .build() compiles it."""

    def __init__(self, fn, backend: str = "cuda", is_entry: bool = True):
        if backend != "cuda":
            raise ValueError(f"unsupported backend {backend!r}: only 'cuda'")
        if not is_entry:
            raise ValueError("only entry kernels (is_entry=True) are supported")
        if not inspect.isfunction(fn):
            raise TypeError(f"@ll.kernel decorates a function, not {type(fn).__name__}")
        self.fn, self.backend = fn, backend
        self.__name__, self.__qualname__, self.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
        self.__module__, self.__wrapped__ = fn.__module__, fn

    def parse(self) -> KernelIR:
        """A fresh, untyped KernelIR of the function's source."""
        fn = self.fn
        try:
            lines, first_line = inspect.getsourcelines(fn)
            filename = inspect.getsourcefile(fn) or inspect.getfile(fn)
        except (OSError, TypeError) as exc:
            raise KernelError(f"cannot read the source of kernel {fn.__name__}: {exc}") from None
        tree = ast.parse(textwrap.dedent("".join(lines)))
        if not tree.body or not isinstance(tree.body[0], ast.FunctionDef):
            raise KernelError(f"{filename}:{first_line}: a kernel must be a plain 'def' function")
        env = {**vars(builtins), **fn.__globals__}
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
            try:
                env[name] = cell.cell_contents
            except ValueError:  # an empty cell
                pass
        ir = KernelIR(fn.__name__, tree.body[0], filename, first_line, env)
        if not ir.name.isascii() or ir.name in _C_RESERVED or ir.name in _HELPERS or ir.name.startswith("__"):
            raise ir.error(ir.tree, f"kernel name '{ir.name}' cannot be a CUDA C function name", KernelSyntaxError)
        names = {a.arg: a for a in ir.tree.args.args} | {n.id: n for n in ast.walk(ir.tree) if isinstance(n, ast.Name)}
        for name, node in names.items():
            if not name.isascii():
                raise ir.error(node, f"'{name}' is not an ASCII identifier", KernelSyntaxError)
            cname = name  # C keywords, CUDA names and our ll_* names get a prefix
            while cname in _C_RESERVED or cname.startswith(("__", "ll_")) or cname in names and cname != name:
                cname = "v_" + cname
            ir.cnames[name] = cname
        return ir

    def translate(self, passes=None) -> KernelIR:
        """parse() then each pass in turn (default PASSES["cuda"]); a pass may return a new IR."""
        ir = self.parse()
        for p in PASSES[self.backend] if passes is None else passes:
            ir = p(ir) or ir
        return ir

    def source(self, passes=None, codegen=None) -> str:
        """The generated CUDA C (raises KernelError for a kernel that does not translate)."""
        return (codegen or codegen_cuda)(self.translate(passes))

    def build(self, passes=None, codegen=None, *, grid=(1, 1, 1), block=(1, 1, 1), shared_mem_bytes=0, arch=None,
              options=(), cache_dir=None, verbose=False, cluster=None):  # fmt: skip
        """Translate (passes, then codegen) and compile with mllm_kernel.runtime.compile_kernel."""
        source = self.source(passes, codegen)
        if verbose:
            print(source)
        from mllm_kernel.runtime import compile_kernel

        return compile_kernel(source, self.__name__, grid=grid, block=block, shared_mem_bytes=shared_mem_bytes,
                              arch=arch, options=options, cache_dir=cache_dir, verbose=verbose, cluster=cluster)  # fmt: skip

    def __call__(self, *args, **kwargs):
        name = self.__name__
        raise TypeError(f"{name} is a kernel: build it first, k = {name}.build(grid=..., block=...), then call k(...)")

    def __repr__(self):
        return f"<ll.kernel {self.__qualname__}>"


def kernel(fn=None, *, backend: str = "cuda", is_entry: bool = True):
    """Decorator: `@ll.kernel` or `@ll.kernel(backend="cuda", is_entry=True)`."""
    if fn is None:
        return lambda f: Kernel(f, backend, is_entry)
    return Kernel(fn, backend, is_entry)


ll_kernel = kernel
