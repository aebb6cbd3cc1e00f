"""Loading chunks onto a device from wherever the host pack keeps them, each byte copied once.

- A chunk in RAM, plain: one copy of its host buffer into one device buffer (the layouts are the same).
- A chunk in RAM, fp8: one copy of its host buffer into a device staging buffer, then every tensor is turned back
  into the model's dtype in its place (memory/fp8.py), on the device.
- A chunk in the files: each tensor is read (pread; O_DIRECT where the file system allows, past the page cache) into
  a small ring of pinned staging buffers and copied from there to its place on the device; the next piece is read
  while the previous one is in flight. A tensor whose
  dtype differs from the model's (or that fp8 storage rounds) goes through a device scratch and is converted there.
- Weight deltas (LoRAs, memory/deltas.py) are merged into the device copy after it is made; the host copy never
  changes.
- On the CPU a plain chunk in RAM without deltas is used as it is; any other chunk is materialised for the stage in a CPU buffer
  laid out like a device buffer (file bytes pread straight into it). Computing from the mapped file itself would
  avoid that copy, but safetensors data is only 8-byte aligned, and CPU kernels round differently on unaligned
  weights: the video would then depend on the host budget.
"""
from __future__ import annotations

import logging

import torch

from configs.memory import MEMORY
from memory import fp8
from memory.chunk import Chunk
from memory.deltas import apply_deltas
from memory.weightfiles import DIRECT_ALIGN, TensorSource, direct_io_available

log = logging.getLogger(__name__)


class Staging:
    """A ring of pinned host buffers for weight-file reads on their way to the GPU (allocated on first use)."""

    def __init__(self, device: torch.device, slots: int = 2, slot_bytes: int = MEMORY.staging_mb << 20, *,
                 direct: bool = MEMORY.direct_io):
        self.device = torch.device(device)
        self.slot_bytes = slot_bytes
        self._bufs: list[torch.Tensor] = []
        self._events: list = [None] * slots
        self._slots = slots
        self._next = 0
        self.bytes_read = 0
        self.direct = direct and direct_io_available()    # O_DIRECT reads (no page-cache read-ahead wanted then)

    @property
    def nbytes(self) -> int:
        return sum(b.numel() for b in self._bufs)

    def _buffer(self, i: int) -> torch.Tensor:
        while len(self._bufs) <= i:
            self._bufs.append(torch.empty(self.slot_bytes, dtype=torch.uint8).pin_memory())
        return self._bufs[i]

    def upload(self, src: TensorSource, dst: torch.Tensor) -> None:
        """Copy the file bytes of `src` into the device byte tensor `dst` (asynchronously on the current stream)."""
        pos = 0
        room = self.slot_bytes - 2 * DIRECT_ALIGN if self.direct else self.slot_bytes
        while pos < src.nbytes:
            i = self._next
            self._next = (i + 1) % self._slots
            if self._events[i] is not None:
                self._events[i].synchronize()           # its previous copy has left the buffer
            n = min(room, src.nbytes - pos)
            slot = self._buffer(i)
            start = src.file.read_direct(slot, src.offset + pos, n) if self.direct else None
            if start is None:
                start = 0
                src.file.read_into(slot[:n], src.offset + pos)
            dst[pos:pos + n].copy_(slot[start:start + n], non_blocking=True)
            if self.device.type == "cuda":             # (elsewhere the copy is done when it returns)
                event = torch.cuda.Event()
                event.record(torch.cuda.current_stream(self.device))
                self._events[i] = event
            pos += n
        self.bytes_read += src.nbytes

    def close(self) -> None:
        for e in self._events:
            if e is not None:
                e.synchronize()
        self._bufs, self._events = [], [None] * self._slots


def finish_stored(chunk: Chunk, stored: torch.Tensor, out: torch.Tensor) -> None:
    """From a device copy of the host buffer (`stored`) to the device layout (`out`): fp8 tensors dequantized."""
    for entry, view in zip(chunk.entries, chunk.views(out)):
        values, scales = chunk.stored_views(stored, entry)
        if isinstance(view, fp8.Kept):                    # stays fp8: the stored bytes as they are
            view.values.copy_(values)
            view.scales.copy_(scales)
        elif scales is None:
            view.copy_(values)
        else:
            fp8.dequantize_into(view, values, scales)


def _from_files(chunk: Chunk, buf: torch.Tensor, staging: Staging) -> None:
    device = buf.device
    for entry, view in zip(chunk.entries, chunk.views(buf)):
        src = entry.source
        assert src is not None                          # (a file-backed entry has its source)
        if isinstance(src, torch.Tensor):
            assert not isinstance(view, fp8.Kept)       # (an in-memory buffer is copied as it is, never kept fp8)
            view.copy_(src)
        elif src.dtype == entry.dtype and not chunk.is_fp8(entry):
            staging.upload(src, buf[entry.offset:entry.offset + entry.nbytes])
        else:
            raw = torch.empty(src.nbytes, dtype=torch.uint8, device=device)
            staging.upload(src, raw)
            w = raw.view(src.dtype).view(src.shape)
            w = w if w.dtype == entry.dtype else w.to(entry.dtype)
            if isinstance(view, fp8.Kept):
                fp8.quantize_into(view.values, view.scales, w)
            elif chunk.is_fp8(entry):
                q, scale = fp8.quantize(w)
                fp8.dequantize_into(view, q, scale)
            else:
                view.copy_(w)


def _fill_cpu(chunk: Chunk, buf: torch.Tensor) -> None:
    for entry, view in zip(chunk.entries, chunk.views(buf)):
        src = entry.source
        if isinstance(view, fp8.Kept):
            values, scales = chunk.stored_value(entry)
            view.values.copy_(values)
            view.scales.copy_(scales)
        elif chunk.home == "file" and isinstance(src, TensorSource) and src.dtype == entry.dtype \
                and not chunk.is_fp8(entry):
            src.file.read_into(buf[entry.offset:entry.offset + entry.nbytes], src.offset)
        else:
            view.copy_(chunk.value(entry))


def fill_from_files(chunk: Chunk, buf: torch.Tensor, staging: Staging | None) -> None:
    """Write the device layout of a file-homed `chunk` into `buf` (a CPU or device byte buffer), deltas not
    included: what load_chunk does before it merges the deltas and binds (memory/lateload.py reuses it)."""
    if buf.device.type == "cpu":
        _fill_cpu(chunk, buf)
    else:
        _from_files(chunk, buf, staging or Staging(buf.device))


def load_chunk(chunk: Chunk, device: torch.device, staging: Staging | None = None,
               non_blocking: bool = True) -> torch.Tensor | None:
    """A device copy of `chunk`, bound; returns its buffer (None on the CPU when the idle views are used)."""
    if device.type == "cpu":
        if chunk.home == "ram" and not chunk.stores_fp8 and not chunk.deltas:
            chunk.bind_idle()
            return None
        buf = torch.empty(chunk.nbytes, dtype=torch.uint8)
        _fill_cpu(chunk, buf)
        apply_deltas(chunk, chunk.views(buf))
        chunk.bind(buf)
        return buf
    buf = torch.empty(chunk.nbytes, dtype=torch.uint8, device=device)
    if chunk.home == "ram" and chunk.copies_as_stored:
        buf.copy_(chunk.host, non_blocking=non_blocking and chunk.pinned)
    elif chunk.home == "ram":
        stored = torch.empty(chunk.host_nbytes, dtype=torch.uint8, device=device)
        stored.copy_(chunk.host, non_blocking=non_blocking and chunk.pinned)
        finish_stored(chunk, stored, buf)
    else:
        _from_files(chunk, buf, staging or Staging(device))
    apply_deltas(chunk, chunk.views(buf))      # LoRAs (memory/deltas.py), on the stream of the copy
    chunk.bind(buf)
    return buf


def load_chunks(chunks: list[Chunk], device: torch.device, non_blocking: bool = True,
                staging: Staging | None = None, aligned: bool = False) -> list[torch.Tensor | None]:
    """Device copies of `chunks`, bound there; returns the buffers to hold for the stage (`aligned`: one per chunk,
    None where a CPU run uses the host copy itself)."""
    device = torch.device(device)
    if device.type != "cpu" and staging is None and any(c.home == "file" for c in chunks):
        staging = Staging(device)
    out = []
    for i, c in enumerate(chunks):
        ahead = next((n for n in chunks[i + 1:] if n.home == "file"), None)
        if ahead is not None and not (staging is not None and staging.direct):
            ahead.will_need()              # one chunk of read-ahead: small enough for a tight page cache
        out.append(load_chunk(c, device, staging, non_blocking))
    return out if aligned else [b for b in out if b is not None]


def unload_chunks(chunks: list[Chunk]) -> None:
    """Point the chunks back at their idle views (nothing is copied back: the host copy never changed)."""
    for c in chunks:
        c.bind_idle()
