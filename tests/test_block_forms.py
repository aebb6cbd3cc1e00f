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


def _rope(block, video, seed=3):
    g = torch.Generator().manual_seed(seed)
    head = block.attn.to_q.out_features // block.attn.heads
    angles = torch.rand(video, head // 2, generator=g, dtype=torch.float64) * 6.0
    return angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1)


def test_the_single_block_form_with_rotary_tables_computes_diffusers_forward(blocks):
    """With the rotary tables of the video tokens (the attention on the whole sequence): diffusers' forward. To
    float32's rounding: diffusers rotates in float32, so in a float64 block the prompt's rows, which its forward
    leaves as they are, are rounded by the identity rows (in the app's dtypes that is exact: the next test)."""
    _, single = blocks
    x, ctx, temb = _inputs(single, seed=4)
    rope = _rope(single, x.shape[1])
    want = type(single).forward(single, x, ctx, temb, None, rope)
    got = block_forms.single_block_forward(single, x, ctx, temb, None, rope)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    plain = block_forms.single_block_forward(single, x, ctx, temb)
    assert not torch.allclose(plain[0], got[0], atol=1e-2)          # (the tables were applied)


def test_the_whole_sequence_attention_gives_diffusers_processors_bits_in_fp32_and_bf16(blocks):
    import copy

    _, single = blocks
    x, ctx, _ = _inputs(single, seed=5)
    rope = tuple(t.float() for t in _rope(single, x.shape[1]))
    text = ctx.shape[1]
    for dtype in (torch.float32, torch.bfloat16):
        attn = copy.deepcopy(single.attn).to(dtype)
        seq = torch.cat([x, ctx], dim=1).to(dtype)
        assert block_forms._plain_processor(attn)
        video, prompt = attn(hidden_states=seq[:, :-text], encoder_hidden_states=seq[:, -text:], image_rotary_emb=rope)
        got = block_forms.whole_sequence_attention(attn, seq, text, rope)
        assert torch.equal(got, torch.cat([video, prompt], dim=1)), dtype


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
