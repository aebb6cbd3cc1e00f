"""The residency plan: from the VRAM cap and the preserved memory to which transformer blocks stay on the GPU.

Pure arithmetic over block sizes, so it is tested without a GPU. "Preserved memory" (FramePack's slider) is the
part of the cap kept free of resident transformer weights: activations, the streaming buffers and other programs
live there. Resident weights may use at most cap − preserved; the non-block parts (embedders, output layers) are
always resident; blocks are made resident in execution order until the budget is used; the rest are streamed from
host memory every step.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

GB = 1024 ** 3


@dataclass(frozen=True)
class ResidencyPlan:
    cap_bytes: int
    preserved_bytes: int
    other_bytes: int                     # always resident (embedders, norms, output projection)
    block_bytes: tuple[int, ...]         # per block, in execution order (dual blocks, then single blocks)
    resident: tuple[int, ...]            # indices into block_bytes
    streamed: tuple[int, ...]

    @property
    def resident_bytes(self) -> int:
        return self.other_bytes + sum(self.block_bytes[i] for i in self.resident)

    @property
    def streamed_bytes(self) -> int:
        return sum(self.block_bytes[i] for i in self.streamed)

    @property
    def total_bytes(self) -> int:
        return self.other_bytes + sum(self.block_bytes)

    @property
    def fully_resident(self) -> bool:
        return not self.streamed

    def describe(self) -> str:
        n = len(self.block_bytes)
        return (f"cap {self.cap_bytes / GB:.1f} GB, preserved {self.preserved_bytes / GB:.1f} GB → "
                f"{self.resident_bytes / GB:.1f} GB of the {self.total_bytes / GB:.1f} GB transformer resident "
                f"({len(self.resident)}/{n} blocks), {self.streamed_bytes / GB:.1f} GB streamed per step "
                f"({len(self.streamed)} blocks)")


def plan_residency(block_bytes: list[int] | tuple[int, ...], other_bytes: int, cap_bytes: int,
                   preserved_bytes: int) -> ResidencyPlan:
    budget = cap_bytes - preserved_bytes - other_bytes
    resident, used = [], 0
    for i, size in enumerate(block_bytes):
        if used + size > budget:
            break
        resident.append(i)
        used += size
    streamed = tuple(i for i in range(len(block_bytes)) if i not in set(resident))
    return ResidencyPlan(cap_bytes, preserved_bytes, other_bytes, tuple(block_bytes), tuple(resident), streamed)


@lru_cache(maxsize=8)
def transformer_sizes(config_items: tuple, bytes_per_param: int) -> tuple[tuple[int, ...], int]:
    """Per-block and other bytes of a FramePack transformer config, counted on the meta device (no memory)."""
    import torch
    from diffusers import HunyuanVideoFramepackTransformer3DModel

    with torch.device("meta"):
        model = HunyuanVideoFramepackTransformer3DModel(**dict(config_items))
    blocks = [*model.transformer_blocks, *model.single_transformer_blocks]
    sizes = tuple(sum(p.numel() for p in b.parameters()) * bytes_per_param for b in blocks)
    total = sum(p.numel() for p in model.parameters()) * bytes_per_param
    return sizes, total - sum(sizes)


REAL_TRANSFORMER_CONFIG = (("has_image_proj", True), ("has_clean_x_embedder", True), ("image_proj_dim", 1152),
                           ("pooled_projection_dim", 768), ("text_embed_dim", 4096))


def describe_preserved(preset, cap_gb: float, preserved_gb: float, device_type: str) -> str:
    """What the preserved-memory slider means on this machine, in one line (the UI shows it live)."""
    if device_type != "cuda":
        return (f"CPU run: no GPU, so nothing is capped or streamed (the slider only matters on a GPU; "
                f"a {cap_gb:g} GB cap with {preserved_gb:g} GB preserved would apply there).")
    if preset.tiny:
        items = tuple(sorted((k, tuple(v) if isinstance(v, (list, tuple)) else v)
                             for k, v in preset.tiny_configs["transformer"].items()))
        sizes, other = transformer_sizes(items, 4)
    else:
        sizes, other = transformer_sizes(REAL_TRANSFORMER_CONFIG, 2)
    plan = plan_residency(sizes, other, int(cap_gb * GB), int(preserved_gb * GB))
    return plan.describe()
