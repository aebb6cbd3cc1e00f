"""Safetensors weight files read in place: the header says where each tensor's bytes are, nothing is copied whole.

A folder of a real repo holds one `*.safetensors` file or several shards listed by a `*.safetensors.index.json`
(`weight_map`: tensor name -> file). For each tensor we keep a `TensorSource` (file, byte offset, size, dtype,
shape), parsed from the 8-byte header length and the JSON header of each file (no tensor bytes are read). Then:
- `read_into(dst, source)`: `pread` (Windows: seek + readinto) the bytes into a host buffer (a pinned chunk, a staging buffer): one copy,
  from the page cache or the disk straight into its final place;
- `view(source)`: a zero-copy tensor over a private memory map of the file (pages are read when touched, and
  count as file-backed RSS, which the kernel can reclaim);
- `drop(sources, cache=...)`: give the pages back: `madvise(DONTNEED)` unmaps touched pages from this process,
  `posix_fadvise(DONTNEED)` also evicts them from the page cache (for a model read once per job, so it does not
  push out what matters).
"""
from __future__ import annotations

import json
import logging
import mmap
import os
import struct
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path

import torch

log = logging.getLogger(__name__)

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}
MAX_HEADER = 100 << 20          # the format's own limit on the JSON header
READ_PIECE = 1 << 30            # bytes per pread call (Linux returns at most ~2 GiB per call)
PAGE = mmap.PAGESIZE


class WeightFileError(ValueError):
    """A weight file that cannot be used as it is (damaged, truncated, not safetensors)."""


@dataclass(frozen=True)
class TensorSource:
    file: "WeightFile"
    name: str
    offset: int                 # absolute byte offset in the file
    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


class WeightFile:
    """One safetensors file: its header, an open descriptor for pread/fadvise, a private map for views."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.size = self.path.stat().st_size
        self.fd = os.open(self.path, os.O_RDONLY)
        self._finalizer = weakref.finalize(self, _close, self.fd)
        self._map: mmap.mmap | None = None
        self._base: torch.Tensor | None = None
        self._lock = threading.Lock()
        self.tensors = self._parse_header()

    def _pread(self, n: int, offset: int) -> bytes:
        buf = bytearray(n)
        got = self._read_at(memoryview(buf), offset) if n else 0
        return bytes(buf[:got])

    def _parse_header(self) -> dict[str, TensorSource]:
        head = self._pread(8, 0)
        if len(head) < 8:
            raise WeightFileError(f"{self.path}: too short to be a safetensors file")
        (n,) = struct.unpack("<Q", head)
        if not 0 < n <= MAX_HEADER or 8 + n > self.size:
            raise WeightFileError(f"{self.path}: not a safetensors file (header length {n})")
        try:
            header = json.loads(self._pread(n, 8))
        except ValueError as e:
            raise WeightFileError(f"{self.path}: damaged safetensors header ({e})") from None
        header.pop("__metadata__", None)
        start = 8 + n
        out = {}
        for name, info in header.items():
            dtype = DTYPES.get(info.get("dtype"))
            if dtype is None:
                raise WeightFileError(f"{self.path}: tensor {name} has an unknown dtype {info.get('dtype')!r}")
            shape = tuple(int(s) for s in info["shape"])
            begin, end = (int(x) for x in info["data_offsets"])
            numel = 1
            for s in shape:
                numel *= s
            if end - begin != numel * dtype.itemsize or begin < 0 or start + end > self.size:
                raise WeightFileError(f"{self.path}: tensor {name} does not fit the file (truncated download?)")
            out[name] = TensorSource(self, name, start + begin, end - begin, dtype, shape)
        return out

    # ---- reading ------------------------------------------------------------------------------------------------
    def read_into(self, dst: torch.Tensor, offset: int) -> None:
        """Fill the contiguous CPU byte tensor `dst` from the file at `offset` (pread, no intermediate copy)."""
        if dst.numel() == 0:
            return
        view = memoryview(dst.numpy()).cast("B")
        done = 0
        while done < len(view):
            n = self._read_at(view[done:done + READ_PIECE], offset + done)
            if n <= 0:
                raise WeightFileError(f"{self.path}: unexpected end of file at byte {offset + done}")
            done += n

    def _read_at(self, view: memoryview, offset: int) -> int:
        if hasattr(os, "preadv"):                      # Linux, BSD, macOS: no seek, no lock
            return os.preadv(self.fd, [view], offset)
        with self._lock, open(self.path, "rb", buffering=0) as f:     # Windows
            f.seek(offset)
            return f.readinto(view)

    def _mapped(self) -> torch.Tensor:
        with self._lock:
            if self._base is None:
                self._map = mmap.mmap(self.fd, 0, access=mmap.ACCESS_COPY)   # private: never written back
                self._base = torch.frombuffer(self._map, dtype=torch.uint8)
            return self._base

    def view(self, src: TensorSource) -> torch.Tensor:
        """A tensor over the mapped file (zero copy; a small copy if the offset is not aligned to the dtype)."""
        raw = self._mapped()[src.offset:src.offset + src.nbytes]
        if src.offset % src.dtype.itemsize:
            raw = raw.clone()
        return raw.view(src.dtype).view(src.shape)

    def will_need(self, offset: int, nbytes: int) -> None:
        """Ask the kernel to start reading a range now (asynchronously), so a later pread finds it in the cache."""
        if nbytes > 0 and hasattr(os, "posix_fadvise"):
            os.posix_fadvise(self.fd, offset, nbytes, os.POSIX_FADV_WILLNEED)

    def drop(self, offset: int, nbytes: int, cache: bool) -> None:
        """Unmap the touched pages of a range from this process; with `cache`, evict them from the page cache."""
        if nbytes <= 0:
            return
        lo = offset - offset % PAGE
        hi = min(self.size, -(-(offset + nbytes) // PAGE) * PAGE)
        if self._map is not None and hasattr(mmap, "MADV_DONTNEED"):
            self._map.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
        if cache and hasattr(os, "posix_fadvise"):
            os.posix_fadvise(self.fd, lo, hi - lo, os.POSIX_FADV_DONTNEED)


def _index_files(folder: Path) -> list[Path]:
    """The weight files of a folder: those an index lists, else every `*.safetensors` file."""
    indexes = sorted(folder.glob("*.safetensors.index.json"))
    if indexes:
        try:
            weight_map = json.loads(indexes[0].read_text())["weight_map"]
        except (ValueError, KeyError, OSError) as e:
            raise WeightFileError(f"{indexes[0]}: damaged index ({type(e).__name__}: {e})") from None
        names = sorted(set(weight_map.values()))
        missing = [n for n in names if not (folder / n).is_file()]
        if missing:
            raise WeightFileError(f"{folder}: the index lists {', '.join(missing[:3])}, which is missing "
                                  f"(an interrupted download?)")
        return [folder / n for n in names]
    return sorted(folder.glob("*.safetensors"))


class WeightFiles:
    """Every tensor of a folder's safetensors files, by name."""

    def __init__(self, folder: Path, files: list[WeightFile]):
        self.folder = Path(folder)
        self.files = files
        self.tensors: dict[str, TensorSource] = {}
        for f in files:
            for name, src in f.tensors.items():
                if name in self.tensors:
                    raise WeightFileError(f"{folder}: tensor {name} is in two files")
                self.tensors[name] = src

    @classmethod
    def open(cls, folder: str | Path) -> "WeightFiles":
        folder = Path(folder)
        paths = _index_files(folder)
        if not paths:
            raise FileNotFoundError(f"{folder}: no *.safetensors files")
        return cls(folder, [WeightFile(p) for p in paths])

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.tensors.values())

    def drop_all(self, cache: bool) -> None:
        for f in self.files:
            f.drop(0, f.size, cache)
