"""A job's weights in host RAM: from host packs to the host plan's inputs, the plan made, and the packs moved to
where it says (memory/hostplan.py makes the plan, memory/hostbudget.py says the budget, memory/hostpack.py holds
the chunks; memory/manager.py calls `arrange` once per job, before the first stage).

`model_host` describes one model for the planner: its chunks' stored sizes, the bytes read from its files, which
chunks its stage streams (they need pinned RAM while it runs) and what a file-homed chunk costs in RAM while its
stage runs. `realize` moves chunks: first the ones leaving RAM (so the peak while re-arranging stays low), then the
storage changes (fp8 or not), then the ones coming in (read from the files straight into their host buffers, whose
page-cache copies are then evicted: the RAM copy is the one that counts).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from common.units import GIB
from configs.memory import MEMORY
from memory.budget import MemoryBudget
from memory.hostbudget import default_host_budget, job_working_bytes, process_overhead
from memory.hostpack import HostPack
from memory.hostplan import HostPlan, ModelHost, StageUse, plan_host

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HostSettings:
    """What a job's host arrangement depends on (a MemoryManager's fields)."""
    device: torch.device
    pin: bool                           # page-locked host copies (a GPU, pinning on)
    host_ram_gb: float | None           # None: what this machine can spare
    weight_storage: str                 # "native" or "fp8"
    host_overhead: int | None           # bytes the process holds besides the weights; None: estimated per job


def pack_for(model: torch.nn.Module, pin: bool, device_type: str) -> HostPack:
    """The model's host pack, pinned or not as `pin` says."""
    pack = HostPack.of(model)
    if pack.pinned != pin and any(c.home == "ram" for c in pack.chunks):
        if not pin and device_type == "cuda":
            log.info("host memory pinning is off: host→device copies are pageable (several times slower)")
        pack.set_pinned(pin)
    return pack


def host_budget(host_ram_gb: float | None) -> tuple[int, str]:
    """(bytes, explanation) of the host-RAM budget."""
    if host_ram_gb is None:
        return default_host_budget()
    return int(host_ram_gb * GIB), f"host RAM budget {host_ram_gb:g} GB (--host-ram-gb)"


def arrange(models: dict[str, torch.nn.Module], stages, sections: int, frames: int, settings: HostSettings,
            vram: MemoryBudget) -> tuple[HostPlan, int, float]:
    """Plan where the weights of a job's models live on the host and put them there: (plan, bytes read, seconds).
    Raises memory.hostplan.HostBudgetError (naming the minimum) before reading any weight if the budget cannot
    work."""
    if settings.weight_storage not in ("native", "fp8"):
        raise ValueError(f"weight storage: {settings.weight_storage!r} is not 'native' or 'fp8'")
    device = settings.device
    packs = {k: HostPack.of(m) for k, m in models.items()}
    quantized = {k: settings.weight_storage == "fp8" and p.can_quantize() for k, p in packs.items()}
    streamed: dict[str, set[int]] = {k: set() for k in models}
    for s in stages:
        names = [k for k in s.models if k in models]
        for k, p in vram.place({k: models[k] for k in names}, {k: packs[k] for k in names}).items():
            streamed[k] |= set(p.streamed)
    hosts = [model_host(k, packs[k], streamed[k], device.type, quantized[k]) for k in models]
    budget, why = host_budget(settings.host_ram_gb)
    w = vram.workload
    overhead = settings.host_overhead
    if overhead is None:
        overhead = (process_overhead(sum(p.host_bytes for p in packs.values()), device.type == "cuda")
                    + job_working_bytes(frames, w.height, w.width, w.window)
                    + (2 * MEMORY.staging_mb << 20 if device.type == "cuda" else 0))
    used: list[StageUse] = [s for s in stages if any(k in models for k in s.models)]
    plan = plan_host(hosts, used, sections, budget, overhead, int(MEMORY.host_reserve_gb * GIB), settings.pin,
                     gpu=device.type == "cuda")
    read, seconds = realize(plan, packs, quantized, settings.pin, device)
    log.info("%s", why)
    log.info("host RAM plan: %s", plan.describe())
    return plan, read, seconds



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
