"""Chunked attention (the fallback when no fused kernel applies) against PyTorch's unchunked attention.

Tolerance: float32 on the CPU, |chunked − full| ≤ 1e-5 absolute (softmax rows are computed independently; only
the reduction order inside a kernel may differ).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from rocm.sdpa import AttentionGuard, chunk_rows, chunked_sdpa

ATOL = 1e-5


def _qkv(b=2, hq=4, hk=4, lq=50, lk=50, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, hq, lq, d, generator=g), torch.randn(b, hk, lk, d, generator=g),
            torch.randn(b, hk, lk, d, generator=g))


def test_chunked_equals_full_without_mask():
    q, k, v = _qkv()
    torch.testing.assert_close(chunked_sdpa(q, k, v, rows=7), F.scaled_dot_product_attention(q, k, v),
                               atol=ATOL, rtol=0)


def test_chunked_equals_full_with_masks_and_scale():
    q, k, v = _qkv(lq=33, lk=41, seed=1)
    bool_mask = torch.rand(2, 1, 33, 41, generator=torch.Generator().manual_seed(2)) > 0.3
    bool_mask[..., 0] = True                                  # no fully masked rows
    key_pad = torch.zeros(1, 1, 1, 41)
    key_pad[..., 30:] = float("-inf")                          # a broadcast key-padding mask (no query dim)
    for mask in (bool_mask, key_pad):
        torch.testing.assert_close(chunked_sdpa(q, k, v, mask, scale=0.3, rows=5),
                                   F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3),
                                   atol=ATOL, rtol=0)


def test_chunked_equals_full_causal_and_gqa():
    q, k, v = _qkv(hq=4, hk=2, seed=3)
    torch.testing.assert_close(chunked_sdpa(q, k, v, is_causal=True, enable_gqa=True, rows=8),
                               F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
                               atol=ATOL, rtol=0)


def test_chunk_rows_from_budget():
    q = torch.empty(1, 24, 18485, 128, device="meta")
    k = torch.empty(1, 24, 18485, 128, device="meta")
    # unchunked: 24 × 18485² × 12 B ≈ 91 GiB; 1 GiB of scores per chunk → 201 query rows
    assert chunk_rows(q, k, 1 << 30) == (1 << 30) // (24 * 18485 * 12) == 201
    assert chunk_rows(q, k, 1) == 1
    assert chunk_rows(q[:, :, :10], k, 1 << 40) == 10


def test_guard_patches_only_inside_and_logs_its_choice(tiny_original, caplog):
    from benchmarks.transformer_step import section_inputs
    from pipeline.denoiser import FramepackDenoiser

    original = F.scaled_dot_product_attention
    tr = tiny_original.transformer
    ctx, idx, shape, image, texts, noise = section_inputs(tr, 64, 64, 9, 16)

    def step():
        den = FramepackDenoiser(tr)
        den.begin_section(ctx, idx, shape, image, texts, 10.0)
        return den(noise, torch.tensor([700.0]))

    reference = step()
    calls = []
    with caplog.at_level("INFO", logger="rocm.sdpa"):
        with AttentionGuard("cpu", chunk_budget_bytes=4096, force_chunked=True, label="transformer") as guard:
            assert F.scaled_dot_product_attention is not original
            wrapped = F.scaled_dot_product_attention
            F.scaled_dot_product_attention = lambda *a, **kw: (calls.append(1), wrapped(*a, **kw))[1]
            try:
                chunked = step()
            finally:
                F.scaled_dot_product_attention = wrapped
    assert F.scaled_dot_product_attention is original
    assert calls                                                   # diffusers' attention went through the guard
    assert guard.choices and all("chunks of" in text for text in guard.choices.values())
    assert "attention in transformer" in caplog.text
    torch.testing.assert_close(chunked, reference, atol=1e-5, rtol=1e-4)


def test_guard_is_a_no_op_on_cpu_unless_forced():
    original = F.scaled_dot_product_attention
    with AttentionGuard("cpu") as guard:
        assert F.scaled_dot_product_attention is original
    assert guard.choices == {}
