"""The memory manager: an explicit budget and the single model slot (never a global).

Exactly one stage's models are on the GPU at a time. `stage()` loads them (whole, or resident part + streamed
blocks per the budget's plan), runs the body with attention guarded against the math kernel, then unloads them
completely (asserting that no tensor of theirs is left on the device), trims the allocator (rocm.trim) and records
a snapshot with a status line, so the load order and the memory at every stage boundary can be read back (tests
assert it; job.json keeps it). Weights live in one host pack per model (memory/hostpack.py): loading is one
pinned copy per chunk (or a read from the weight files), unloading copies nothing back.

Host RAM has its own budget (`host_ram_gb`): `arrange_host()` (once per job, before the first stage) makes the
host plan (memory/hostplan.py: which chunks stay in RAM, which are read from the files when needed) and moves the
chunks there; a budget too small for any plan is refused then, before any weight is read. After a stage, the file
pages its models touched are given back (and evicted from the page cache for models used once per job).

Under such a budget the transformer's resident blocks whose home is the files are read while its first step runs
(memory/lateload.py) and, when its stage ends, parked on the device (memory/parking.py): the VAE decode between two
transformer stages runs beside them (`stage(..., beside_parked=True)`) and releases what its tiles need; any other
stage releases them first, as does `release_parked()` at the job's end.
"""
from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import torch

import rocm
from common.units import GIB
from configs.memory import MEMORY
from memory.budget import DEFAULT_PREFETCH_DEPTH, MemoryBudget, Placement, Workload, is_transformer
from memory.chunkload import Staging, load_chunks, unload_chunks
from memory.device import default_device  # noqa: F401  (one place: memory/device.py; callers import it from here)
from memory.hostpack import HostPack
from memory.hostplan import HostPlan, StageUse
from memory.hostram import HostSettings, arrange, host_budget, pack_for
from memory.lateload import LateLoader
from memory.parking import ParkedBlocks
from memory.snapshot import MemorySnapshot, host_rss_bytes, take_snapshot
from memory.streaming import BlockStreamer
from memory.vae import VaeDecodePolicy, cudnn_workspace_reserve, miopen_scratch_limit, streamed_decode
from rocm.allocator import synchronize
from rocm.conv_fallback import ConvFallback, new_conv_fallback
from rocm.sdpa import AttentionGuard

log = logging.getLogger(__name__)


@dataclass
class StageRecord:
    name: str
    models: tuple[str, ...]
    started: float
    ended: float = 0.0
    pin_s: float = 0.0                 # one-time packing/pinning of models seen for the first time
    load_s: float = 0.0
    unload_s: float = 0.0
    before: MemorySnapshot | None = None
    after: MemorySnapshot | None = None
    peak_allocated: int = 0
    peak_reserved: int = 0
    placement: dict[str, str] = field(default_factory=dict)
    streamed_bytes_per_pass: int = 0
    stream_misses: int = 0
    attention: dict[str, str] = field(default_factory=dict)
    vae_attempts: list[dict] = field(default_factory=list)
    leftover_bytes: int = 0            # allocated after − before (tensors the caller still holds, e.g. outputs)
    file_bytes: int = 0                # read from the weight files in this stage (chunks not kept in RAM)
    host_transient_bytes: int = 0      # host RAM given to streamed chunks from the files for this stage only
    parked_bytes: int = 0              # file-homed blocks bound from the park instead of read (memory/parking.py)

    def as_dict(self) -> dict:
        return {"name": self.name, "models": list(self.models), "seconds": round(self.ended - self.started, 4),
                "pin_s": round(self.pin_s, 4), "load_s": round(self.load_s, 4), "unload_s": round(self.unload_s, 4),
                "peak_allocated": self.peak_allocated, "peak_reserved": self.peak_reserved,
                "placement": self.placement, "streamed_bytes_per_pass": self.streamed_bytes_per_pass,
                "stream_misses": self.stream_misses, "attention": self.attention, "vae_attempts": self.vae_attempts,
                "leftover_bytes": self.leftover_bytes, "file_bytes": self.file_bytes,
                "host_transient_bytes": self.host_transient_bytes, "parked_bytes": self.parked_bytes,
                "host_rss_before": self.before.host_rss if self.before else None,
                "host_rss_after": self.after.host_rss if self.after else None}


@dataclass
class MemoryManager:
    device: torch.device = field(default_factory=default_device)
    cap_gb: float = MEMORY.vram_cap_gb
    preserved_gb: float = MEMORY.preserved_gb
    pin_host_memory: bool = MEMORY.pin_host_memory
    records: list[StageRecord] = field(default_factory=list)
    timeline: list[MemorySnapshot] = field(default_factory=list)
    prefetch_depth: int = DEFAULT_PREFETCH_DEPTH
    workload: Workload = field(default_factory=Workload)
    plan_on_cpu: bool = False          # apply the cap's plan on a CPU run too (tests: streaming without a GPU)
    vae_policy: VaeDecodePolicy = field(default_factory=VaeDecodePolicy)
    host_ram_gb: float | None = MEMORY.host_ram_gb      # None: what this machine can spare (hostbudget.py)
    weight_storage: str = MEMORY.weight_storage         # "native" or "fp8" (transformer and Llama in host RAM)
    host_overhead: int | None = None      # bytes the process holds besides the weights; None: measured per job
    late_load: bool = MEMORY.late_load    # file-homed resident blocks read while the stage computes (lateload.py)
    park: bool = MEMORY.park_file_blocks  # and kept on the GPU between transformer stages where room (parking.py)
    direct_io: bool = MEMORY.direct_io    # weight files read to the GPU with O_DIRECT (weightfiles.py)
    # The tiered convolution fallback of this manager's stages (rocm/), passed explicitly to the VAE decode and
    # used by the orchestrator around its conv stages; one per manager, never looked up from a module global.
    conv_fallback: ConvFallback = field(default_factory=new_conv_fallback)
    host_plan: HostPlan | None = None
    arrange_s: float = 0.0
    arrange_read: int = 0
    _loaded: dict[str, torch.nn.Module] = field(default_factory=dict)
    _current: StageRecord | None = None
    _live: tuple | None = None          # (placements, held, packs) of the stage in progress
    _staging: Staging | None = None
    _parked: ParkedBlocks = field(default_factory=ParkedBlocks)
    _park_source: tuple | None = None   # (placement, [(chunk, buffer)]) of the stage whose file blocks may park

    def __post_init__(self):
        self.device = torch.device(self.device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        if self.device.type == "cuda" and torch.version.hip is not None:
            if self.vae_policy.scratch_limit is None:
                self.vae_policy.scratch_limit = miopen_scratch_limit(rocm.detect_runtime(self.device))
        elif not self.vae_policy.workspace_reserve:
            self.vae_policy.workspace_reserve = cudnn_workspace_reserve(self.device)
        if self.vae_policy.streamed is None:
            for name, value in streamed_decode(self.device).items():
                setattr(self.vae_policy, name, value)
        self.cap_applied = False

    # ---- budget -------------------------------------------------------------------------------------------------
    @property
    def cap_bytes(self) -> int | None:
        return int(self.cap_gb * GIB) if self.device.type == "cuda" else None

    @property
    def budget(self) -> MemoryBudget:
        cap = self.cap_bytes if self.cap_bytes is not None or not self.plan_on_cpu else int(self.cap_gb * GIB)
        return MemoryBudget(cap, int(self.preserved_gb * GIB), self.prefetch_depth, self.workload)

    def set_workload(self, height: int, width: int, window: int, processes: int = 1) -> None:
        """The bucket and latent window of the job (the plan's activation estimate uses them); `processes`: the GPUs
        its tokens are split over (a split job's share needs fewer activations: memory/plan.py)."""
        self.workload = Workload(height, width, window, processes)

    def apply_cap(self) -> None:
        """Enforce the cap: past it, an allocation raises out-of-memory instead of growing (CUDA and ROCm).
        An explicit call (the orchestrator makes it when a job starts), not a side effect of building a manager:
        it sets a process-wide limit of the device."""
        if self.device.type != "cuda":
            return
        total = torch.cuda.get_device_properties(self.device).total_memory
        fraction = min(1.0, self.cap_gb * GIB / total)
        torch.cuda.set_per_process_memory_fraction(fraction, self.device)
        self.cap_applied = True
        log.info("VRAM cap %.1f GB (%.0f%% of %.1f GB)", self.cap_gb, 100 * fraction, total / GIB)

    # ---- the slot -----------------------------------------------------------------------------------------------
    def snapshot(self, label: str) -> MemorySnapshot:
        snap = take_snapshot(label, self.device, self.cap_bytes, tuple(self._loaded))
        self.timeline.append(snap)
        return snap

    def loaded(self) -> list[str]:
        return list(self._loaded)

    def _load(self, placements: dict[str, Placement], held: list, record: StageRecord) -> None:
        """Resident chunks to device buffers, streamers attached; `held` collects both as it goes (so a failure
        halfway is unloaded completely). Streamed chunks whose home is the files get RAM for the stage."""
        buffers, streamers, transient = held
        late: list[LateLoader] = []
        if self.device.type == "cuda" and self._staging is None:
            self._staging = Staging(self.device, direct=self.direct_io)
        for p in placements.values():
            modules, chunks = p.streamed_modules()
            for c in chunks:
                if c.home == "file":
                    transient.append(c)
                    record.file_bytes += c.to_ram(c.fp8, self.device)
                    record.host_transient_bytes += c.host_nbytes
                    c.set_pinned(self.pin)
            resident = p.resident_chunks()
            unparked = self._unpark(p, resident, record) if self._parked.model == p.name else []
            kept = {id(c) for c, _ in unparked}
            buffers += [b for _, b in unparked]
            record.file_bytes += sum(c.file_bytes for c in resident if c.home == "file" and id(c) not in kept)
            late_modules, late_chunks = self._late(p, kept)
            later = kept | {id(c) for c in late_chunks}
            todo = [c for c in resident if id(c) not in later]
            loaded = load_chunks(todo, self.device, staging=self._staging, aligned=True)
            buffers += [b for b in loaded if b is not None]
            if self._parks(p):
                self._park_source = (p, unparked + [(c, b) for c, b in zip(todo, loaded)
                                                    if c.home == "file" and b is not None])
            if p.streamed:
                streamer = BlockStreamer(modules, chunks, self.device, self.prefetch_depth)
                streamers.append(streamer)
                streamer.attach()
            if late_chunks:
                late.append(LateLoader(late_modules, late_chunks, self.device, self._staging))
        synchronize(self.device)
        for loader in late:                    # read while the stage computes (memory/lateload.py)
            streamers.append(loader)
            loader.attach()

    def _late(self, p: Placement, parked: set[int]) -> tuple[list, list]:
        """The transformer's resident blocks whose home is the files (block 0 excepted: TeaCache reads it
        before the blocks run; parked ones too), with their modules, when they are loaded while the stage computes."""
        if not self.late_load or not is_transformer(self._loaded.get(p.name)) \
                or not (self.device.type == "cuda" or self.plan_on_cpu):
            return [], []
        streamed = set(p.streamed)
        pairs = [(p.pack.block_modules[i], c) for i, c in enumerate(p.pack.blocks)
                 if i and i not in streamed and c.home == "file" and id(c) not in parked]
        return [m for m, _ in pairs], [c for _, c in pairs]

    def _parks(self, p: Placement) -> bool:
        """Are this placement's file-homed resident blocks kept on the device after its stage (memory/parking.py)?"""
        return self.park and is_transformer(self._loaded.get(p.name)) \
            and (self.device.type == "cuda" or self.plan_on_cpu)

    def _unpark(self, p: Placement, resident: list, record: StageRecord) -> list[tuple]:
        """Bind the parked buffers of this placement's resident chunks; release the rest of the park."""
        out = []
        for c in resident:
            buf = self._parked.take(c)
            if buf is not None:
                c.bind(buf)
                out.append((c, buf))
                record.parked_bytes += c.file_bytes
        self._parked.release("not resident in this plan")
        return out

    def release_parked(self, why: str = "") -> int:
        """Drop the parked blocks (the job's end; memory/parking.py)."""
        return self._parked.release(why)

    def _unload(self, placements: dict[str, Placement], held: list, record: StageRecord) -> list[str]:
        buffers, streamers, transient = held
        synchronize(self.device)
        source, self._park_source = self._park_source, None
        for s in streamers:
            record.stream_misses += s.misses
            done = s.detach()
            if source is not None and isinstance(s, LateLoader):
                source[1].extend(done)
        if source is not None:
            index = {id(c): i for i, c in enumerate(source[0].pack.chunks)}
            self._parked.park(source[0].name, [(index[id(c)] - 1, c, b) for c, b in source[1]])
        for p in placements.values():
            unload_chunks(p.pack.chunks)
        for c in transient:
            c.to_file()
            c.drop_pages(cache=True)
        buffers.clear()
        streamers.clear()
        transient.clear()
        if self.device.type == "cpu":
            return []
        return [f"{name}/{t}" for name, p in placements.items() for t in p.pack.device_tensors()]

    def _give_back_pages(self, packs: dict[str, HostPack]) -> None:
        """File pages the stage touched go back; a model used once per job is evicted from the page cache too."""
        for name, pack in packs.items():
            if pack.files is None:
                continue
            once = self.host_plan is not None and self.host_plan.uses(name) <= 1
            for c in pack.chunks:
                if c.home == "file":
                    c.drop_pages(cache=once)

    @contextmanager
    def stage(self, name: str, *, beside_parked: bool = False, **models: torch.nn.Module) -> Iterator[StageRecord]:
        """Load `models` into the slot (which must be empty), yield, unload them all, trim, snapshot.
        Parked blocks (memory/parking.py) are released first unless the stage loads their model or runs
        `beside_parked` (the VAE decode, which makes room for its own tiles in decode_vae)."""
        if self._loaded:
            raise RuntimeError(f"stage {name!r}: the slot still holds {', '.join(self._loaded)}")

        if self._parked and self._parked.model not in models and not beside_parked:
            self._parked.release(f"before {name}")

        record = StageRecord(name, tuple(models), time.monotonic())
        record.before = self.snapshot(f"before {name}")
        log.info(record.before.status_line())
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        t0 = time.perf_counter()
        packs = {k: self._pack(m) for k, m in models.items()}
        record.pin_s = time.perf_counter() - t0
        placements = self.budget.place(models, packs)
        record.placement = {k: p.describe() for k, p in placements.items()}
        record.streamed_bytes_per_pass = sum(c.nbytes for p in placements.values() for c in p.streamed_modules()[1])
        self._loaded, self._current = dict(models), record
        held: list = [[], [], []]
        self._live = (placements, held, packs)
        leftovers: list[str] = []
        try:
            t0 = time.perf_counter()
            self._load(placements, held, record)
            record.load_s = time.perf_counter() - t0
            log.info(self.snapshot(f"in {name}").status_line())
            with AttentionGuard(self.device, self._attention_budget(), label=name) as guard:
                yield record
            record.attention = dict(guard.choices)
        finally:
            if self.device.type == "cuda":
                record.peak_allocated = torch.cuda.max_memory_allocated(self.device)
                record.peak_reserved = torch.cuda.max_memory_reserved(self.device)
            t0 = time.perf_counter()
            placements = self._live[0]            # stream_more() may have re-placed the models
            leftovers = self._unload(placements, held, record)
            self._give_back_pages(packs)
            record.unload_s = time.perf_counter() - t0
            self._loaded, self._current, self._live = {}, None, None
            rocm.trim(f"after {name}")
            record.after = self.snapshot(f"after {name}")
            record.leftover_bytes = record.after.allocated - record.before.allocated
            record.ended = time.monotonic()
            self.records.append(record)
            log.info(record.after.status_line())
        if leftovers:
            raise RuntimeError(f"stage {name!r}: tensors left on {self.device} after unloading: "
                               f"{', '.join(leftovers[:5])}")

    def stream_more(self) -> bool:
        """After an out-of-memory inside a stage: keep fewer weights resident (more preserved memory), reload, and
        say whether that changed anything (False: everything is streamed already, nothing more to give).
        The larger preserved memory stays for the rest of the job."""
        if self._live is None or self._current is None:
            raise RuntimeError("stream_more() is only possible inside a stage")
        placements, held, packs = self._live
        before = sum(len(p.streamed) for p in placements.values())
        step = max(2.0, 0.25 * self.cap_gb)
        preserved = self.preserved_gb + step
        budget = MemoryBudget(self.budget.cap_bytes, int(preserved * GIB), self.prefetch_depth, self.workload)
        trial = budget.place(self._loaded, packs)
        if sum(len(p.streamed) for p in trial.values()) <= before:
            return False
        extra = sum(c.stored_nbytes(c.fp8) for p in trial.values() for c in p.streamed_modules()[1]
                    if c.home == "file")
        plan = self.host_plan
        if extra and plan is not None and plan.peak + extra + plan.reserve > plan.budget:
            log.warning("out of GPU memory in %s: streaming more would need %.1f GB more host RAM than the host "
                        "budget allows", self._current.name, extra / GIB)
            return False
        self._unload(placements, held, self._current)
        rocm.trim("before re-planning")
        log.warning("out of GPU memory in %s: preserved memory %.1f → %.1f GB, reloading with more weights "
                    "streamed", self._current.name, self.preserved_gb, preserved)
        self.preserved_gb = preserved
        self._current.placement = {k: p.describe() for k, p in trial.items()}
        self._live = (trial, held, packs)
        self._load(trial, held, self._current)
        return True

    def _attention_budget(self) -> int:
        """Bytes one chunk of the math attention fallback may use: a quarter of what the cap leaves, ≤ 1 GiB."""
        if self.device.type != "cuda":
            return 1 << 30
        free = self.cap_bytes - torch.cuda.memory_allocated(self.device)
        return int(min(1 << 30, max(64 << 20, free // 4)))

    def decode_vae(self, vae, latents: torch.Tensor) -> torch.Tensor:
        """Decode (B, C, T, H, W) latents (already divided by the scaling factor) to pixels in [-1, 1], in tiles
        chosen from what the cap leaves; smaller tiles on out-of-memory, then the rocm conv fallback."""
        if self.device.type == "cuda":
            available = self.cap_bytes - torch.cuda.memory_allocated(self.device) - (512 << 20)
        else:
            import psutil

            available = psutil.virtual_memory().available // 2
        if self._parked:          # the tiles chosen as if nothing were parked; parked blocks leave them their room
            available += self._parked.nbytes
            self._parked.fit(available - self.vae_policy.room(vae, tuple(latents.shape[2:]), max(0, available)))
        self.vae_policy.before_retry = lambda: self._parked.release("the VAE decode ran out of memory")
        try:
            return self.vae_policy.decode(vae, latents, max(0, available), conv=self.conv_fallback)
        finally:
            self.vae_policy.before_retry = None
            if self._current is not None:
                self._current.vae_attempts.extend(self.vae_policy.attempts)

    # ---- host RAM (memory/hostram.py) --------------------------------------------------------------------------
    def prepare(self, **models: torch.nn.Module) -> float:
        """Pack (and pin, if enabled) models ahead of the first job; returns the seconds it took."""
        t0 = time.perf_counter()
        for model in models.values():
            self._pack(model)
        return time.perf_counter() - t0

    @property
    def pin(self) -> bool:
        return self.pin_host_memory and self.device.type == "cuda"

    def _pack(self, model: torch.nn.Module) -> HostPack:
        return pack_for(model, self.pin, self.device.type)

    def host_budget(self) -> tuple[int, str]:
        """(bytes, explanation) of the host-RAM budget."""
        return host_budget(self.host_ram_gb)

    def arrange_host(self, models: dict[str, torch.nn.Module], stages: list[StageUse] | tuple[StageUse, ...],
                     sections: int = 1, frames: int = 0) -> HostPlan:
        """Plan where the weights of a job's models live on the host and put them there. Raises
        memory.hostplan.HostBudgetError (naming the minimum) before reading any weight if the budget cannot work."""
        settings = HostSettings(self.device, self.pin, self.host_ram_gb, self.weight_storage, self.host_overhead)
        plan, read, seconds = arrange(models, stages, sections, frames, settings, self.budget)
        self.host_plan = plan
        self.arrange_s += seconds
        self.arrange_read += read
        return plan

    def host_summary(self) -> dict:
        plan = self.host_plan
        pinned = plan.persistent_bytes if plan and plan.pinned else 0
        transient = max((r.host_transient_bytes for r in self.records), default=0) if self.pin else 0
        staging = self._staging.nbytes if self._staging is not None else 0
        return {"budget_gb": round(plan.budget / GIB, 3) if plan else self.host_ram_gb,
                "pinned_peak_bytes": pinned + transient + staging,
                "weight_storage": self.weight_storage, "arrange_s": round(self.arrange_s, 4),
                "arrange_read_bytes": self.arrange_read,
                "file_bytes_in_stages": sum(r.file_bytes for r in self.records),
                "plan": plan.as_dict() if plan else None}

    def load_order(self) -> list[str]:
        return [r.name for r in self.records]

    def summary(self) -> dict:
        peaks = [r.peak_reserved for r in self.records] or [0]
        return {"device": str(self.device), "cap_gb": self.cap_gb if self.device.type == "cuda" else None,
                "preserved_gb": self.preserved_gb, "pin_host_memory": self.pin_host_memory,
                "prefetch_depth": self.prefetch_depth, "peak_reserved": max(peaks),
                "peak_allocated": max([r.peak_allocated for r in self.records] or [0]),
                "host_rss": host_rss_bytes(),
                "switch_s": round(sum(r.load_s + r.unload_s for r in self.records), 4),
                "host": self.host_summary(),
                "stages": [r.as_dict() for r in self.records]}
