"""Integrity records of built modules: size and sha256, taken when a module is published and
checked before it is loaded. dlopen maps the file, so a truncated module.so would kill the
process with SIGBUS at first touch: a module is never loaded unless its content matches.

JIT cache: integrity.json beside module.so, written in the private build directory before the
atomic rename. Prebuilt trees: "size" and "sha256" in each manifest entry (prebuilt.py).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from . import filememo

RECORD_FILE = "integrity.json"


def measure(path: Path) -> dict[str, Any]:
    """{"size", "sha256"} of a file as it is now (read in chunks; no memo: it was just written)."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
            size += len(chunk)
    return {"size": size, "sha256": digest.hexdigest()}


def write_record(module_path: Path) -> dict[str, Any]:
    record = dict(measure(module_path), file=module_path.name)
    (module_path.parent / RECORD_FILE).write_text(json.dumps(record, indent=1) + "\n")
    return record


def read_record(module_path: Path) -> dict[str, Any] | None:
    try:
        record = json.loads((module_path.parent / RECORD_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("size"), int) or not isinstance(record.get("sha256"), str):
        return None
    return record


def problem(path: Path, expected: dict[str, Any] | None) -> str | None:
    """None when `path` has the recorded size and sha256, else what is wrong with it.

    The digest is memoized by the file's stat (filememo), so a warm load hashes nothing, and a
    file that changed in any way is hashed again."""
    if expected is None or not isinstance(expected.get("size"), int) or not isinstance(expected.get("sha256"), str):
        return "it has no integrity record (size, sha256)"
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        return "it is missing"
    if size != expected["size"]:
        return f"its size is {size} bytes, {expected['size']} were recorded"
    try:
        digest = filememo.file_sha256(str(path))
    finally:
        filememo.flush()
    if digest != expected["sha256"]:
        return "its content does not match the recorded sha256"
    return None
