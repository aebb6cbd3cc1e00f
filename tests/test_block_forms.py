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
