"""fp8 attention's inputs from the q/k/v products in three Triton passes (rocm/fp8_qkv.py): the kernels in Triton's
interpreter on the CPU against diffusers' norm and rotary steps followed by rocm/fp8_attention.py's quantization for
FlashAttention-3, and the blocks' attention form (pipeline/block_forms.py) that calls them, against diffusers'
processor."""
from __future__ import annotations

import textwrap

import pytest
import torch

from pipeline import block_forms
from rocm import fp8_qkv, sdpa
from tests.fp8_qkv_helpers import make, reference
from tests.model_helpers import in_triton_interpreter

# Run in a process of its own: Triton's interpreter is chosen before Triton is imported. The kernels write float32
# (the values before their e4m3 rounding: the interpreter rounds to fp8 by truncating, the GPU to nearest as
# PyTorch does), so the test rounds them with PyTorch.
_INTERPRETED = textwrap.dedent("""
    import json, torch
    from rocm import fp8_qkv, fp8_qkv_kernel
    from rocm.fp8_attention import FP8
    from tests.fp8_qkv_helpers import make, reference
    kernels = fp8_qkv.Kernels(fp8_qkv_kernel)
    results = {}
    cases = (("double-stream", False, dict(rows=16, stats_bt=8, bt=8, chunks_at_once=2, stats_heads=2, heads=2)),
             ("single-stream", True, dict(rows=24, stats_bt=8, bt=8, heads_first=False, stats_heads=1, heads=1)),
             ("one chunk", False, dict(rows=256, stats_bt=16, bt=16, stats_heads=2, heads=1)))
    for name, single, setting in cases:
        pieces, weights, cos, sin = make(single=single)
        shape = (2, 49, 2, 128)
        q8, k8, v8 = (torch.full(shape, float("nan")) for _ in range(3))
        scales, means = fp8_qkv.launch(kernels, pieces, weights, cos, sin, 1e-6, q8, k8, v8,
                                       setting=fp8_qkv.Setting(**setting), interpreted=True)
        want = reference(pieces, weights, cos, sin, 1e-6)
        r = {"nan": any(bool(t.isnan().any()) for t in (q8, k8, v8, scales, means))}
        for i, key in enumerate("qkv"):
            got = (q8, k8, v8)[i].to(FP8).view(torch.uint8)
            r[key + " differ"] = int((got != want[i].view(torch.uint8)).sum())
        r["scales rel"] = float(((scales - want[3]).abs() / want[3]).max())
        r["means abs"] = float((means - want[4]).abs().max())
        r["largest code"] = float(q8.to(FP8).float().abs().amax())
        results[name] = r
    print(json.dumps(results))
""")


def test_the_passes_in_tritons_interpreter_quantize_as_the_steps_before_them():
    """Norm, rotary, smoothing and the head scales: the e4m3 values of the steps they replace (diffusers' norm and
    rotary, then fp8_attention.quantize for FlashAttention-3), for the two pieces of a double-stream block, the views
    of one single-stream product, several chunks of tokens and one; descales and means a float32 rounding apart."""
    results = in_triton_interpreter(_INTERPRETED)
    assert set(results) == {"double-stream", "single-stream", "one chunk"}
    for name, r in results.items():
        assert not r["nan"], name                       # every value, scale and mean written
        for key in "qkv":                               # of 25,088 each; sums in another order may move one
            assert r[key + " differ"] <= 25, (name, key, r)
        assert r["scales rel"] < 1e-6 and r["means abs"] < 1e-5, (name, r)
        assert r["largest code"] == 448.0, name         # each head's largest |q| maps to e4m3's largest


def test_the_passes_are_chosen_for_bf16_heads_of_128_on_an_nvidia_gpu_only(monkeypatch):
    pieces, weights, cos, sin = make()
    monkeypatch.setitem(fp8_qkv._READY, "op", object())         # as if prepared
    assert not fp8_qkv.usable(pieces, weights, cos, sin)        # the CPU
    meta = [p.to("meta") for p in pieces]
    assert not fp8_qkv.usable(meta, weights, cos, sin)
    monkeypatch.setitem(fp8_qkv._READY, "op", None)             # not prepared (no Triton): never
    assert not fp8_qkv.ready()


@pytest.fixture(scope="module")
def blocks_128():
    """A transformer of the tiny preset with heads of 128 (2 heads), bf16, one block of each kind."""
    from diffusers import HunyuanVideoFramepackTransformer3DModel

    from configs.presets import PRESETS

    cfg = dict(PRESETS["tiny"].tiny_configs["transformer"])
    cfg.update(num_attention_heads=2, attention_head_dim=128, num_layers=1, num_single_layers=1)
    torch.manual_seed(0)
    tr = HunyuanVideoFramepackTransformer3DModel(**cfg).eval().requires_grad_(False).to(torch.bfloat16)
    return tr.transformer_blocks[0], tr.single_transformer_blocks[0]


@pytest.mark.parametrize("kind", ["double-stream", "single-stream"])
def test_the_attention_form_quantizes_through_the_passes_while_compiled_under_fp8(blocks_128, kind, monkeypatch):
    """The blocks' attention form under fp8 attention through FlashAttention-3 while compiling: the products' outputs
    go to the passes as the video's and the prompt's pieces with their norm weights (the reference here stands for
    the kernels on the CPU), then to the fp8 attention operator (here its bf16 fallback on the dequantized inputs),
    V's mean added back: close to diffusers' processor. Not compiling, or without the setting: diffusers' bits."""
    import copy

    block = copy.deepcopy(blocks_128[0 if kind == "double-stream" else 1])
    block_forms.fuse_blocks([block])
    attn = block.attn
    assert type(attn.processor).__name__ == "FusedHunyuanVideoAttnProcessor"
    g = torch.Generator().manual_seed(1)
    width = attn.to_q.in_features
    video, text = (torch.randn(1, 24, width, generator=g).bfloat16(), torch.randn(1, 6, width, generator=g).bfloat16())
    _, _, cos, sin = make(n_a=24)
    plain = type(attn.processor).__mro__[2].__call__(attn.processor, attn, video, text, None, (cos, sin))  # diffusers'
    assert all(torch.equal(a, b) for a, b in zip(attn(video, text, image_rotary_emb=(cos, sin)), plain))
    seen = []

    def passes(pieces, weights, cos_, sin_, eps):
        seen.append(([tuple(p.shape) for p in pieces], [w.data_ptr() for w in weights]))
        return reference(pieces, weights, cos_, sin_, eps)

    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    monkeypatch.setattr(sdpa, "fp8_prequantized", lambda: True)
    monkeypatch.setattr(fp8_qkv, "usable", lambda *a: True)
    monkeypatch.setattr(fp8_qkv, "quantize", passes)
    monkeypatch.setattr(sdpa, "_FP8_FAILED", ["FlashAttention-3 absent on the CPU"])     # the operator's fallback
    got = attn(video, text, image_rotary_emb=(cos, sin))
    norms = (attn.norm_q, attn.norm_k) if kind == "single-stream" else (attn.norm_q, attn.norm_added_q,
                                                                        attn.norm_k, attn.norm_added_k)
    expect = [n.weight.data_ptr() for n in norms]
    expect = [expect[0], expect[0], expect[1], expect[1]] if kind == "single-stream" else expect
    inner = attn.to_q.out_features
    assert seen == [([(1, 24, inner), (1, 6, inner)] * 3, expect)]
    for a, b in zip(got, plain):
        assert a.shape == b.shape
        assert float((a.float() - b.float()).norm() / b.float().norm()) < 0.05     # e4m3's rounding of q/k/v
    monkeypatch.setattr(sdpa, "fp8_prequantized", lambda: False)    # the setting off: diffusers' call
    assert all(torch.equal(a, b) for a, b in zip(attn(video, text, image_rotary_emb=(cos, sin)), plain))
