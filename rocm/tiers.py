"""The four ways to run one convolution, forward and backward.

1. native: ``torch.conv2d/conv3d`` as PyTorch dispatches them (MIOpen on ROCm, cuDNN on CUDA).
2. vendor off: the same convolution with MIOpen/cuDNN off for this call only (``rocm.vendor_free``: the switch is
   an argument of ``aten::_convolution``, so no process-wide flag flips while other threads compute), so PyTorch
   runs its own GPU kernels (im2col/vol2col + BLAS; ``slow_conv_dilated3d`` for 3D). Needs a large column buffer
   (about C_in*k^3*T*H*W elements per batch item).
3. decomposition: ``rocm.decompose`` (conv3d as conv2d over time, conv2d as im2col + GEMM), on the GPU; with
   ``vendor_in_decomposition=False`` its inner conv2d is the vendor-free one of tier 2.
4. CPU in fp32: inputs copied to the CPU as float32, results moved back to the input's device and dtype.

On CPU tiers 1 and 2 are the same plain convolution.
"""

from __future__ import annotations

import torch

from rocm import vendor_free
from rocm.decompose import conv2d_as_gemm, conv3d_as_conv2d_sum
from rocm.signature import ConvSpec

TIERS = (1, 2, 3, 4)
TIER_NAMES = {1: "native (MIOpen/cuDNN)", 2: "GPU, MIOpen/cuDNN off", 3: "exact decomposition", 4: "CPU fp32"}


def _native(op: str):
    return torch.conv3d if op == "conv3d" else torch.conv2d


def forward(tier: int, spec: ConvSpec, x, weight, bias, *, vendor_in_decomposition: bool = True):
    """Run ``spec`` on (x, weight, bias) with the given tier; differentiable where the ops are."""
    args = (spec.stride, spec.padding, spec.dilation, spec.groups)
    if tier == 1:
        return _native(spec.op)(x, weight, bias, *args)
    if tier == 2:
        return vendor_free.conv(x, weight, bias, *args)
    if tier == 3:
        if spec.op == "conv3d":
            inner = torch.conv2d if vendor_in_decomposition else vendor_free.conv
            return conv3d_as_conv2d_sum(x, weight, bias, spec, conv2d=inner)
        return conv2d_as_gemm(x, weight, bias, spec)
    if tier == 4:
        cpu = [None if t is None else t.detach().to("cpu", torch.float32) for t in (x, weight, bias)]
        out = _native(spec.op)(cpu[0], cpu[1], cpu[2], *args)
        return out.to(x.device, x.dtype)
    raise ValueError(f"no tier {tier}")


def _aten_backward(spec: ConvSpec, x, weight, bias, grad_out, mask):
    bias_sizes = [weight.shape[0]] if bias is not None else None
    return torch.ops.aten.convolution_backward(
        grad_out, x, weight, bias_sizes, list(spec.stride), list(spec.padding), list(spec.dilation), False,
        [0] * spec.dims, spec.groups, list(mask))


def backward(tier: int, spec: ConvSpec, x, weight, bias, grad_out, mask, *, vendor_in_decomposition: bool = True):
    """Gradients (input, weight, bias) of ``spec`` by the given tier; entries not in ``mask`` are None."""
    mask = (bool(mask[0]), bool(mask[1]), bool(mask[2]) and bias is not None)
    if tier == 1:
        grads = _aten_backward(spec, x, weight, bias, grad_out, mask)
    elif tier == 2:
        grads = vendor_free.backward(x, weight, bias is not None, grad_out, spec.stride, spec.padding,
                                     spec.dilation, spec.groups, mask)
    elif tier == 3:
        grads = _decomposition_backward(spec, x, weight, bias, grad_out, mask, vendor_in_decomposition)
    elif tier == 4:
        cpu = [None if t is None else t.detach().to("cpu", torch.float32) for t in (x, weight, bias, grad_out)]
        grads = _aten_backward(spec, cpu[0], cpu[1], cpu[2], cpu[3], mask)
        grads = tuple(None if g is None else g.to(ref.device, ref.dtype)
                      for g, ref in zip(grads, (x, weight, bias if bias is not None else weight)))
    else:
        raise ValueError(f"no tier {tier}")
    return tuple(g if m else None for g, m in zip(grads, mask))


def _decomposition_backward(spec, x, weight, bias, grad_out, mask, vendor_in_decomposition):
    leaves = [t.detach().requires_grad_(m) if t is not None else None for t, m in zip((x, weight, bias), mask)]
    wanted = [t for t, m in zip(leaves, mask) if m]
    with torch.enable_grad():
        out = forward(3, spec, *leaves, vendor_in_decomposition=vendor_in_decomposition)
        grads = iter(torch.autograd.grad(out, wanted, grad_out)) if wanted else iter(())
    return tuple(next(grads) if m else None for m in mask)
