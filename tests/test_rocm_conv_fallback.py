"""ConvFallback: every tier equals the plain conv (outputs and gradients), and faults move calls down the tiers.

Tolerances: fp32 on CPU, |tier - plain| <= 1e-5 * max(1, max|plain|) for outputs and gradients (tier 3 sums in
another order, tier 4 too; tiers 2 and 5 are bit-identical on CPU, and tier 1 too but for a float32 conv3d, which it
gives to oneDNN: rocm/tiers.py). On a CUDA GPU (cuDNN in MIOpen's place as tier 1) the
same tests run in fp32 with TF32 off and a 1e-4 tolerance (different algorithms per tier). Low-precision inputs
through tiers 3-5 come back in their dtype and within 1e-2 (fp16) / 2e-2 (bf16) relative of the fp32 result.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from rocm_helpers import assert_close_scaled

from rocm.conv_fallback import ConvFallback
from rocm.errors import ConvFallbackExhausted
from rocm.faults import Fault, FaultPlan
from rocm.policy import BypassConfig, BypassStrategy

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
REL = {"cpu": 1e-5, "cuda": 1e-4}


@pytest.fixture(autouse=True)
def _no_tf32():
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


# (input shape, weight shape, kwargs); the last ones are HunyuanVideo's causal convs on pre-padded input
CONV3D_CASES = {
    "k3_p1": ((2, 4, 6, 9, 9), (5, 4, 3, 3, 3), dict(padding=1)),
    "stride_pad_dil": ((2, 4, 9, 11, 10), (5, 4, 3, 3, 3), dict(stride=(2, 1, 2), padding=(1, 2, 0),
                                                                 dilation=(2, 1, 1))),
    "groups2": ((1, 4, 5, 8, 8), (6, 2, 3, 3, 3), dict(padding=(0, 1, 1), groups=2)),
    "depthwise": ((1, 4, 5, 8, 8), (4, 1, 3, 3, 3), dict(padding=1, groups=4)),
    "same_even_kernel": ((1, 3, 6, 8, 7), (4, 3, 2, 3, 4), dict(padding="same", dilation=(2, 1, 2))),
    "valid": ((1, 3, 6, 8, 7), (4, 3, 3, 2, 2), dict(padding="valid")),
    "k1": ((1, 6, 4, 5, 5), (3, 6, 1, 1, 1), dict()),
    "time_stride3": ((1, 2, 10, 6, 6), (3, 2, 3, 1, 1), dict(stride=(3, 1, 1), padding=(2, 0, 0))),
    "unbatched": ((4, 5, 7, 7), (3, 4, 3, 3, 3), dict(padding=1)),
    "hunyuan_causal": ((1, 8, 7, 10, 12), (8, 8, 3, 3, 3), dict(causal=True)),
    "hunyuan_causal_up": ((1, 8, 9, 16, 16), (4, 8, 3, 3, 3), dict(causal=True)),
}
CONV2D_CASES = {
    "k3_p1": ((2, 4, 9, 9), (5, 4, 3, 3), dict(padding=1)),
    "stride_dil": ((2, 4, 11, 10), (5, 4, 3, 3), dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2))),
    "groups2": ((1, 4, 8, 8), (6, 2, 3, 3), dict(padding=1, groups=2)),
    "same_even_kernel": ((1, 3, 8, 7), (4, 3, 2, 4), dict(padding="same")),
    "unbatched": ((4, 7, 7), (3, 4, 3, 3), dict(padding=1)),
}


def _tensors(xs, ws, bias=True, dtype=torch.float32, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(xs, generator=g).to(device, dtype).requires_grad_()
    w = torch.randn(ws, generator=g).to(device, dtype).requires_grad_()
    b = torch.randn(ws[0], generator=g).to(device, dtype).requires_grad_() if bias else None
    return x, w, b


def _call(fn, x, w, b, kw):
    kw = dict(kw)
    if kw.pop("causal", False):     # HunyuanVideoCausalConv3d: replicate-pad (1,1,1,1,2,0), then conv pad 0
        x = F.pad(x, (1, 1, 1, 1, 2, 0), mode="replicate")
    return fn(x, w, b, **kw)


def _check_tier_equals_plain(op, case, tier, bias=True, device="cpu"):
    xs, ws, kw = case
    x, w, b = _tensors(xs, ws, bias, device=device)
    plain = getattr(F, op)
    fb = ConvFallback(tiers=(tier,), persist=False, probe=None)
    ref = _call(plain, x, w, b, kw)
    out = _call(getattr(fb, op), x, w, b, kw)
    assert fb.last_tier == tier and out.device == x.device
    assert_close_scaled(out, ref, REL[device])
    grad = torch.randn_like(ref)
    leaves = [t for t in (x, w, b) if t is not None]
    for got, want in zip(torch.autograd.grad(out, leaves, grad), torch.autograd.grad(ref, leaves, grad)):
        assert_close_scaled(got, want, REL[device])
    calls = fb.stats().calls_per_op
    assert calls[op] == {tier: 1} and calls[f"{op}_backward"] == {tier: 1}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tier", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("name", list(CONV3D_CASES))
def test_conv3d_every_tier_matches_plain(name, tier, device):
    _check_tier_equals_plain("conv3d", CONV3D_CASES[name], tier, bias=name != "k1", device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tier", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("name", list(CONV2D_CASES))
def test_conv2d_every_tier_matches_plain(name, tier, device):
    _check_tier_equals_plain("conv2d", CONV2D_CASES[name], tier, device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kinds,expected_tier", [
    (["miopen_unknown"], 2), (["no_algorithm"], 2), (["hip_oom"], 2), (["oom"], 2),
    (["no_algorithm", "oom"], 3), (["miopen_unknown", "hip_oom", "no_algorithm"], 4),
])
def test_faults_move_to_next_tier(kinds, expected_tier, device):
    plan = FaultPlan([Fault(tier=i + 1, kind=k) for i, k in enumerate(kinds)])
    fb = ConvFallback(persist=False, probe=None, fault_plan=plan)
    xs, ws, kw = CONV3D_CASES["hunyuan_causal"]
    x, w, b = _tensors(xs, ws, device=device)
    out = _call(fb.conv3d, x, w, b, kw)
    assert fb.last_tier == expected_tier and out.device == x.device
    assert_close_scaled(out, _call(F.conv3d, x, w, b, kw), REL[device])
    stats = fb.stats()
    assert stats.calls_per_tier == {expected_tier: 1}
    assert sorted(stats.fell_back[0].failed) == list(range(1, expected_tier))


def test_backward_falls_back_independently():
    plan = FaultPlan([Fault(tier=1, kind="miopen_unknown", direction="backward")])
    fb = ConvFallback(persist=False, probe=None, fault_plan=plan)
    x, w, b = _tensors((1, 4, 5, 8, 8), (4, 4, 3, 3, 3))
    out = fb.conv3d(x, w, b, padding=1)
    ref = F.conv3d(x, w, b, padding=1)
    g = torch.randn_like(ref)
    for got, want in zip(torch.autograd.grad(out, (x, w, b), g), torch.autograd.grad(ref, (x, w, b), g)):
        assert_close_scaled(got, want)
    assert fb.stats().calls_per_op == {"conv3d": {1: 1}, "conv3d_backward": {2: 1}}


def test_verdict_skips_failing_tier_for_that_shape_only():
    bad = (1, 4, 5, 8, 8)
    plan = FaultPlan([Fault(tier=1, kind="no_algorithm", input_shape=bad, times=1)])
    fb = ConvFallback(persist=False, probe=None, fault_plan=plan)
    w = torch.randn(4, 4, 3, 3, 3)
    with torch.no_grad():
        for _ in range(3):
            fb.conv3d(torch.randn(bad), w, padding=1)
        fb.conv3d(torch.randn(1, 4, 6, 8, 8), w, padding=1)
    assert plan.fired() == [1]                       # tier 1 was tried once for the bad shape, then skipped
    assert fb.stats().calls_per_tier == {2: 3, 1: 1}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,rel", [(torch.float16, 1e-2), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("tier", [3, 4, 5])
def test_low_precision_comes_back_in_its_dtype(dtype, rel, tier, device):
    fb = ConvFallback(tiers=(tier,), persist=False, probe=None)
    x, w, b = _tensors((1, 4, 5, 8, 8), (4, 4, 3, 3, 3), dtype=dtype, device=device)
    with torch.no_grad():
        out = fb.conv3d(x, w, b, padding=1)
        ref = F.conv3d(x.float(), w.float(), b.float(), padding=1)
    assert out.dtype == dtype and out.device == x.device
    assert_close_scaled(out.float(), ref, rel=rel)


def test_errors_that_are_not_the_gpus_propagate():
    fb = ConvFallback(persist=False, probe=None, fault_plan=FaultPlan([Fault(tier=1, kind="error")]))
    with pytest.raises(ValueError, match="injected"):
        fb.conv3d(torch.randn(1, 2, 3, 4, 4), torch.randn(2, 2, 1, 1, 1))
    fb2 = ConvFallback(persist=False, probe=None)
    with pytest.raises(RuntimeError, match="channels") as info:    # PyTorch's own shape message
        fb2.conv3d(torch.randn(1, 3, 3, 4, 4), torch.randn(2, 2, 1, 1, 1))
    assert not isinstance(info.value, ConvFallbackExhausted)
    assert fb2.stats().total_calls == 0 and fb2.stats().fell_back == []


def test_every_tier_failing_raises_exhausted():
    plan = FaultPlan([Fault(tier=t, kind="miopen_unknown") for t in (1, 2, 3, 4, 5)])
    fb = ConvFallback(persist=False, probe=None, fault_plan=plan)
    with pytest.raises(ConvFallbackExhausted, match="every tier"):
        fb.conv2d(torch.randn(1, 2, 4, 4), torch.randn(2, 2, 1, 1))
    assert fb.stats().exhausted == 1


def test_install_patches_and_restores_functional():
    saved = F.conv2d, F.conv3d
    fb = ConvFallback(persist=False, probe=None)
    conv = torch.nn.Conv3d(2, 3, 3, padding=1)
    with fb.active():
        assert F.conv3d is not saved[1] and fb.installed
        with torch.no_grad():
            conv(torch.randn(1, 2, 4, 5, 5))
            torch.nn.Conv2d(2, 2, 1)(torch.randn(1, 2, 3, 3))
    assert (F.conv2d, F.conv3d) == saved and not fb.installed
    assert fb.stats().calls_per_op == {"conv3d": {1: 1}, "conv2d": {1: 1}}
    fb.reset_stats()
    assert fb.stats().total_calls == 0
    assert "conv fallback: 0 calls" in fb.report()


def test_profile_like_tier_plan_rdna1():
    """RDNA1's plan (tiers 2, 3, 5, conv3d from tier 3, no vendor in tier 3) applied explicitly."""
    fb = ConvFallback(tiers=(2, 3, 5), conv3d_first_tier=3, vendor_in_decomposition=False, persist=False,
                      probe=None)
    with torch.no_grad():
        fb.conv3d(torch.randn(1, 2, 4, 5, 5), torch.randn(2, 2, 3, 3, 3), padding=1)
        assert fb.last_tier == 3
        fb.conv2d(torch.randn(1, 2, 5, 5), torch.randn(2, 2, 3, 3), padding=1)
        assert fb.last_tier == 2


# (strategy, extra config, tiers for a large conv3d / conv2d, tiers for a small conv3d / conv2d)
STRATEGIES = [
    (BypassStrategy.AUTO, {}, (1, 1), (1, 1)),
    (BypassStrategy.AUTO, {"enable_implicit_gemm": False}, (3, 3), (1, 1)),
    (BypassStrategy.IMPLICIT_GEMM, {}, (3, 1), (1, 1)),
    (BypassStrategy.SELECTIVE, {}, (3, 3), (1, 1)),
    (BypassStrategy.GPU_UNFOLD, {}, (3, 3), (3, 3)),
    (BypassStrategy.CPU_FALLBACK, {}, (5, 5), (5, 5)),
]


@pytest.mark.parametrize("strategy,extra,large,small", STRATEGIES)
def test_bypass_strategies_with_the_threshold_in_pixels(strategy, extra, large, small):
    x3, w3 = torch.randn(1, 4, 8, 32, 40), torch.randn(4, 4, 3, 3, 3)     # larger spatial side: 40 px
    x2, w2 = torch.randn(1, 4, 24, 40), torch.randn(4, 4, 3, 3)           # 40 px (frames never count)
    for threshold, expected in ((39, large), (40, small)):                 # large means "more than" the threshold
        fb = ConvFallback(persist=False, probe=None, bypass=BypassConfig(strategy, threshold, **extra))
        with torch.no_grad():
            fb.conv3d(x3, w3, padding=1)
            got3 = fb.last_tier
            fb.conv2d(x2, w2, padding=1)
        assert (got3, fb.last_tier) == expected, threshold


def test_bypass_config_can_rule_out_tiers_and_ignore_verdicts():
    plan = FaultPlan([Fault(tier=1, kind="no_algorithm", times=1)])
    fb = ConvFallback(persist=False, probe=None, fault_plan=plan,
                      bypass=BypassConfig(cache_decisions=False, gpu_unfold_fallback=False))
    x, w = torch.randn(1, 2, 6, 6), torch.randn(2, 2, 3, 3)
    with torch.no_grad():
        fb.conv2d(x, w, padding=1)
        assert fb.last_tier == 2                    # tier 1 failed once
        fb.conv2d(x, w, padding=1)
        assert fb.last_tier == 1                    # cache_decisions=False: tier 1 is tried again (and works)
    blocked = FaultPlan([Fault(tier=t, kind="no_algorithm") for t in (1, 2)])
    no_unfold = ConvFallback(persist=False, probe=None, fault_plan=blocked,
                             bypass=BypassConfig(gpu_unfold_fallback=False))
    with torch.no_grad():
        no_unfold.conv2d(x, w, padding=1)
    assert no_unfold.last_tier == 5 and not {3, 4} & set(no_unfold.stats().attempts_per_tier)
    with pytest.raises(ValueError, match="cpu_fallback_enabled"):
        BypassConfig("CPU_FALLBACK", cpu_fallback_enabled=False)
    with pytest.raises(ValueError, match="pixels"):
        BypassConfig(size_threshold=-1)


def test_rdna_conv3d_keeps_a_gpu_tier_after_a_miopen_failure_in_tier_3(monkeypatch):
    """RDNA2-4 start conv3d at tier 3 (2D convs over time through MIOpen); one MIOpen failure there moves the call to
    tier 4 (the same decomposition, MIOpen off, on the GPU), not to the CPU. A conv2d has no tier 4 (its tier 3 has
    no MIOpen call): it goes from tier 3 to the CPU."""
    from rocm import vendor_free

    vendor_calls = []
    real = vendor_free.conv
    monkeypatch.setattr(vendor_free, "conv", lambda *a, **k: vendor_calls.append(1) or real(*a, **k))
    plan = FaultPlan([Fault(tier=t, kind="miopen_unknown") for t in (1, 2, 3)])
    fb = ConvFallback(conv3d_first_tier=3, vendor_in_decomposition=True, persist=False, probe=None, fault_plan=plan)
    x, w, b = _tensors((1, 4, 5, 8, 8), (4, 4, 3, 3, 3))
    with torch.no_grad():
        out = fb.conv3d(x, w, b, padding=1)
        assert fb.last_tier == 4 and vendor_calls            # the 2D convs ran without MIOpen/cuDNN
        assert_close_scaled(out, F.conv3d(x, w, b, padding=1))
        fb.conv2d(torch.randn(1, 2, 6, 6), torch.randn(2, 2, 3, 3), padding=1)
    assert fb.last_tier == 5
    assert fb.stats().calls_per_op == {"conv3d": {4: 1}, "conv2d": {5: 1}}
    assert 4 not in fb.stats().fell_back[-1].failed             # the conv2d never tried a copy of tier 3


def test_a_small_float32_conv3d_on_the_cpu_runs_on_onednn_at_tier_1():
    """PyTorch's dispatch sends an input this small (N*C*D*H <= 20480: the tiny VAE's layers) to its slow reference
    path; tier 1 calls oneDNN instead, with the same result within the tolerance."""
    from rocm import tiers
    from rocm.signature import ConvSpec

    x, w, b = torch.randn(1, 8, 9, 24, 32), torch.randn(8, 8, 3, 3, 3), torch.randn(8)
    spec = ConvSpec("conv3d", (1, 1, 1), (1, 1, 1), (1, 1, 1), 1)
    with torch.autograd.profiler.profile() as prof:
        out = tiers.forward(tiers.NATIVE, spec, x, w, b)
    ops = {e.name for e in prof.function_events}
    assert "aten::mkldnn_convolution" in ops and "aten::slow_conv3d_forward" not in ops, ops
    assert_close_scaled(out, F.conv3d(x, w, b, padding=1), REL["cpu"])
