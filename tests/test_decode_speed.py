"""The VAE decode's speed options: applied only inside their block, and within tolerance of the default decode.

The tolerance is the one the decode already lives with: tiling changes pixels by rounding too. On the GPU
(fp16) benchmarks/vae_decode.py reports the difference of each option; here, on the CPU in float32, channels-last
runs other convolution kernels (oneDNN's NDHWC path) and must agree to float32 rounding.
"""
from __future__ import annotations

import pytest
import torch

from configs.video import DECODE_SPEED, VaeDecodeSpeed
from pipeline.decode_speed import decode_speed

TOLERANCE = 1e-4        # float32 on the CPU; pixels are in [-1, 1] (one uint8 level is 0.0078)


@pytest.fixture(scope="module")
def latents():
    return torch.randn(1, 16, 5, 8, 12, generator=torch.Generator().manual_seed(0))


def test_defaults_change_no_convolution_kernel_and_round_only_on_gpus():
    """cudnn.benchmark and channels-last stay off; the exact padding is on everywhere, and the GroupNorm whose
    statistics round differently (pipeline/vae_ops.py, tests/test_vae_ops.py) is on, used on GPUs only."""
    assert DECODE_SPEED == VaeDecodeSpeed(cudnn_benchmark=False, channels_last=False, fast_pad=True,
                                          fast_group_norm=True)


@torch.no_grad()
def test_channels_last_decode_is_within_tolerance_and_really_channels_last(tiny_original, latents):
    vae = tiny_original.vae
    plain = vae.decode(latents).sample
    layouts = []
    with decode_speed(vae, torch.device("cpu"), VaeDecodeSpeed(channels_last=True)):
        convs = [m for m in vae.decoder.modules() if isinstance(m, torch.nn.Conv3d)]
        spies = [m.register_forward_hook(lambda m, args, out: layouts.append(
            args[0].is_contiguous(memory_format=torch.channels_last_3d))) for m in convs]
        try:
            fast = vae.decode(latents).sample
        finally:
            for s in spies:
                s.remove()
    assert layouts and all(layouts)                              # every conv saw an NDHWC input
    assert fast.shape == plain.shape
    assert (fast - plain).abs().max() <= TOLERANCE
    again = vae.decode(latents).sample                           # hooks gone: the plain decode again, exactly
    torch.testing.assert_close(again, plain, atol=0, rtol=0)
    assert not any(m._forward_pre_hooks for m in convs)


def test_cudnn_benchmark_is_scoped_and_only_for_nvidia(tiny_original):
    before = torch.backends.cudnn.benchmark
    with decode_speed(tiny_original.vae, torch.device("cpu"), VaeDecodeSpeed(cudnn_benchmark=True)):
        assert torch.backends.cudnn.benchmark == before          # the CPU has no cuDNN to tune
    with pytest.raises(RuntimeError):
        with decode_speed(tiny_original.vae, torch.device("cpu"), VaeDecodeSpeed(channels_last=True)):
            raise RuntimeError("a failed decode")
    assert torch.backends.cudnn.benchmark == before
    assert not any(m._forward_pre_hooks for m in tiny_original.vae.decoder.modules())
