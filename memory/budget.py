"""The budget: the cap, the preserved memory and the workload, and where each model of a stage goes.

`MemoryBudget.place(packs)` decides per model: fully resident, or resident part + streamed blocks. The
transformer always follows the residency plan of the preserved memory (FramePack's slider); another model with
blocks (the Llama text encoder) is streamed only when the stage does not fit under the cap with a reserve for its
activations; models without blocks are loaded whole. The rule itself is memory/plan.py's
(`transformer_residency`, `text_residency`), which the estimate before a job (memory/estimate.py) uses too.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from common.units import GIB
from configs.memory import MEMORY
from memory.hostpack import Chunk, HostPack
from memory.plan import TEXT_RESERVE_BYTES, ResidencyPlan, Workload, text_residency, transformer_residency

log = logging.getLogger(__name__)

DEFAULT_PREFETCH_DEPTH = MEMORY.prefetch_depth     # configs/memory.py
@dataclass
class Placement:
    name: str
    pack: HostPack
    plan: ResidencyPlan | None = None      # None: loaded whole

    @property
    def streamed(self) -> tuple[int, ...]:
        return self.plan.streamed if self.plan else ()

    def resident_chunks(self) -> list[Chunk]:
        streamed = set(self.streamed)
        return [self.pack.rest] + [c for i, c in enumerate(self.pack.blocks) if i not in streamed]

    def streamed_modules(self) -> tuple[list, list[Chunk]]:
        return ([self.pack.block_modules[i] for i in self.streamed], [self.pack.blocks[i] for i in self.streamed])

    def describe(self) -> str:
        if not self.streamed:
            return f"{self.name}: {self.pack.nbytes / GIB:.2f} GB resident"
        return f"{self.name}: {self.plan.describe(self.name) if self.plan is not None else 'streamed'}"


def is_transformer(model) -> bool:
    return hasattr(model, "transformer_blocks") and hasattr(model, "single_transformer_blocks")


def _dtype_bytes(model) -> int:
    p = next(model.parameters(), None)
    return p.element_size() if p is not None else 2   # meta tensors (weights in the files) have a dtype too


@dataclass
class MemoryBudget:
    cap_bytes: int | None                  # None: no cap (a CPU run), everything loads whole
    preserved_bytes: int
    prefetch_depth: int = DEFAULT_PREFETCH_DEPTH
    workload: Workload = Workload()
    text_reserve_bytes: int = TEXT_RESERVE_BYTES

    @property
    def slot_count(self) -> int:
        return self.prefetch_depth + 1

    def transformer_plan(self, model, pack: HostPack) -> ResidencyPlan:
        assert self.cap_bytes is not None                   # (planned under a cap only: `place`)
        cfg = model.config
        hidden = cfg.num_attention_heads * cfg.attention_head_dim
        return transformer_residency([c.nbytes for c in pack.blocks], pack.rest.nbytes, self.cap_bytes,
                                     self.preserved_bytes, self.workload, hidden, _dtype_bytes(model),
                                     slot_count=self.slot_count,
                                     stage_bytes=max((c.host_nbytes for c in pack.blocks if not c.copies_as_stored),
                                                     default=0))

    def place(self, models: dict[str, torch.nn.Module], packs: dict[str, HostPack]) -> dict[str, Placement]:
        out = {name: Placement(name, pack) for name, pack in packs.items()}
        if self.cap_bytes is None:
            return out
        total = sum(p.nbytes for p in packs.values())
        for name, model in models.items():
            pack = packs[name]
            if not pack.blocks:
                continue
            plan: ResidencyPlan | None
            if is_transformer(model):
                plan = self.transformer_plan(model, pack)
            else:
                plan = text_residency([c.nbytes for c in pack.blocks], pack.rest.nbytes, total - pack.nbytes,
                                      self.cap_bytes, slot_count=self.slot_count,
                                      reserve_bytes=self.text_reserve_bytes)
                if plan is None:
                    continue
            for w in plan.warnings():
                log.warning("%s: %s", name, w)
            out[name].plan = plan if plan is not None and plan.streamed else None
            log.info(out[name].describe())
        return out
