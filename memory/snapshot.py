"""Memory snapshots: device and host figures at a moment, and the status line the log shows per stage."""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass

import torch

from common.units import GIB


def host_rss_bytes() -> int:
    import psutil

    return psutil.Process(os.getpid()).memory_info().rss


@dataclass(frozen=True)
class MemorySnapshot:
    label: str
    time: float                  # time.monotonic()
    device: str
    allocated: int               # bytes held by live tensors (PyTorch's allocator)
    reserved: int                # bytes cached by the allocator
    peak_allocated: int
    peak_reserved: int
    free: int | None             # device memory not yet reserved, within the cap (None on CPU)
    cap: int | None              # the VRAM cap in bytes (None on CPU)
    host_rss: int
    loaded: tuple[str, ...] = ()     # the models in the slot at this moment

    def status_line(self) -> str:
        if self.free is None:
            return (f"[{self.label}] CPU run: no GPU memory in use | host RSS {self.host_rss / GIB:.2f} GB")
        pct = f" ({100 * self.allocated / self.cap:.0f}% of cap)" if self.cap else ""
        return (f"[{self.label}] free {self.free / GIB:.2f} GB | allocated {self.allocated / GIB:.2f} GB{pct} | "
                f"reserved {self.reserved / GIB:.2f} GB | host RSS {self.host_rss / GIB:.2f} GB")

    def as_dict(self) -> dict:
        return asdict(self)


def take_snapshot(label: str, device: torch.device, cap_bytes: int | None,
                  loaded: tuple[str, ...] = ()) -> MemorySnapshot:
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        reserved = torch.cuda.memory_reserved(device)
        if cap_bytes is not None:          # what this process may still take: the driver's free, within the cap
            free = max(0, min(free, cap_bytes - reserved))
        return MemorySnapshot(label, time.monotonic(), str(device), torch.cuda.memory_allocated(device), reserved,
                              torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device), free,
                              cap_bytes, host_rss_bytes(), loaded)
    return MemorySnapshot(label, time.monotonic(), str(device), 0, 0, 0, 0, None, None, host_rss_bytes(), loaded)
