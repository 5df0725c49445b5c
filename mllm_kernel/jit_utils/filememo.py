"""Memoized facts about files (content digest, parsed #includes, compiler identity), kept in
this process and across processes in <cache root>/.memo/, so that a warm load does not re-read
Highway's headers or run `c++ --version`.

An entry is valid only for the exact file version it was computed from: it is keyed by the
path and checked against (size, mtime_ns, ctime_ns, inode, device), so any edit, replacement or
truncation is seen. Files modified in the last RACY_S seconds are never memoized: a second edit
within one filesystem timestamp tick could otherwise keep the same stamp (git's "racy" rule).

The disk store is one JSON file, replaced atomically (temp file + rename); a corrupt, missing or
unwritable store only costs recomputation. It is used only when the cache root already exists
and is private to us: loading prebuilt modules must not create a cache directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import config

MEMO_DIR = ".memo"
MEMO_FILE = "files-v1.json"
RACY_S = 2.0
MAX_ENTRIES = 8192  # beyond this the store starts over (stale paths accumulate otherwise)

_INCLUDE_LINE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"\n]+)[>"]', re.MULTILINE)
# Highway's foreach_target.h re-includes the file named here once per SIMD target.
_HWY_TARGET_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*define[ \t]+HWY_TARGET_INCLUDE[ \t]+(")([^"\n]+)"', re.MULTILINE)

Stamp = list  # [size, mtime_ns, ctime_ns, inode, device]: JSON-friendly

_lock = threading.Lock()
_entries: dict[str, tuple[Stamp, dict[str, Any]]] = {}  # this process's memo, valid for any root
_loaded_stores: set[str] = set()  # store files already merged into _entries
_pending: dict[str, dict[str, tuple[Stamp, dict[str, Any]]]] = {}  # store file -> new entries


def stamp_of(info: os.stat_result) -> Stamp:
    return [info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino, info.st_dev]


def _store_path() -> Path | None:
    """The store file of the current cache root (resolved once per $MLLM_KERNEL_CACHE_DIR)."""
    configured = (os.environ.get(config.ENV_CACHE_DIR, ""), os.environ.get("HOME", ""))
    store = _store_paths.get(configured)
    if store is None:
        try:
            store = _store_paths[configured] = config.cache_root() / MEMO_DIR / MEMO_FILE
        except (OSError, RuntimeError):
            return None
    return store


def _usable(store: Path) -> bool:
    """Only a cache root that exists and is private to us (it decides which modules load)."""
    try:
        info = store.parent.parent.stat()
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o022


_store_paths: dict[tuple[str, str], Path] = {}


def _read_store(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_bytes())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}  # missing, unreadable or corrupt: start over


def _valid(record: Any) -> bool:
    return isinstance(record, list) and len(record) == 2 and isinstance(record[0], list) and isinstance(record[1], dict)


def _lookup(key: str, stamp: Stamp) -> dict[str, Any] | None:
    store = _store_path()
    with _lock:
        if store is not None and str(store) not in _loaded_stores:
            _loaded_stores.add(str(store))
            on_disk = _read_store(store) if _usable(store) else {}
            # What this process learned under another cache root belongs in this store too.
            _pending.setdefault(str(store), {}).update((k, v) for k, v in _entries.items() if k not in on_disk)
            for name, record in on_disk.items():
                if _valid(record):
                    _entries.setdefault(name, (record[0], record[1]))
        found = _entries.get(key)
    return found[1] if found is not None and found[0] == stamp else None


def _remember(key: str, info: os.stat_result, value: dict[str, Any]) -> None:
    if time.time_ns() - info.st_mtime_ns < RACY_S * 1e9 or time.time_ns() - info.st_ctime_ns < RACY_S * 1e9:
        return  # may still change within the same timestamp tick
    record = (stamp_of(info), value)
    store = _store_path()
    with _lock:
        _entries[key] = record
        if store is not None:
            _pending.setdefault(str(store), {})[key] = record


def flush() -> None:
    """Write this process's new entries to the disk store (merged with what others wrote)."""
    with _lock:
        pending = dict(_pending)
        _pending.clear()
    for store_name, new in pending.items():
        store = Path(store_name)
        if not _usable(store):
            continue  # no cache root (e.g. only prebuilt modules are used): create nothing
        try:
            store.parent.mkdir(mode=0o700, exist_ok=True)
            merged = _read_store(store)
            if len(merged) + len(new) > MAX_ENTRIES:
                merged = {}
            merged.update({name: list(record) for name, record in new.items()})
            fd, temp = tempfile.mkstemp(prefix=".tmp-", dir=store.parent)
            try:
                with os.fdopen(fd, "w") as out:
                    json.dump(merged, out, separators=(",", ":"))
                os.replace(temp, store)  # atomic: readers see the old or the new store, whole
            except BaseException:
                os.unlink(temp)
                raise
        except OSError:
            pass  # read-only or full disk: the memo is an optimization only


def _memoized(path: str, kind: str, compute: Callable[[bytes], dict[str, Any]], need: str) -> dict[str, Any]:
    info = os.stat(path)
    key = f"{kind}:{path}"
    value = _lookup(key, stamp_of(info))
    if value is not None and isinstance(value.get("sha256"), str) and isinstance(value.get(need), (str, list)):
        return value
    with open(path, "rb") as file:
        data = file.read()
    value = compute(data)
    # The stamp taken before reading describes what we read unless the file changed meanwhile.
    if stamp_of(os.stat(path)) == stamp_of(info) and len(data) == info.st_size:
        _remember(key, info, value)
    return value


def _digest_only(data: bytes) -> dict[str, Any]:
    return {"sha256": hashlib.sha256(data).hexdigest()}


def _digest_and_includes(data: bytes) -> dict[str, Any]:
    matches = sorted([*_INCLUDE_LINE.finditer(data), *_HWY_TARGET_INCLUDE.finditer(data)], key=lambda m: m.start())
    includes = [[m.group(1).decode(), m.group(2).decode().strip()] for m in matches]
    return {"sha256": hashlib.sha256(data).hexdigest(), "includes": includes}


def scan_source(path: str) -> tuple[str, list[list[str]]]:
    """(sha256 of the content, [[delimiter, spelled name] of each #include]) of a source file."""
    value = _memoized(path, "src", _digest_and_includes, "includes")
    if not all(isinstance(item, list) and len(item) == 2 and all(isinstance(x, str) for x in item) for item in value["includes"]):
        with open(path, "rb") as file:  # a damaged memo entry: never trust it
            value = _digest_and_includes(file.read())
    return value["sha256"], value["includes"]


def file_sha256(path: str) -> str:
    """sha256 of a file (e.g. a module being verified), memoized by its stat."""
    return _memoized(path, "bin", _digest_only, "sha256")["sha256"]


def compiler_identity(resolved: str, compute: Callable[[], str]) -> str:
    """compute() for the compiler at `resolved`, memoized by the stat of the real file."""
    real = os.path.realpath(resolved)
    info = os.stat(real)
    key = f"compiler-sha256:{real}"  # renamed when the identity's form changed: old entries are ignored
    value = _lookup(key, stamp_of(info))
    if value is not None and "identity" in value:
        return value["identity"]
    identity = compute()
    _remember(key, info, {"identity": identity})
    flush()
    return identity


def clear_process_memo() -> None:
    """Forget everything memoized in this process (tests; the disk store stays)."""
    with _lock:
        _entries.clear()
        _loaded_stores.clear()
        _pending.clear()
