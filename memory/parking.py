"""Parked blocks: the transformer's resident blocks that come from the weight files, kept on the GPU between its
stages as far as the VAE decode between them leaves room.

Under a host-RAM budget some resident blocks have no home in RAM: every transformer stage reads them from the
weight files again (4.4 GB per section with a 24 GiB budget: 2–3 s on a 1.5–2 GB/s disk, every section). Between
two transformer stages only the VAE decode runs, and it rarely needs the whole cap. So when a transformer stage
ends, its file-homed resident blocks are not dropped: their device buffers are parked (nothing else changes: the
model's weights point back at their idle views as after any stage). Then:

- the VAE decode picks its tiles as if nothing were parked (the same tiles, so the same frames bit for bit as
  without a host budget), and before it starts, parked blocks are released, the last in execution order first,
  until what stays parked leaves that tiling its estimated peak and its convolution workspace room
  (`MemoryManager.decode_vae`, `VaeDecodePolicy.room`);
- the next transformer stage binds the parked buffers instead of reading those blocks (the same bytes: deltas such
  as LoRAs were merged into them when they were read, and a job keeps its LoRAs);
- any other stage, an out-of-memory re-plan that streams a parked block, and the job's end release them.

The earliest blocks stay parked longest: the ones not parked are read while the first step of the next section
computes the blocks before them (memory/lateload.py), so the latest are the cheapest to read again.
"""
from __future__ import annotations

import logging

import torch

from common.units import GIB
from memory.chunk import Chunk

log = logging.getLogger(__name__)

ALLOC_ROUND = 512          # PyTorch's caching allocator rounds every block up to this many bytes


class ParkedBlocks:
    """Device buffers of file-homed resident blocks of one model, between that model's stages."""

    def __init__(self) -> None:
        self.model: str | None = None
        self._bufs: dict[int, tuple[int, Chunk, torch.Tensor]] = {}     # id(chunk) -> (block index, chunk, buffer)
        self.kept_bytes = 0            # read from the files and not read again thanks to parking (for the record)

    def __bool__(self) -> bool:
        return bool(self._bufs)

    def __len__(self) -> int:
        return len(self._bufs)

    @property
    def nbytes(self) -> int:
        """Device bytes the parked buffers hold, as the allocator counts them."""
        return sum(-(-b.numel() // ALLOC_ROUND) * ALLOC_ROUND for _, _, b in self._bufs.values())

    def park(self, model: str, blocks: list[tuple[int, Chunk, torch.Tensor]]) -> None:
        """Keep these (block index, chunk, device buffer) of `model` until they are taken or released."""
        if self._bufs and model != self.model:
            self.release("another model parks")
        self.model = model
        for i, chunk, buf in blocks:
            self._bufs[id(chunk)] = (i, chunk, buf)
        if blocks:
            log.info("parked %d block(s) of the %s on the GPU (%.2f GB): not read from the files again if the "
                     "next stage leaves room", len(self._bufs), model, self.nbytes / GIB)

    def take(self, chunk: Chunk) -> torch.Tensor | None:
        """The parked buffer of `chunk` (which leaves the park), or None."""
        entry = self._bufs.pop(id(chunk), None)
        if entry is None or entry[2].numel() != chunk.nbytes:     # none, or parked before its layout changed
            return None
        self.kept_bytes += chunk.file_bytes
        return entry[2]

    def fit(self, nbytes: int) -> int:
        """Release the latest blocks until at most `nbytes` stay parked; returns the bytes released."""
        before = self.nbytes
        order = sorted(self._bufs.items(), key=lambda kv: kv[1][0])
        while order and self.nbytes > max(0, nbytes):
            key, _ = order.pop()
            del self._bufs[key]
        released = before - self.nbytes
        if released:
            log.info("released %.2f GB of parked blocks for the VAE decode's tiles; %.2f GB stay parked",
                     released / GIB, self.nbytes / GIB)
        return released

    def release(self, why: str = "") -> int:
        """Drop every parked buffer; returns the bytes released."""
        released = self.nbytes
        if released:
            log.info("released %.2f GB of parked %s blocks%s", released / GIB, self.model, f" ({why})" if why else "")
        self._bufs.clear()
        return released
