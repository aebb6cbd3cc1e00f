"""Resident blocks whose weights come from the files, read while the stage already computes.

Under a host-RAM budget the transformer keeps its streamed blocks and as many resident ones as fit in RAM; the
other resident blocks are read from the weight files at every transformer stage (4.4 GB per section with a 24 GiB
budget: 2.3-3.6 s on the benchmark machine's disk, on the critical path). They are the last resident blocks in
execution order (memory/hostplan.py gives RAM to the earlier ones first), so the first sampling step can run the
blocks before them while they are being read:

- the stage loads everything else as before, then a reader thread reads these blocks, in execution order, into
  their device buffers on a side stream (memory/chunkload.py's staged reads, LoRA deltas merged there too) and
  records an event after each;
- a hook before each of these blocks waits (on the host) until the reader has issued that block, makes the compute
  stream wait for its event, and points the block's weights at its buffer; from then on the block is resident like
  the others and the hook does nothing;
- the stage's end (or an out-of-memory reload) stops the reader, joins it and drops the buffers; an error in the
  reader is raised by the hook of the block that needed it.

The weights each block computes with are the same bytes as with the load at the stage's start, so the results are
the same bit for bit (benchmarks/hostram.py checks the video). `LateLoader` has the streamer's interface
(`attach`, `detach`, `misses`) so the memory manager holds it like one. On GPUs (MemoryConfig.late_load), and on the
CPU where the manager applies its GPU plan there too (`plan_on_cpu`, the tests).
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time

import torch
from diffusers.hooks import HookRegistry, ModelHook
from torch import nn

from memory.chunk import Chunk
from memory.chunkload import Staging, fill_from_files
from memory.deltas import apply_deltas

log = logging.getLogger(__name__)

HOOK_NAME = "steadyframe_late_load"


class _WaitHook(ModelHook):
    def __init__(self, loader: "LateLoader", index: int):
        super().__init__()
        self.loader, self.index = loader, index

    def pre_forward(self, module, *args, **kwargs):
        self.loader.before(self.index)
        return args, kwargs


class LateLoader:
    """Loads `chunks` (file-homed, resident, of `modules`, in execution order) on a reader thread."""

    def __init__(self, modules: list[nn.Module], chunks: list[Chunk], device: torch.device,
                 staging: Staging | None):
        if any(c.home != "file" for c in chunks):
            raise ValueError("only chunks whose home is the weight files are loaded late")
        self.modules, self.chunks = list(modules), list(chunks)
        self.device = torch.device(device)
        self.staging = staging
        self.cuda = self.device.type == "cuda"
        self.misses = 0                         # (the streamer's interface)
        self.wait_s = 0.0                       # host time the compute spent waiting for the reader
        self._bufs: list[torch.Tensor | None] = [None] * len(chunks)
        self._events: list = [None] * len(chunks)
        self._ready = [threading.Event() for _ in chunks]
        self._bound: set[int] = set()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._stream = None
        self._attached = False

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.chunks)

    def attach(self) -> None:
        for i, module in enumerate(self.modules):
            HookRegistry.check_if_exists_or_initialize(module).register_hook(_WaitHook(self, i), HOOK_NAME)
        self._attached = True
        if self.cuda:
            self._stream = torch.cuda.Stream(self.device)
        self._thread = threading.Thread(target=self._read_all, name="steadyframe-late-load", daemon=True)
        self._thread.start()

    def _read_all(self) -> None:
        try:
            for i, chunk in enumerate(self.chunks):
                if self._stop.is_set():
                    break
                scope = torch.cuda.stream(self._stream) if self.cuda else contextlib.nullcontext()
                with scope:
                    buf = torch.empty(chunk.nbytes, dtype=torch.uint8, device=self.device)
                    fill_from_files(chunk, buf, self.staging)
                    apply_deltas(chunk, chunk.views(buf))          # LoRAs, on the same stream
                    event = None
                    if self.cuda:
                        event = torch.cuda.Event()
                        event.record(self._stream)
                self._bufs[i], self._events[i] = buf, event
                self._ready[i].set()
        except BaseException as e:          # raised again by the hook of the block that needs it
            self._error = e
        finally:
            for r in self._ready:
                r.set()

    def before(self, i: int) -> None:
        if i in self._bound:
            return
        t0 = time.perf_counter()
        self._ready[i].wait()
        if self._bufs[i] is None:
            err = self._error or RuntimeError("the weight-file reader stopped before this block was read")
            raise err
        if self._events[i] is not None:
            torch.cuda.current_stream(self.device).wait_event(self._events[i])
        self.chunks[i].bind(self._bufs[i])
        self._bound.add(i)
        self.wait_s += time.perf_counter() - t0

    def detach(self) -> list[tuple[Chunk, torch.Tensor]]:
        """Stop the reader, wait for it and for its copies, remove the hooks, let go of the buffers; returns the
        (chunk, device buffer) of every block read completely (the memory manager may park them: parking.py)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.cuda and self._stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(self._stream)
            torch.cuda.synchronize(self.device)
        if self._attached:
            for module in self.modules:
                HookRegistry.check_if_exists_or_initialize(module).remove_hook(HOOK_NAME, recurse=False)
        for c in self.chunks:
            c.bind_idle()
        log.debug("late load: %d blocks, %.2f GB, compute waited %.2f s", len(self.chunks), self.nbytes / 2**30,
                  self.wait_s)
        done = [(c, b) for c, b, ready in zip(self.chunks, self._bufs, self._ready) if b is not None and ready.is_set()]
        self._bufs, self._events, self._bound = [None] * len(self.chunks), [None] * len(self.chunks), set()
        self._thread, self._stream, self._attached = None, None, False
        return done
