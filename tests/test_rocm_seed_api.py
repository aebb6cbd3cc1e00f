"""The AMD field notes' usage examples run as written (only the import line differs: ``rocm`` instead of their
module). Two notes: "MIOpen Fallback System for AMD GPUs" (a conv3d monkey patch with CPU as the last resort) and
"MIOpen Bypass for RDNA1 GPUs" (SafeConv2d, strategies, size threshold in pixels). Each example is rewritten here
in the notes' own words, on the CPU (the notes call ``.cuda()``; the strategies decide tiers the same way)."""

from __future__ import annotations

import io

import pytest
import rocm_helpers  # noqa: F401  (puts the repo on sys.path)
import torch
import torch.nn.functional as F
from torch import nn

import rocm
from rocm.conv_fallback import ConvFallback
from rocm.faults import Fault, FaultPlan


@pytest.fixture(autouse=True)
def shared_fallback():
    """A fresh shared fallback (verdicts in memory only) for each example; nothing stays patched after it."""
    fb = ConvFallback(persist=False, probe=None)
    rocm.set_default_fallback(fb)
    saved = F.conv2d, F.conv3d
    yield fb
    rocm.set_default_fallback(None)
    assert (F.conv2d, F.conv3d) == saved


class YourModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 8, 3, padding=1))
        self.head = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        return self.head(self.features(x))


class Vae(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(4, 3, 3, padding=1)

    def decode(self, latents):
        return self.conv(latents)


# --- "MIOpen Fallback System for AMD GPUs" ---------------------------------------------------------------------

def test_activation_in_demo_gradio(shared_fallback):
    # "Activated in demo_gradio.py": import, initialise with the monkey patch, print the statistics at the end
    from rocm import MIOpenFallbackHandler, initialize_miopen_fallback

    initialize_miopen_fallback(use_monkey_patch=True, verbose=True)
    assert F.conv3d is not torch.conv3d and shared_fallback.installed
    with torch.no_grad():
        Vae().decode(torch.randn(1, 4, 3, 8, 8))
    out = io.StringIO()
    MIOpenFallbackHandler.print_stats(file=out)
    assert "CPU fallback attempts: 0, successes: 0" in out.getvalue()
    assert shared_fallback.stats().calls_per_tier == {1: 1}


def test_cpu_fallback_counts_as_the_last_resort(shared_fallback):
    # "Tier 2 Fallback Activated (CPU - Rare)": every GPU path fails, the CPU answers, the statistics say so
    from rocm import MIOpenFallbackHandler, initialize_miopen_fallback

    initialize_miopen_fallback(use_monkey_patch=True)
    shared_fallback.fault_plan = FaultPlan([Fault(tier=t, kind="miopen_unknown") for t in (1, 2, 3, 4)])
    x = torch.randn(1, 4, 3, 8, 8)
    vae = Vae()
    with torch.no_grad():
        out = vae.decode(x)
    assert shared_fallback.last_tier == 5
    torch.testing.assert_close(out, torch.conv3d(x, vae.conv.weight, vae.conv.bias, padding=1))
    stats = MIOpenFallbackHandler.stats()
    assert (stats["cpu_attempts"], stats["cpu_successes"], stats["calls_per_tier"]) == (1, 1, {5: 1})


def test_option_a_context_manager(shared_fallback):
    from rocm import miopen_safe_execution

    my_model, input = Vae(), torch.randn(1, 4, 2, 6, 6)
    with torch.no_grad():
        with miopen_safe_execution("My Operation"):
            output = my_model.decode(input)
    assert output.shape == (1, 3, 2, 6, 6) and shared_fallback.stats().calls_per_tier == {1: 1}


def test_option_b_decorator(shared_fallback):
    from rocm import with_miopen_fallback

    model = Vae()

    @with_miopen_fallback
    def my_function(data):
        return model.decode(data)

    with torch.no_grad():
        my_function(torch.randn(1, 4, 2, 6, 6))
    assert shared_fallback.stats().calls_per_tier == {1: 1} and not shared_fallback.installed


def test_option_c_manual_initialisation(shared_fallback):
    from rocm import initialize_miopen_fallback

    initialize_miopen_fallback(use_monkey_patch=False)          # without monkey patch: nothing is patched
    assert not shared_fallback.installed and F.conv3d is torch.nn.functional.conv3d
    initialize_miopen_fallback(use_monkey_patch=True)           # with monkey patch (global)
    assert shared_fallback.installed


# --- "MIOpen Bypass for RDNA1 GPUs" ------------------------------------------------------------------------------

def test_quick_start_enable_and_use_any_model(shared_fallback):
    from rocm import enable_miopen_bypass

    enable_miopen_bypass()
    model = YourModel()
    with torch.no_grad():
        model(torch.randn(1, 3, 20, 20))                        # "Now use any model"
    model = rocm.patch_model(model)                             # the notes' way to route its convs
    with torch.no_grad():
        model(torch.randn(1, 3, 20, 20))
    assert shared_fallback.stats().calls_per_tier == {1: 3}


@pytest.mark.parametrize("name,tier", [("IMPLICIT_GEMM", 1), ("SELECTIVE", 3), ("GPU_UNFOLD", 3),
                                       ("CPU_FALLBACK", 5)])
def test_strategy_recipes(shared_fallback, name, tier):
    # "For Maximum Performance" / "Selective" / "Force GPU-Only Mode" / "For Maximum Safety"
    from rocm import FallbackStrategy, enable_miopen_bypass

    enable_miopen_bypass(strategy=getattr(FallbackStrategy, name))
    conv = rocm.SafeConv2d(3, 8, kernel_size=3, padding=1)
    with torch.no_grad():
        conv(torch.randn(1, 3, 64, 64))                         # 64 px: above the 42 px boundary
    assert conv.last_tier == tier
    assert enable_miopen_bypass(strategy=name).strategy is FallbackStrategy(name)    # the names as strings too


def test_configuration_options(shared_fallback):
    from rocm import Conv2dBypassConfig, FallbackStrategy

    config = Conv2dBypassConfig(
        strategy=FallbackStrategy.AUTO,
        size_threshold=42,
        enable_implicit_gemm=True,
        cpu_fallback_enabled=True,
        verbose=True,
        cache_decisions=True,
    )
    assert config.size_threshold == 42 and config.strategy is FallbackStrategy.AUTO


def test_direct_layer_replacement(shared_fallback):
    from rocm import Conv2dBypassConfig, FallbackStrategy, SafeConv2d

    config = Conv2dBypassConfig(strategy=FallbackStrategy.GPU_UNFOLD, verbose=True)
    conv = SafeConv2d(3, 64, kernel_size=3, padding=1, config=config)
    x = torch.randn(1, 3, 224, 224)
    y = conv(x)                                                  # unfold + GEMM (tier 3), no MIOpen
    assert conv.last_tier == 3 and y.shape == (1, 64, 224, 224)
    torch.testing.assert_close(y, F.conv2d(x, conv.weight, conv.bias, padding=1), atol=1e-4, rtol=1e-4)


def test_model_patching_with_a_config(shared_fallback):
    from rocm import Conv2dBypassConfig, FallbackStrategy, patch_model, print_bypass_report

    model = YourModel()
    config = Conv2dBypassConfig(strategy=FallbackStrategy.GPU_UNFOLD)
    patch_model(model, config)
    with torch.no_grad():
        model(torch.randn(1, 3, 16, 16))
    report = print_bypass_report(model, file=io.StringIO())      # "Monitoring"
    assert "features.0" in report and "head" in report
    assert all(m.get_bypass_stats()["bypass_rate"] == 100.0 for m in model.modules() if rocm.safe_conv.is_safe_conv(m))


def test_quick_functionality_test(shared_fallback):
    from rocm import SafeConv2d

    conv = SafeConv2d(3, 64, kernel_size=3, padding=1)
    x = torch.randn(1, 3, 44, 44)                               # "previously problematic size"
    y = conv(x)
    stats = conv.get_bypass_stats()
    assert y.shape == (1, 64, 44, 44) and f"{stats['bypass_rate']:.1f}" == "0.0"
    assert stats["total_forwards"] == 1 and stats["strategy"] == "auto"


def test_cpu_fallback_strategy_bypasses_every_forward_with_gradients(shared_fallback):
    from rocm import Conv2dBypassConfig, FallbackStrategy, SafeConv2d

    config = Conv2dBypassConfig(strategy=FallbackStrategy.CPU_FALLBACK, verbose=False)
    conv = SafeConv2d(3, 64, kernel_size=3, padding=1, config=config)
    x = torch.randn(1, 3, 64, 64)
    y = conv(x)
    loss = y.sum()
    loss.backward()
    stats = conv.get_bypass_stats()
    assert stats["bypass_count"] == stats["total_forwards"] == 1 and conv.weight.grad.shape == (64, 3, 3, 3)


def test_selective_size_threshold_is_in_pixels(shared_fallback):
    # "Only bypass for sizes >42x42, use MIOpen for small sizes"
    from rocm import Conv2dBypassConfig, FallbackStrategy, SafeConv2d

    conv = SafeConv2d(3, 8, kernel_size=3, padding=1,
                      config=Conv2dBypassConfig(strategy=FallbackStrategy.SELECTIVE, size_threshold=42))
    with torch.no_grad():
        conv(torch.randn(1, 3, 44, 44))
        assert conv.last_tier == 3
        conv(torch.randn(1, 3, 42, 42))
        assert conv.last_tier == 1
    assert conv.get_bypass_stats()["bypass_rate"] == 50.0


def test_issue_31_enable_miopen_bypass_with_a_model_routes_its_convolutions(shared_fallback):
    """The notes: `enable_miopen_bypass(model)` — "all Conv2d layers will be safe". Before, it set the strategy
    only and none of the model's convolutions went through the fallback."""
    from rocm import enable_miopen_bypass

    model = YourModel()
    config = enable_miopen_bypass(model)
    assert config.strategy.name == "AUTO" and len(rocm.patched_layers(model)) == 3
    with torch.no_grad():
        model(torch.randn(1, 3, 20, 20))
    assert sum(shared_fallback.stats().calls_per_tier.values()) == 3


def test_issue_31_initialising_without_the_monkey_patch_takes_an_earlier_one_off(shared_fallback):
    from rocm import initialize_miopen_fallback

    initialize_miopen_fallback(use_monkey_patch=True)
    assert shared_fallback.installed
    initialize_miopen_fallback(use_monkey_patch=False)         # before: the global patch stayed on
    from common import patches

    assert not shared_fallback.installed and "torch.nn.functional.conv3d" not in patches.active_patches()
