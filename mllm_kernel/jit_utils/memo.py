"""`cache_once`: per-process memoization for module loaders."""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
_MISSING = object()


def _call_key(args: tuple, kwargs: dict) -> tuple:
    # Typed, so that 1, 1.0 and True (different C++ template arguments) stay apart.
    return tuple((type(a), a) for a in args) + tuple((k, type(v), v) for k, v in sorted(kwargs.items()))


def _hide_from_torch_compile(fn: F) -> F:
    """Make TorchDynamo run `fn` eagerly instead of tracing into locks and dict lookups.

    torch.compiler.disable imports TorchDynamo (about 1 s), so the wrapper is made on the first
    call after something else has imported it: until then nothing can be compiling. torch is
    imported only if installed (code that defines kernels imports it anyway).
    """
    try:
        import torch
    except ImportError:
        return fn
    hidden: list[Callable[..., Any]] = []

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if "torch._dynamo" not in sys.modules:
            return fn(*args, **kwargs)
        if not hidden:
            hidden.append(torch.compiler.disable(fn))
        return hidden[0](*args, **kwargs)

    return call  # type: ignore[return-value]


def cache_once(fn: F) -> F:
    """Like functools.cache, but the first call for given arguments runs exactly once even
    when several threads call at the same time (a module must be built and loaded once).
    Exceptions are not cached, so a failed build is retried on the next call."""
    results: dict[Any, Any] = {}
    key_locks: dict[Any, threading.Lock] = {}
    table_lock = threading.Lock()

    @functools.wraps(fn)
    def cached(*args: Any, **kwargs: Any) -> Any:
        key = _call_key(args, kwargs)
        result = results.get(key, _MISSING)
        if result is not _MISSING:
            return result
        with table_lock:
            key_lock = key_locks.setdefault(key, threading.Lock())
        with key_lock:  # double-checked: another thread may have finished meanwhile
            result = results.get(key, _MISSING)
            if result is _MISSING:
                result = fn(*args, **kwargs)
                results[key] = result
        return result

    def cache_clear() -> None:
        with table_lock:
            results.clear()
            key_locks.clear()

    wrapper = _hide_from_torch_compile(cached)
    wrapper.cache_clear = cache_clear  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]
