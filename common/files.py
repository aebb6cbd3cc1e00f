"""The one way SteadyFrame writes a file: atomically. The data goes to a hidden temporary file in the same folder
(``.<name>.<random>.tmp``), is flushed to disk, and is renamed over the real name only when complete, so a crash
never leaves a half-written file under a real name (a job's videos, job.json, checkpoints, caches). On an error
the temporary file is removed and the error propagates.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
from pathlib import Path
from typing import Iterator


def temp_name(path: Path) -> Path:
    """The temporary file a write of `path` uses (what a clean-up after a crash looks for: a name ending in .tmp)."""
    return path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")


def _sync(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


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
        os.replace(tmp, path)
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
