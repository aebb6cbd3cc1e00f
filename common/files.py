"""The one way SteadyFrame writes a file: atomically. The data goes to a hidden temporary file in the same folder
(``.<name>.<random>.tmp``), is flushed to disk, and is renamed over the real name only when complete, so a crash
never leaves a half-written file under a real name (a job's videos, job.json, checkpoints, caches). On an error
the temporary file is removed and the error propagates.

The same on Windows: there os.fsync needs a descriptor open for writing (it calls _commit, FlushFileBuffers), a
rename is refused while another program (an antivirus or the search indexer reading a file just written, a file
explorer, a player) holds the file or a file in the folder open, and a file cannot be deleted while it is open or
mapped: renames are tried again for a few seconds, then fail with a message that says why.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import secrets
import shutil
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

log = logging.getLogger(__name__)

REFUSED_RETRY_S = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6)    # Windows: waits before each new try of a refused rename


def temp_name(path: Path) -> Path:
    """The temporary file a write of `path` uses (what a clean-up after a crash looks for: a name ending in .tmp)."""
    return path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")


def _sync(path: Path) -> None:
    with open(path, "r+b") as f:          # writable: os.fsync of a read-only descriptor fails on Windows (EBADF)
        os.fsync(f.fileno())


def _windows() -> bool:
    return sys.platform == "win32"


def _rename(rename: Callable[[Path, Path], None], source: Path, target: Path) -> None:
    """`rename(source, target)`; on Windows tried again while it is refused (PermissionError: another program has
    the file, or a file in the folder, open; POSIX renames open files), then refused with a message that says so."""
    waits = REFUSED_RETRY_S if _windows() else ()
    for wait in (*waits, None):
        try:
            rename(source, target)
            return
        except PermissionError as e:
            if wait is None:
                if not _windows():
                    raise
                raise PermissionError(e.errno, f"could not rename {source} to {target.name}: {e.strerror}; another "
                                      f"program (an antivirus scan, the search indexer, a file explorer or player) "
                                      f"has it or a file in it open: close that program or exclude this folder "
                                      f"from it, then try again", str(source)) from e
            time.sleep(wait)


def _rename_new(source: Path, target: Path) -> None:
    if os.path.lexists(target):
        raise FileExistsError(errno.EEXIST, f"{target} exists already; {source.name} was not renamed", str(target))
    try:
        os.rename(source, target)
    except OSError as e:
        if e.errno in (errno.EEXIST, errno.ENOTEMPTY):            # made meanwhile (POSIX: a full folder)
            raise FileExistsError(e.errno, f"{target} exists already; {source.name} was not renamed",
                                  str(target)) from e
        raise


def rename_new(source: str | os.PathLike, target: str | os.PathLike) -> Path:
    """Rename the file or folder `source` to `target`, which must not exist: FileExistsError if it does, on every
    platform (POSIX's rename would replace an empty folder or a file, Windows refuses). Windows refuses to rename a
    folder while a file in it is open: see `_rename`."""
    _rename(_rename_new, Path(source), Path(target))
    return Path(target)


def unlink_if_possible(path: str | os.PathLike) -> bool:
    """Delete a file if it is there; True when it is gone, False when it stays: (Windows) open or mapped by a
    process, which POSIX deletes and Windows refuses (PermissionError). For caches and clean-ups, which try again
    later."""
    try:
        Path(path).unlink(missing_ok=True)
        return True
    except OSError as e:
        log.debug("could not delete %s: %s", path, e)
        return False


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, *, fsync: bool = True) -> Iterator[Path]:
    """For writers that need a file name (PyAV, safetensors): write to the yielded temporary path; when the block
    ends without an error it becomes `path`."""
    path = Path(path)
    tmp = temp_name(path)
    try:
        yield tmp
        if fsync:
            _sync(tmp)
        _rename(os.replace, tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_bytes(path: str | os.PathLike, data: bytes, *, fsync: bool = True) -> Path:
    with atomic_path(path, fsync=fsync) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def atomic_write_json(path: str | os.PathLike, obj, *, indent: int | None = 2, fsync: bool = True) -> Path:
    return atomic_write_bytes(path, json.dumps(obj, indent=indent, default=str).encode("utf-8"), fsync=fsync)


def atomic_copy(source: str | os.PathLike, path: str | os.PathLike) -> Path:
    with atomic_path(path) as tmp:
        shutil.copyfile(source, tmp)
    return Path(path)


def file_sha256(path: str | os.PathLike) -> str:
    """The file's SHA-256 in hex, read 1 MiB at a time (job.json records inputs by it: LoRAs, source videos)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
