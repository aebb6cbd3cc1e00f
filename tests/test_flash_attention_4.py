"""FlashAttention-4 in the attention guard (rocm/sdpa.py): which calls it takes, that the guard routes them to it
in the fused kernels' output layout, that it can be turned off, and that a failure falls back to PyTorch's kernels
once and for the rest of the process. The CPU stands in for the GPU: `_fa4_here` (installed, and a GPU where it was
measured faster) is replaced, and flash-attn-4's function by a reference of the same interface ((batch, tokens,
heads, dim) in, (out, lse) back). The real kernel is timed and checked on the GPU (benchmarks/attention.py)."""
from __future__ import annotations

import sys
import types

import pytest
import rocm_helpers  # noqa: F401  (puts the repo on sys.path)
import torch
import torch.nn.functional as F

from rocm import sdpa


def _qkv(d=64, heads=4, tokens=48, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    # diffusers' layout: (batch, tokens, heads, dim) storage seen as (batch, heads, tokens, dim)
    return tuple(torch.randn(1, tokens, heads, d, generator=g).to(dtype).transpose(1, 2) for _ in range(3))


class FakeFlash4:
    """flash_attn.cute.flash_attn_func's interface, computed by PyTorch's attention."""

    def __init__(self, fail: bool = False):
        self.calls, self.fail = [], fail

    def __call__(self, q, k, v, softmax_scale=None, **kw):
        self.calls.append((tuple(q.shape), softmax_scale))
        if self.fail:
            raise RuntimeError("CuTe DSL: cannot compile for this GPU")
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             scale=softmax_scale)
        return out.transpose(1, 2).contiguous(), None


@pytest.fixture
def flash4(monkeypatch):
    """A fresh process's FlashAttention-4 state, with the fake installed and the CPU taken as a GPU it is measured
    on."""
    fake = FakeFlash4()
    module = types.ModuleType("flash_attn.cute")
    module.flash_attn_func = fake
    monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))
    monkeypatch.setitem(sys.modules, "flash_attn.cute", module)
    monkeypatch.setattr(sdpa, "_FA4", [])
    monkeypatch.setattr(sdpa, "_FA4_FAILED", [])
    monkeypatch.setattr(sdpa, "_fa4_here", lambda query: sdpa._flash4() is not None)
    return fake


@pytest.mark.parametrize("change,takes", [
    ({}, True),
    ({"dtype": torch.float16}, True),
    ({"d": 256}, True),
    ({"dtype": torch.float32}, False),          # bf16/fp16 only
    ({"d": 260}, False),                        # above 256
    ({"d": 20}, False),                         # not a multiple of 8
])
def test_the_calls_it_takes_by_dtype_and_head_size(change, takes):
    q, k, v = _qkv(**change)
    assert sdpa.fa4_takes(q, k, v, None, 0.0, False, False) is takes


def test_masks_dropout_causal_gqa_gradients_and_other_layouts_are_not_taken():
    q, k, v = _qkv()
    assert sdpa.fa4_takes(q, k, v, None, 0.0, False, False)
    assert not sdpa.fa4_takes(q, k, v, torch.ones(48, 48, dtype=torch.bool), 0.0, False, False)
    assert not sdpa.fa4_takes(q, k, v, None, 0.1, False, False)
    assert not sdpa.fa4_takes(q, k, v, None, 0.0, True, False)
    assert not sdpa.fa4_takes(q, k[:, :2], v[:, :2], None, 0.0, False, True)       # fewer k/v heads
    assert not sdpa.fa4_takes(q.detach().requires_grad_(), k, v, None, 0.0, False, False)
    assert not sdpa.fa4_takes(q[0], k[0], v[0], None, 0.0, False, False)             # 3-D
    assert not sdpa.fa4_takes(q, k, v[..., :32], None, 0.0, False, False)            # another value head size


def test_not_installed_or_not_a_measured_gpu_keeps_pytorchs_kernels(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn.cute", None)          # `import` raises ImportError
    monkeypatch.setattr(sdpa, "_FA4", [])
    assert sdpa._flash4() is None
    q, k, v = _qkv()
    assert not sdpa.fa4_fits(q, k, v, None, 0.0, False, False)
    monkeypatch.setattr(sdpa, "_FA4", [FakeFlash4()])                  # installed, but these are CPU tensors
    assert not sdpa._fa4_here(q)


def test_the_guard_runs_fa4_in_the_fused_kernels_layout_and_records_it(flash4):
    q, k, v = _qkv()
    guard = sdpa.AttentionGuard(torch.device("cpu"), label="transformer")
    out = guard._sdpa(q, k, v, scale=0.1)
    assert flash4.calls == [((1, 48, 4, 64), 0.1)]                   # (batch, tokens, heads, dim), the scale passed
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, scale=0.1))
    assert out.stride() == sdpa._out_like(q, v).stride()              # token-major, as compiled blocks expect
    assert guard.choices == {"bfloat16, head dim 64, no mask": sdpa.FA4_CHOICE}
    guard._sdpa(q, k, v, attn_mask=torch.ones(48, 48, dtype=torch.bool))              # a mask: PyTorch's kernels
    with sdpa.flash_attention_4(False):
        off = guard._sdpa(q, k, v, scale=0.1)
    assert len(flash4.calls) == 1
    torch.testing.assert_close(off, out)


def test_fp8_attention_comes_first_where_it_is_on(flash4, monkeypatch):
    from rocm import fp8_attention as fa

    ran = []
    monkeypatch.setattr(fa, "fits", lambda *a: True)
    monkeypatch.setattr(sdpa, "_run_fp8", lambda query, z, scale: ran.append(1) or torch.zeros_like(query))
    q, k, v = _qkv()
    guard = sdpa.AttentionGuard(torch.device("cpu"))
    with sdpa.fp8_attention(True):
        guard._sdpa(q, k, v)
    assert ran == [1] and flash4.calls == []


def test_a_failure_falls_back_once_and_for_the_rest_of_the_process(flash4, caplog):
    flash4.fail = True
    q, k, v = _qkv()
    guard = sdpa.AttentionGuard(torch.device("cpu"))
    with caplog.at_level("WARNING", logger="rocm.sdpa"):
        first = guard._sdpa(q, k, v)
        second = guard._sdpa(q, k, v)
    torch.testing.assert_close(first, F.scaled_dot_product_attention(q, k, v))
    torch.testing.assert_close(second, first)
    assert len(flash4.calls) == 1 and sdpa._FA4_FAILED
    warnings = [r.getMessage() for r in caplog.records if "FlashAttention-4 failed" in r.getMessage()]
    assert len(warnings) == 1 and "cannot compile" in warnings[0]
    assert sdpa.FA4_CHOICE not in guard.choices.values()
