"""fp8 compute's MLP output products with the GELU in their input's quantization (pipeline/fp8_rows.py): the Triton
kernel in Triton's interpreter on the CPU against the PyTorch form, and the compiled blocks' forms that use it (the
single-stream block, the double-stream blocks' FeedForward) against the same products through the concatenation."""
from __future__ import annotations

import copy
import textwrap

import pytest
import torch

from memory import fp8
from pipeline import block_forms, compiled, fp8_rows
from tests.model_helpers import in_triton_interpreter, small_transformer

# Run in a process of its own: Triton's interpreter must be chosen before Triton is imported. The kernel writes
# float32 (the values before their e4m3 rounding: the interpreter rounds to fp8 by truncating, the GPU to nearest
# as PyTorch does), so the test rounds them with PyTorch and compares bits.
_INTERPRETED = textwrap.dedent("""
    import json, torch
    from memory import fp8
    from pipeline import fp8_rows, fp8_rows_kernel
    g = torch.Generator().manual_seed(0)
    batch, n, n_a, k1, k2 = 2, 9, 6, 48, 200
    full = (torch.randn(batch, n, k1, generator=g) * 3).bfloat16()
    h = (torch.randn(batch, n, k2, generator=g) * 4).bfloat16()
    h[1, 3] = 0                                          # a row whose GELU is all zeros ...
    full[1, 3] = 0                                       # ... and its attention part too: scale 1
    h[0, 2, 7] = 300.0                                   # a large value: its row's scale follows it
    wide = full.new_empty(batch, n, k1 + 16)[..., 8:8 + k1]     # pieces with strides of their own
    wide.copy_(full)
    results = {}
    for name, first in {"two pieces": [wide[:, :n_a], wide[:, n_a:]], "one piece": [full], "none": []}.items():
        width = (k1 if first else 0) + k2
        pre = torch.full((batch * n, width), float("nan"))
        s = torch.full((batch * n,), float("nan"))
        fp8_rows.launch(fp8_rows_kernel.jitted, first, h, pre, s)
        want_q, want_s = fp8_rows.reference(first, h)
        results[name] = {
            "scales equal": torch.equal(s, want_s),
            "values differ": int((pre.to(fp8.FP8).view(torch.uint8) != want_q.view(torch.uint8)).sum()),
            "nan": bool(pre.isnan().any()),
            "zero row scale": float(s[n + 3]),
        }
    print(json.dumps(results))
""")


def test_the_kernel_in_tritons_interpreter_gives_the_pytorch_forms_bits():
    results = in_triton_interpreter(_INTERPRETED)
    assert set(results) == {"two pieces", "one piece", "none"}
    for name, r in results.items():
        assert r["scales equal"], name
        assert r["values differ"] == 0, name
        assert not r["nan"], name                       # every value and scale written
        assert r["zero row scale"] == 1.0, name


def _linear(k_in: int, k_out: int, seed: int) -> compiled.Fp8Linear:
    torch.manual_seed(seed)
    linear = torch.nn.Linear(k_in, k_out).to(torch.bfloat16).requires_grad_(False)
    linear.__class__ = compiled.Fp8Linear
    fp8.keep_on_device(linear)
    return linear


def _codes_apart(a: torch.Tensor, b: torch.Tensor) -> int:
    """The largest distance between two e4m3 tensors in codes (steps of the format, sign apart)."""
    def signed(t):
        bits = t.view(torch.uint8).to(torch.int32)
        return torch.where(bits >= 128, -(bits - 128), bits)
    return int((signed(a) - signed(b)).abs().max())


@pytest.mark.parametrize("recipe", ["rowwise", "tensorwise"])
def test_gelu_rows_is_the_product_of_the_concatenated_gelu_rows(recipe):
    linear = _linear(16 + 48, 32, seed=1)
    linear.fp8_recipe = recipe
    g = torch.Generator().manual_seed(3)
    video, text = (torch.randn(1, 11, 16, generator=g) * 2).bfloat16(), torch.randn(1, 4, 16, generator=g).bfloat16()
    h = (torch.randn(1, 15, 48, generator=g) * 3).bfloat16()
    got = linear.gelu_rows((video, text), h)
    through_cat = linear(torch.cat([torch.cat([video, text], dim=1), block_forms.gelu_tanh(h)], dim=-1))
    assert got.shape == (1, 15, 32)
    if recipe == "rowwise":         # the rows' quantization (fp8_rows.reference here, on the CPU), then the product
        values, scales = linear.fp8_weight()
        want = fp8_rows.rowwise_product(*fp8_rows.reference((video, text), h), values, scales, linear.bias,
                                        torch.bfloat16).reshape(1, 15, 32)
        assert torch.equal(got, want)
        assert float((got.float() - through_cat.float()).norm() / through_cat.float().norm()) < 1e-2
    else:                           # other recipes: through the concatenation, as the Linear's own forward
        assert torch.equal(got, through_cat)
    ff = _linear(48, 32, seed=2)
    assert not torch.equal(ff.gelu_rows((), h), ff(h))              # (the GELU is applied)
    assert float((ff.gelu_rows((), h) - ff(block_forms.gelu_tanh(h))).float().norm()
                 / ff(block_forms.gelu_tanh(h)).float().norm()) < 1e-2


def test_the_reference_quantizes_the_rows_as_the_fp8_products_do():
    """Per row as memory/fp8.py's `quantize_rows`, its divisions as products with reciprocals: the scales at most
    one float32 rounding apart, the values at most one e4m3 code."""
    g = torch.Generator().manual_seed(4)
    first = (torch.randn(2, 50, 8, generator=g) * 5).bfloat16()
    h = torch.randn(2, 50, 24, generator=g).bfloat16()
    h[1, 7] = 0
    first[1, 7] = 0
    q, s = fp8_rows.reference([first[:, :20], first[:, 20:]], h)
    rows = torch.cat([first, block_forms.gelu_tanh(h)], dim=-1).reshape(100, 32)
    want_q, want_s = fp8.quantize_rows(rows)
    assert torch.allclose(s, want_s, rtol=2 ** -23, atol=0) and s[57] == 1.0
    assert _codes_apart(q, want_q) <= 1
    assert torch.allclose(q.float() * s[:, None], rows.float(), rtol=0.07, atol=1e-3)
    assert float(q.float().abs().amax(dim=1).min()) == 0 and float(q.float().abs().amax()) == fp8.FP8_MAX


def test_rows_are_held_as_two_tiles_of_powers_of_two():
    assert fp8_rows.tiles(12288) == (8192, 4096) and fp8_rows.tiles(3072) == (2048, 1024)
    assert fp8_rows.tiles(4096) == (4096, 0) and fp8_rows.tiles(0) == (0, 0)
    assert fp8_rows.tiles(200) == (128, 128) and fp8_rows.tiles(1) == (1, 0)
    for k in range(1, 3000, 7):
        a, b = fp8_rows.tiles(k)
        assert a + b >= k and a <= k and b <= a


def test_the_kernel_is_chosen_only_for_bf16_rows_on_an_nvidia_gpu():
    h = torch.zeros(1, 4, 64, dtype=torch.bfloat16)
    assert not fp8_rows._usable((), h)                              # the CPU: the PyTorch form
    meta = torch.zeros(1, 4, 64, dtype=torch.bfloat16, device="meta")
    assert not fp8_rows._usable((), meta)


@pytest.fixture(scope="module")
def fp8_blocks():
    tr = small_transformer()
    compiled.use_fp8_compute(tr, "rowwise")
    return tr.transformer_blocks[0], tr.single_transformer_blocks[0]


def _inputs(dim, video=24, text=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, video, dim, generator=g).bfloat16(), torch.randn(1, text, dim, generator=g).bfloat16(),
            torch.randn(1, dim, generator=g).bfloat16())


def test_the_single_block_form_under_fp8_puts_the_gelu_in_proj_outs_quantization(fp8_blocks, monkeypatch):
    _, single = fp8_blocks
    x, ctx, temb = _inputs(single.proj_out.out_features)
    calls = []
    original = compiled.Fp8Linear.gelu_rows

    def counted(self, first, h):
        calls.append((len(first), tuple(h.shape)))
        return original(self, first, h)

    monkeypatch.setattr(compiled.Fp8Linear, "gelu_rows", counted)
    got = block_forms.single_block_forward(single, x, ctx, temb)
    assert calls == [(2, (1, 29, single.proj_mlp.out_features))]   # the attention in two pieces, h before GELU
    monkeypatch.setattr(compiled.Fp8Linear, "gelu_rows", None)      # the form before: the concatenation
    want = block_forms.single_block_forward(single, x, ctx, temb)
    for a, b in zip(got, want):                 # the same products, the rows' divisions one rounding apart
        assert float((a.float() - b.float()).norm() / b.float().norm()) < 2e-3
    plain = type(single).forward(single, x, ctx, temb)              # diffusers' forward, tanh GELU of its own
    for a, b in zip(got, plain):
        assert float((a.float() - b.float()).norm() / b.float().norm()) < 0.02


def test_the_feed_forward_form_under_fp8_while_compiling_and_diffusers_forward_otherwise(fp8_blocks, monkeypatch):
    double, _ = fp8_blocks
    fused = copy.deepcopy(double)
    block_forms.fuse_blocks([fused])
    ff = fused.ff
    assert type(ff).__name__ == "FusedFeedForward"
    x = _inputs(ff.net[2].out_features, seed=5)[0]
    eager = ff(x)
    want = ff.net[2](block_forms.gelu_tanh(ff.net[0].proj(x)))
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    got = ff(x)
    values, scales = ff.net[2].fp8_weight()
    rows = fp8_rows.rowwise_product(*fp8_rows.reference((), ff.net[0].proj(x)), values, scales, ff.net[2].bias,
                                    torch.bfloat16)
    assert torch.equal(got, rows.reshape(got.shape))
    assert float((got.float() - want.float()).norm() / want.float().norm()) < 2e-3
    assert float((got.float() - eager.float()).norm() / eager.float().norm()) < 0.02
    ff.net[1].p, ff.net[1].training = 0.5, True     # a dropout that acts: diffusers' forward, not the form
    assert block_forms._feed_forward_rows(ff) is None
    plain = copy.deepcopy(double)                   # bf16 Linears: no rows product, the GELU module's form
    plain.ff.net[2].__class__ = torch.nn.Linear
    block_forms.fuse_blocks([plain])
    assert block_forms._feed_forward_rows(plain.ff) is None
