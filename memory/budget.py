"""The budget: the cap, the preserved memory and the workload, and where each model of a stage goes.

`MemoryBudget.place(packs)` decides per model: fully resident, or resident part + streamed blocks. The
transformer always follows the residency plan of the preserved memory (FramePack's slider); another model with
blocks (the Llama text encoder) is streamed only when the stage does not fit under the cap with a reserve for its
activations; models without blocks are loaded whole.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from configs.memory import MEMORY
from memory.hostpack import Chunk, HostPack
from common.units import GIB
from memory.plan import ResidencyPlan, activation_bytes, framepack_tokens, plan_residency

log = logging.getLogger(__name__)

DEFAULT_PREFETCH_DEPTH = MEMORY.prefetch_depth     # configs/memory.py
TEXT_RESERVE_BYTES = 2 * GIB       # activations of the text encoders (≤ ~350 tokens) + headroom


@dataclass(frozen=True)
class Workload:
    """What the transformer will see: the bucket and the latent window (for the activation estimate)."""
    height: int = 608
    width: int = 640
    window: int = 9

    @property
    def tokens(self) -> int:
        return framepack_tokens(self.height, self.width, self.window)


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
        return f"{self.name}: {self.plan.describe(self.name)}"


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
        cfg = model.config
        hidden = cfg.num_attention_heads * cfg.attention_head_dim
        act = activation_bytes(self.workload.tokens, hidden, _dtype_bytes(model))
        return plan_residency([c.nbytes for c in pack.blocks], pack.rest.nbytes, self.cap_bytes,
                              self.preserved_bytes, min_resident=1, activation_bytes=act,
                              slot_count=self.slot_count,
                              stage_bytes=max((c.host_nbytes for c in pack.blocks if c.stores_fp8), default=0))

    def place(self, models: dict[str, torch.nn.Module], packs: dict[str, HostPack]) -> dict[str, Placement]:
        out = {name: Placement(name, pack) for name, pack in packs.items()}
        if self.cap_bytes is None:
            return out
        total = sum(p.nbytes for p in packs.values())
        for name, model in models.items():
            pack = packs[name]
            if not pack.blocks:
                continue
            if is_transformer(model):
                plan = self.transformer_plan(model, pack)
            elif total + self.text_reserve_bytes > self.cap_bytes:
                others = total - pack.nbytes
                plan = plan_residency([c.nbytes for c in pack.blocks], pack.rest.nbytes + others, self.cap_bytes,
                                      self.text_reserve_bytes, slot_count=self.slot_count)
            else:
                continue
            for w in plan.warnings():
                log.warning("%s: %s", name, w)
            out[name].plan = plan if plan.streamed else None
            log.info(out[name].describe())
        return out
