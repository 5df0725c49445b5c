"""The public way to declare modules: `@jit`, `load_cpu_jit`, `load_cuda_jit` (all three through
make_spec) and the registry that show-config lists.

Kernel sources should be absolute paths; a relative one resolves against
$MLLM_KERNEL_SOURCE_ROOT if set, else the current working directory.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .cpp_args import make_cpp_args
from .memo import cache_once
from .spec import JitSpec, Wrapper, resolve_source  # noqa: F401 (resolve_source: public since 0.1)

_registry: dict[str, JitSpec] = {}
_registry_lock = threading.Lock()


def register_spec(spec: JitSpec) -> JitSpec:
    with _registry_lock:
        _registry.setdefault(spec.display_name, spec)
    return spec


def registered_specs() -> list[JitSpec]:
    with _registry_lock:
        return list(_registry.values())


def _as_wrappers(wrappers: Iterable[Sequence[str]]) -> tuple[Wrapper, ...]:
    return tuple((str(export), str(symbol)) for export, symbol in wrappers)


def make_spec(
    name: str,
    device: str,
    template_args: Sequence[Any] = (),
    *,
    cpp_files: Sequence[str] = (),
    cuda_files: Sequence[str] = (),
    cpp_wrappers: Iterable[Sequence[str]] = (),
    cuda_wrappers: Iterable[Sequence[str]] = (),
    extra_cflags: Sequence[str] = (),
    extra_cuda_cflags: Sequence[str] = (),
    extra_ldflags: Sequence[str] = (),
    extra_include_paths: Sequence[str] = (),
) -> JitSpec:
    """The one constructor behind jit / load_cpu_jit / load_cuda_jit: normalizes what users pass
    (lists, Paths, Python values or rendered C++ arguments) into a JitSpec."""
    return JitSpec(
        name=name,
        device=device,
        cpp_args=str(make_cpp_args(*template_args)),
        cpp_files=tuple(map(str, cpp_files)),
        cuda_files=tuple(map(str, cuda_files)),
        cpp_wrappers=_as_wrappers(cpp_wrappers),
        cuda_wrappers=_as_wrappers(cuda_wrappers),
        extra_cflags=tuple(extra_cflags),
        extra_cuda_cflags=tuple(extra_cuda_cflags),
        extra_ldflags=tuple(extra_ldflags),
        extra_include_paths=tuple(map(str, extra_include_paths)),
    )


def load_cpu_jit(
    name: str,
    *args: Any,
    cpp_files: Sequence[str],
    cpp_wrappers: Iterable[Sequence[str]],
    extra_cflags: Sequence[str] = (),
    extra_ldflags: Sequence[str] = (),
    extra_include_paths: Sequence[str] = (),
) -> Any:
    """Build (once) and load a CPU module. `args` are its template arguments: Python values or
    already-rendered C++ arguments (`*make_cpp_args(...)`); they name the module."""
    spec = make_spec(
        name,
        "cpu",
        args,
        cpp_files=cpp_files,
        cpp_wrappers=cpp_wrappers,
        extra_cflags=extra_cflags,
        extra_ldflags=extra_ldflags,
        extra_include_paths=extra_include_paths,
    )
    return register_spec(spec).load()


def load_cuda_jit(
    name: str,
    *args: Any,
    cuda_files: Sequence[str] = (),
    cpp_files: Sequence[str] = (),
    cuda_wrappers: Iterable[Sequence[str]] = (),
    cpp_wrappers: Iterable[Sequence[str]] = (),
    extra_cflags: Sequence[str] = (),
    extra_cuda_cflags: Sequence[str] = (),
    extra_ldflags: Sequence[str] = (),
    extra_include_paths: Sequence[str] = (),
) -> Any:
    """load_cpu_jit for CUDA modules (plus host-side C++ files and wrappers)."""
    spec = make_spec(
        name,
        "cuda",
        args,
        cpp_files=cpp_files,
        cuda_files=cuda_files,
        cpp_wrappers=cpp_wrappers,
        cuda_wrappers=cuda_wrappers,
        extra_cflags=extra_cflags,
        extra_cuda_cflags=extra_cuda_cflags,
        extra_ldflags=extra_ldflags,
        extra_include_paths=extra_include_paths,
    )
    return register_spec(spec).load()


def jit(
    args: Any = (),
    device: str = "cpu",
    *,
    cpp_files: Sequence[str] = (),
    cuda_files: Sequence[str] = (),
    cpp_wrappers: Iterable[Sequence[str]] = (),
    cuda_wrappers: Iterable[Sequence[str]] = (),
    func_name: str | None = None,
    name: str | None = None,
    extra_cflags: Sequence[str] = (),
    extra_cuda_cflags: Sequence[str] = (),
    extra_ldflags: Sequence[str] = (),
    extra_include_paths: Sequence[str] = (),
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Declare a kernel: `fn(compiled_module, *call_args)` gets the module built for `args` (one
    value, or a list / tuple / make_cpp_args result of Python values or rendered C++ arguments).

    With `func_name="ns::kernel"` and no explicit wrappers, the module exports `kernel`
    bound to `ns::kernel<args...>` (or `ns::kernel` when there are no args). The module is
    built and loaded on the first call, once per process.
    """
    template_args = tuple(args) if isinstance(args, (list, tuple)) else (args,)
    cpp_args = make_cpp_args(*template_args)
    cpp_wrappers = _as_wrappers(cpp_wrappers)
    cuda_wrappers = _as_wrappers(cuda_wrappers)
    if func_name is not None and not cpp_wrappers and not cuda_wrappers:
        symbol = f"{func_name}<{cpp_args}>" if cpp_args else func_name
        generated = ((func_name.rsplit("::", 1)[-1], symbol),)
        if device == "cuda":
            cuda_wrappers = generated
        else:
            cpp_wrappers = generated
    module_name = name or (func_name.rsplit("::", 1)[-1] if func_name else None)

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        spec = make_spec(
            module_name or fn.__name__.strip("_"),
            device,
            cpp_args,
            cpp_files=cpp_files,
            cuda_files=cuda_files,
            cpp_wrappers=cpp_wrappers,
            cuda_wrappers=cuda_wrappers,
            extra_cflags=extra_cflags,
            extra_cuda_cflags=extra_cuda_cflags,
            extra_ldflags=extra_ldflags,
            extra_include_paths=extra_include_paths,
        )
        register_spec(spec)
        load_module = cache_once(spec.load)

        @functools.wraps(fn)
        def call(*call_args: Any, **call_kwargs: Any) -> Any:
            return fn(load_module(), *call_args, **call_kwargs)

        call.spec = spec  # type: ignore[attr-defined]
        call.load_module = load_module  # type: ignore[attr-defined]
        return call

    return decorate
