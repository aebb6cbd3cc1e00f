"""The inputs tests/test_fp8_qkv.py gives rocm/fp8_qkv.py's passes, and what it compares them with
(benchmarks/fp8_qkv.py `reference`); also imported by its interpreter subprocess."""
from __future__ import annotations

import torch

from benchmarks.fp8_qkv import reference  # noqa: F401  (the tests' reference: the steps the passes replace)

D = 128


def make(batch=2, heads=2, n_a=40, n_b=9, single=False, seed=0):
    """Pieces, weights and rotary tables of one attention call (K and V with offsets for the smoothing to take)."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=1.0, shift=0.0):
        return (torch.randn(*shape, generator=g) * scale + shift).bfloat16()

    if single:
        q, k, v = r(batch, n_a + n_b, heads * D, scale=2), r(batch, n_a + n_b, heads * D, scale=2, shift=3.0), \
            r(batch, n_a + n_b, heads * D)
        pieces = [q[:, :n_a], q[:, n_a:], k[:, :n_a], k[:, n_a:], v[:, :n_a], v[:, n_a:]]
        wq, wk = r(D, shift=1.0), r(D, shift=1.0)
        weights = [wq, wq, wk, wk]
    else:
        pieces = [r(batch, n_a, heads * D, scale=2), r(batch, n_b, heads * D, scale=2),
                  r(batch, n_a, heads * D, scale=2, shift=3.0), r(batch, n_b, heads * D, shift=-1.0),
                  r(batch, n_a, heads * D), r(batch, n_b, heads * D, shift=2.0)]
        weights = [r(D, shift=1.0) for _ in range(4)]
    angles = torch.rand(n_a, D // 2, generator=g) * 6
    cos = angles.cos().repeat_interleave(2, dim=1).contiguous()
    sin = angles.sin().repeat_interleave(2, dim=1).contiguous()
    return pieces, weights, cos, sin
