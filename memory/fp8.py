"""fp8 weight storage: e4m3fn values with one float32 scale per output channel, turned back into the model's dtype
on the device just before use (so matmuls and attention run in bf16/fp16 as before).

Only the weights of `nn.Linear` layers are stored in fp8 (they are ~99 % of the transformer's and the Llama's
bytes); norms, biases, embeddings, convolutions and buffers keep their dtype. Per output channel (a row of the
weight): scale = max|row| / 448 (e4m3fn's largest value), q = row / scale rounded to the nearest e4m3fn value.
The stored bytes are half of bf16's plus 4 bytes per row. Quantizing and dequantizing are the same arithmetic on
the CPU and the GPU (fp32 division and multiplication, round-to-nearest-even), so a weight turned into fp8 on the
host or on the device gives the same bits.

Error (e4m3fn keeps 3 mantissa bits): every element within 2^-4 of its value relative to its row's scale grid;
on normally distributed weights the relative error (Frobenius norm) is about 2.3 % per matrix. What that does to
one transformer step and to a section's latents is measured in tests/test_fp8.py (tiny preset) and in
benchmarks/hostram.py (full size; BENCHMARKS.md).

**Kept in fp8 on the device** (fp8 compute, pipeline/compiled.py): a Linear marked with `keep_on_device` has its
weight stored in fp8 on the host whatever the storage setting, and its device copy is the stored form too: the
e4m3fn values and their row scales, in a device region of that size (memory/chunk.py: about half the bf16
weight's, so the blocks' device copies and what is streamed under a cap are halved too). While bound,
the Parameter holds the fp8 values and the module's `weight_scale` buffer the scales (None otherwise), so the
product multiplies them as they are: no dequantising on the way in, no cast of the weight in each product.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)      # 448
ROWS_PER_PIECE_BYTES = 64 << 20            # fp32 temporaries while quantizing are bounded by this
KEEP_ATTR = "_steadyframe_fp8_kept"        # a Linear whose weight stays fp8 on the device
SCALE = "weight_scale"                     # its buffer: the row scales of the bound fp8 weight (None: not fp8)


class Kept(NamedTuple):
    """A kept weight's device copy: e4m3fn values (out, in) and float32 row scales (out,)."""
    values: torch.Tensor
    scales: torch.Tensor


def compute_target(name: str, module: nn.Module) -> bool:
    """Is this module of the transformer (`name`: its name there) one of the Linears fp8 compute multiplies in fp8
    and keeps in fp8 (pipeline/compiled.py `use_fp8_compute`; memory/estimate.py sizes them so before a job)? The
    blocks' Linears, not their modulation layers (one row of input: nothing to gain), both sizes multiples of 16
    (the fp8 product's)."""
    return (name.startswith(("transformer_blocks.", "single_transformer_blocks.")) and isinstance(module, nn.Linear)
            and ".norm" not in f".{name}" and module.in_features % 16 == 0 and module.out_features % 16 == 0)


def keep_on_device(linear: nn.Linear) -> None:
    """Mark `linear` (before the model is packed): its weight is stored and bound in fp8 with row scales."""
    setattr(linear, KEEP_ATTR, True)
    linear.register_buffer(SCALE, None, persistent=False)


def marked(module: nn.Module) -> bool:
    """Was `module` marked with `keep_on_device`?"""
    return bool(getattr(module, KEEP_ATTR, False))


def kept_fits(shape: tuple[int, ...], region: int, align: int) -> bool:
    """Do the fp8 values (aligned) and the row scales fit in a device region of `region` bytes?"""
    values, scales = stored_bytes(shape)
    return -(-values // align) * align + scales <= region


def quantizable(module: nn.Module, name: str, tensor: torch.Tensor) -> bool:
    """Is this tensor stored in fp8 when fp8 storage is on? (the 2-D weight of a Linear layer)"""
    return isinstance(module, nn.Linear) and name == "weight" and tensor.dim() == 2 and tensor.is_floating_point()


def stored_bytes(shape: tuple[int, ...]) -> tuple[int, int]:
    """(bytes of the fp8 values, bytes of the scales) for a weight of `shape` (out, in)."""
    return shape[0] * shape[1], shape[0] * 4


def row_scales(w: torch.Tensor) -> torch.Tensor:
    """float32 scale per row: max|row| / 448 (1 for an all-zero row)."""
    amax = w.abs().amax(dim=1).float() if w.numel() else torch.zeros(w.shape[0], device=w.device)
    scale = amax / FP8_MAX
    return torch.where(scale > 0, scale, torch.ones_like(scale))


def quantize_into(q: torch.Tensor, scale: torch.Tensor, w: torch.Tensor, device: torch.device | None = None) -> None:
    """Write e4m3fn values into `q` (same shape as w, dtype FP8) and the row scales into `scale` (float32, rows).
    With a GPU `device` the arithmetic runs there (fast; the device path of file-homed chunks quantizes there too,
    so a weight gets the same bits whichever home it has) and the results are copied into q and scale."""
    if device is not None and torch.device(device).type != "cpu" and w.device.type == "cpu":
        qd, sd = quantize(w.to(device))
        q.copy_(qd)
        scale.copy_(sd)
        return
    s = row_scales(w)
    scale.copy_(s)
    rows = max(1, ROWS_PER_PIECE_BYTES // max(1, 4 * w.shape[1]))
    for r in range(0, w.shape[0], rows):
        piece = torch.div(w[r:r + rows].float(), s[r:r + rows, None]).clamp_(-FP8_MAX, FP8_MAX)   # w untouched
        q[r:r + rows].copy_(piece)


def quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3fn values, float32 row scales) in one expression (traceable by torch.compile); the same bits as
    `quantize` for a weight, and the per-token quantization of an activation (rows = tokens)."""
    s = row_scales(w)
    return torch.div(w.float(), s[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8), s


def quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    q = torch.empty(w.shape, dtype=FP8, device=w.device)
    scale = torch.empty(w.shape[0], dtype=torch.float32, device=w.device)
    quantize_into(q, scale, w)
    return q, scale


def dequantize_into(dst: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> None:
    """dst (the model's dtype) = q · scale, computed in float32 and rounded once (no temporary of dst's size)."""
    dst.copy_(q)                      # exact: every e4m3fn value is a bf16/fp16/fp32 value
    dst.mul_(scale[:, None])          # bf16 × fp32 is computed in fp32 and rounded once to bf16


def round_trip(w: torch.Tensor) -> torch.Tensor:
    """What a weight becomes after fp8 storage (for error measurements and the file-to-device path)."""
    q, scale = quantize(w)
    out = torch.empty_like(w)
    dequantize_into(out, q, scale)
    return out


def relative_error(approx: torch.Tensor, exact: torch.Tensor) -> float:
    """‖approx − exact‖ / ‖exact‖ (Frobenius, in float64)."""
    a, e = approx.double(), exact.double()
    denom = e.norm().item()
    return (a - e).norm().item() / denom if denom else float((a - e).norm().item())
