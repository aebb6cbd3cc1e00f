"""A chunk: the tensors of one block (or of the rest of a model), laid out in one flat buffer, and its one home on
the host (memory/hostpack.py says which homes there are and why).

Layouts: the device layout (the model's dtype, every tensor 256-byte aligned) is what a device buffer holds and what
the parameters are bound to during a stage; the host layout is the same for plain storage, and for fp8 storage
holds the Linear weights as e4m3fn + a float32 scale per row. Binding swaps `.data` pointers only (the same
Parameter objects throughout; a model built empty gets real Parameters on its first binding). A weight kept in
fp8 on the device (memory/fp8.py `keep_on_device`, for fp8 compute) is stored in fp8 whatever the storage setting,
and its region of the device layout is that stored form (values, then the row scales), as large as it is.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import nn

from common.units import GIB
from memory import fp8
from memory.weightfiles import TensorSource, WeightFiles

log = logging.getLogger(__name__)

ALIGN = 256          # bytes; keeps every view aligned for vectorised kernels and BLAS


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass
class _Place:
    module: nn.Module
    name: str
    is_param: bool


@dataclass
class _Entry:
    places: list[_Place]
    offset: int                 # in the device layout (the model's dtype)
    nbytes: int
    shape: torch.Size
    dtype: torch.dtype
    name: str                   # state-dict name
    source: TensorSource | torch.Tensor | None = None   # file-backed packs: the file, or an in-memory buffer
    quantizable: bool = False
    h_offset: int = 0           # in the host buffer (its stored form)
    h_nbytes: int = 0
    scale_offset: int = -1      # fp8 entries: float32 scale per row, in the host buffer
    keep: bool = False          # kept in fp8 on the device (values + scales in its device region)


def _keeps(entry: _Entry) -> bool:
    """Is this entry kept in fp8 on the device? (a weight of a Linear marked by memory.fp8.keep_on_device whose
    stored form fits its device region)"""
    return entry.quantizable and fp8.marked(entry.places[0].module) \
        and fp8.kept_fits(tuple(entry.shape), _align(entry.nbytes), ALIGN)


def _region(entry: _Entry, stored_fp8: bool) -> int:
    """The aligned bytes an entry takes in a buffer: its fp8 values and row scales, or its own bytes."""
    if stored_fp8:
        values, scales = fp8.stored_bytes(tuple(entry.shape))
        return _align(values) + _align(scales)
    return _align(entry.nbytes)


def _placeholder(entry: _Entry) -> torch.Tensor:
    """What a tensor with no host copy in its dtype points at between stages: its shape and dtype in one element
    (NaN for floats, so a model run outside a stage shows it instead of computing quietly)."""
    fill = float("nan") if entry.dtype.is_floating_point else 0
    return torch.full((), fill, dtype=entry.dtype).expand(entry.shape)


def _register(t: torch.Tensor) -> bool:
    """Page-lock the exact bytes of `t` (cudaHostRegister; hipHostRegister on ROCm). False if refused."""
    try:
        err = torch.cuda.cudart().cudaHostRegister(t.data_ptr(), t.numel() * t.element_size(), 0)
    except (RuntimeError, AttributeError) as e:
        log.warning("cudaHostRegister unavailable (%s)", e)
        return False
    return int(getattr(err, "value", err)) == 0


def _unregister(ptrs) -> None:
    for ptr in list(ptrs):
        try:
            torch.cuda.cudart().cudaHostUnregister(ptr)
        except (RuntimeError, AttributeError):   # interpreter shutting down, or no CUDA any more
            pass
    ptrs.clear()


class Chunk:
    """The tensors of one block (or of the rest of a model) and their one host home."""

    def __init__(self, name: str, modules: list[nn.Module], skip: set[int], prefixes: dict[int, str],
                 files: WeightFiles | None, registry: set[int]):
        self.name = name
        self.files = files
        self.entries: list[_Entry] = []
        self._registry = registry
        self._pinned_ptr: int | None = None
        self.fp8 = False
        self.deltas: dict = {}      # entry index -> memory.deltas.WeightDelta, merged into every device copy
        self.host: torch.Tensor | None = None
        self.pinned = False
        seen: dict[int, _Entry] = {}
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
                    name_ = f"{prefixes[id(module)]}.{key}".lstrip(".")
                    entry = _Entry([place], 0, n, tensor.shape, tensor.dtype, name_,
                                   quantizable=fp8.quantizable(module, key, tensor))
                    entry.keep = _keeps(entry)
                    seen[id(tensor)] = entry
                    self.entries.append(entry)
        self.ids = set(seen)
        self.nbytes = self._device_layout()
        if files is None:                                       # in memory: copy into one flat buffer
            self.home = "ram"
            self.host_nbytes = self._layout(False)
            self.host = torch.empty(self.host_nbytes, dtype=torch.uint8)
            for entry in self.entries:
                current = self._current(entry.places[0])
                if self.is_fp8(entry):
                    fp8.quantize_into(self._host_view(entry), self.scale_view(self.host, entry), current)
                else:
                    self._host_view(entry).copy_(current)
        else:                                                   # file-backed: nothing read yet
            self.home = "file"
            for entry in self.entries:
                entry.source = files.tensors.get(entry.name)
                if entry.source is None:                       # a buffer the model computes (not saved)
                    entry.source = self._current(entry.places[0]).detach()
            self.host_nbytes = self._layout(False)
        self._refresh_idle()
        self.bind_idle()                                        # the originals are freed here

    # ---- layout and views ---------------------------------------------------------------------------------------
    def _device_layout(self) -> int:
        """Offsets of every entry in the device layout; returns its size. A weight kept in fp8 takes its stored
        form's bytes (the values, then the row scales, as in the host layout), not its bf16 region's: the whole
        full-size transformer then takes ~12.5 GB on the device instead of 24, so fewer blocks are streamed under
        a cap, and a chunk whose host buffer holds nothing else in fp8 is copied to the device as it is."""
        off = 0
        for e in self.entries:
            e.offset = off
            off += _region(e, e.keep)
        return off

    @property
    def copies_as_stored(self) -> bool:
        """Is the device layout the host buffer's, byte for byte? (True unless fp8 storage rounds weights that the
        device holds in the model's dtype: those are turned back on the device, `memory.chunkload.finish_stored`)"""
        return not any(self.is_fp8(e) and not e.keep for e in self.entries)

    def _layout(self, quantized: bool) -> int:
        """Offsets of every entry in the host buffer for plain or fp8 storage; returns its size."""
        off = 0
        for e in self.entries:
            e.h_offset = off
            if self._stored_fp8(e, quantized):
                values, scales = fp8.stored_bytes(tuple(e.shape))
                e.h_nbytes = values
                e.scale_offset = off + _align(values)
                off = e.scale_offset + _align(scales)
            else:
                e.h_nbytes, e.scale_offset = e.nbytes, -1
                off += _align(e.nbytes)
        return off

    def stored_nbytes(self, quantized: bool) -> int:
        """Bytes of the host buffer in plain or fp8 form (without changing anything)."""
        return sum(_region(e, self._stored_fp8(e, quantized)) for e in self.entries)

    @property
    def file_bytes(self) -> int:
        """Bytes read from the weight files to load this chunk once (0 for chunks without files)."""
        return sum(e.source.nbytes for e in self.entries if isinstance(e.source, TensorSource))

    @staticmethod
    def _stored_fp8(entry: _Entry, quantized: bool) -> bool:
        return entry.keep or (quantized and entry.quantizable)

    def is_fp8(self, entry: _Entry) -> bool:
        """Is this entry stored in fp8 on the host now?"""
        return self._stored_fp8(entry, self.fp8)

    @property
    def stores_fp8(self) -> bool:
        """Does the host buffer hold anything in fp8 (fp8 storage, or weights kept in fp8 on the device)?"""
        return self.fp8 or any(e.keep for e in self.entries)

    @staticmethod
    def _current(place: _Place) -> torch.Tensor:
        table = place.module._parameters if place.is_param else place.module._buffers
        return table[place.name].data

    @staticmethod
    def _view(flat: torch.Tensor, entry: _Entry) -> torch.Tensor | fp8.Kept:
        if entry.keep:                  # the stored form: values, then (aligned) the row scales
            values, scales = fp8.stored_bytes(tuple(entry.shape))
            at = entry.offset + _align(values)
            return fp8.Kept(flat[entry.offset:entry.offset + values].view(fp8.FP8).view(entry.shape),
                            flat[at:at + scales].view(torch.float32))
        return flat[entry.offset:entry.offset + entry.nbytes].view(entry.dtype).view(entry.shape)

    def _host_view(self, entry: _Entry, host: torch.Tensor | None = None) -> torch.Tensor:
        host = self.host if host is None else host
        assert host is not None                         # (a chunk with a host copy)
        raw = host[entry.h_offset:entry.h_offset + entry.h_nbytes]
        return raw.view(fp8.FP8 if self.is_fp8(entry) else entry.dtype).view(entry.shape)

    def scale_view(self, flat: torch.Tensor, entry: _Entry) -> torch.Tensor:
        return flat[entry.scale_offset:entry.scale_offset + 4 * entry.shape[0]].view(torch.float32)

    def stored_views(self, flat: torch.Tensor, entry: _Entry) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(values, scales or None) of an entry in a buffer laid out like the host buffer (a device staging copy)."""
        values = flat[entry.h_offset:entry.h_offset + entry.h_nbytes]
        if self.is_fp8(entry):
            return values.view(fp8.FP8).view(entry.shape), self.scale_view(flat, entry)
        return values.view(entry.dtype).view(entry.shape), None

    def views(self, flat: torch.Tensor) -> list[torch.Tensor | fp8.Kept]:
        """One view of `flat` (device layout) per tensor (made once per buffer: binding is then pointer swaps);
        a kept fp8 weight's is a `memory.fp8.Kept` (values, scales)."""
        return [self._view(flat, entry) for entry in self.entries]

    def _idle_view(self, entry: _Entry) -> torch.Tensor:
        if self.home == "ram" and not self.is_fp8(entry):
            return self._host_view(entry)
        src = entry.source
        if isinstance(src, torch.Tensor):
            return src
        if self.home == "file" and src is not None and src.dtype == entry.dtype and not self.is_fp8(entry):
            return src.file.view(src)
        return _placeholder(entry)

    def _refresh_idle(self) -> None:
        self.host_views = [self._idle_view(e) for e in self.entries]

    # ---- binding ------------------------------------------------------------------------------------------------
    def bind(self, flat: torch.Tensor) -> None:
        """Point every tensor of the chunk at its view of `flat` (a device copy in the device layout)."""
        self.bind_views(self.views(flat))

    def bind_idle(self) -> None:
        self.bind_views(self.host_views)

    def bind_views(self, views: list[torch.Tensor | fp8.Kept]) -> None:
        for entry, view in zip(self.entries, views):
            fresh = None
            if entry.keep:              # the fp8 values in the Parameter, their scales beside it (None: not fp8)
                scales = view.scales if isinstance(view, fp8.Kept) else None
                view = view.values if isinstance(view, fp8.Kept) else view
                for place in entry.places:
                    place.module._buffers[fp8.SCALE] = scales
            for place in entry.places:
                if not place.is_param:
                    place.module._buffers[place.name] = view
                    continue
                param = place.module._parameters[place.name]
                if param.device.type == "meta":       # a model built empty: real Parameters once, shared as tied
                    fresh = fresh if fresh is not None else nn.Parameter(view, requires_grad=False)
                    place.module._parameters[place.name] = fresh
                else:
                    param.data = view

    def is_idle(self) -> bool:
        """Are all tensors pointing at their idle views (nothing moved them behind the pack's back)?"""
        for entry, view in zip(self.entries, self.host_views):
            cur = self._current(entry.places[0])
            if view.numel() and (cur.data_ptr() != view.data_ptr() or cur.device != view.device):
                return False
        return True

    def device_tensors(self) -> list[str]:
        """Names of tensors of the chunk that are on a device (must be none after a stage)."""
        return [f"{self.name}:{e.places[0].name}" for e in self.entries
                if self._current(e.places[0]).device.type not in ("cpu", "meta")]

    # ---- homes --------------------------------------------------------------------------------------------------
    def value(self, entry: _Entry) -> torch.Tensor:
        """The entry's weight in the model's dtype on the CPU, from wherever it lives now (may be a temporary)."""
        if self.home == "ram":
            if self.is_fp8(entry):
                out = torch.empty(entry.shape, dtype=entry.dtype)
                fp8.dequantize_into(out, self._host_view(entry), self.scale_view(self.host, entry))
                return out
            return self._host_view(entry)
        src = entry.source
        if isinstance(src, torch.Tensor):
            return src
        assert src is not None                          # (a file-backed entry has its source)
        value = src.file.view(src)
        value = value if value.dtype == entry.dtype else value.to(entry.dtype)
        return fp8.round_trip(value) if self.is_fp8(entry) else value

    def stored_value(self, entry: _Entry) -> tuple[torch.Tensor, torch.Tensor]:
        """An fp8-stored entry's (values, scales) on the CPU: the host copy's, or quantized from the files."""
        if self.home == "ram":
            values, scales = self.stored_views(self.host, entry)
            return values, scales
        return fp8.quantize(self._file_value(entry))

    def to_ram(self, quantized: bool, device: torch.device | None = None) -> int:
        """Give the chunk a host buffer (plain or fp8) filled from where its values are now; returns the bytes
        read from the weight files. A pinned chunk stays pinned."""
        if self.home == "ram" and self.fp8 == quantized:
            return 0
        if self.home == "ram" and self.fp8 and not quantized:
            raise ValueError(f"{self.name}: weights stored in fp8 have no files to return to full precision from; "
                             f"load the models again")
        return self._fill_host(quantized, device)

    def keep_marked(self, device: torch.device | None = None) -> bool:
        """Weights whose Linear was marked with memory.fp8.keep_on_device after this chunk was made become kept in
        fp8 (a host buffer is rebuilt; call between stages). Returns whether anything changed."""
        keep = [_keeps(e) for e in self.entries]
        if keep == [e.keep for e in self.entries]:
            return False
        values = [self.value(e) for e in self.entries] if self.home == "ram" else None   # with the old layout
        for e, k in zip(self.entries, keep):
            e.keep = k
        self.nbytes = self._device_layout()
        if values is None:
            self.host_nbytes = self._layout(self.fp8)
            self._refresh_idle()
            self.bind_idle()
        else:
            self._fill_host(self.fp8, device, values)
        return True

    def _fill_host(self, quantized: bool, device: torch.device | None, values: list | None = None) -> int:
        was_pinned = self.pinned
        if values is None and self.home == "ram":
            values = [self.value(e) for e in self.entries]                 # before the relayout
        size = self.stored_nbytes(quantized)
        host = torch.empty(size, dtype=torch.uint8)
        self._layout(quantized)
        read = 0
        for i, e in enumerate(self.entries):
            dst = host[e.h_offset:e.h_offset + e.h_nbytes]
            if self._stored_fp8(e, quantized):
                w = values[i] if values is not None else self._file_value(e)
                read += e.source.nbytes if values is None and isinstance(e.source, TensorSource) else 0
                fp8.quantize_into(dst.view(fp8.FP8).view(e.shape), self.scale_view(host, e), w, device)
            elif values is not None:
                dst.view(e.dtype).view(e.shape).copy_(values[i])
            else:
                read += self._fill_from_file(e, dst)
        del values
        self._release_pin()
        self.host, self.home, self.fp8, self.host_nbytes = host, "ram", quantized, size
        self._refresh_idle()
        self.bind_idle()
        if was_pinned:
            self.set_pinned(True)
        return read

    def _file_value(self, e: _Entry) -> torch.Tensor:
        src = e.source
        if isinstance(src, torch.Tensor):
            return src
        assert src is not None                          # (a file-backed entry has its source)
        v = src.file.view(src)
        return v if v.dtype == e.dtype else v.to(e.dtype)

    def _fill_from_file(self, e: _Entry, dst: torch.Tensor) -> int:
        src = e.source
        if isinstance(src, torch.Tensor):
            dst.view(e.dtype).view(e.shape).copy_(src)
            return 0
        assert src is not None                          # (a file-backed entry has its source)
        if src.dtype == e.dtype:
            src.file.read_into(dst, src.offset)          # pread: straight into the host buffer
        else:
            dst.view(e.dtype).view(e.shape).copy_(src.file.view(src))
        return src.nbytes

    def to_file(self) -> None:
        """Drop the host buffer: the values are read from the weight files again when needed."""
        if self.files is None:
            raise ValueError(f"{self.name}: this model has no weight files; its weights stay in RAM")
        if self.home == "file":
            return
        self._release_pin()
        self.host, self.home = None, "file"
        self.host_nbytes = self.stored_nbytes(self.fp8)
        self._layout(self.fp8)
        self._refresh_idle()
        self.bind_idle()

    def set_fp8(self, quantized: bool, device: torch.device | None = None) -> int:
        """Choose plain or fp8 storage; a file-homed chunk only remembers it (its device copies are rounded).
        Returns the bytes read from the weight files."""
        if self.home == "ram" and self.fp8 and not quantized and self.files is not None:
            pinned = self.pinned
            self.to_file()                               # fp8 cannot be undone: read the full values again
            self.fp8 = False
            read = self.to_ram(False, device)
            self.set_pinned(pinned)
            return read
        if self.home == "ram":
            return self.to_ram(quantized, device)
        self.fp8 = quantized
        self.host_nbytes = self._layout(quantized)
        self._refresh_idle()
        self.bind_idle()
        return 0

    def set_pinned(self, pinned: bool) -> None:
        pinned = pinned and torch.cuda.is_available()
        if self.home != "ram" or pinned == self.pinned or not self.host_nbytes:
            self.pinned = pinned and self.home == "ram"
            return
        assert self.host is not None                    # (a chunk in RAM has its host copy)
        if pinned:
            if _register(self.host):
                self._pinned_ptr = self.host.data_ptr()
                self._registry.add(self._pinned_ptr)
            else:                      # PyTorch's pinned allocator: a copy, rounded up to a power of two
                self.host = self.host.pin_memory()
                log.warning("%s: cudaHostRegister refused; pinned a copy with PyTorch's allocator instead "
                            "(%.2f GB of page-locked RAM for %.2f GB)", self.name,
                            2 ** (self.host_nbytes - 1).bit_length() / GIB, self.host_nbytes / GIB)
                self._refresh_idle()
                self.bind_idle()
        elif self._pinned_ptr is not None:
            self._release_pin()
        elif self.host.is_pinned():
            self.host = torch.empty_like(self.host, device="cpu").copy_(self.host)
            self._refresh_idle()
            self.bind_idle()
        self.pinned = pinned

    def _release_pin(self) -> None:
        """Unregister the host buffer (before it is dropped or replaced); an allocator-pinned copy just goes."""
        if self._pinned_ptr is not None:
            _unregister({self._pinned_ptr})
            self._registry.discard(self._pinned_ptr)
            self._pinned_ptr = None
        self.pinned = False

    def will_need(self) -> None:
        """Start reading this chunk's file ranges ahead (the next chunk's disk reads overlap this one's copies)."""
        for e in self.entries:
            if isinstance(e.source, TensorSource):
                e.source.file.will_need(e.source.offset, e.source.nbytes)

    def drop_pages(self, cache: bool) -> None:
        """Give back the file pages this chunk touched (and with `cache`, evict them from the page cache)."""
        for e in self.entries:
            if isinstance(e.source, TensorSource):
                e.source.file.drop(e.source.offset, e.source.nbytes, cache)
