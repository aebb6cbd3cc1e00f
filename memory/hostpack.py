"""Host packs: where a model's weights live on the host, chunk by chunk, with never more than one copy.

A chunk is one streamable block (a transformer block, a Llama decoder layer) or "the rest" of the model. Each chunk
has a home, chosen by the host plan (memory/hostplan.py):
- "ram": one flat host buffer per chunk (pinned or pageable), the model's own copy. A device load is one large
  copy per chunk (fast DMA) into one device buffer; unloading copies nothing back (the host copy never changed);
  pinning registers the exact bytes with the driver (cudaHostRegister; PyTorch's pinned allocator would round
  every allocation up to a power of two).
- "file": no host copy at all. The chunk's tensors are read from the model's safetensors files when a stage needs
  them (memory/chunkload.py), straight into their place on the device; between stages they point at zero-copy
  views of the mapped files (or at a one-element placeholder where a dtype conversion would be needed).
A pack built from a model that has no files (the tiny preset, built in code) keeps every chunk in RAM.

With fp8 storage (memory/fp8.py) the host buffer holds the Linear weights as e4m3fn + a scale per row (about
half the bytes); the device copy is turned back into the model's dtype when it is loaded.

The pack lives on the model (`HostPack.of(model)`), so jobs after the first reuse it.
"""
from __future__ import annotations

import logging
import time
import weakref

import torch
from torch import nn

from common.units import GIB
from memory.chunk import ALIGN, Chunk, _unregister
from memory.weightfiles import WeightFiles

log = logging.getLogger(__name__)

_ATTR = "_steadyframe_host_pack"
__all__ = ["ALIGN", "Chunk", "HostPack", "block_list"]


def block_list(model: nn.Module) -> list[nn.Module]:
    """The blocks a model runs in sequence (streamable one at a time), in execution order; [] if none."""
    if hasattr(model, "transformer_blocks") and hasattr(model, "single_transformer_blocks"):
        return [*model.transformer_blocks, *model.single_transformer_blocks]
    layers = getattr(model, "layers", None)          # a Llama: its decoder layers (one, too: the tiny preset's,
    if isinstance(layers, nn.ModuleList) and len(layers) > 0:    # trimmed, stays a block, so fp8 storage covers it)
        return list(layers)
    return []



class HostPack:
    """All chunks of one model: `rest` (always loaded with the model) and one per block, in execution order."""

    def __init__(self, model: nn.Module, files: WeightFiles | None = None):
        t0 = time.perf_counter()
        blocks = block_list(model)
        in_blocks = {id(m) for b in blocks for m in b.modules()}
        prefixes = {id(m): name for name, m in model.named_modules(remove_duplicate=False)}
        rest_modules = [m for m in model.modules() if id(m) not in in_blocks]
        self.files = files
        self._registered: set[int] = set()
        self.rest = Chunk("rest", rest_modules, set(), prefixes, files, self._registered)
        self.blocks = [Chunk(f"block{i}", list(b.modules()), self.rest.ids, prefixes, files, self._registered)
                       for i, b in enumerate(blocks)]
        self.block_modules = blocks
        self.name = type(model).__name__
        self._finalizer = weakref.finalize(self, _unregister, self._registered)
        self.pack_s = time.perf_counter() - t0
        self.pin_s = 0.0

    @classmethod
    def of(cls, model: nn.Module) -> "HostPack":
        """The model's pack, built on first use (and rebuilt if someone moved the weights behind our back)."""
        pack = model.__dict__.get(_ATTR)
        if pack is None or not pack.intact():
            if pack is not None:
                if pack.files is not None:
                    raise RuntimeError(f"{type(model).__name__}: weights were moved outside the memory manager")
                log.warning("%s: weights were moved outside the memory manager; re-packing",
                            type(model).__name__)
            pack = cls(model)
            model.__dict__[_ATTR] = pack
            log.info("%s: packed %.2f GB into %d host chunk(s) in %.2f s", type(model).__name__, pack.nbytes / GIB,
                     len(pack.chunks), pack.pack_s)
        return pack

    @classmethod
    def from_files(cls, model: nn.Module, files: WeightFiles) -> "HostPack":
        """A pack whose chunks are all read from `files` on demand (the model's parameters are meta tensors)."""
        pack = cls(model, files)
        model.__dict__[_ATTR] = pack
        return pack

    def keep_marked(self, device: torch.device | None = None) -> int:
        """Chunks whose Linears were marked to keep their weights in fp8 on the device (memory/fp8.py) since the pack
        was made take that storage now; returns how many changed."""
        return sum(c.keep_marked(device) for c in self.chunks)

    @classmethod
    def existing(cls, model: nn.Module) -> "HostPack | None":
        """The model's pack if it has one (nothing is built)."""
        return model.__dict__.get(_ATTR)

    @property
    def chunks(self) -> list[Chunk]:
        return [self.rest, *self.blocks]

    @property
    def nbytes(self) -> int:
        """Bytes of the model in its own dtype (what a device copy takes)."""
        return sum(c.nbytes for c in self.chunks)

    @property
    def host_bytes(self) -> int:
        """Bytes held in host RAM now."""
        return sum(c.host_nbytes for c in self.chunks if c.home == "ram")

    @property
    def pinned(self) -> bool:
        ram = [c for c in self.chunks if c.home == "ram" and c.host_nbytes]
        return bool(ram) and all(c.pinned for c in ram)

    @property
    def fp8(self) -> bool:
        return any(c.fp8 for c in self.chunks)

    def can_quantize(self) -> bool:
        return bool(self.blocks) and any(e.quantizable for c in self.chunks for e in c.entries)

    def intact(self) -> bool:
        return all(c.is_idle() for c in self.chunks)

    def set_pinned(self, pinned: bool) -> float:
        """Pin (or unpin) the host buffers of the chunks in RAM; returns the seconds it took. Needs a GPU runtime."""
        if pinned and not torch.cuda.is_available():
            return 0.0
        t0 = time.perf_counter()
        changed = [c for c in self.chunks if c.home == "ram" and c.pinned != pinned]
        for c in changed:
            c.set_pinned(pinned)
        seconds = time.perf_counter() - t0
        self.pin_s += seconds
        if changed:
            log.info("%s: %.2f GB of host chunks %s in %.2f s", self.name, sum(c.host_nbytes for c in changed) / GIB,
                     "pinned" if pinned else "unpinned", seconds)
        return seconds

    def device_tensors(self) -> list[str]:
        return [name for c in self.chunks for name in c.device_tensors()]
