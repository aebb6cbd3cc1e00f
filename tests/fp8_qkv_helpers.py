"""What tests/test_fp8_qkv.py compares rocm/fp8_qkv.py's passes with, and the inputs it gives them (also imported
by its interpreter subprocess)."""
from __future__ import annotations

import torch

from rocm import fp8_attention as fa

D = 128


def reference(pieces, weights, cos, sin, eps):
    """What the passes compute, the way the code before them did: diffusers' RMSNorm and `apply_rotary_emb` on the
    video's tokens, the tokens joined, then `fp8_attention.quantize(..., kernel=FA3)`; in the passes' output forms."""
    from diffusers.models.embeddings import apply_rotary_emb
    from diffusers.models.normalization import RMSNorm

    heads = pieces[0].shape[-1] // D

    def norm(x, w):
        m = RMSNorm(D, eps=eps).to(w.dtype).requires_grad_(False)
        m.weight.data.copy_(w)
        return m(x.unflatten(2, (heads, D)))

    def qk(a, b, wa, wb):
        return torch.cat([apply_rotary_emb(norm(a, wa), (cos, sin), sequence_dim=1), norm(b, wb)], dim=1)

    q, k = qk(pieces[0], pieces[1], weights[0], weights[1]), qk(pieces[2], pieces[3], weights[2], weights[3])
    v = torch.cat([pieces[4], pieces[5]], dim=1).unflatten(2, (heads, D))
    with torch.no_grad():
        z = fa.quantize(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), kernel=fa.FA3)
    b = q.shape[0]
    descales = torch.stack([t.reshape(b * heads) for t in (z.descale_q, z.descale_k, z.descale_v)], dim=1)
    scales = torch.cat([descales, 1.0 / descales], dim=1)
    k_mean = k.float().mean(dim=1).reshape(b * heads, D)
    means = torch.stack([k_mean, z.v_mean.reshape(b * heads, D)], dim=1)
    return (*(t.transpose(1, 2).contiguous() for t in (z.q, z.k, z.v)), scales, means)


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
