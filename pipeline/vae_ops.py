"""Two operations of the HunyuanVideo VAE decoder done faster on the GPU: its replicate padding (exactly the same
values) and its GroupNorm (the same formula; its statistics rounded differently).

A profile of the decode on an H100/H200 (benchmarks/vae_decode.py, middle sections, fp16) put more GPU time in
these two than in the convolutions themselves:
- **GroupNorm statistics** (PyTorch's `RowwiseMomentsCUDAKernel`): one thread block per (sample, group) row, so a
  decoder activation of 32 groups of ~10 million values each runs on 32 blocks of a 132-SM GPU. Here the mean and
  the variance come from PyTorch's general reductions (`torch.mean(..., dtype=float32)` and `torch.var(..., out=
  float32)`: Welford, accumulated in float32 straight from the fp16 values, spread over the whole GPU), and the
  normalisation is one `addcmul` computed in float32 and rounded once into the output's dtype, as PyTorch's own
  kernel does (y = x·a + b with a = rstd·γ, b = β − mean·a per channel). Only the order of the additions in the
  statistics differs, so an output value moves by at most a rounding step now and then; through the whole decoder
  that gives pixels within the tolerance tests/test_vae_ops.py and benchmarks/vae_decode.py state.
- **Replicate padding** (`F.pad(x, (1, 1, 1, 1, 2, 0), mode="replicate")` before every causal 3×3×3 convolution):
  PyTorch's generic kernel computes a clamped index per output value. Here the padded tensor is made by plain
  copies: the input into the middle, then the borders from their neighbouring row, column and first frame. Every
  value is copied, never computed: the result is bit for bit F.pad's.

`fast_decoder(vae, fast_pad=..., fast_norm=...)` swaps them in on the decoder's modules for the duration of a block and
restores the modules after (pipeline/decode_speed.py decides when; configs/video.py holds the switches).
"""
from __future__ import annotations

import contextlib
import types
from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from memory.vae_stream import channel_affine, group_stats, replicate_borders


def replicate_pad(x: torch.Tensor, pad: tuple[int, ...]) -> torch.Tensor:
    """F.pad(x, pad, mode="replicate") for a 5-D x, pad = (left, right, top, bottom, front, back), by copies."""
    if len(pad) != 6 or x.dim() != 5 or min(pad) < 0:
        return F.pad(x, pad, mode="replicate")
    wl, wr, ht, hb, tf, tb = pad
    if not any(pad):
        return x.clone()
    n, c, t, h, w = x.shape
    last = x.is_contiguous(memory_format=torch.channels_last_3d) and not x.is_contiguous()
    out = torch.empty((n, c, t + tf + tb, h + ht + hb, w + wl + wr), dtype=x.dtype, device=x.device,
                      memory_format=torch.channels_last_3d if last else torch.contiguous_format)
    frames = slice(tf, tf + t)
    out[:, :, frames, ht:ht + h, wl:wl + w].copy_(x)
    replicate_borders(out[:, :, frames], (wl, wr, ht, hb))
    if tf:
        out[:, :, :tf].copy_(out[:, :, tf:tf + 1].expand(-1, -1, tf, -1, -1))
    if tb:
        out[:, :, tf + t:].copy_(out[:, :, tf + t - 1:tf + t].expand(-1, -1, tb, -1, -1))
    return out


def group_norm(x: torch.Tensor, groups: int, weight: torch.Tensor | None, bias: torch.Tensor | None,
               eps: float) -> torch.Tensor:
    """F.group_norm(x, groups, weight, bias, eps) with the statistics from PyTorch's parallel reductions."""
    n, c = x.shape[:2]
    grads = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias))
    if c % groups or x.numel() == 0 or not x.is_contiguous() or grads:
        # (a channels-last x would be copied by the reshape; `out=` reductions do not record gradients)
        return F.group_norm(x, groups, weight, bias, eps)
    a, b = channel_affine(*group_stats(x, groups, eps), c, weight, bias)
    shape = (n, c) + (1,) * (x.dim() - 2)
    out = torch.empty_like(x)
    torch.addcmul(b.view(shape), x, a.view(shape), out=out)   # computed in float32, rounded once to x's dtype
    return out


def _padded_conv_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    """HunyuanVideoCausalConv3d.forward with the padding done by replicate_pad."""
    if self.pad_mode != "replicate":
        return self.conv(F.pad(hidden_states, self.time_causal_padding, mode=self.pad_mode))
    return self.conv(replicate_pad(hidden_states, self.time_causal_padding))


def _group_norm_forward(self, x: torch.Tensor) -> torch.Tensor:
    return group_norm(x, self.num_groups, self.weight, self.bias, self.eps)


def _causal_convs(module: nn.Module) -> list[nn.Module]:
    from diffusers.models.autoencoders.autoencoder_kl_hunyuan_video import HunyuanVideoCausalConv3d

    return [m for m in module.modules() if isinstance(m, HunyuanVideoCausalConv3d)]


@contextlib.contextmanager
def fast_decoder(vae, fast_pad: bool = True, fast_norm: bool = True) -> Iterator[int]:
    """Within the block, the decoder's causal convolutions pad with replicate_pad and its GroupNorms use
    group_norm(); yields how many modules were swapped. Modules whose forward is already replaced on the
    instance (another hook) are left alone."""
    swapped: list[nn.Module] = []
    decoder = getattr(vae, "decoder", vae)
    try:
        targets: list[tuple[nn.Module, Callable]] = []
        if fast_pad:
            targets += [(m, _padded_conv_forward) for m in _causal_convs(decoder)]
        if fast_norm:
            targets += [(m, _group_norm_forward) for m in decoder.modules() if isinstance(m, nn.GroupNorm)]
        for m, fn in targets:
            if "forward" in m.__dict__:
                continue
            m.forward = types.MethodType(fn, m)
            swapped.append(m)
        yield len(swapped)
    finally:
        for m in swapped:
            m.__dict__.pop("forward", None)
