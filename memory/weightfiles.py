"""Safetensors weight files read in place: the header says where each tensor's bytes are, nothing is copied whole.

A folder of a real repo holds one `*.safetensors` file or several shards listed by a `*.safetensors.index.json`
(`weight_map`: tensor name -> file). For each tensor we keep a `TensorSource` (file, byte offset, size, dtype,
shape), parsed from the 8-byte header length and the JSON header of each file (no tensor bytes are read). Then:
- `read_into(dst, offset)`: `pread` (Windows: seek + readinto) the bytes into a host buffer (a pinned chunk, a staging
  buffer): one copy, from the page cache or the disk straight into its final place. A large read is cut into pieces
  read by several threads at once (`MemoryConfig.read_threads`): one thread waits for each small request the kernel
  makes in turn, several keep the disk's queue full (`benchmarks/read_speed.py` measures it);
- `read_direct(slot, offset, n)`: the same bytes read with `O_DIRECT` (Linux) into a page-aligned staging slot,
  bypassing the page cache: a model read once per job or per section does not fill the cache, so under a memory
  cgroup the kernel does not reclaim pages while it reads (`MemoryConfig.direct_io`; falls back to `read_into`
  where the file system refuses it);
- `view(source)`: a zero-copy tensor over a private memory map of the file (pages are read when touched, and
  count as file-backed RSS, which the kernel can reclaim);
- `drop(sources, cache=...)`: give the pages back: `madvise(DONTNEED)` unmaps touched pages from this process,
  `posix_fadvise(DONTNEED)` also evicts them from the page cache (for a model read once per job, so it does not
  push out what matters).
"""
from __future__ import annotations

import errno
import json
import logging
import mmap
import os
import struct
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from configs.memory import MEMORY

log = logging.getLogger(__name__)

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}
MAX_HEADER = 100 << 20          # the format's own limit on the JSON header
READ_PIECE = 1 << 30            # bytes per pread call (Linux returns at most ~2 GiB per call)
PARALLEL_PIECE = 4 << 20        # the smallest piece one reader thread takes of a large read
PAGE = mmap.PAGESIZE
DIRECT_ALIGN = 4096             # O_DIRECT: buffer address, file offset and length in multiples of this


def direct_io_available() -> bool:
    """O_DIRECT reads need os.O_DIRECT and os.preadv: Linux, not macOS or Windows (read at call time)."""
    return hasattr(os, "O_DIRECT") and hasattr(os, "preadv")


def read_threads() -> int:
    return max(1, int(MEMORY.read_threads))


def _in_pieces(read, pieces: list[tuple[int, int]]) -> None:
    """`read(start, end)` for every piece: here for one, on the reader threads for several (errors re-raised)."""
    if len(pieces) == 1:
        read(*pieces[0])
        return
    with ThreadPoolExecutor(max_workers=len(pieces), thread_name_prefix="weight-read") as readers:
        for f in [readers.submit(read, a, b) for a, b in pieces]:     # os.preadv releases the GIL
            f.result()


def split(nbytes: int, threads: int | None = None) -> list[tuple[int, int]]:
    """(start, end) pieces of a read of `nbytes` for `threads` readers (default `MemoryConfig.read_threads`):
    page-aligned, at least PARALLEL_PIECE each."""
    threads = read_threads() if threads is None else threads
    if threads <= 1 or nbytes < 2 * PARALLEL_PIECE:
        return [(0, nbytes)]
    piece = max(PARALLEL_PIECE, -(-nbytes // threads))
    piece = -(-piece // PAGE) * PAGE
    return [(a, min(nbytes, a + piece)) for a in range(0, nbytes, piece)]


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
        self.fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_BINARY", 0))    # O_BINARY: Windows, no text mode
        self._finalizer = weakref.finalize(self, _close, self.fd)
        self._map: mmap.mmap | None = None
        self._base: torch.Tensor | None = None
        self._lock = threading.Lock()
        self._direct: int | None = None          # O_DIRECT descriptor (-1: refused here), opened on first use
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
    def read_into(self, dst: torch.Tensor, offset: int, threads: int | None = None) -> None:
        """Fill the contiguous CPU byte tensor `dst` from the file at `offset` (pread, no intermediate copy), in
        pieces read by `threads` threads at once (default `MemoryConfig.read_threads`)."""
        if dst.numel() == 0:
            return
        view = memoryview(dst.numpy()).cast("B")
        _in_pieces(lambda a, b: self._fill(view, offset, a, b), split(len(view), threads))

    def _fill(self, view: memoryview, offset: int, start: int, end: int, fd: int | None = None) -> None:
        """Read file bytes [offset + start, offset + end) into view[start:end] (through `fd` when given: O_DIRECT)."""
        done = start
        while done < end:
            if fd is None:
                n = self._read_at(view[done:min(end, done + READ_PIECE)], offset + done)
            else:
                n = os.preadv(fd, [view[done:end]], offset + done)
            if n <= 0:
                raise WeightFileError(f"{self.path}: unexpected end of file at byte {offset + done}")
            done += n

    def _direct_fd(self) -> int | None:
        with self._lock:
            if self._direct is None:
                self._direct = -1
                if direct_io_available():
                    try:
                        self._direct = os.open(self.path, os.O_RDONLY | os.O_DIRECT)
                        weakref.finalize(self, _close, self._direct)
                    except OSError:
                        pass
            return self._direct if self._direct >= 0 else None

    def read_direct(self, slot: torch.Tensor, offset: int, nbytes: int, threads: int | None = None) -> int | None:
        """Read bytes [offset, offset + nbytes) with O_DIRECT into the page-aligned byte tensor `slot` (the read is
        widened to whole blocks); returns where in `slot` the bytes start, or None where direct reading is off or
        refused (the caller reads through the page cache instead)."""
        fd = self._direct_fd()
        if fd is None or slot.data_ptr() % DIRECT_ALIGN or nbytes <= 0:
            return None
        lo = offset - offset % DIRECT_ALIGN
        hi = -(-(offset + nbytes) // DIRECT_ALIGN) * DIRECT_ALIGN
        if hi - lo > slot.numel():
            raise ValueError(f"a direct read of {hi - lo} bytes does not fit a slot of {slot.numel()}")
        view = memoryview(slot.numpy()).cast("B")[:hi - lo]
        need = offset + nbytes - lo              # the last block may end past the file: stop at the bytes wanted
        try:
            _in_pieces(lambda a, b: self._fill(view, lo, a, min(b, need), fd), split(hi - lo, threads))
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            log.info("%s: direct reads refused (%s); reading through the page cache", self.path.name, e)
            with self._lock:
                self._direct = -1
            return None
        return offset - lo

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
            weight_map = json.loads(indexes[0].read_text("utf-8"))["weight_map"]    # not the locale's (Windows)
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
