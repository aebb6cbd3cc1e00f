"""From host packs to a host plan's inputs, and from a plan back to the packs (where each chunk lives).

`model_host` describes one model for memory/hostplan.py: its chunks' stored sizes, the bytes read from its files,
which chunks its stage streams (they need pinned RAM while it runs) and what a file-homed chunk costs in RAM while
its stage runs. `realize` moves chunks: first the ones leaving RAM (so the peak while re-arranging stays low), then
the storage changes (fp8 or not), then the ones coming in (read from the files straight into their host buffers, whose page-cache copies are then
evicted: the RAM copy is the one that counts).
"""
from __future__ import annotations

import logging
import time

from memory.hostpack import HostPack
from memory.hostplan import HostPlan, ModelHost
from common.units import GIB

log = logging.getLogger(__name__)


def model_host(name: str, pack: HostPack, streamed_blocks: set[int], device_type: str,
               quantized: bool | None = None) -> ModelHost:
    """`streamed_blocks`: block indices (the VRAM plan's); chunk 0 is the rest, chunk i + 1 is block i;
    `quantized`: the storage the plan is for (None: as the chunks are stored now)."""
    chunks = pack.chunks
    streamed = frozenset(i + 1 for i in streamed_blocks)
    stored = tuple(c.stored_nbytes(c.fp8 if quantized is None else quantized) for c in chunks)
    # streamed chunks need RAM while their stage runs; a GPU stage reads resident ones straight to the device, a
    # CPU stage into a buffer for the stage (memory/chunkload.py says why not the mapped file itself)
    transient = tuple(stored[i] if i in streamed else c.nbytes if device_type == "cpu" else 0
                      for i, c in enumerate(chunks))
    files = tuple(c.file_bytes for c in chunks) if pack.files is not None else None
    return ModelHost(name, stored, files, transient, streamed)


def realize(plan: HostPlan, packs: dict[str, HostPack], quantized: dict[str, bool], pinned: bool,
            device=None) -> tuple[int, float]:
    """Give every chunk the home and storage (plain or fp8) the plan is for; returns (bytes read from the weight
    files, seconds). fp8 arithmetic runs on `device` when it is a GPU."""
    t0 = time.perf_counter()
    for name, pack in packs.items():
        for chunk, home in zip(pack.chunks, plan.homes(name)):
            if home == "file" and chunk.home == "ram":
                chunk.to_file()
    read = 0
    for name, pack in packs.items():
        if pack.can_quantize():
            read += sum(c.set_fp8(quantized.get(name, False), device) for c in pack.chunks)
    for name, pack in packs.items():
        for chunk, home in zip(pack.chunks, plan.homes(name)):
            if home == "ram":
                was_file = chunk.home == "file"
                read += chunk.to_ram(chunk.fp8, device)
                chunk.set_pinned(pinned)
                if was_file:
                    chunk.drop_pages(cache=True)
    seconds = time.perf_counter() - t0
    if read:
        log.info("host plan: %.2f GB read from the weight files into RAM in %.1f s", read / GIB, seconds)
    return read, seconds
