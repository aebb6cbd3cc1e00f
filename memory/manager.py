"""The memory manager: an explicit budget and the single model slot (never a global).

Exactly one stage's models are on the GPU at a time. `stage()` loads them, yields, then unloads them completely,
trims the allocator (rocm.trim) and records a snapshot with a status line, so the load order and the memory at
every stage boundary can be read back (tests assert it; job.json keeps it).
"""
from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import torch

from configs.memory import MEMORY
from memory.snapshot import GB, MemorySnapshot, take_snapshot

log = logging.getLogger(__name__)


def default_device() -> torch.device:
    """The GPU when there is one (ROCm shows up as "cuda"), else the CPU."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


@dataclass
class StageRecord:
    name: str
    models: tuple[str, ...]
    started: float
    ended: float = 0.0
    load_s: float = 0.0
    unload_s: float = 0.0
    before: MemorySnapshot | None = None
    after: MemorySnapshot | None = None
    peak_allocated: int = 0
    peak_reserved: int = 0

    def as_dict(self) -> dict:
        return {"name": self.name, "models": list(self.models), "seconds": round(self.ended - self.started, 4),
                "load_s": round(self.load_s, 4), "unload_s": round(self.unload_s, 4),
                "peak_allocated": self.peak_allocated, "peak_reserved": self.peak_reserved,
                "host_rss_after": self.after.host_rss if self.after else None}


@dataclass
class MemoryManager:
    device: torch.device = field(default_factory=default_device)
    cap_gb: float = MEMORY.vram_cap_gb
    preserved_gb: float = MEMORY.preserved_gb
    pin_host_memory: bool = MEMORY.pin_host_memory
    records: list[StageRecord] = field(default_factory=list)
    timeline: list[MemorySnapshot] = field(default_factory=list)
    _loaded: dict[str, torch.nn.Module] = field(default_factory=dict)

    def __post_init__(self):
        self.device = torch.device(self.device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.apply_cap()

    # ---- budget -------------------------------------------------------------------------------------------------
    @property
    def cap_bytes(self) -> int | None:
        return int(self.cap_gb * GB) if self.device.type == "cuda" else None

    def apply_cap(self) -> None:
        """Enforce the cap: past it, an allocation raises out-of-memory instead of growing (CUDA and ROCm)."""
        if self.device.type != "cuda":
            return
        total = torch.cuda.get_device_properties(self.device).total_memory
        fraction = min(1.0, self.cap_gb * GB / total)
        torch.cuda.set_per_process_memory_fraction(fraction, self.device)
        log.info("VRAM cap %.1f GB (%.0f%% of %.1f GB)", self.cap_gb, 100 * fraction, total / GB)

    # ---- the slot -----------------------------------------------------------------------------------------------
    def snapshot(self, label: str) -> MemorySnapshot:
        snap = take_snapshot(label, self.device, self.cap_bytes)
        self.timeline.append(snap)
        return snap

    def loaded(self) -> list[str]:
        return list(self._loaded)

    def _move(self, modules: dict[str, torch.nn.Module], device: torch.device) -> float:
        t0 = time.perf_counter()
        for module in modules.values():
            module.to(device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0

    @contextmanager
    def stage(self, name: str, **models: torch.nn.Module) -> Iterator[StageRecord]:
        """Load `models` into the slot (which must be empty), yield, unload them all, trim, snapshot."""
        if self._loaded:
            raise RuntimeError(f"stage {name!r}: the slot still holds {', '.join(self._loaded)}")
        import rocm

        record = StageRecord(name, tuple(models), time.monotonic())
        record.before = self.snapshot(f"before {name}")
        log.info(record.before.status_line())
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self._loaded = dict(models)
        try:
            record.load_s = self._move(self._loaded, self.device)
            yield record
        finally:
            if self.device.type == "cuda":
                record.peak_allocated = torch.cuda.max_memory_allocated(self.device)
                record.peak_reserved = torch.cuda.max_memory_reserved(self.device)
            record.unload_s = self._move(self._loaded, torch.device("cpu"))
            self._loaded = {}
            rocm.trim(f"after {name}")
            record.after = self.snapshot(f"after {name}")
            record.ended = time.monotonic()
            self.records.append(record)
            log.info(record.after.status_line())

    def decode_vae(self, vae, latents: torch.Tensor) -> torch.Tensor:
        """Decode (B, C, T, H, W) latents (already divided by the scaling factor) to pixels in [-1, 1]."""
        return vae.decode(latents).sample

    def load_order(self) -> list[str]:
        return [r.name for r in self.records]

    def summary(self) -> dict:
        peaks = [r.peak_reserved for r in self.records] or [0]
        return {"device": str(self.device), "cap_gb": self.cap_gb if self.device.type == "cuda" else None,
                "preserved_gb": self.preserved_gb, "peak_reserved": max(peaks),
                "peak_allocated": max([r.peak_allocated for r in self.records] or [0]),
                "stages": [r.as_dict() for r in self.records]}
