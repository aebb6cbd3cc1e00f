"""The memory manager's host side: packing and pinning models, the host-RAM budget and plan of a job, and what the
host held (memory/manager.py holds the device side: the single model slot). A mixin of MemoryManager, whose fields
(device, pin_host_memory, host_ram_gb, weight_storage, host_overhead, host_plan, ...) it reads."""
from __future__ import annotations

import logging
import time

import torch

from common.units import GIB
from configs.memory import MEMORY
from memory.hostarrange import model_host, realize
from memory.hostbudget import default_host_budget, job_working_bytes, process_overhead
from memory.hostpack import HostPack
from memory.hostplan import HostPlan, StageUse, plan_host

log = logging.getLogger("memory.manager")


class HostSide:
    """Host-RAM methods of MemoryManager (see memory/manager.py)."""

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
        pack = HostPack.of(model)
        if pack.pinned != self.pin and any(c.home == "ram" for c in pack.chunks):
            if not self.pin and self.device.type == "cuda":
                log.info("host memory pinning is off: host→device copies are pageable (several times slower)")
            pack.set_pinned(self.pin)
        return pack

    def host_budget(self) -> tuple[int, str]:
        """(bytes, explanation) of the host-RAM budget."""
        if self.host_ram_gb is None:
            return default_host_budget()
        return int(self.host_ram_gb * GIB), f"host RAM budget {self.host_ram_gb:g} GB (--host-ram-gb)"

    def arrange_host(self, models: dict[str, torch.nn.Module], stages: list[StageUse] | tuple[StageUse, ...],
                     sections: int = 1, frames: int = 0) -> HostPlan:
        """Plan where the weights of a job's models live on the host and put them there. Raises
        memory.hostplan.HostBudgetError (naming the minimum) before reading any weight if the budget cannot work."""
        if self.weight_storage not in ("native", "fp8"):
            raise ValueError(f"weight storage: {self.weight_storage!r} is not 'native' or 'fp8'")
        packs = {k: HostPack.of(m) for k, m in models.items()}
        quantized = {k: self.weight_storage == "fp8" and p.can_quantize() for k, p in packs.items()}
        streamed: dict[str, set[int]] = {k: set() for k in models}
        for s in stages:
            names = [k for k in s.models if k in models]
            for k, p in self.budget.place({k: models[k] for k in names}, {k: packs[k] for k in names}).items():
                streamed[k] |= set(p.streamed)
        hosts = [model_host(k, packs[k], streamed[k], self.device.type, quantized[k]) for k in models]
        budget, why = self.host_budget()
        w = self.workload
        overhead = self.host_overhead
        if overhead is None:
            overhead = (process_overhead(sum(p.host_bytes for p in packs.values()), self.device.type == "cuda")
                        + job_working_bytes(frames, w.height, w.width, w.window)
                        + (2 * MEMORY.staging_mb << 20 if self.device.type == "cuda" else 0))
        plan = plan_host(hosts, [s for s in stages if any(k in models for k in s.models)], sections, budget,
                         overhead, int(MEMORY.host_reserve_gb * GIB), self.pin)
        read, seconds = realize(plan, packs, quantized, self.pin, self.device)
        self.host_plan = plan
        self.arrange_s += seconds
        self.arrange_read += read
        log.info("%s", why)
        log.info("host RAM plan: %s", plan.describe())
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
