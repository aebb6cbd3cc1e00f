"""The residency plan: from the VRAM cap and the preserved memory to which transformer blocks stay on the GPU.

Pure arithmetic over block sizes, so it is tested without a GPU. "Preserved memory" (FramePack's slider) is the
part of the cap kept free of resident transformer weights: activations, the streaming slots and other programs
live there. Resident weights may use at most cap − preserved; the non-block parts (embedders, output layers) are
always resident; so are the first `min_resident` blocks (TeaCache reads block 0's norm outside the block's forward);
then blocks are made resident from the *last* one backwards until the budget is used, and the ones between are
streamed from host memory every step. Resident at the end rather than the start: under a host-RAM budget the
resident blocks that host RAM cannot hold are read from the weight files at every transformer stage, and the host
plan gives RAM to the earlier blocks first, so these are the very last blocks of a step; they are read while the
first step computes everything before them (memory/lateload.py). The streamed bytes are the same either way.
The activation estimate says whether the preserved memory can hold one block's working set at the chosen
resolution and window.
"""
from __future__ import annotations

from dataclasses import dataclass

from common.units import GIB

# Live tensors at the peak of a step, in units of tokens × hidden × dtype bytes (single block: input, norm, attention
# output, MLP hidden 4×, the 5× concatenation, GELU temporaries; plus the section's constants). Measured on the H100
# at 18,485 tokens (bf16, fused attention): 2.05 GiB above weights and slots in every configuration = a factor of
# 19.4 (BENCHMARKS.md).
ACTIVATION_FACTOR = 20


@dataclass(frozen=True)
class ResidencyPlan:
    cap_bytes: int
    preserved_bytes: int
    other_bytes: int                     # always resident (embedders, norms, output projection)
    block_bytes: tuple[int, ...]         # per block, in execution order (dual blocks, then single blocks)
    resident: tuple[int, ...]            # indices into block_bytes
    streamed: tuple[int, ...]
    activation_bytes: int = 0            # estimate for the workload (0: unknown)
    slot_count: int = 2                  # device slots the streamer holds (prefetch depth + 1)
    stage_bytes: int = 0                 # fp8 storage: the stored bytes beside each slot

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

    @property
    def slot_bytes(self) -> int:
        """Device memory of the streaming slots (one per block in flight, each the size of the largest)."""
        if not self.streamed:
            return 0
        biggest = max(self.block_bytes[i] for i in self.streamed)
        return min(self.slot_count, len(self.streamed)) * (biggest + self.stage_bytes)

    @property
    def working_bytes(self) -> int:
        """What must fit in the preserved memory: activations plus the streaming slots."""
        return self.activation_bytes + self.slot_bytes

    @property
    def peak_estimate(self) -> int:
        return self.resident_bytes + self.working_bytes

    def warnings(self) -> list[str]:
        out = []
        if self.activation_bytes and self.cap_bytes - self.resident_bytes < self.working_bytes:
            out.append(f"preserved memory {self.preserved_bytes / GIB:.1f} GB is below the estimated working set "
                       f"{self.working_bytes / GIB:.1f} GB (activations {self.activation_bytes / GIB:.1f} GB + "
                       f"streaming slots {self.slot_bytes / GIB:.1f} GB): expect out-of-memory; raise it")
        if self.resident_bytes > self.cap_bytes:
            out.append(f"the always-resident part alone ({self.resident_bytes / GIB:.1f} GB) exceeds the cap")
        kept_free = self.cap_bytes - self.resident_bytes
        if self.preserved_bytes > kept_free:
            out.append(f"{self.preserved_bytes / GIB:.1f} GB cannot be kept free: the part of the transformer that "
                       f"must stay on the GPU ({self.resident_bytes / GIB:.1f} GB) leaves at most "
                       f"{max(kept_free, 0) / GIB:.1f} GB of the {self.cap_bytes / GIB:.1f} GB cap, so a larger value "
                       f"changes nothing")
        return out

    def describe(self, label: str = "transformer") -> str:
        n = len(self.block_bytes)
        act = (f"; activations ≈ {self.activation_bytes / GIB:.1f} GB + slots {self.slot_bytes / GIB:.1f} GB"
               if self.activation_bytes else "")
        return (f"cap {self.cap_bytes / GIB:.1f} GB, preserved {self.preserved_bytes / GIB:.1f} GB → "
                f"{self.resident_bytes / GIB:.1f} GB of the {self.total_bytes / GIB:.1f} GB {label} resident "
                f"({len(self.resident)}/{n} blocks), {self.streamed_bytes / GIB:.1f} GB streamed per step "
                f"({len(self.streamed)} blocks){act}")


def plan_residency(block_bytes: list[int] | tuple[int, ...], other_bytes: int, cap_bytes: int,
                   preserved_bytes: int, *, min_resident: int = 0, activation_bytes: int = 0,
                   slot_count: int = 2, stage_bytes: int = 0, heaviest: bool = False) -> ResidencyPlan:
    """`heaviest`: the largest blocks stay resident and the smallest are streamed (see `_heaviest`), instead of
    the last blocks resident."""
    budget = cap_bytes - preserved_bytes - other_bytes
    head = list(range(min(min_resident, len(block_bytes))))
    used = sum(block_bytes[i] for i in head)
    tail = []
    if heaviest:
        tail = _heaviest(block_bytes, len(head), budget - used)
    else:
        for i in reversed(range(len(head), len(block_bytes))):
            if used + block_bytes[i] > budget:
                break
            tail.append(i)
            used += block_bytes[i]
    resident = head + sorted(tail)
    chosen = set(resident)
    streamed = tuple(i for i in range(len(block_bytes)) if i not in chosen)
    return ResidencyPlan(cap_bytes, preserved_bytes, other_bytes, tuple(block_bytes), tuple(resident), streamed,
                         activation_bytes, slot_count, stage_bytes)


def _heaviest(block_bytes, start: int, budget: int) -> list[int]:
    """Blocks from `start` on kept resident within `budget`, the largest first; of the size where the budget runs
    out (some blocks of it resident, some streamed) the resident ones are spread evenly among the streamed ones.

    Why: a streamed block's copy overlaps the compute of the blocks run since the copy before it could start
    (memory/streaming.py: one block ahead). Streaming the small blocks (FramePack's single blocks, 0.26 GiB for
    about the compute of a dual block of 0.63 GiB) moves 2.4× fewer bytes per block of compute, and a resident
    block between two streamed ones gives the second copy that block's compute too. A step whose compute is cut
    N times by a split job (pipeline/split.py) is otherwise bound by the copies of the dual blocks streamed in a
    row (BENCHMARKS.md, "One video on several GPUs")."""
    sizes = sorted({block_bytes[i] for i in range(start, len(block_bytes))}, reverse=True)
    out: list[int] = []
    for size in sizes:
        group = [i for i in range(start, len(block_bytes)) if block_bytes[i] == size]
        k = min(len(group), max(0, budget) // size)
        if k == len(group):
            out += group
        elif k:       # k of the group's g blocks, one every g/k, the last one included
            g = len(group)
            out += [group[g - 1 - (j * g) // k] for j in range(k)]
        budget -= k * size
    return out


def framepack_tokens(height: int, width: int, window: int, image_tokens: int = 729, text_tokens: int = 256) -> int:
    """Tokens one transformer step sees: the noisy window (patch 1×2×2), the clean 1x context (start + post
    latent), 2x (2 frames, kernel 2×4×4) and 4x history (16 frames, kernel 4×8×8), SigLIP and text tokens."""
    lh, lw = height // 8, width // 8

    def ceil(a, b):
        return -(-a // b)

    per_frame = ceil(lh, 2) * ceil(lw, 2)
    return (window * per_frame + 2 * per_frame + ceil(lh, 4) * ceil(lw, 4) + 4 * ceil(lh, 8) * ceil(lw, 8)
            + image_tokens + text_tokens)


def activation_bytes(tokens: int, hidden: int = 3072, dtype_bytes: int = 2,
                     factor: float = ACTIVATION_FACTOR) -> int:
    """Peak activation memory of one transformer block (fused attention: no score matrix)."""
    return int(tokens * hidden * dtype_bytes * factor)


TEXT_RESERVE_BYTES = 2 * GIB       # activations of the text encoders (≤ ~350 tokens) + headroom


@dataclass(frozen=True)
class Workload:
    """What the transformer will see: the bucket and the latent window (for the activation estimate). The default
    is the nominal job the estimate plans for before a request is known (608×640, window 9). `processes`: the
    job's tokens are split over that many GPUs (pipeline/split.py), each holding `share_tokens` in its blocks."""
    height: int = 608
    width: int = 640
    window: int = 9
    processes: int = 1

    @property
    def tokens(self) -> int:
        return framepack_tokens(self.height, self.width, self.window)

    @property
    def share_tokens(self) -> int:
        return -(-self.tokens // max(1, self.processes))


# ---- the one fit rule: the planner (memory/budget.py, as a job runs) and the estimate (memory/estimate.py, before
# anything loads) both decide "what stays on the GPU" with these two functions, from the same sizes ---------------
def transformer_residency(block_bytes, other_bytes: int, cap_bytes: int, preserved_bytes: int, workload: Workload,
                          hidden: int, dtype_bytes: int, *, slot_count: int = 2, stage_bytes: int = 0
                          ) -> ResidencyPlan:
    """The transformer's plan: the first block and as many of the last as cap − preserved holds stay resident, the
    rest is streamed; the activation estimate is the workload's (tokens × hidden × dtype bytes).

    The preserved memory is set for a whole job's working set (activations and streaming slots). A share of a
    split job (`workload.processes` > 1) holds 1/N of the tokens in its blocks, and it keeps its largest blocks
    resident, streaming the small ones (`_heaviest`: its step's compute is 1/N of one GPU's, so the copies of the
    large blocks would bound it), which needs smaller slots. The working set it does not need (one GPU's
    activations and slots less the share's) goes to resident blocks, so each GPU streams less per step and its
    peak stays at most one GPU's (each GPU's peak measured in BENCHMARKS.md, "One video on several GPUs"). (One
    GPU keeps the last blocks resident: its compute hides the copies either way, and under a host-RAM budget the
    late resident blocks are read from the files while the step computes, memory/lateload.py; a split share's
    early resident blocks are read before it.)"""
    def plan(preserved: int, act: int, heaviest: bool) -> ResidencyPlan:
        return plan_residency(block_bytes, other_bytes, cap_bytes, max(0, preserved), min_resident=1,
                              activation_bytes=act, slot_count=slot_count, stage_bytes=stage_bytes,
                              heaviest=heaviest)

    one = plan(preserved_bytes, activation_bytes(workload.tokens, hidden, dtype_bytes), False)
    if workload.processes <= 1:
        return one
    act = activation_bytes(workload.share_tokens, hidden, dtype_bytes)
    share = plan(preserved_bytes - one.activation_bytes + act, act, True)
    # again with its own slots (the small blocks' size: as small or smaller once more of them are resident)
    return plan(preserved_bytes - (one.working_bytes - (act + share.slot_bytes)), act, True)


def text_residency(block_bytes, rest_bytes: int, others_bytes: int, cap_bytes: int, *, slot_count: int = 2,
                   reserve_bytes: int = TEXT_RESERVE_BYTES) -> ResidencyPlan | None:
    """The text encoder's plan (the Llama: `block_bytes`, `rest_bytes`; `others_bytes`: the stage's other models,
    CLIP): None when the whole stage fits under the cap with `reserve_bytes` left for its activations, else the
    blocks that must be streamed."""
    if sum(block_bytes) + rest_bytes + others_bytes + reserve_bytes <= cap_bytes:
        return None
    return plan_residency(block_bytes, rest_bytes + others_bytes, cap_bytes, reserve_bytes, slot_count=slot_count)


REAL_TRANSFORMER_CONFIG = (("has_image_proj", True), ("has_clean_x_embedder", True), ("image_proj_dim", 1152),
                           ("pooled_projection_dim", 768), ("text_embed_dim", 4096))
