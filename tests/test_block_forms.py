"""The compiled blocks' own forms (pipeline/block_forms.py): the single-stream block without its concatenation, the
MLP's GELU in its product, each against diffusers' own forward on a tiny real block (CPU, float64)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pipeline import block_forms


@pytest.fixture(scope="module")
def blocks(tiny_original):
    import copy

    tr = copy.deepcopy(tiny_original.transformer).to(torch.float64)
    return tr.transformer_blocks[0], tr.single_transformer_blocks[0]


def _inputs(block, video=40, text=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    dim = block.proj_out.out_features if hasattr(block, "proj_out") else block.norm1.linear.in_features
    x = torch.randn(1, video, dim, generator=g, dtype=torch.float64)
    ctx = torch.randn(1, text, dim, generator=g, dtype=torch.float64)
    temb = torch.randn(1, dim, generator=g, dtype=torch.float64)
    return x, ctx, temb


def test_the_single_block_form_computes_diffusers_forward(blocks):
    _, single = blocks
    x, ctx, temb = _inputs(single)
    want = type(single).forward(single, x, ctx, temb)
    got = block_forms.single_block_forward(single, x, ctx, temb)
    assert [t.shape for t in got] == [t.shape for t in want]
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    assert not torch.equal(got[0], x)                     # (the block did something)


def test_the_split_product_is_the_product_of_the_concatenation():
    g = torch.Generator().manual_seed(1)
    linear = torch.nn.Linear(5 + 11, 6).double()
    a, m = torch.randn(3, 4, 5, generator=g, dtype=torch.float64), torch.randn(3, 4, 11, generator=g, dtype=torch.float64)
    torch.testing.assert_close(block_forms.split_linear(linear, a, m), linear(torch.cat([a, m], -1)))


def test_the_gelu_product_operator_is_tanh_gelu_of_the_product_and_checks_as_an_operator():
    g = torch.Generator().manual_seed(2)
    x, w, b = (torch.randn(2, 9, 8, generator=g), torch.randn(12, 8, generator=g), torch.randn(12, generator=g))
    out = torch.ops.steadyframe.linear_gelu_tanh(x, w, b)
    torch.testing.assert_close(out, F.gelu(F.linear(x, w, b), approximate="tanh"))
    assert not torch.allclose(out, F.gelu(F.linear(x, w, b)), atol=1e-6)      # tanh, not the exact GELU
    torch.library.opcheck(torch.ops.steadyframe.linear_gelu_tanh, (x, w, b))  # schema, fake tensor, autograd reg.


def test_gelu_tanh_is_the_tanh_gelu_written_with_sigmoid():
    x = torch.linspace(-12, 12, 20001, dtype=torch.float64)
    torch.testing.assert_close(block_forms.gelu_tanh(x), F.gelu(x, approximate="tanh"), rtol=1e-13, atol=1e-15)
    assert not torch.allclose(block_forms.gelu_tanh(x), F.gelu(x), atol=1e-6)          # tanh's, not the exact GELU
    h = (x * 3).to(torch.bfloat16)
    got = block_forms.gelu_tanh(h)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), F.gelu(h.float(), approximate="tanh").bfloat16().float(), rtol=8e-3,
                               atol=1e-6)                                              # one bf16 rounding apart
    linear = torch.nn.Linear(8, 16).double()        # not an epilogue case (the CPU): the product, then gelu_tanh
    xs = torch.randn(3, 8, dtype=torch.float64)
    torch.testing.assert_close(block_forms.linear_gelu(linear, xs), F.gelu(linear(xs), approximate="tanh"))


def test_the_epilogue_is_used_only_for_a_plain_half_precision_linear_on_an_nvidia_gpu():
    linear = torch.nn.Linear(4, 4).to(torch.bfloat16)
    assert not block_forms._epilogue(linear, torch.zeros(2, 4, dtype=torch.bfloat16))      # the CPU
    meta = torch.zeros(2, 4, dtype=torch.bfloat16, device="meta")
    assert not block_forms._epilogue(linear, meta)


def test_fused_gelu_modules_run_diffusers_forward_eagerly(blocks):
    double, _ = blocks
    import copy

    from diffusers.models.activations import GELU

    fused = copy.deepcopy(double)
    block_forms.fuse_blocks([fused])
    modules = [m for m in fused.modules() if isinstance(m, GELU)]
    assert modules and all(type(m).__name__ == "FusedGELU" for m in modules)
    block_forms.fuse_blocks([fused])                                    # once: a second call changes nothing
    assert all(type(m).__mro__.count(GELU) == 1 for m in modules)
    x = torch.randn(1, 6, modules[0].proj.in_features, dtype=torch.float64)
    want = GELU.forward(modules[0], x)
    assert torch.equal(modules[0](x), want)                              # eager: diffusers' own, bit for bit


def _rows_reference(h, first=None):
    """[first | gelu_tanh(h)] in float64 and each row's largest |value| taken from those values."""
    values = F.gelu(h.double(), approximate="tanh").reshape(-1, h.shape[-1])
    if first is not None:
        values = torch.cat([first.double().reshape(-1, first.shape[-1]), values], dim=1)
    return values, values.abs().amax(dim=1)


def test_gelu_rows_fp8_bounds_each_rows_largest_gelu_from_its_extremes():
    g = torch.Generator().manual_seed(3)
    rows = [torch.randn(64, generator=g) * 3,                     # the usual row: its largest GELU is GELU(max)
            -torch.rand(64, generator=g) * 0.7 - 0.01,            # all in (-0.75, 0): |GELU| largest at the min
            -torch.rand(64, generator=g) * 5 - 0.8,               # all below -0.75: the bound 0.1700408
            torch.zeros(64)]                                       # nothing: scale 1
    h = torch.stack(rows).to(torch.bfloat16)
    q, s = block_forms.gelu_rows_fp8(h)
    assert q.dtype == torch.float8_e4m3fn and q.shape == h.shape and s.dtype == torch.float32
    values, amax = _rows_reference(h)
    assert torch.all(s.double() * 448 >= amax * (1 - 1e-6))                   # never below the row's largest
    torch.testing.assert_close(s[:2].double() * 448, amax[:2], rtol=1e-6, atol=0)   # tight where it can be
    assert abs(float(s[2]) * 448 - 0.1700408) < 1e-6 and float(s[3]) == 1.0
    assert float(q[:2].float().abs().amax(dim=1).min()) >= 416                     # full range used (e4m3 steps)
    back = q.float().double() * s.double()[:, None]
    assert torch.all((back - values).abs() <= amax[:, None] * 2 ** -4 + 1e-12)     # within e4m3's rounding


def test_gelu_rows_fp8_puts_the_first_values_in_front_with_their_own_range():
    g = torch.Generator().manual_seed(4)
    h = torch.randn(2, 5, 48, generator=g).to(torch.bfloat16)
    first = (torch.randn(2, 5, 16, generator=g) * torch.tensor([1.0, 40.0]).view(2, 1, 1)).to(torch.bfloat16)
    q, s = block_forms.gelu_rows_fp8(h, first=first)
    assert q.shape == (10, 64)
    values, amax = _rows_reference(h, first)
    torch.testing.assert_close(s.double() * 448, amax, rtol=1e-6, atol=0)
    back = q.float().double() * s.double()[:, None]
    assert torch.all((back - values).abs() <= amax[:, None] * 2 ** -4 + 1e-12)
    assert float(q[5:, :16].float().abs().amax()) >= 416        # the second batch's rows: their range is first's


def _rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def test_under_fp8_compute_the_blocks_mlps_take_rows_quantized_with_their_gelu(monkeypatch):
    """The single-stream block's form and the double-stream block's MLP (compiled, row-wise fp8) give what
    diffusers' forward gives with the same fp8 Linears, within fp8's rounding: the GELU's rows reach the product
    quantized by `gelu_rows_fp8` (counted), and the first values are the attention's output."""
    from pipeline import compiled
    from tests.test_compiled import _fp8_transformer

    tr = _fp8_transformer()
    compiled.use_fp8_compute(tr, "rowwise")
    block_forms.fuse_blocks(compiled.blocks_of(tr))
    double, single = tr.transformer_blocks[0], tr.single_transformer_blocks[0]
    assert type(double.ff).__name__ == "FusedFeedForward" and block_forms._rows_fp8_ready(single.proj_out)
    seen = []
    real = block_forms.gelu_rows_fp8
    monkeypatch.setattr(block_forms, "gelu_rows_fp8", lambda h, first=None: seen.append(
        (tuple(h.shape), None if first is None else tuple(first.shape))) or real(h, first))
    g = torch.Generator().manual_seed(5)
    x, ctx, temb = (torch.randn(1, n, 32, generator=g).to(torch.bfloat16) for n in (40, 7, 1))
    temb = temb[:, 0]
    want = type(single).forward(single, x, ctx, temb)
    got = block_forms.single_block_forward(single, x, ctx, temb)
    assert seen == [((1, 47, 128), (1, 47, 32))]
    for a, b in zip(got, want):
        assert _rel(a - (x if a.shape == x.shape else ctx), b - (x if b.shape == x.shape else ctx)) < 0.05
    hidden = torch.randn(1, 40, 32, generator=g).to(torch.bfloat16)
    plain = type(double.ff).__mro__[2].forward(double.ff, hidden)          # diffusers' FeedForward.forward
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)     # the form is for compiled code
    fused = double.ff(hidden)
    assert seen[-1] == ((1, 40, 128), None) and fused.shape == plain.shape
    assert 0 < _rel(fused, plain) < 0.05
