"""Host packs: a model's own weights re-homed into one flat host buffer per chunk, pinned once, never duplicated.

A chunk is one streamable block (a transformer block, a Llama decoder layer) or "the rest" of the model. Packing
copies each tensor into its chunk's flat buffer and points the parameter at a view of it, so the original is
freed: there is exactly one host copy, and it is the model's own. Why flat buffers:
- a device load is one large copy per chunk (fast DMA) into one device buffer (no allocator churn);
- unloading is free: the parameters are pointed back at the host views, the device buffer is dropped - the host
  copy never changed, so nothing is copied back;
- pinning registers the exact bytes with the driver (cudaHostRegister); PyTorch's pinned allocator would round
  every allocation up to a power of two (a 0.63 GiB block would take 1 GiB of page-locked RAM).
The pack lives on the model (`HostPack.of(model)`), so jobs after the first reuse it.
"""
from __future__ import annotations

import logging
import time
import weakref
from dataclasses import dataclass

import torch
from torch import nn

log = logging.getLogger(__name__)

ALIGN = 256          # bytes; keeps every view aligned for vectorised kernels and BLAS
_ATTR = "_steadyframe_host_pack"


def block_list(model: nn.Module) -> list[nn.Module]:
    """The blocks a model runs in sequence (streamable one at a time), in execution order; [] if none."""
    if hasattr(model, "transformer_blocks") and hasattr(model, "single_transformer_blocks"):
        return [*model.transformer_blocks, *model.single_transformer_blocks]
    layers = getattr(model, "layers", None)
    if isinstance(layers, nn.ModuleList) and len(layers) > 1:
        return list(layers)
    return []


@dataclass
class _Place:
    module: nn.Module
    name: str
    is_param: bool


@dataclass
class _Entry:
    places: list[_Place]
    offset: int
    nbytes: int
    shape: torch.Size
    dtype: torch.dtype


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


class Chunk:
    """The tensors of one block (or of the rest of a model) and their one flat host buffer."""

    def __init__(self, name: str, modules: list[nn.Module], skip: set[int]):
        self.name = name
        self.entries: list[_Entry] = []
        seen: dict[int, _Entry] = {}
        offset = 0
        for module in modules:
            for kind, table in (("param", module._parameters), ("buffer", module._buffers)):
                for key, tensor in table.items():
                    if tensor is None or id(tensor) in skip:
                        continue
                    place = _Place(module, key, kind == "param")
                    if id(tensor) in seen:
                        seen[id(tensor)].places.append(place)
                        continue
                    n = tensor.numel() * tensor.element_size()
                    entry = _Entry([place], offset, n, tensor.shape, tensor.dtype)
                    seen[id(tensor)] = entry
                    self.entries.append(entry)
                    offset += _align(n)
        self.ids = set(seen)
        self.nbytes = offset
        self.host = torch.empty(self.nbytes, dtype=torch.uint8)
        for entry in self.entries:
            self._view(self.host, entry).copy_(self._current(entry.places[0]))
        self.host_views = self.views(self.host)
        self.bind_views(self.host_views)  # the originals are freed here

    @staticmethod
    def _current(place: _Place) -> torch.Tensor:
        table = place.module._parameters if place.is_param else place.module._buffers
        return table[place.name].data

    @staticmethod
    def _view(flat: torch.Tensor, entry: _Entry) -> torch.Tensor:
        return flat[entry.offset:entry.offset + entry.nbytes].view(entry.dtype).view(entry.shape)

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """One view of `flat` per tensor (made once per buffer: binding is then only pointer swaps)."""
        return [self._view(flat, entry) for entry in self.entries]

    def bind(self, flat: torch.Tensor) -> None:
        """Point every tensor of the chunk at its view of `flat` (the host buffer or a device copy of it)."""
        self.bind_views(self.host_views if flat is self.host else self.views(flat))

    def bind_views(self, views: list[torch.Tensor]) -> None:
        for entry, view in zip(self.entries, views):
            for place in entry.places:
                if place.is_param:
                    place.module._parameters[place.name].data = view
                else:
                    place.module._buffers[place.name] = view

    def replace_host(self, host: torch.Tensor) -> None:
        """Move the host copy to another buffer (pinned or not) with the same layout; only while bound to host."""
        self.host = host
        self.host_views = self.views(host)
        self.bind_views(self.host_views)

    def bound_to(self, flat: torch.Tensor) -> bool:
        base = flat.data_ptr()
        return all(self._current(e.places[0]).data_ptr() == base + e.offset for e in self.entries if e.nbytes)

    def device_tensors(self) -> list[str]:
        """Names of tensors of the chunk that are not on the CPU (must be none after a stage)."""
        return [f"{self.name}:{e.places[0].name}" for e in self.entries
                if self._current(e.places[0]).device.type != "cpu"]


def _register(t: torch.Tensor) -> bool:
    """Page-lock the exact bytes of `t` (cudaHostRegister; hipHostRegister on ROCm). False if refused."""
    try:
        err = torch.cuda.cudart().cudaHostRegister(t.data_ptr(), t.numel() * t.element_size(), 0)
    except (RuntimeError, AttributeError) as e:
        log.warning("cudaHostRegister unavailable (%s)", e)
        return False
    return int(getattr(err, "value", err)) == 0


def _unregister(ptrs: list[int]) -> None:
    for ptr in ptrs:
        try:
            torch.cuda.cudart().cudaHostUnregister(ptr)
        except (RuntimeError, AttributeError):   # interpreter shutting down, or no CUDA any more
            pass


class HostPack:
    """All chunks of one model: `rest` (always loaded with the model) and one per block, in execution order."""

    def __init__(self, model: nn.Module):
        t0 = time.perf_counter()
        blocks = block_list(model)
        in_blocks = {id(m) for b in blocks for m in b.modules()}
        rest_modules = [m for m in model.modules() if id(m) not in in_blocks]
        self.rest = Chunk("rest", rest_modules, set())
        self.blocks = [Chunk(f"block{i}", list(b.modules()), self.rest.ids) for i, b in enumerate(blocks)]
        self.block_modules = blocks
        self.pinned = False
        self._registered: list[int] = []
        self._allocator_pinned: list[Chunk] = []
        self._finalizer = weakref.finalize(self, _unregister, self._registered)
        self.pack_s = time.perf_counter() - t0
        self.pin_s = 0.0

    @classmethod
    def of(cls, model: nn.Module) -> "HostPack":
        """The model's pack, built on first use (and rebuilt if someone moved the weights behind our back)."""
        pack = model.__dict__.get(_ATTR)
        if pack is None or not pack.intact():
            if pack is not None:
                log.warning("%s: weights were moved outside the memory manager; re-packing",
                            type(model).__name__)
            pack = cls(model)
            model.__dict__[_ATTR] = pack
            log.info("%s: packed %.2f GB into %d host chunk(s) in %.2f s", type(model).__name__, pack.nbytes / 1e9,
                     len(pack.chunks), pack.pack_s)
        return pack

    @property
    def chunks(self) -> list[Chunk]:
        return [self.rest, *self.blocks]

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.chunks)

    def intact(self) -> bool:
        return all(c.bound_to(c.host) for c in self.chunks)

    def set_pinned(self, pinned: bool) -> float:
        """Pin (or unpin) the host buffers; returns the seconds it took. Needs a GPU runtime to pin."""
        if pinned == self.pinned or (pinned and not torch.cuda.is_available()):
            return 0.0
        t0 = time.perf_counter()
        if pinned:
            for c in self.chunks:
                if c.nbytes and _register(c.host):
                    self._registered.append(c.host.data_ptr())
                elif c.nbytes:    # PyTorch's pinned allocator: a copy, rounded up to a power of two
                    c.replace_host(c.host.pin_memory())
                    self._allocator_pinned.append(c)
                    log.warning("%s: cudaHostRegister refused; pinned a copy with PyTorch's allocator instead "
                                "(%.2f GB of page-locked RAM for %.2f GB)", c.name,
                                2 ** (c.nbytes - 1).bit_length() / 1e9, c.nbytes / 1e9)
        else:
            _unregister(self._registered)
            self._registered.clear()
            for c in self._allocator_pinned:
                c.replace_host(torch.empty(c.nbytes, dtype=torch.uint8).copy_(c.host))
            self._allocator_pinned.clear()
        self.pinned = pinned
        self.pin_s += time.perf_counter() - t0
        log.info("host pack of %.2f GB %s in %.2f s", self.nbytes / 1e9, "pinned" if pinned else "unpinned",
                 time.perf_counter() - t0)
        return time.perf_counter() - t0

    def device_tensors(self) -> list[str]:
        return [name for c in self.chunks for name in c.device_tensors()]


def load_chunks(chunks: list[Chunk], device: torch.device, non_blocking: bool = True) -> list[torch.Tensor]:
    """Copy chunks to one device buffer each and bind them there. On the CPU the host buffers are used as they are."""
    if device.type == "cpu":
        for c in chunks:
            c.bind(c.host)
        return []
    buffers = []
    for c in chunks:
        buf = torch.empty(c.nbytes, dtype=torch.uint8, device=device)
        buf.copy_(c.host, non_blocking=non_blocking)
        c.bind(buf)
        buffers.append(buf)
    return buffers


def unload_chunks(chunks: list[Chunk]) -> None:
    """Point the chunks back at their host buffers (nothing is copied: the host copy never changed)."""
    for c in chunks:
        c.bind(c.host)
