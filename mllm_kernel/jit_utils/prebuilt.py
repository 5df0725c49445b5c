"""Prebuilt (ahead-of-time) modules: trees laid out like the JIT cache, plus a manifest.

Bazel builds them with the runtime's own JitSpec.build (python -m mllm_kernel.jit_utils.aot), so
they carry the same keys. A manifest entry is looked up by display name and *source key*, which
needs no compiler: a wheel's modules load on a machine without one, and a module whose sources,
headers, flags or tvm-ffi version changed since it was built is never loaded. Each entry records
the module's size and sha256; a module that does not match them (truncated, overwritten) is
skipped with one warning line, never loaded.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

from . import compile, config, integrity

MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = 1  # entries carry "size" and "sha256"; one without them is never loaded

_lock = threading.Lock()
_manifests: dict[tuple[str, float], list[dict[str, Any]]] = {}


def _read_manifest(path: Path) -> list[dict[str, Any]]:
    stamp = (str(path), path.stat().st_mtime)
    with _lock:
        if stamp in _manifests:
            return _manifests[stamp]
    data = json.loads(path.read_text())
    if data.get("format") != MANIFEST_FORMAT:
        raise RuntimeError(f"mllm_kernel: prebuilt manifest {path} has format {data.get('format')!r}, "
                           f"this runtime reads format {MANIFEST_FORMAT}")
    entries = [dict(entry, path=str(path.parent / entry["path"])) for entry in data["modules"]]
    with _lock:
        _manifests[stamp] = entries
    return entries


def entries() -> list[dict[str, Any]]:
    """Every prebuilt module this process can see, first manifests first."""
    found: list[dict[str, Any]] = []
    for manifest in config.prebuilt_manifests():
        found += _read_manifest(manifest)
    return found


def _visible_capabilities() -> list[tuple[int, int]] | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})


def find_prebuilt(display_name: str, device: str, source_key: str, damaged: list[str] | None = None) -> Path | None:
    """The verified prebuilt module for this spec, or None. CUDA modules must run on every
    visible GPU. A damaged candidate is skipped with a warning (and described in `damaged`)."""
    for entry in entries():
        if entry["display_name"] != display_name or entry["source_key"] != source_key:
            continue
        if device == "cuda":
            capabilities = _visible_capabilities()
            if capabilities and not all(compile.runs_on(entry["archs"], cc) for cc in capabilities):
                continue
        path = Path(entry["path"])
        if not path.is_file():
            continue
        problem = integrity.problem(path, entry)
        if problem is None:
            return path
        why = f"prebuilt module {display_name} at {path} is damaged: {problem}"
        _warn_once(f"mllm_kernel: warning: {why}; not loading it")
        if damaged is not None:
            damaged.append(why)
    return None


_warned: set[str] = set()


def _warn_once(line: str) -> None:
    with _lock:
        if line in _warned:
            return
        _warned.add(line)
    print(line, file=sys.stderr, flush=True)


def manifest_entry(spec: Any, location: Any) -> dict[str, Any]:
    """The manifest line of a module built into a prebuilt tree at location.root."""
    return {
        "display_name": spec.display_name,
        "device": spec.device,
        "name": spec.name,
        "args": spec.cpp_args,
        "source_key": location.source_key,
        "key": location.key,
        "archs": [name for arch in location.archs for name in arch.names()],
        "path": os.path.relpath(location.module_path, location.root),
        **integrity.measure(location.module_path),
    }


def write_manifest(root: Path, module_entries: list[dict[str, Any]]) -> Path:
    path = root / MANIFEST_FILE
    path.write_text(json.dumps({"format": MANIFEST_FORMAT, "modules": module_entries}, indent=1, sort_keys=True))
    return path
