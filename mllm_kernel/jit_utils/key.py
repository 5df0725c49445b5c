"""Content-addressed cache keys.

A key must change whenever the built module could change, and must not depend on where
the files live (a prebuilt cache has to stay valid when the package moves). So we hash
file *contents* in a deterministic traversal order, never absolute paths.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

# Bumped whenever the layout of the cache or of generated wrappers changes meaning.
RUNTIME_FORMAT_VERSION = "1"

_INCLUDE_LINE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"\n]+)[>"]', re.MULTILINE)
# Highway's foreach_target.h re-includes the file named here once per SIMD target.
_HWY_TARGET_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*define[ \t]+HWY_TARGET_INCLUDE[ \t]+(")([^"\n]+)"', re.MULTILINE)


def _scan_file(path: Path) -> tuple[str, list[tuple[str, str]]]:
    """(sha256 of the content, [(delimiter, spelled name) of each include])."""
    data = path.read_bytes()
    matches = sorted([*_INCLUDE_LINE.finditer(data), *_HWY_TARGET_INCLUDE.finditer(data)], key=lambda m: m.start())
    includes = [(m.group(1).decode(), m.group(2).decode().strip()) for m in matches]
    return hashlib.sha256(data).hexdigest(), includes


def _resolve_include(
    delimiter: str, name: str, including_dir: Path, include_paths: Sequence[Path]
) -> Path | None:
    # Same search order as the compiler: "x" looks next to the includer first.
    search = ([including_dir] if delimiter == '"' else []) + list(include_paths)
    for directory in search:
        candidate = directory / name
        if candidate.is_file():
            return candidate.resolve()
    return None  # a system / CUDA toolkit header: covered by the compiler's identity


def hash_sources(hasher, sources: Sequence[Path], include_paths: Sequence[Path]) -> list[Path]:
    """Feed every source and every header it reaches into `hasher`; return the files seen.

    Include resolution is textual (no preprocessor), so a header included under an #if is
    hashed even when not used; that only costs an occasional unnecessary rebuild.
    """
    seen: set[Path] = set()
    order: list[Path] = []
    stack = [Path(s).resolve() for s in reversed(sources)]
    while stack:
        path = stack.pop()
        if path in seen:
            continue
        seen.add(path)
        order.append(path)
        digest, includes = _scan_file(path)
        hasher.update(f"file {digest}\n".encode())
        children = []
        for delimiter, name in includes:
            resolved = _resolve_include(delimiter, name, path.parent, include_paths)
            hasher.update(f"  include {delimiter}{name} -> {'found' if resolved else 'external'}\n".encode())
            if resolved is not None:
                children.append(resolved)
        stack.extend(reversed(children))
    return order


def compute_key(
    *,
    sources: Sequence[Path],
    include_paths: Sequence[Path],
    texts: Iterable[tuple[str, str]],
) -> str:
    """sha256 over the transitive source closure plus labelled text parts (flags, versions...)."""
    hasher = hashlib.sha256()
    hasher.update(f"mllm_kernel-jit-format {RUNTIME_FORMAT_VERSION}\n".encode())
    for label, text in texts:
        # Length-prefix each part so that concatenations cannot collide.
        encoded = text.encode()
        hasher.update(f"{label} {len(encoded)}\n".encode())
        hasher.update(encoded)
    hash_sources(hasher, sources, include_paths)
    return hasher.hexdigest()


def sanitize_name(text: str, max_len: int = 96) -> str:
    """A directory-name-safe, human-readable version of `text`."""
    cleaned = re.sub(r"[^A-Za-z0-9_.+-]+", "_", text).strip("_.") or "module"
    if len(cleaned) > max_len:
        cleaned = cleaned[:max_len] + "_" + hashlib.sha256(text.encode()).hexdigest()[:8]
    return cleaned

