"""The five ways to run one convolution, forward and backward.

1. native: ``torch.conv2d/conv3d`` as PyTorch dispatches them (MIOpen on ROCm, cuDNN on CUDA).
2. vendor off: the same convolution with MIOpen/cuDNN off for this call only (``rocm.vendor_free``: the switch is
   an argument of ``aten::_convolution``, so no process-wide flag flips while other threads compute), so PyTorch
   runs its own GPU kernels (im2col/vol2col + BLAS; ``slow_conv_dilated3d`` for 3D). Needs a large column buffer
   (about C_in*k^3*T*H*W elements per batch item).
3. decomposition: ``rocm.decompose`` (conv3d as conv2d over time, conv2d as im2col + GEMM), on the GPU; with
   ``vendor_in_decomposition=False`` its inner conv2d is the vendor-free one of tier 2.
4. decomposition with MIOpen/cuDNN off: tier 3 with the vendor-free inner conv2d, still on the GPU. It is the GPU
   tier left to a conv3d after one MIOpen failure or probe timeout in tier 3 (RDNA2-4 start conv3d at tier 3, and
   tier 2's conv3d needs a column buffer of C_in*k^3*T*H*W elements: 7.7 GB at 608x640). Where tier 3 is already
   vendor-free (a conv2d: im2col + GEMM; ``vendor_in_decomposition=False``) it is the same as tier 3 and skipped.
5. CPU in fp32: inputs copied to the CPU as float32, results moved back to the input's device and dtype.

On CPU tiers 1 and 2 are the same plain convolution. A float32 conv3d on the CPU goes to oneDNN
(``aten::mkldnn_convolution``) whatever its size: PyTorch's own dispatch sends small inputs (N*C*D*H <= 20480, e.g.
the tiny preset's 8-channel VAE) to its reference im2col path, measured 8.7x slower on the tiny VAE's decode (0.40 vs
0.046 s, one thread); full-size layers take oneDNN either way.
"""

from __future__ import annotations

import torch

from configs.rocm_profiles import (  # noqa: F401
    CPU,
    DECOMPOSED,
    DECOMPOSED_VENDOR_OFF,
    NATIVE,
    TIER_NAMES,
    TIERS,
    VENDOR_OFF,
)
from rocm import vendor_free
from rocm.decompose import conv2d_as_gemm, conv3d_as_conv2d_sum
from rocm.signature import ConvSpec


def same_as_previous(tier: int, op: str, vendor_in_decomposition: bool) -> bool:
    """Whether ``tier`` runs exactly what the tier before it runs (tier 4 where tier 3 has no vendor call)."""
    return tier == DECOMPOSED_VENDOR_OFF and (op != "conv3d" or not vendor_in_decomposition)


def _native(op: str):
    return torch.conv3d if op == "conv3d" else torch.conv2d


def _native_forward(spec: ConvSpec, x, weight, bias):
    """Tier 1's forward: PyTorch's dispatch, but oneDNN for every float32 conv3d on the CPU (module docstring)."""
    if spec.op == "conv3d" and x.device.type == "cpu" and x.dtype == weight.dtype == torch.float32 \
            and torch.backends.mkldnn.is_available():
        return torch.ops.aten.mkldnn_convolution(x.contiguous(), weight.contiguous(), bias, list(spec.padding),
                                                 list(spec.stride), list(spec.dilation), spec.groups)
    return _native(spec.op)(x, weight, bias, spec.stride, spec.padding, spec.dilation, spec.groups)


def forward(tier: int, spec: ConvSpec, x, weight, bias, *, vendor_in_decomposition: bool = True):
    """Run ``spec`` on (x, weight, bias) with the given tier; differentiable where the ops are."""
    args = (spec.stride, spec.padding, spec.dilation, spec.groups)
    if tier == NATIVE:
        return _native_forward(spec, x, weight, bias)
    if tier == VENDOR_OFF:
        return vendor_free.conv(x, weight, bias, *args)
    if tier in (DECOMPOSED, DECOMPOSED_VENDOR_OFF):
        if spec.op == "conv3d":
            vendor = vendor_in_decomposition and tier == DECOMPOSED
            return conv3d_as_conv2d_sum(x, weight, bias, spec, conv2d=torch.conv2d if vendor else vendor_free.conv)
        return conv2d_as_gemm(x, weight, bias, spec)
    if tier == CPU:
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
    if tier == NATIVE:
        grads = _aten_backward(spec, x, weight, bias, grad_out, mask)
    elif tier == VENDOR_OFF:
        grads = vendor_free.backward(x, weight, bias is not None, grad_out, spec.stride, spec.padding,
                                     spec.dilation, spec.groups, mask)
    elif tier in (DECOMPOSED, DECOMPOSED_VENDOR_OFF):
        grads = _decomposition_backward(spec, x, weight, bias, grad_out, mask,
                                        vendor_in_decomposition and tier == DECOMPOSED)
    elif tier == CPU:
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
        out = forward(DECOMPOSED, spec, *leaves, vendor_in_decomposition=vendor_in_decomposition)
        grads = iter(torch.autograd.grad(out, wanted, grad_out)) if wanted else iter(())
    return tuple(next(grads) if m else None for m in mask)
