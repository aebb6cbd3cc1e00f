"""Convolution with MIOpen (ROCm) / cuDNN (CUDA) off for one call, without touching the process-wide flag.

``torch.backends.cudnn.enabled = False`` would turn MIOpen off for every thread (and for batch norm too) while it
is set. ``aten::_convolution`` takes the switch as an argument instead: its ``ConvParams::use_miopen`` /
``use_cudnn`` read that ``cudnn_enabled`` argument, not the global flag (aten/src/ATen/native/Convolution.cpp), so
``cudnn_enabled=False`` selects PyTorch's own kernels (im2col/vol2col + BLAS; ``slow_conv_dilated3d`` for 3D) for
that call only. The backward pass is computed from the same primitive (a transposed convolution for the input,
a convolution over the batch for the weight), because ``aten::convolution_backward`` reads the global flag.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable


def _flags() -> tuple[bool, bool]:
    return torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.allow_tf32


def conv_nd(x, weight, bias, stride, padding, dilation, groups, *, transposed=False, output_padding=None):
    """One ``aten::_convolution`` call with MIOpen/cuDNN off (not differentiable through the vendor)."""
    dims = weight.dim() - 2
    deterministic, tf32 = _flags()
    return torch._convolution(x, weight, bias, list(stride), list(padding), list(dilation), transposed,
                              list(output_padding or [0] * dims), groups, False, deterministic, False, tf32)


def backward(x, weight, bias_defined: bool, grad_out, stride, padding, dilation, groups, mask):
    """(grad input, grad weight, grad bias) of ``conv_nd`` (entries not in ``mask`` are None)."""
    dims = weight.dim() - 2
    spatial_in, spatial_out, kernel = x.shape[2:], grad_out.shape[2:], weight.shape[2:]
    gx = gw = gb = None
    if mask[0]:
        # conv_transpose of grad_out; output_padding restores the input rows the forward's floor division dropped
        extra = [spatial_in[i] - ((spatial_out[i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (kernel[i] - 1)
                                  + 1) for i in range(dims)]
        gx = conv_nd(grad_out, weight, None, stride, padding, dilation, groups, transposed=True,
                     output_padding=extra)
    if mask[1]:
        # grad_w[o, i, k] = sum_{n, p} x[n, i, p*stride + k*dilation - pad] * g[n, o, p]: a grouped convolution of
        # the input with the batch as channels, grad_out as its weight, stride and dilation swapped
        n, c_in = x.shape[:2]
        per_group = c_in // groups
        xt = x.reshape(n, groups, per_group, *spatial_in).movedim((2, 1), (0, 1))    # (C_in/g, g, N, *in)
        xt = xt.reshape(per_group, groups * n, *spatial_in)
        gt = grad_out.transpose(0, 1)                               # (C_out, N, *out): channel g*co + o
        full = conv_nd(xt, gt, None, dilation, padding, stride, groups)   # (C_in/g, C_out, *K' >= K)
        full = full[(slice(None), slice(None)) + tuple(slice(0, k) for k in kernel)]
        gw = full.transpose(0, 1).contiguous()
    if mask[2] and bias_defined:
        gb = grad_out.sum(dim=[0, *range(2, 2 + dims)])
    return gx, gw, gb


class _VendorFreeConv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, stride, padding, dilation, groups):
        ctx.args = (stride, padding, dilation, groups)
        ctx.has_bias = bias is not None
        ctx.save_for_backward(x, weight)
        return conv_nd(x, weight, bias, stride, padding, dilation, groups)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        mask = ctx.needs_input_grad[:3]
        gx, gw, gb = backward(x, weight, ctx.has_bias, grad_out.contiguous(), *ctx.args, mask)
        return gx, gw, gb, None, None, None, None


def conv(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """``torch.conv2d``/``conv3d`` with MIOpen/cuDNN off for this call, differentiable (vendor-free backward)."""
    dims = weight.dim() - 2

    def tup(v):
        return tuple(v) if isinstance(v, (tuple, list)) else (v,) * dims

    args = (tup(stride), tup(padding), tup(dilation), int(groups))
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias)):
        return _VendorFreeConv.apply(x, weight, bias, *args)
    return conv_nd(x, weight, bias, *args)
