"""The on-disk cache: private directories, per-module locks and atomic publication.

Layout (one directory per module version):
    <root>/<device>_<name>_<args>/<key[:16]>/module.so   (+ integrity.json, the generated wrappers, build.json)
    <root>/<device>_<name>_<args>/<key[:16]>.lock         (flock target; may linger, harmless)
    <root>/<device>_<name>_<args>/.tmp-<key[:16]>-<pid>-<rand>/   (a build in progress)
    <root>/<device>_<name>_<args>/.damaged-<key[:16]>-<pid>-<rand>/   (a damaged version, moved aside)
    <root>/.memo/   (memoized file digests and compiler identities, see filememo.py)

A version directory only ever appears through os.rename of a finished temp directory, so
its presence means the module is complete; a killed build leaves only a temp directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

PRIVATE_DIR_MODE = 0o700
TEMP_PREFIX = ".tmp-"


def ensure_private_dir(path: Path, root: Path) -> Path:
    """Create `path` (and parents up to and including `root`) as 0700 dirs owned by us.

    Compiled modules are loaded into the process, so a cache writable by others would be
    a code-injection hole: refuse a directory owned by someone else, repair loose modes.
    """
    path = Path(path)
    root = Path(root)
    root.parent.mkdir(parents=True, exist_ok=True)  # e.g. ~/.cache: not ours to lock down
    chain = [path] + [p for p in path.parents if p == root or root in p.parents]
    for directory in reversed(chain):
        try:
            directory.mkdir(mode=PRIVATE_DIR_MODE)
        except FileExistsError:
            pass
        info = directory.stat()
        if not stat.S_ISDIR(info.st_mode):
            raise NotADirectoryError(f"mllm_kernel cache path {directory} is not a directory")
        if info.st_uid != os.getuid():
            raise PermissionError(
                f"mllm_kernel cache directory {directory} is owned by uid {info.st_uid}, not by "
                f"the current user; set MLLM_KERNEL_CACHE_DIR to a directory you own"
            )
        if stat.S_IMODE(info.st_mode) != PRIVATE_DIR_MODE:
            os.chmod(directory, PRIVATE_DIR_MODE)
    return path


def lock_path_for(module_dir: Path) -> Path:
    """The lock of one module version lives beside (not inside) its directory, which only
    appears when the build is published."""
    return module_dir.parent / f"{module_dir.name}.lock"


def _open_lock_file(lock_path: Path) -> int:
    # O_CLOEXEC: compiler subprocesses must not inherit (and so prolong) the lock.
    return os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


def _try_lock(lock_path: Path) -> int | None:
    """The fd holding the lock, or None when another process holds it."""
    fd = _open_lock_file(lock_path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    except BlockingIOError:
        os.close(fd)
        return None


@contextlib.contextmanager
def file_lock(lock_path: Path, what: str) -> Iterator[None]:
    """Exclusive flock on `lock_path`.

    flock belongs to the open file, so the kernel drops it when the holder dies: a lock file
    left on disk, or one whose holder was SIGKILLed, never blocks anybody.
    """
    fd = _try_lock(lock_path)
    if fd is None:
        print(f"mllm_kernel: waiting for another process building {what} ...", file=sys.stderr, flush=True)
        fd = _open_lock_file(lock_path)
        fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        os.close(fd)  # closing releases the lock


def make_temp_dir(parent: Path, tag: str, prefix: str = TEMP_PREFIX) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{tag}-{os.getpid()}-", dir=parent))


def remove_abandoned_temp_dirs(parent: Path, own_tag: str) -> None:
    """Remove temp dirs left by builders that died, in this module's directory.

    Call while holding the lock of `own_tag`. A live builder of any version holds that
    version's lock, so a temp dir whose version lock we can take belongs to a dead process.
    """
    by_tag: dict[str, list[Path]] = {}
    for entry in parent.glob(f"{TEMP_PREFIX}*"):
        tag = entry.name[len(TEMP_PREFIX) :].split("-", 1)[0]
        by_tag.setdefault(tag, []).append(entry)
    for tag, entries in by_tag.items():
        fd = None if tag == own_tag else _try_lock(lock_path_for(parent / tag))
        if tag != own_tag and fd is None:
            continue  # being built right now
        try:
            for entry in entries:
                shutil.rmtree(entry, ignore_errors=True)
        finally:
            if fd is not None:
                os.close(fd)


def publish_dir(temp_dir: Path, final_dir: Path) -> None:
    """Atomically make a finished build visible (rename within one filesystem)."""
    if final_dir.exists():
        # Only reachable when a version dir lacks its module (tampered with); we hold the lock.
        shutil.rmtree(final_dir)
    os.rename(temp_dir, final_dir)
