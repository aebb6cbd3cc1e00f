"""fp8 attention's inputs in the compiled blocks, from the q/k/v products to FlashAttention-3's e4m3 tensors in three
Triton passes (issue 46).

What an attention call of HunyuanVideo's blocks computes before the kernel, under fp8 attention through
FlashAttention-3 (rocm/fp8_attention.py `quantize(..., kernel=FA3)`): q and k normalized per head (RMSNorm over the
head's 128 channels, the prompt's tokens with their own weights in the double-stream blocks), the rotary embedding
on the video's tokens, then one descale per head: the largest |q|, and for K and V (smoothed: less their mean over
the tokens) the largest deviation from that mean. Inductor compiled that into six to eight kernels a block that
read and wrote q and k in bf16 between them; a profile of the fp8 step at 608×640 (H200) put them at ~49 ms of its
~560 (norm and rotary 21 ms, the statistics 13, the quantization 15), at 1.3–2 TB/s.

Here (`quantize`, a Triton operator Inductor calls as it is):
1. `qkv_stats`: each program takes a chunk of tokens of one head, computes q and k as the attention sees them
   (norm and rotary in registers, rounded to bf16 where PyTorch rounds) and v, and writes the chunk's partial
   statistics: max |q|, and each channel's sum, maximum and minimum for k and v;
2. `qkv_scales`: one program per head sums the chunks in their order (the same bits every run, no atomics) into the
   means and the descales (× (1/448), as PyTorch divides by a number) and their inverses;
3. `qkv_quantize`: q and k computed again (the same bits), K and V less their means, times the inverse descale,
   rounded to e4m3 in (batch, tokens, heads, dim), FlashAttention-3's layout.
The products' outputs are read twice and the e4m3 tensors written once: nothing in bf16 is written between. The
video's and the prompt's tokens are read from their two tensors (the double-stream blocks' two products), so their
concatenation is not written either. Passes 1 and 3 run once per piece (the video's tokens with the rotary
embedding, the prompt's without), so a program reads one tensor and branches on nothing per value; a head's
channels are held as their 64 (even, odd) pairs, the rotary embedding's unit; the statistics are kept per value
across a chunk and reduced once at its end. A program takes several heads of its tokens (the rotary tables' rows,
float32, 1 KB a token, are more bytes than one head's q, k and v: read once per head they made both passes wait on
the L2 cache), neighbouring programs take the other heads of the same tokens, the statistics pass's loads are
software-pipelined, only a piece's last chunk masks its rows, and the scales pass reads 16 chunks at a time.

On an H200 (BENCHMARKS.md) the three passes take 27.3 ms of the fp8 step (statistics 14.4, quantization 12.2,
scales 0.6) where Inductor's kernels took ~49; the first form of this code, one head per program, took 38.1
(21.6, 13.8, 2.7). With them the fp8 step is 0.495–0.501× eager under the 20 GB cap on two machines (0.518× before them). A first version
(a per-value choice of piece, each pair's partner loaded again, the statistics reduced across warps at every step)
took 174 ms and was not kept.

Compared with `fp8_attention.quantize` on the same q/k/v: its divisions are products with the inverse here, and the
sums run in another order, so a value may land one e4m3 step apart (tests/test_fp8_qkv.py, in Triton's interpreter
on the CPU). Written here because FlashAttention-3 takes inputs already quantized and leaves their scales to its
caller, and no library fuses a normalization and rotary prologue with SageAttention-style smoothing.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rocm import triton_ops
from rocm.fp8_attention import FP8


@dataclass(frozen=True)
class Setting:
    """How the passes are launched. The defaults are the fastest of 17 settings at the full-size step's shapes on an
    H200 (benchmarks/fp8_qkv.py, BENCHMARKS.md): the statistics pass 0.27 ms a block, the quantization 0.19."""
    rows: int = 256             # tokens per program in the statistics pass (partials: 1 + 6·128 floats each)
    stats_bt: int = 8           # the statistics pass: tokens held at once
    stats_warps: int = 4        # … its warps per program
    stages: int = 3             # … its loop's software-pipelining stages (1: none)
    stats_heads: int = 2        # … heads per program (a power of two; fewer where the heads are not a multiple)
    bt: int = 8                 # the quantization pass: tokens per program
    warps: int = 4              # … its warps per program
    heads: int = 8              # … heads per program (as stats_heads)
    heads_first: bool = True    # neighbouring programs take the heads of one block of tokens (`_ids` in the kernels)
    chunks_at_once: int = 16    # the scales pass: chunks' statistics read at once


SETTING = Setting()
_READY: dict[str, object] = {}      # "kernels": rocm/fp8_qkv_kernel.py, "op": its operator (`prepare`)


def prepare() -> bool:
    """Import the kernels and register their operator, once per process and outside compiled code
    (rocm/triton_ops.py); whether they can run here."""
    return triton_ops.prepare(_READY, _load)


def _load():
    from rocm import fp8_qkv_kernel  # Triton: imported only here

    return fp8_qkv_kernel, _register()


def prepared() -> Kernels:
    """The prepared kernels, unwrapped (benchmarks/fp8_qkv.py launches them itself); after `prepare` returned True."""
    return Kernels(_READY["kernels"])


def ready() -> bool:
    """Prepared and able to run (read in traced code: no import, no registration there)."""
    return _READY.get("op") is not None


def usable(pieces: Sequence[torch.Tensor], weights: Sequence[torch.Tensor], cos: torch.Tensor,
           sin: torch.Tensor) -> bool:
    """Whether the kernels take these: an NVIDIA GPU, bf16 (batch, tokens, heads × 128) pieces with contiguous
    channels, bf16 norm weights of 128, float rotary tables of (video tokens, 128)."""
    if not ready() or len(pieces) != 6 or len(weights) != 4:
        return False
    a = pieces[0]
    d = weights[0].shape[0] if weights[0].dim() == 1 else 0
    return (a.is_cuda and torch.version.hip is None and d == 128 and a.dim() == 3 and a.shape[-1] % d == 0
            and all(p.dim() == 3 and p.dtype == torch.bfloat16 and p.stride(-1) == 1 and p.shape[-1] == a.shape[-1]
                    and p.shape[0] == a.shape[0] and p.device == a.device for p in pieces)
            and all(p.shape[1] == a.shape[1] for p in pieces[0::2])
            and all(p.shape[1] == pieces[1].shape[1] for p in pieces[1::2])
            and all(w.shape == (d,) and w.dtype == torch.bfloat16 and w.is_contiguous() for w in weights)
            and cos.shape == sin.shape == (a.shape[1], d) and cos.stride() == sin.stride() and cos.stride(-1) == 1
            and cos.dtype == sin.dtype and cos.dtype in (torch.float32, torch.bfloat16))


def launch(kernels, pieces: Sequence[torch.Tensor], weights: Sequence[torch.Tensor], cos: torch.Tensor,
           sin: torch.Tensor, eps: float, q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor,
           setting: Setting | None = None, interpreted: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the three passes (`kernels`: the jitted ones, or Triton's interpreter in tests with `interpreted`) into
    q8, k8, v8 (batch, tokens, heads, 128); returns (scales (batch × heads, 6): descales q, k, v then their
    inverses; means (batch × heads, 2, 128): k's, v's). `pieces`: q, k, v as (video, prompt) pairs, each (batch,
    tokens, heads × 128); `weights`: the norm weights of q (video, prompt) and k (video, prompt). Passes 1 and 3
    run once per piece (the video's with the rotary embedding)."""
    d = weights[0].shape[0]
    batch, heads = pieces[0].shape[0], pieces[0].shape[-1] // d
    sizes = (pieces[0].shape[1], pieces[1].shape[1])
    n = sum(sizes)
    st = setting or SETTING
    chunks = [-(-m // st.rows) for m in sizes]
    dev = pieces[0].device
    part = torch.empty(batch * heads * sum(chunks) * (1 + 6 * d), dtype=torch.float32, device=dev)
    scales = torch.empty((batch * heads, 6), dtype=torch.float32, device=dev)
    means = torch.empty((batch * heads, 2, d), dtype=torch.float32, device=dev)

    def grid(blocks, at_once):
        groups = batch * heads // at_once
        return (groups, blocks) if st.heads_first else (blocks, groups)

    hs, hq = _heads_at_once(st.stats_heads, heads), _heads_at_once(st.heads, heads)
    for p, m, rope, args in _per_piece(pieces, weights, cos, sin):
        kernels.stats[grid(chunks[p], hs)](*args, part, m, chunks[0] if p else 0, sum(chunks), heads, eps,
                                           ROWS=st.rows, BT=st.stats_bt, HG=hs, D=d, ROPE=rope,
                                           HEADS_FIRST=st.heads_first, STAGES=st.stages, INTERPRETED=interpreted,
                                           num_warps=st.stats_warps)
    kernels.scales[(batch * heads,)](part, scales, means, n, sum(chunks), D=d, CB=st.chunks_at_once, num_warps=4)
    for p, m, rope, args in _per_piece(pieces, weights, cos, sin):
        kernels.quantize[grid(-(-m // st.bt), hq)](*args, scales, means, q8, k8, v8, m, sizes[0] if p else 0, n,
                                                   heads, eps, BT=st.bt, HG=hq, D=d, ROPE=rope,
                                                   HEADS_FIRST=st.heads_first, INTERPRETED=interpreted,
                                                   num_warps=st.warps)
    return scales, means


def _heads_at_once(wanted: int, heads: int) -> int:
    """The most heads a program takes: `wanted` (a power of two) or fewer, dividing `heads` (24: up to 8)."""
    at_once = 1
    while at_once * 2 <= wanted and heads % (at_once * 2) == 0:
        at_once *= 2
    return at_once


def _per_piece(pieces: Sequence[torch.Tensor], weights: Sequence[torch.Tensor], cos: torch.Tensor,
               sin: torch.Tensor):
    """(piece index, its tokens, whether it takes the rotary embedding, the kernels' first arguments for it) for
    each piece with tokens: the video's (0, with the rotary embedding), then the prompt's (1)."""
    for p in (0, 1):
        q, k, v = pieces[p], pieces[2 + p], pieces[4 + p]
        if q.shape[1]:
            yield p, q.shape[1], p == 0, (q, k, v, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0),
                                          v.stride(1), weights[p], weights[2 + p], cos, sin, cos.stride(0))


class Kernels:
    """The kernels of `module` (rocm/fp8_qkv_kernel.py: the jitted ones, or Triton's interpreter's in tests) as
    `launch` takes them, each through `wrap` (torch.library's, so Inductor calls it itself; by default as they are)."""

    def __init__(self, module, wrap=lambda kernel: kernel):
        self.stats, self.scales, self.quantize = (wrap(k) for k in (module.stats_jit, module.scales_jit,
                                                                    module.quantize_jit))


def _register():
    """`steadyframe::qkv_fp8` (a Triton operator)."""
    @torch.library.triton_op("steadyframe::qkv_fp8", mutates_args=())
    def qkv_fp8(pieces: list[torch.Tensor], weights: list[torch.Tensor], cos: torch.Tensor, sin: torch.Tensor,
                eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        a = pieces[0]
        d = weights[0].shape[0]
        shape = (a.shape[0], a.shape[1] + pieces[1].shape[1], a.shape[-1] // d, d)
        q8, k8, v8 = (torch.empty(shape, dtype=FP8, device=a.device) for _ in range(3))
        kernels = Kernels(_READY["kernels"], torch.library.wrap_triton)
        scales, means = launch(kernels, pieces, weights, cos, sin, eps, q8, k8, v8)
        return q8, k8, v8, scales, means

    return qkv_fp8


def quantize(pieces: Sequence[torch.Tensor], weights: Sequence[torch.Tensor], cos: torch.Tensor, sin: torch.Tensor,
             eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q8, k8, v8 (batch, tokens, heads, 128) e4m3; scales (batch × heads, 6); means (batch × heads, 2, 128)) of the
    attention's inputs (`launch` says which), through the operator: call only where `usable`."""
    return _READY["op"](list(pieces), list(weights), cos, sin, float(eps))     # type: ignore[operator]
