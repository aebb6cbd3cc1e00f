"""Block streaming: the non-resident blocks of a model come from their pinned host chunks, copied one block ahead.

Mechanics (CUDA and ROCm; on the CPU the same code runs with plain copies and no streams):
- `slots`: `depth + 1` device buffers, each the size of the largest streamed block, allocated once per stage
  (no allocator churn, no fragmentation under the cap; freed when the stage ends).
- Blocks are copied into slots round-robin on a side stream, in execution order (cyclically: after the last
  streamed block come the first ones of the next step). A copy into a slot first waits (on the GPU, not the host)
  for the event recorded after the slot's previous block finished computing.
- Before a streamed block runs (a diffusers `ModelHook`, so it works for any module called through `__call__`):
  the compute stream waits for the block's copy event and the block's parameters are pointed at views of its slot.
  The next `depth` blocks are already being copied, overlapping this block's compute.
- After it runs: an event is recorded on the compute stream, the parameters are pointed back at the host views,
  and the freed slot is given the block after the last one in flight (that copy starts once the event has passed).
- A chunk stored in fp8 is copied (half the bytes) into a staging buffer of its slot and turned back into the
  model's dtype in the slot on the side stream, before the copy event: the block computes in bf16 as before;
  weights kept in fp8 for fp8 compute (memory/fp8.py) are copied as they are stored: a chunk with nothing else in
  fp8 (`Chunk.copies_as_stored`) straight into its slot, in one copy.
- A chunk with weight deltas (LoRAs, memory/deltas.py) gets them merged into its slot after the copy, on the side
  stream, before the copy event. The host never waits for the GPU; slots are never freed while in use, so no `record_stream` is needed.
A block called out of order (another model calling it directly, a skipped step that breaks the cycle) is loaded
synchronously and the prefetch restarts from there; `misses` counts it.
"""
from __future__ import annotations

import logging
from typing import Any

import torch
from diffusers.hooks import HookRegistry, ModelHook
from torch import nn

from common.units import GIB
from memory.chunk import Chunk
from memory.chunkload import finish_stored
from memory.deltas import apply_deltas

log = logging.getLogger(__name__)

HOOK_NAME = "steadyframe_stream"


class _StreamHook(ModelHook):
    def __init__(self, streamer: "BlockStreamer", index: int):
        super().__init__()
        self.streamer, self.index = streamer, index

    def pre_forward(self, module, *args, **kwargs):
        self.streamer.before(self.index)
        return args, kwargs

    def post_forward(self, module, output):
        self.streamer.after(self.index)
        return output


class BlockStreamer:
    """Streams `chunks` (the host chunks of `modules`, in execution order) through a ring of device slots."""

    def __init__(self, modules: list[nn.Module], chunks: list[Chunk], device: torch.device, depth: int = 1):
        if not chunks:
            raise ValueError("nothing to stream")
        if any(c.home != "ram" for c in chunks):
            raise ValueError("streamed chunks must be in host RAM (the memory manager gives them RAM for the stage)")
        self.modules, self.chunks = list(modules), list(chunks)
        self.device = torch.device(device)
        self.depth = max(1, min(depth, len(chunks) - 1)) if len(chunks) > 1 else 0
        self.n_slots = self.depth + 1
        self.slot_bytes = max(c.nbytes for c in chunks)
        self.stage_bytes = max((c.host_nbytes for c in chunks if not c.copies_as_stored), default=0)
        self.cuda = self.device.type == "cuda"
        self.misses = 0
        self.copies = 0
        self.bytes_copied = 0
        self._slots: list[torch.Tensor] = []
        self._stages: list[torch.Tensor] = []                # fp8: the stored bytes, per slot
        self._views: list[list[list[torch.Tensor]]] = []      # [slot][chunk] -> views
        self._ready: dict[int, tuple[int, object]] = {}       # chunk index -> (slot, copy event)
        self._released: list[object] = []                    # per slot: event after its last compute
        self._next_slot = 0
        self._next_issue = 0                                  # the chunk the next prefetch loads
        self._bound: dict[int, int] = {}                      # chunk index -> slot, while its block runs
        self._stream: Any = None                 # a torch.cuda.Stream on a GPU
        self._attached = False

    # ---- stage entry / exit -------------------------------------------------------------------------------
    def attach(self) -> None:
        self._slots = [torch.empty(self.slot_bytes, dtype=torch.uint8, device=self.device)
                       for _ in range(self.n_slots)]
        self._stages = [torch.empty(self.stage_bytes, dtype=torch.uint8, device=self.device)
                        for _ in range(self.n_slots)] if self.stage_bytes else []
        self._views = [[c.views(slot) for c in self.chunks] for slot in self._slots]
        self._released = [None] * self.n_slots
        if self.cuda:
            self._stream = torch.cuda.Stream(self.device)
        for i, module in enumerate(self.modules):
            HookRegistry.check_if_exists_or_initialize(module).register_hook(_StreamHook(self, i), HOOK_NAME)
        self._attached = True
        self._restart(0)

    def detach(self) -> None:
        if not self._attached:
            return
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_stream(self._stream)
            torch.cuda.synchronize(self.device)
        for module in self.modules:
            HookRegistry.check_if_exists_or_initialize(module).remove_hook(HOOK_NAME, recurse=False)
        for c in self.chunks:
            c.bind_views(c.host_views)
        self._slots, self._stages, self._views, self._ready, self._bound = [], [], [], {}, {}
        self._released, self._stream, self._attached = [], None, False
        log.debug("streamer detached: %d copies, %.2f GB, %d misses", self.copies, self.bytes_copied / GIB,
                  self.misses)

    # ---- per block -----------------------------------------------------------------------------------------
    def _issue(self, k: int) -> None:
        """Start copying chunk k into the next slot (after that slot's previous block has finished)."""
        s = self._next_slot
        self._next_slot = (s + 1) % self.n_slots
        chunk, slot = self.chunks[k], self._slots[s]
        if self.cuda:
            with torch.cuda.stream(self._stream):
                if self._released[s] is not None:
                    self._stream.wait_event(self._released[s])
                self._copy(chunk, s, slot, non_blocking=chunk.pinned)
                apply_deltas(chunk, self._views[s][k])         # LoRAs: merged in the slot, on the side stream
                event = torch.cuda.Event()
                event.record(self._stream)
        else:
            self._copy(chunk, s, slot, non_blocking=False)
            apply_deltas(chunk, self._views[s][k])
            event = None
        self._ready[k] = (s, event)
        self.copies += 1
        self.bytes_copied += chunk.nbytes

    def _copy(self, chunk: Chunk, s: int, slot: torch.Tensor, non_blocking: bool) -> None:
        if chunk.copies_as_stored:
            slot[:chunk.nbytes].copy_(chunk.host, non_blocking=non_blocking)
            return
        stored = self._stages[s][:chunk.host_nbytes]
        stored.copy_(chunk.host, non_blocking=non_blocking)
        finish_stored(chunk, stored, slot[:chunk.nbytes])

    def _restart(self, k: int) -> None:
        """Drop what is in flight and start loading from chunk k (all slots are free afterwards)."""
        if self.cuda:
            self._stream.synchronize()
            torch.cuda.current_stream(self.device).synchronize()
        self._ready.clear()
        self._released = [None] * self.n_slots
        self._next_slot = 0
        self._next_issue = k
        self._top_up()

    def _issue_next(self) -> None:
        k = self._next_issue
        self._next_issue = (k + 1) % len(self.chunks)
        if k not in self._ready and k not in self._bound:
            self._issue(k)

    def before(self, k: int) -> None:
        if k not in self._ready:
            self.misses += 1
            log.debug("stream miss at block %d: loading it synchronously", k)
            self._restart(k)
        s, event = self._ready.pop(k)
        if event is not None:
            torch.cuda.current_stream(self.device).wait_event(event)
        self.chunks[k].bind_views(self._views[s][k])
        self._bound[k] = s
        self._top_up()

    def after(self, k: int) -> None:
        s = self._bound.pop(k)
        if self.cuda:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self.device))
            self._released[s] = event
        chunk = self.chunks[k]
        chunk.bind_views(chunk.host_views)
        self._top_up()     # the slot just released takes the block after the last one in flight

    def _top_up(self) -> None:
        """Keep every slot not held by a running block busy with the next blocks in execution order."""
        for _ in range(len(self.chunks)):
            if len(self._ready) + len(self._bound) >= self.n_slots:
                break
            self._issue_next()
