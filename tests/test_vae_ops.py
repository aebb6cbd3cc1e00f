"""pipeline/vae_ops.py: the decoder's replicate padding by copies is F.pad's result bit for bit; its GroupNorm from
PyTorch's parallel reductions agrees with F.group_norm to rounding; both are swapped in only inside their block.

Tolerance of the GroupNorm (stated in configs/video.py and README): per call, float32 within 1e-5 of F.group_norm
(values of order 1, also with a mean 20 standard deviations away from 0); fp16 within one rounding step of the
output (2^-8 relative to its largest value); a whole tiny decode in float32 within 1e-4 (pixels in [-1, 1]; one
uint8 level is 0.0078). On a GPU in fp16 benchmarks/vae_decode.py measures it for the full-size decoder.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from configs.video import VaeDecodeSpeed
from pipeline.decode_speed import decode_speed
from pipeline.vae_ops import fast_decoder, group_norm, replicate_pad

PADS = [(1, 1, 1, 1, 2, 0), (0, 0, 0, 0, 2, 0), (0, 0, 0, 0, 0, 0), (2, 1, 0, 3, 1, 1)]


@pytest.mark.parametrize("pad", PADS, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last_3d"])
def test_replicate_pad_is_f_pad_bit_for_bit(pad, dtype, layout):
    x = torch.randn(2, 3, 4, 5, 6, generator=torch.Generator().manual_seed(1)).to(dtype)
    if layout == "channels_last_3d":
        x = x.contiguous(memory_format=torch.channels_last_3d)
    ours = replicate_pad(x, pad)
    ref = F.pad(x, pad, mode="replicate")
    assert ours.shape == ref.shape and ours.dtype == ref.dtype
    assert torch.equal(ours, ref)
    assert ours.data_ptr() != x.data_ptr()              # a new tensor, as F.pad gives


def _gn_input(dtype, offset=0.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, 64, 5, 12, 10, generator=g) * 3 + offset).to(dtype)


@pytest.mark.parametrize("offset", [0.0, 60.0], ids=["centred", "mean 20 sd away"])
def test_group_norm_agrees_with_pytorch_in_float32(offset):
    x = _gn_input(torch.float32, offset)
    w, b = torch.randn(64), torch.randn(64)
    ref = F.group_norm(x, 32, w, b, 1e-6)
    ours = group_norm(x, 32, w, b, 1e-6)
    assert (ours - ref).abs().max().item() <= 1e-5
    plain = group_norm(x, 32, None, None, 1e-6)          # no affine
    assert (plain - F.group_norm(x, 32, None, None, 1e-6)).abs().max().item() <= 1e-5


def test_group_norm_falls_back_to_pytorch_where_its_way_does_not_apply():
    x = _gn_input(torch.float32, seed=2)
    w, b = torch.randn(64), torch.randn(64)
    last = x.contiguous(memory_format=torch.channels_last_3d)            # would need a copy to reshape
    assert torch.equal(group_norm(last, 32, w, b, 1e-6), F.group_norm(last, 32, w, b, 1e-6))
    wg = w.clone().requires_grad_()                                      # training: PyTorch's, with its gradients
    out = group_norm(x, 32, wg, b, 1e-6)
    out.sum().backward()
    assert wg.grad is not None and torch.equal(out.detach(), F.group_norm(x, 32, w, b, 1e-6))


def test_group_norm_in_fp16_is_within_one_rounding_step():
    x = _gn_input(torch.float16, 5.0, seed=3)
    w, b = torch.randn(64).half(), torch.randn(64).half()
    ref = F.group_norm(x.float(), 32, w.float(), b.float(), 1e-6)      # the exact answer, in float32
    ours = group_norm(x, 32, w, b, 1e-6)
    assert ours.dtype == torch.float16
    step = ref.abs().max().item() * 2 ** -8
    assert (ours.float() - ref).abs().max().item() <= step
    # and the wrong formula would not pass: no normalisation at all is far off
    assert (x.float() - ref).abs().max().item() > 100 * step


@torch.no_grad()
def test_a_tiny_decode_with_the_fast_pad_is_exact_and_with_the_group_norm_within_tolerance(tiny_original):
    vae = tiny_original.vae
    z = torch.randn(1, 16, 5, 8, 12, generator=torch.Generator().manual_seed(0))
    plain = vae.decode(z).sample
    with fast_decoder(vae, fast_pad=True, fast_norm=False) as n:
        assert n == sum(1 for m in vae.decoder.modules() if type(m).__name__ == "HunyuanVideoCausalConv3d")
        padded = vae.decode(z).sample
    assert torch.equal(padded, plain)
    with fast_decoder(vae, fast_pad=True, fast_norm=True) as n:
        norms = [m for m in vae.decoder.modules() if isinstance(m, torch.nn.GroupNorm)]
        assert norms and all("forward" in m.__dict__ for m in norms)
        both = vae.decode(z).sample
    assert (both - plain).abs().max().item() <= 1e-4
    assert not any("forward" in m.__dict__ for m in vae.decoder.modules())     # all restored
    assert torch.equal(vae.decode(z).sample, plain)


def test_the_job_decode_swaps_the_group_norm_only_on_a_gpu(tiny_original):
    vae = tiny_original.vae
    norms = [m for m in vae.decoder.modules() if isinstance(m, torch.nn.GroupNorm)]
    convs = [m for m in vae.decoder.modules() if type(m).__name__ == "HunyuanVideoCausalConv3d"]
    with decode_speed(vae, torch.device("cpu"), VaeDecodeSpeed()):
        assert all("forward" in m.__dict__ for m in convs)           # exact: everywhere
        assert not any("forward" in m.__dict__ for m in norms)       # rounding: GPUs only
    with pytest.raises(RuntimeError):
        with decode_speed(vae, torch.device("cpu"), VaeDecodeSpeed()):
            raise RuntimeError("a failed decode")
    assert not any("forward" in m.__dict__ for m in convs + norms)
    with decode_speed(vae, torch.device("cpu"), VaeDecodeSpeed(fast_pad=False)):
        assert not any("forward" in m.__dict__ for m in convs)
