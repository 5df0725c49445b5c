"""Content-addressed cache keys.

A key must change whenever the built module could change, and must not depend on where
the files live (a prebuilt cache has to stay valid when the package moves). So we hash
file *contents* in a deterministic traversal order, never absolute paths.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from . import filememo

# Bumped whenever the layout of the cache or of generated wrappers changes meaning.
# 2: wrappers hashed with source basenames, CPU modules export the SIMD target functions,
#    include traversal follows paths as spelled (no realpath), modules carry an integrity record.
RUNTIME_FORMAT_VERSION = "2"


def _find_include(delimiter: str, name: str, including_dir: str, include_paths: Sequence[str]) -> str | None:
    # Same search order as the compiler: "x" looks next to the includer first. Paths stay as
    # spelled (like the compiler's): under Bazel the runfiles' symlinks are what a build sees.
    search = ([including_dir] if delimiter == '"' else []) + list(include_paths)
    for directory in search:
        candidate = f"{directory}/{name}"
        if os.path.isfile(candidate):
            return os.path.normpath(candidate)
    return None  # a system / CUDA toolkit header: covered by the compiler's identity


def hash_sources(hasher, sources: Sequence[Path], include_paths: Sequence[Path]) -> list[str]:
    """Feed every source and every header it reaches into `hasher`; return the files seen.

    Include resolution is textual (no preprocessor), so a header included under an #if is
    hashed even when not used; that only costs an occasional unnecessary rebuild. Digests and
    include lists come from filememo (keyed by each file's stat), so a warm process re-reads
    nothing; resolving the includes is still done every time (a new header may shadow one).
    """
    search = [os.path.abspath(p) for p in include_paths]
    resolved_in: dict[tuple[str, str, str], str | None] = {}  # this traversal's resolutions
    seen: set[tuple[int, int]] = set()  # (device, inode): one file reached through two paths
    order: list[str] = []
    stack = [os.path.abspath(s) for s in reversed(sources)]
    while stack:
        path = stack.pop()
        info = os.stat(path)
        identity = (info.st_dev, info.st_ino)
        if identity in seen:
            continue
        seen.add(identity)
        order.append(path)
        digest, includes = filememo.scan_source(path)
        hasher.update(f"file {digest}\n".encode())
        children = []
        including_dir = os.path.dirname(path)
        for delimiter, name in includes:
            # <x> does not depend on the includer's folder: share its resolution.
            memo_key = (delimiter, name, including_dir if delimiter == '"' else "")
            if memo_key not in resolved_in:
                resolved_in[memo_key] = _find_include(delimiter, name, including_dir, search)
            resolved = resolved_in[memo_key]
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
    filememo.flush()
    return hasher.hexdigest()


def sanitize_name(text: str, max_len: int = 96) -> str:
    """A directory-name-safe, human-readable version of `text`."""
    cleaned = re.sub(r"[^A-Za-z0-9_.+-]+", "_", text).strip("_.") or "module"
    if len(cleaned) > max_len:
        cleaned = cleaned[:max_len] + "_" + hashlib.sha256(text.encode()).hexdigest()[:8]
    return cleaned

