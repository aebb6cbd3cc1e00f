"""The field-notes API: SafeConv drop-ins, patch_model, bypass report, the global-style helpers."""

from __future__ import annotations

import io
import os

import pytest
import torch
import torch.nn.functional as F
from rocm_helpers import assert_close_scaled
from torch import nn

from rocm import api
from rocm.conv_fallback import ConvFallback
from rocm.faults import Fault, FaultPlan
from rocm.policy import BypassConfig, BypassStrategy
from rocm.safe_conv import SafeConv2d, SafeConv3d, patch_model, patched_layers, unpatch_model


@pytest.fixture
def fallback():
    fb = ConvFallback(persist=False, probe=None)
    api.set_default_fallback(fb)
    yield fb
    api.set_default_fallback(None)


@pytest.mark.parametrize("padding_mode", ["zeros", "replicate", "reflect"])
def test_safeconv3d_equals_conv3d(fallback, padding_mode):
    torch.manual_seed(0)
    plain = nn.Conv3d(3, 5, (3, 3, 2), stride=(1, 2, 1), padding=(1, 1, 1), padding_mode=padding_mode)
    safe = SafeConv3d.from_conv(plain, fallback)
    assert safe.weight is plain.weight and safe.bias is plain.bias
    x = torch.randn(2, 3, 4, 9, 8, requires_grad=True)
    out, ref = safe(x), plain(x)
    assert_close_scaled(out, ref)
    g = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad(out, (x, plain.weight), g), torch.autograd.grad(ref, (x, plain.weight), g)):
        assert_close_scaled(a, b)
    assert safe.forwards == 1 and safe.bypasses == 0 and safe.last_tier == 1


def test_safeconv_constructor_like_nn():
    torch.manual_seed(0)
    safe = SafeConv2d(3, 4, 3, padding="same", fallback=ConvFallback(tiers=(3,), persist=False, probe=None))
    x = torch.randn(1, 3, 7, 6)
    with torch.no_grad():
        assert_close_scaled(safe(x), F.conv2d(x, safe.weight, safe.bias, padding="same"))
    assert safe.bypasses == 1 and safe.last_tier == 3


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.blocks = nn.Sequential(nn.Conv3d(4, 6, 3, padding=1), nn.SiLU(), nn.Conv3d(6, 2, 1))

    def forward(self, x):
        b, c, t, h, w = x.shape
        y = self.stem(x.transpose(1, 2).reshape(b * t, c, h, w))
        y = y.reshape(b, t, 4, h, w).transpose(1, 2)
        return self.blocks(y)


def test_patch_model_keeps_weights_and_reports(fallback):
    torch.manual_seed(0)
    net = Net()
    weights = {n: p for n, p in net.named_parameters()}
    x = torch.randn(1, 3, 4, 6, 6)
    with torch.no_grad():
        ref = net(x)
    # tier 1 fails for the second Conv3d's input shape only -> that layer is bypassed
    fallback.fault_plan = FaultPlan([Fault(tier=1, kind="no_algorithm", op="conv3d", input_shape=(1, 4, 4, 6, 6))])
    assert patch_model(net, fallback=fallback) is net
    replaced = patched_layers(net)
    assert replaced == ["stem", "blocks.0", "blocks.2"]
    assert isinstance(net.stem, SafeConv2d) and isinstance(net.blocks[0], SafeConv3d)
    assert all(p is weights[n] for n, p in net.named_parameters())
    with torch.no_grad():
        out = net(x)
        net(x)
    assert_close_scaled(out, ref)
    buf = io.StringIO()
    text = api.print_bypass_report(net, file=buf)
    assert buf.getvalue().strip() == text.strip()
    rows = {line.split()[0]: line.split() for line in text.splitlines()[2:]}
    assert rows["stem"][1:4] == ["2", "0", "1"]           # forwards, bypasses, tier
    assert rows["blocks.0"][1:4] == ["2", "2", "2"]       # bypassed: answered by tier 2 both times
    assert rows["blocks.2"][1:4] == ["2", "0", "1"]
    assert rows["total"][1:3] == ["6", "2"]
    assert unpatch_model(net) == replaced and type(net.stem) is nn.Conv2d
    with torch.no_grad():
        assert_close_scaled(net(x), ref)


def test_initialize_and_safe_execution(fallback):
    saved = F.conv3d
    fb = api.initialize_miopen_fallback(use_monkey_patch=True)
    assert fb is fallback and F.conv3d is not saved
    api.set_default_fallback(None)                         # uninstalls the old default
    assert F.conv3d is saved

    api.set_default_fallback(fallback)
    with api.miopen_safe_execution("vae") as fb2:
        assert fb2 is fallback and F.conv3d is not saved
        with torch.no_grad():
            nn.Conv3d(2, 2, 1)(torch.randn(1, 2, 2, 2, 2))
    assert F.conv3d is saved and fallback.stats().calls_per_tier == {1: 1}

    @api.with_miopen_fallback
    def decode(x):
        assert F.conv3d is not saved
        return nn.Conv3d(2, 2, 1)(x)

    @api.with_miopen_fallback(name="named")
    def decode2(x):
        return nn.Conv3d(2, 2, 1)(x)

    with torch.no_grad():
        decode(torch.randn(1, 2, 2, 2, 2))
        decode2(torch.randn(1, 2, 2, 2, 2))
    assert F.conv3d is saved and fallback.stats().calls_per_tier == {1: 3}
    assert "tier 1" in api.print_job_statistics(file=io.StringIO())


@pytest.mark.parametrize("strategy,tier3d,tier2d", [
    ("auto", 1, 1), ("implicit_gemm", 3, 1), ("CPU_FALLBACK", 5, 5), ("Selective", 3, 3), ("GPU_UNFOLD", 3, 3)])
def test_enable_miopen_bypass(fallback, strategy, tier3d, tier2d):
    env_before = dict(os.environ)
    cfg = api.enable_miopen_bypass(strategy=strategy, size_threshold=0)
    assert cfg == BypassConfig(BypassStrategy(strategy), 0.0) and fallback.bypass == cfg
    with torch.no_grad():
        fallback.conv3d(torch.randn(1, 2, 3, 4, 4), torch.randn(2, 2, 3, 3, 3), padding=1)
        assert fallback.last_tier == tier3d
        fallback.conv2d(torch.randn(1, 2, 4, 4), torch.randn(2, 2, 3, 3), padding=1)
        assert fallback.last_tier == tier2d
    assert dict(os.environ) == env_before                  # no strategy touches the environment
    assert api.enable_miopen_bypass(config=BypassConfig("selective", 7)).size_threshold == 7
