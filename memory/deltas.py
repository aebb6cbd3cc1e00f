"""Low-rank weight deltas merged into the device copy of a chunk as it is loaded (LoRAs, pipeline/lora.py).

The host pack is never changed: every device copy of a chunk (a resident load, or a streamed block copied into its
slot) gets `W += up @ down` right after its copy, on the stream that copied it (so the prefetch order and overlap
of memory/streaming.py are untouched). Removing the deltas is forgetting them: the next load is the plain weight
again, bit for bit, whatever happened to the job that used them.

Why here and not merged into the host copy once per job: the host copy may be fp8 (re-quantising would round the
LoRA away and cannot be undone), or not exist at all (chunks read from the weight files), and undoing a bf16
merge by subtraction is not exact; a second full copy to restore from would double the host RAM. The cost is one
(out × R) @ (R × in) product per weight per load (R = the ranks of all LoRAs together), on the side stream for
streamed blocks: see benchmarks/lora_step.py.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from memory import fp8

HALF = (torch.bfloat16, torch.float16)
ROWS_PER_PIECE = 1024      # rows merged at a time: float32 temporaries ≤ rows × in × 8 bytes (126 MB at in = 15360)


@dataclass(frozen=True)
class WeightDelta:
    """W (out × in) += up (out × R) @ down (R × in) + full; strengths and alpha/rank are folded into `up`. Either
    part may be None: `full` alone is a full-weight or a bias difference (any shape: the tensor's own)."""
    down: torch.Tensor | None
    up: torch.Tensor | None
    full: torch.Tensor | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        if self.full is not None:
            return tuple(self.full.shape)
        assert self.up is not None and self.down is not None            # (a delta has one part or both)
        return (self.up.shape[0], self.down.shape[1])

    def apply(self, weight: torch.Tensor) -> None:
        """Add the delta to `weight` in place, computed in float32 and rounded once to the weight's dtype."""
        device = weight.device
        if self.full is None and self.up is not None and self.down is not None and device.type == "cuda" \
                and weight.dtype in HALF and self.up.dtype == weight.dtype == self.down.dtype:
            # One GEMM in place: cuBLAS accumulates the product in float32 and adds W in its float32 epilogue,
            # rounding once, at a quarter of the float32 path's memory traffic (no float32 copy of W), which is
            # what the streamer's side stream needs (benchmarks/lora_step.py: 1.05× → 1.01× per step). Measured
            # on an H100 at 3072×15360, rank 96: 0.24 % of elements differ from the float32 path by one bf16 ulp
            # (cuBLAS's summation order), so a LoRA's pixels can differ across devices by rounding.
            weight.addmm_(self.up.to(device, non_blocking=True), self.down.to(device, non_blocking=True))
            return
        def f32(t):
            return None if t is None else t.to(device, torch.float32, non_blocking=True)
        down, up, full = f32(self.down), f32(self.up), f32(self.full)
        for r0 in range(0, weight.shape[0], ROWS_PER_PIECE):
            rows = weight[r0:r0 + ROWS_PER_PIECE]
            merged = rows.float() if down is None else torch.addmm(rows.float(), up[r0:r0 + ROWS_PER_PIECE], down)
            if full is not None:
                merged = merged + full[r0:r0 + ROWS_PER_PIECE]
            rows.copy_(merged)


def set_deltas(pack, deltas: dict[str, WeightDelta]) -> None:
    """Give the chunks of `pack` (memory.hostpack.HostPack) the deltas of their tensors, by state-dict name
    ("transformer_blocks.0.attn.to_q.weight"); every other delta the pack had is forgotten. Raises KeyError naming
    a tensor the pack does not have (nothing is changed then)."""
    where = {e.name: (c, i) for c in pack.chunks for i, e in enumerate(c.entries)}
    missing = [name for name in deltas if name not in where]
    if missing:
        raise KeyError(f"no tensor {missing[0]!r} in {pack.name}")
    for c in pack.chunks:
        c.deltas = {}
    for name, delta in deltas.items():
        chunk, i = where[name]
        entry = chunk.entries[i]
        if tuple(entry.shape) != delta.shape:
            raise ValueError(f"{name}: weight {tuple(entry.shape)}, delta {delta.shape}")
        chunk.deltas[i] = _stored(delta, entry.dtype)


def _stored(delta: WeightDelta, dtype: torch.dtype) -> WeightDelta:
    """The factors in the weight's dtype (half the bytes to copy per load for bf16), pinned when there is a GPU
    (their copy is then asynchronous on the streamer's side stream)."""
    def keep(t):
        if t is None:
            return None
        t = t.to(dtype).contiguous()
        return t.pin_memory() if torch.cuda.is_available() else t
    return WeightDelta(keep(delta.down), keep(delta.up), keep(delta.full))


def clear_deltas(pack) -> None:
    for c in pack.chunks:
        c.deltas = {}


def apply_deltas(chunk, views: list) -> None:
    """Merge the chunk's deltas into `views` (its tensors in a device copy, memory/chunk.py `views`). A weight kept
    in fp8 on the device is turned into its dtype, merged and quantized again in place (one temporary of its size)."""
    for i, delta in chunk.deltas.items():
        view = views[i]
        if isinstance(view, fp8.Kept):
            weight = torch.empty(view.values.shape, dtype=chunk.entries[i].dtype, device=view.values.device)
            fp8.dequantize_into(weight, view.values, view.scales)
            delta.apply(weight)
            fp8.quantize_into(view.values, view.scales, weight)
        else:
            delta.apply(view)
