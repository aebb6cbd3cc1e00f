"""Exact decompositions of convolutions into other GPU operations (tier 3 of the fallback).

* conv3d = sum over the time kernel of conv2d on time slices (time folded into the batch). This is the rewrite of
  HunyuanVideo's causal 3D conv reported 1.66x faster on gfx1100: MIOpen has 2D heuristics but none for 3D.
  Handles stride, padding, dilation and groups in every dimension. Partial sums are added in the input dtype
  (each conv2d already accumulates in fp32 inside); bf16, with its 8-bit mantissa, is accumulated in fp32.
  Measured on an H100/H200 (fp16, decoder shapes): in-place fp16 accumulation is ~20% faster than an fp32
  accumulator, and stacking the kt slices into one conv2d was no faster while needing kt x the input in memory.
* conv2d = im2col (``F.unfold``) + one batched GEMM per group (rocBLAS/cuBLAS), no MIOpen/cuDNN involved.

Both are plain differentiable torch code: autograd gives exact gradients.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from rocm.errors import TierDeclined
from rocm.signature import ConvSpec


def _check_dtype(x: torch.Tensor, weight: torch.Tensor) -> None:
    if not x.is_floating_point() or x.is_complex() or weight.dtype != x.dtype:
        raise TierDeclined(f"decomposition handles real floating inputs of one dtype, got {x.dtype}/{weight.dtype}")


def _out_size(size: int, kernel: int, stride: int, pad: int, dilation: int) -> int:
    return (size + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1


def conv3d_as_conv2d_sum(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, spec: ConvSpec,
                         conv2d: Callable = torch.conv2d) -> torch.Tensor:
    """``conv3d(x, weight, bias, ...)`` computed as ``sum_k conv2d(x[:, :, t*st + k*dt], weight[:, :, k])``.

    ``x`` is (N, C, T, H, W) with symmetric padding given in ``spec`` (see ``rocm.signature.normalize_call``).
    """
    _check_dtype(x, weight)
    (st, sh, sw), (pt, ph, pw), (dt, dh, dw) = spec.stride, spec.padding, spec.dilation
    n, c, t, h, w = x.shape
    c_out, kt = weight.shape[0], weight.shape[2]
    t_out = _out_size(t, kt, st, pt, dt)
    if t_out <= 0:
        raise ValueError(f"conv3d: input time size {t} (padding {pt}) is smaller than the dilated kernel "
                         f"{dt * (kt - 1) + 1}")
    if pt:
        x = F.pad(x, (0, 0, 0, 0, pt, pt))
    xt = x.transpose(1, 2).contiguous()          # (N, T, C, H, W): time slices become batch items
    acc_dtype = torch.float32 if x.dtype == torch.bfloat16 else x.dtype
    grad = torch.is_grad_enabled()
    out = None
    for k in range(kt):
        start = k * dt
        sl = xt[:, start:start + (t_out - 1) * st + 1:st].reshape(n * t_out, c, xt.shape[3], xt.shape[4])
        y = conv2d(sl, weight[:, :, k], None, (sh, sw), (ph, pw), (dh, dw), spec.groups)
        if out is None:
            out = y.to(acc_dtype)
        elif grad:
            out = out + y
        else:
            out.add_(y)
    assert out is not None                              # (a kernel has a time extent: kt >= 1)
    if bias is not None:
        b = bias.to(acc_dtype).view(1, -1, 1, 1)
        out = out + b if grad else out.add_(b)
    h_out, w_out = out.shape[-2], out.shape[-1]
    out = out.to(x.dtype).view(n, t_out, c_out, h_out, w_out)
    return out.transpose(1, 2).contiguous()


def conv2d_as_gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, spec: ConvSpec) -> torch.Tensor:
    """``conv2d`` as im2col + batched GEMM per group. ``x`` is (N, C, H, W), symmetric padding in ``spec``."""
    _check_dtype(x, weight)
    n, c, h, w = x.shape
    c_out, c_per_group, kh, kw = weight.shape
    g = spec.groups
    h_out = _out_size(h, kh, spec.stride[0], spec.padding[0], spec.dilation[0])
    w_out = _out_size(w, kw, spec.stride[1], spec.padding[1], spec.dilation[1])
    if h_out <= 0 or w_out <= 0:
        raise ValueError(f"conv2d: input {h}x{w} is smaller than the dilated kernel")
    cols = F.unfold(x, (kh, kw), dilation=spec.dilation, padding=spec.padding, stride=spec.stride)
    cols = cols.view(n, g, c_per_group * kh * kw, h_out * w_out)
    wm = weight.reshape(g, c_out // g, c_per_group * kh * kw)
    out = torch.matmul(wm.unsqueeze(0), cols)     # (N, G, C_out/G, L)
    out = out.reshape(n, c_out, h_out, w_out)
    if bias is not None:
        out = out + bias.view(1, -1, 1, 1)
    return out
