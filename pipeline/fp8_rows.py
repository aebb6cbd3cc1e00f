"""fp8 compute's MLP output products: the GELU and the per-token fp8 quantization of their input in one pass over it
(issue 46).

Under fp8 compute each block Linear quantizes its input per token (row) before its fp8 product
(pipeline/compiled.py `fp8_linear`). The MLP's output product reads `gelu(h)`, h being the MLP's first product:
- in the double-stream blocks `ff.net[2](gelu(ff.net[0].proj(x)))`, 12,288 values a row;
- in the single-stream blocks `proj_out(cat([attention, gelu(proj_mlp(x))], -1))`, 3,072 + 12,288 a row.

Compiled by Inductor, each is one kernel that reads a row twice (its largest value first, then the values; the GELU
evaluated both times) through a looped reduction, since rows of 12,288–15,360 values are beyond its persistent
reductions. A profile of the fp8 step at 608×640 (H200) put them at 33 ms (the single-stream blocks', 0.83 ms a
block) and 10 ms (the double-stream blocks') of its 121 ms of fused kernels; multi-kernel persistent reductions
did not help (BENCHMARKS.md).

Here one Triton program holds a whole row in registers (each part as two tiles of powers of two, `tiles`: nothing
padded at full size): it reads the row once (the attention's part from its two pieces, the video and the prompt
tokens, so their concatenation is never written), applies the GELU once, takes the row's largest value and writes
the fp8 values and the row's scale. The math (`reference`) is `memory/fp8.py`'s `quantize_rows` of
`block_forms.gelu_tanh`'s output with its two divisions as PyTorch's CUDA kernels make them or nearly: the scale
as largest × (1/448) (PyTorch divides by a number so), the values × (1/s) (one product instead of an IEEE division
per value, which made a first version arithmetic-bound). On an H200 it gave eager PyTorch's bits on the step's rows,
at 0.37 ms against Inductor's 0.60 for a single-stream block. Rows are independent and nothing is summed: the same
bits every run.

Written here because no library fuses an activation with dynamic per-token fp8 scaling for `torch._scaled_mm`
(TransformerEngine's fused casts use its own delayed or block scaling and its own GEMMs), and Inductor does not by default
make rows of this width persistent. Used on NVIDIA GPUs where Triton imports (elsewhere `reference`, the same math);
`quantize_gelu_rows` picks, every caller goes through it.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from memory import fp8
from pipeline.block_forms import gelu_tanh
from rocm import triton_ops

MAX_ROW = 32768         # widest row (its two tiles) a program holds in registers; wider rows: PyTorch
_READY: dict[str, object] = {}     # "kernels": pipeline/fp8_rows_kernel.py, "op": its operator (`prepare`)


def prepare() -> bool:
    """Import the kernel and register its operator, once per process and outside compiled code
    (rocm/triton_ops.py); whether it can run here."""
    return triton_ops.prepare(_READY, _load)


def _load():
    from pipeline import fp8_rows_kernel  # Triton: imported only here

    return fp8_rows_kernel, _register()


def _next_pow2(k: int) -> int:
    return 1 << max(k - 1, 0).bit_length() if k else 0


def tiles(k: int) -> tuple[int, int]:
    """A row part of k columns as two tiles of powers of two (the kernel's registers): the largest power of two not
    above k, then the rest rounded up (12,288 = 8,192 + 4,096; 3,072 = 2,048 + 1,024; 0 = 0 + 0)."""
    if k <= 0:
        return 0, 0
    first = 1 << (k.bit_length() - 1)
    return first, _next_pow2(k - first)


def launch(kernel, first: Sequence[torch.Tensor], h: torch.Tensor, q: torch.Tensor, s: torch.Tensor,
           num_warps: int | None = None) -> None:
    """Run `kernel` (the jitted one, or Triton's interpreter in tests) over the rows of cat([*first, gelu(h)], -1)
    into q (rows, width) and s (rows,). `first`: () or one or two (batch, tokens, width) pieces; h (batch, tokens,
    width), its last dimension contiguous."""
    batch, n, k2 = h.shape
    if first:
        a, b = first if len(first) == 2 else (first[0], first[0])
        n_a, k1 = a.shape[1], a.shape[-1]
        a_sb, a_st, b_sb, b_st = a.stride(0), a.stride(1), b.stride(0), b.stride(1)
    else:
        a = b = h
        n_a, k1, a_sb, a_st, b_sb, b_st = n, 0, 0, 0, 0, 0
    f0, f1 = tiles(k1)
    h0, h1 = tiles(k2)
    if num_warps is None:
        num_warps = 8 if k1 + k2 >= 2048 else 4      # the fastest at full size (benchmarks/fp8_rows.py, H200)
    kernel[(batch * n,)](a, b, h, q, s, n, n_a, a_sb, a_st, b_sb, b_st, h.stride(1), k1, k2,
                         F0=f0, F1=f1, H0=h0, H1=h1, num_warps=num_warps)


def _usable(first: Sequence[torch.Tensor], h: torch.Tensor) -> bool:
    """Whether the kernel runs these rows: an NVIDIA GPU with Triton, rows it holds, inputs it reads as they are."""
    if not (h.is_cuda and torch.version.hip is None and _READY.get("op") is not None and h.dim() == 3
            and (h.shape[0] == 1 or h.stride(0) == h.shape[1] * h.stride(1))):
        return False
    k1 = first[0].shape[-1] if first else 0
    pieces = [*first, h]
    return (sum(tiles(k1)) + sum(tiles(h.shape[-1])) <= MAX_ROW and len(first) <= 2
            and all(p.dim() == 3 and p.stride(-1) == 1 and p.dtype == torch.bfloat16 and p.shape[0] == h.shape[0]
                    for p in pieces)
            and all(p.shape[-1] == k1 for p in first) and sum(p.shape[1] for p in first) in (0, h.shape[1]))


def _register():
    """`steadyframe::gelu_rows_fp8` (a Triton op: Inductor calls the kernel itself)."""
    @torch.library.triton_op("steadyframe::gelu_rows_fp8", mutates_args=())
    def gelu_rows_fp8(first: list[torch.Tensor], h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = h.shape[0] * h.shape[1]
        width = (first[0].shape[-1] if first else 0) + h.shape[-1]
        q = torch.empty((rows, width), dtype=fp8.FP8, device=h.device)
        s = torch.empty((rows,), dtype=torch.float32, device=h.device)
        launch(torch.library.wrap_triton(_READY["kernels"].jitted), first, h, q, s)  # type: ignore[attr-defined]
        return q, s

    return gelu_rows_fp8


def gelu_cat(first: Sequence[torch.Tensor], h: torch.Tensor) -> torch.Tensor:
    """cat([*first, gelu_tanh(h)], -1), the pieces of `first` joined along the tokens first: what the rows are."""
    parts = [torch.cat(list(first), dim=1)] if len(first) > 1 else list(first)
    return torch.cat([*parts, gelu_tanh(h)], dim=-1) if parts else gelu_tanh(h)


def reference(first: Sequence[torch.Tensor], h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's math in PyTorch (the CPU, ROCm, and the tests): `gelu_cat`'s rows quantized per row as
    `memory/fp8.py`'s `quantize_rows` does, its scale as PyTorch's CUDA division by 448 makes it (a product with
    1/448 in float32) and its division as a product with 1/s (one rounding apart: see the module docstring)."""
    rows = gelu_cat(first, h)
    rows = rows.reshape(-1, rows.shape[-1])
    s = rows.abs().amax(dim=1).float() * (1.0 / fp8.FP8_MAX)
    s = torch.where(s > 0, s, torch.ones_like(s))
    return (rows.float() * (1.0 / s)[:, None]).clamp(-fp8.FP8_MAX, fp8.FP8_MAX).to(fp8.FP8), s


def quantize_gelu_rows(first: Sequence[torch.Tensor], h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3fn values (rows, width), float32 scales (rows,)) of cat([*first, gelu_tanh(h)], -1) per token: the
    kernel where `_usable`, else `reference` (the same math). `first`: () or the attention's output as one or two
    (batch, tokens, width) pieces (the video's tokens, then the prompt's); h (batch, tokens, width)."""
    if not torch.compiler.is_compiling():
        prepare()                       # (compiled code: done by fp8 compute's setup, pipeline/compiled.py)
    if _usable(first, h):
        return _READY["op"](list(first), h)     # type: ignore[operator]
    return reference(first, h)


def rowwise_product(xq: torch.Tensor, xs: torch.Tensor, values: torch.Tensor, scales: torch.Tensor,
                    bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """rows (xq · xs) @ (values · scales)ᵀ + bias in `dtype`: one fp8 product with a scale per token and per weight row
    (`torch._scaled_mm`, cuBLASLt)."""
    return torch._scaled_mm(xq, values.t(), scale_a=xs[:, None], scale_b=scales[None, :], bias=bias, out_dtype=dtype,
                            use_fast_accum=True)
