"""Attention that never falls back to PyTorch's math kernel at full size.

At FramePack's ~18k tokens the math SDPA kernel materialises the score matrix: 24 heads × 18k² × 4 B ≈ 29 GB.
Inside a stage, `AttentionGuard` replaces (through the one patch registry, common/patches.py) `torch.nn.functional.scaled_dot_product_attention` (which diffusers'
native attention backend and transformers' sdpa attention call) with a checked version: on a GPU it asks PyTorch
which fused kernel (flash, memory-efficient, cuDNN) takes this call and runs it restricted to that kernel; when
none applies (dtype, head size, mask kind on this device), it splits the queries into chunks whose score matrix
fits the chunk budget. Each choice is logged once per kind of call and stage and kept in `choices` (for job.json);
when a ROCm GPU ends up on the chunked math kernel, the line also says why fused kernels may be off
(`aotriton_note`: PyTorch's TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL gate).

Inside compiled code (pipeline/compiled.py compiles the transformer blocks) the same checked call is one opaque
operator, `steadyframe::attention`: dynamo does not trace the guard's kernel choice (it cannot ask PyTorch which
fused kernel takes fake tensors), the compiled graph stays whole around it, and at run time the operator runs the
guard's eager path (the same kernel, or the same chunks). The function patched in is always `_dispatch` (one
object), so a compiled block traced under one stage's guard is reused under the next one's without recompiling.

**FlashAttention-4** (`flash-attn-4` on PyPI, the optional extra `flash-attention-4`: Tri Dao's CuTe DSL kernels,
compiled at first use): where it is installed, on the GPUs where it was measured faster than cuDNN's bf16 kernel at
this model's shape (`FA4_MAJORS`, BENCHMARKS.md), an unmasked bf16/fp16 call without dropout runs through it; every
other call, every GPU elsewhere and every call after it failed once in the process (one warning) keeps the fused
kernel chosen below. `flash_attention_4(False)` turns it off for a block (the benchmarks' comparison).

**fp8 attention** (the job's "fp8 attention" setting; rocm/fp8_attention.py): inside `fp8_attention(True)` (the
orchestrator's transformer sampling), a call that fits the fp8 kernels has q/k/v quantized (K and V smoothed, the
scales per head) and runs through FlashAttention-3's fp8 kernel where it is installed on a Hopper GPU (measured the
fastest), else through cuDNN's via the cuDNN frontend: `fa.kernel`, chosen once per process when the switch is
first turned on. In compiled blocks the quantization is traced into the
block's graph (Inductor fuses it with what comes before) and the kernel is a second opaque operator,
`steadyframe::fp8_attention`, whose output leaves V's mean to the graph (added where the output is read, not in a
pass of its own: 10 ms a step in the profile); with FlashAttention-3 the blocks' attention form (pipeline/block_forms.py)
quantizes the inputs itself in rocm/fp8_qkv.py's Triton passes and calls a third operator,
`steadyframe::fp8_attention_quantized` (`fp8_prequantized` says when); dynamo guards on the switch, so each setting has its graph (compiled once per
process, reused by every later job). A call that does not fit, and every call after the frontend failed once in
the process (one warning), runs in bf16 as without the setting.
"""
from __future__ import annotations

import functools
import logging
import os
from contextlib import contextmanager
from typing import Iterator, Mapping, Optional

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from common import patches
from common.patches import Patch
from common.units import GIB
from configs.rocm_profiles import AOTRITON_EXPERIMENTAL_VAR
from rocm import fp8_attention as fa
from rocm import fp8_qkv
from rocm.arch import detect_runtime
from rocm.env import aotriton_gated

log = logging.getLogger(__name__)

FUSED = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION)
# The fused kernels, fastest first, on the GPUs where they were measured (Hopper, compute capability 9.x): at
# FramePack's shape (bf16, 24 heads x 18,485 tokens x head 128) cuDNN's flash kernel took 6.65 ms, PyTorch's flash
# kernel 11.9, memory-efficient 24.0 on an H200 (and 6.67 / 11.44 / 23.30 on an H100; BENCHMARKS.md). Where cuDNN's
# does not take a call (a mask it refuses), the next one runs; on other GPUs (not measured) PyTorch's own order.
PREFERRED = (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION)
MEASURED_MAJOR = 9
# Where FlashAttention-4's bf16 forward, when installed, is taken before the kernels above: the compute capabilities
# (majors) on which it was measured faster than cuDNN's flash kernel at FramePack's shape (BENCHMARKS.md).
FA4_MAJORS: tuple[int, ...] = (9,)
FA4_CHOICE = "FlashAttention-4 kernel (flash-attn-4)"
_NAMES = {SDPBackend.FLASH_ATTENTION: "flash", SDPBackend.EFFICIENT_ATTENTION: "memory-efficient",
          SDPBackend.CUDNN_ATTENTION: "cudnn", SDPBackend.MATH: "math"}
MATH_BYTES_PER_SCORE = 12        # fp32 scores, their softmax and a cast, per (query, key) pair and head


def aotriton_note(backend: str, arch: str | None, environ: Mapping[str, str]) -> str | None:
    """Why flash / memory-efficient attention may be off on this ROCm device; None when the gate is open or
    does not apply."""
    if backend != "rocm" or not arch or not aotriton_gated(arch):
        return None
    value = environ.get(AOTRITON_EXPERIMENTAL_VAR)
    if value == "1":
        return None
    shown = "unset" if value is None else f"{value!r}"
    return (f"{AOTRITON_EXPERIMENTAL_VAR} is {shown}, so PyTorch may keep its AOTriton flash / memory-efficient "
            f"kernels off on {arch}; SteadyFrame's profile sets it to 1 unless you set it (it must be set before "
            f"the first attention call: PyTorch reads it once, into a static, in sdp_utils.cpp)")



def chunk_rows(query: torch.Tensor, key: torch.Tensor, budget_bytes: int) -> int:
    """Query rows per chunk so that the math kernel's score matrices stay within `budget_bytes`."""
    heads = query.shape[:-2].numel()
    per_row = heads * key.shape[-2] * MATH_BYTES_PER_SCORE
    return max(1, min(query.shape[-2], budget_bytes // max(per_row, 1)))


def chunked_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                 enable_gqa=False, *, rows: int, sdpa=None) -> torch.Tensor:
    """SDPA computed `rows` queries at a time (same result up to rounding; masks and causality handled)."""
    sdpa = sdpa or F.scaled_dot_product_attention
    lq, lk = query.shape[-2], key.shape[-2]
    if is_causal and attn_mask is not None:
        raise ValueError("attn_mask and is_causal cannot both be set")
    out = query.new_empty((*query.shape[:-1], value.shape[-1]))
    for s in range(0, lq, rows):
        e = min(s + rows, lq)
        mask = attn_mask
        if mask is not None and mask.dim() >= 2 and mask.shape[-2] > 1:
            mask = mask[..., s:e, :]
        if is_causal:   # PyTorch's is_causal is top-left aligned: query i sees keys 0..i
            mask = torch.ones(e - s, lk, dtype=torch.bool, device=query.device).tril(diagonal=s)
        out[..., s:e, :] = sdpa(query[..., s:e, :], key, value, attn_mask=mask, dropout_p=dropout_p,
                                is_causal=False, scale=scale, enable_gqa=enable_gqa)
    return out


_ATEN_SDPA = torch._C._nn.scaled_dot_product_attention     # PyTorch's own, whatever is patched over it
_ACTIVE: list["AttentionGuard"] = []                          # the guards inside their stage, innermost last
_FP8 = False                    # inside fp8_attention(True): calls that fit run in fp8 (dynamo guards on it)
_FP8_FAILED: list[str] = []     # why the fp8 kernel failed in this process (then bf16 for the rest of it)
FP8_CHOICE = "fp8 (cuDNN frontend; K and V smoothed, q/k balanced per head, per-tensor scales)"
FP8_FA3_CHOICE = "fp8 (FlashAttention-3; K and V smoothed, scales per head)"
FP8_CHOICES = {fa.CUDNN: FP8_CHOICE, fa.FA3: FP8_FA3_CHOICE}
_FA4_ON = True                  # flash_attention_4(False): the fused kernels below only
_FA4_FAILED: list[str] = []     # why FlashAttention-4 failed in this process (then the fused kernels for the rest)
_FA4: list = []                 # [flash_attn_func or None], looked up once


def _flash4():
    """FlashAttention-4's forward (`flash_attn.cute.flash_attn_func`), or None where flash-attn-4 is not installed
    (or does not import: then said once)."""
    if not _FA4:
        try:
            from flash_attn.cute import flash_attn_func
        except ImportError:
            flash_attn_func = None
        except Exception as e:        # installed but broken (a CUDA or CuTe DSL mismatch): the fused kernels
            log.warning("flash-attn-4 is installed but does not import (%s: %s); attention uses PyTorch's kernels",
                        type(e).__name__, " ".join(str(e).split())[:200])
            flash_attn_func = None
        _FA4.append(flash_attn_func)
    return _FA4[0]


@contextmanager
def flash_attention_4(on: bool) -> Iterator[None]:
    """FlashAttention-4 may be chosen inside this block when `on` (where installed and measured faster; the
    default is on)."""
    global _FA4_ON
    before, _FA4_ON = _FA4_ON, bool(on)
    try:
        yield
    finally:
        _FA4_ON = before


@functools.lru_cache(maxsize=None)
def _fa4_device(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device)[0] in FA4_MAJORS


def _fa4_here(query: torch.Tensor) -> bool:
    """Is FlashAttention-4 installed and measured faster on this call's GPU (FA4_MAJORS)?"""
    return query.is_cuda and not torch.version.hip and _fa4_device(query.device) and _flash4() is not None


def fa4_takes(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa) -> bool:
    """Is this a call FlashAttention-4 takes: 4-D bf16/fp16 in PyTorch's (batch, heads, tokens, dim), as many heads
    in q as in k/v, no mask, no dropout, not causal, equal q/v head sizes that are a multiple of 8 up to 256, no
    gradient?"""
    if attn_mask is not None or dropout_p or is_causal or enable_gqa or query.requires_grad:
        return False
    if query.dim() != 4 or not (key.dim() == value.dim() == 4) or query.dtype not in (torch.bfloat16, torch.float16):
        return False
    if key.dtype != query.dtype or value.dtype != query.dtype or key.shape[1] != query.shape[1]:
        return False
    d = query.shape[-1]
    return d == value.shape[-1] and d % 8 == 0 and d <= 256


def fa4_fits(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa) -> bool:
    """Does this call go to FlashAttention-4 (on, not failed in this process, here, and a call it takes)?"""
    return (_FA4_ON and not _FA4_FAILED and fa4_takes(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
            and _fa4_here(query))


def _give_up(failed: list[str], kernel: str, e: Exception, instead: str) -> None:
    """A kernel failed: keep why in `failed` (the process's record: no later call tries it) and say it once."""
    failed.append(f"{type(e).__name__}: {' '.join(str(e).split())[:300]}")
    log.warning("%s failed (%s); attention %s for the rest of this process", kernel, failed[0], instead)


def _run_fa4(query, key, value, scale) -> torch.Tensor | None:
    """FlashAttention-4 on (batch, heads, tokens, dim) inputs, its output in the fused kernels' layout (token-major:
    `_out_like`), or None once it has failed in this process (said once)."""
    try:
        out, _ = _flash4()(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), softmax_scale=scale)
    except torch.OutOfMemoryError:
        raise
    except Exception as e:      # a CuTe DSL compile or launch failure: the fused kernels from here on
        _give_up(_FA4_FAILED, "FlashAttention-4", e, "uses PyTorch's fused kernels")
        return None
    return out.transpose(1, 2)


@contextmanager
def fp8_attention(on: bool) -> Iterator[None]:
    """Attention calls that fit the fp8 kernels run in fp8 inside this block when `on` (the job's setting,
    checked against the device before the job was queued: rocm.fp8_attention.unavailable)."""
    global _FP8
    if on and fa.kernel() == fa.FA3:    # chosen now, eagerly: compiled code reads the choice (fa.chosen)
        fp8_qkv.prepare()               # and the compiled blocks' quantization passes, outside traced code
    before, _FP8 = _FP8, bool(on)
    try:
        yield
    finally:
        _FP8 = before


def fp8_requested() -> bool:
    """Is the code running inside fp8_attention(True)?"""
    return _FP8


def _dispatch(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """What `F.scaled_dot_product_attention` is while a guard holds it."""
    if torch.compiler.is_compiling():
        if _FP8 and fa.fits(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa):
            z = fa.quantize(query, key, value)       # traced: fused into the compiled block
            out = torch.ops.steadyframe.fp8_attention(query, key, value, z.q, z.k, z.v, z.descale_q, z.descale_k,
                                                      z.descale_v, z.v_mean, scale)
            return (out.float() + z.v_mean).to(query.dtype)     # V's mean back, fused into what reads the output
        return torch.ops.steadyframe.attention(query, key, value, attn_mask, float(dropout_p), bool(is_causal),
                                               scale, bool(enable_gqa))
    return _checked(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


def _checked(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    if _ACTIVE:
        return _ACTIVE[-1]._sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    return _ATEN_SDPA(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                      scale=scale, enable_gqa=enable_gqa)


def _out_like(query: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """The output in the fused kernels' layout: (batch, heads, tokens, dim) stored token-major, as flash and cuDNN
    return it for diffusers' (batch, tokens, heads, dim) inputs (so the transpose after attention is free)."""
    if query.dim() != 4:
        return query.new_empty((*query.shape[:-1], value.shape[-1]))
    b, h, n, _ = query.shape
    return query.new_empty((b, n, h, value.shape[-1])).transpose(1, 2)


@torch.library.custom_op("steadyframe::attention", mutates_args=())
def _attention_op(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: Optional[torch.Tensor],
                  dropout_p: float, is_causal: bool, scale: Optional[float], enable_gqa: bool) -> torch.Tensor:
    out = _checked(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    shaped = _out_like(query, value)
    if out.stride() == shaped.stride():
        return out
    return shaped.copy_(out)        # compiled code was built for this layout (cheap next to the attention)


@_attention_op.register_fake
def _(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    return _out_like(query, value)


def _run_fp8(query: torch.Tensor, z: fa.Quantized, scale: Optional[float], with_mean: bool = True
             ) -> torch.Tensor | None:
    """The fp8 attention of quantized inputs (`fa.run`), or None once it has failed in this process (said once)."""
    if _FP8_FAILED:
        return None
    try:
        out = fa.run(z, query.dtype, scale, with_mean=with_mean)
    except torch.OutOfMemoryError:
        raise
    except Exception as e:      # the frontend or cuDNN refused this graph or this GPU: bf16 from here on
        _give_up(_FP8_FAILED, "fp8 attention", e, "runs in bf16")
        return None
    if _ACTIVE:
        _ACTIVE[-1]._note(query, FP8_CHOICES[fa.chosen()])
    return out


@torch.library.custom_op("steadyframe::fp8_attention", mutates_args=())
def _fp8_op(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, q8: torch.Tensor, k8: torch.Tensor,
            v8: torch.Tensor, descale_q: torch.Tensor, descale_k: torch.Tensor, descale_v: torch.Tensor,
            v_mean: torch.Tensor, scale: Optional[float]) -> torch.Tensor:
    """The fp8 kernel's output without V's mean (the traced caller adds it: `_dispatch`)."""
    out = _run_fp8(query, fa.Quantized(q8, k8, v8, descale_q, descale_k, descale_v, v_mean), scale, with_mean=False)
    if out is None:             # bf16, as the guard would have run it without the setting, less the mean added after
        out = (_checked(query, key, value, None, 0.0, False, scale, False).float() - v_mean).to(query.dtype)
    shaped = _out_like(query, value)
    return out if out.stride() == shaped.stride() else shaped.copy_(out)


@_fp8_op.register_fake
def _(query, key, value, q8, k8, v8, descale_q, descale_k, descale_v, v_mean, scale):
    return _out_like(query, value)


def fp8_prequantized() -> bool:
    """Do the compiled blocks hand fp8 attention inputs already quantized (rocm/fp8_qkv.py's passes, called by the
    blocks' attention form in pipeline/block_forms.py)? Inside `fp8_attention(True)` with FlashAttention-3 chosen
    and the passes prepared; read in traced code (dynamo guards on it)."""
    return _FP8 and fa.chosen() == fa.FA3 and fp8_qkv.ready()


@torch.library.custom_op("steadyframe::fp8_attention_quantized", mutates_args=())
def _fp8_quantized_op(q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor, descale_q: torch.Tensor,
                      descale_k: torch.Tensor, descale_v: torch.Tensor, v_mean: torch.Tensor, scale: Optional[float],
                      dtype: torch.dtype) -> torch.Tensor:
    """The fp8 kernel's output for inputs quantized by the caller ((batch, heads, tokens, dim) views, K and V less
    their means), without V's mean, in `dtype` and the fused kernels' layout. Where the kernel has failed: bf16
    attention of the dequantized inputs (V's mean left out alike)."""
    z = fa.Quantized(q8, k8, v8, descale_q, descale_k, descale_v, v_mean)
    like = q8.new_empty((0, q8.shape[-1]), dtype=dtype)
    out = _run_fp8(like, z, scale, with_mean=False)
    if out is None:
        q, k, v = ((t.float() * d).to(dtype) for t, d in ((q8, descale_q), (k8, descale_k), (v8, descale_v)))
        out = _checked(q, k, v, None, 0.0, False, scale, False)
    shaped = _quantized_out(q8, v8, dtype)
    return out if out.stride() == shaped.stride() and out.dtype == dtype else shaped.copy_(out)


def _quantized_out(q8: torch.Tensor, v8: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    b, h, n, _ = q8.shape
    return q8.new_empty((b, n, h, v8.shape[-1]), dtype=dtype).transpose(1, 2)


@_fp8_quantized_op.register_fake
def _(q8, k8, v8, descale_q, descale_k, descale_v, v_mean, scale, dtype):
    return _quantized_out(q8, v8, dtype)


def _fused_choice(args) -> SDPBackend | None:
    """The fused kernel for this call, math excluded (on Hopper in the order of PREFERRED, the fastest measured first;
    elsewhere PyTorch's choice), or None if none applies."""
    q, k, v, mask, dropout_p, is_causal, scale, enable_gqa = args
    measured = (q.is_cuda and not torch.version.hip
                and torch.cuda.get_device_capability(q.device)[0] == MEASURED_MAJOR)
    with sdpa_kernel(list(PREFERRED if measured else FUSED), set_priority=measured):
        try:
            choice = torch._fused_sdp_choice(q, k, v, mask, dropout_p, is_causal, scale=scale,
                                             enable_gqa=enable_gqa)
        except RuntimeError:
            return None
    try:
        backend = SDPBackend(choice)
    except ValueError:
        return None
    return backend if backend in FUSED else None


class AttentionGuard:
    """Context manager for one stage; `force_chunked` (tests) chunks every call, also on the CPU. `gate_note`:
    why fused kernels may be off on this device (default: asked from rocm on the first chunked call)."""

    def __init__(self, device: torch.device, chunk_budget_bytes: int = 1 << 30, *, force_chunked: bool = False,
                 label: str = "", gate_note: str | None = None):
        self.device = torch.device(device)
        self.chunk_budget_bytes = int(chunk_budget_bytes)
        self.force_chunked = force_chunked
        self.label = label
        self.gate_note = gate_note
        self.choices: dict[str, str] = {}
        self._decided: dict[tuple, SDPBackend | None] = {}
        self._patch: Patch | None = None

    @property
    def _original(self):
        """The attention below this guard (PyTorch's own under a nested guard: never `_dispatch` again)."""
        below = self._patch.original if self._patch is not None else F.scaled_dot_product_attention
        return _ATEN_SDPA if below is _dispatch else below

    def __enter__(self) -> "AttentionGuard":
        if self.device.type == "cuda" or self.force_chunked:
            owner = "memory.AttentionGuard" + (f" ({self.label})" if self.label else "")
            self._patch = patches.patch(F, "scaled_dot_product_attention", _dispatch, owner)
            _ACTIVE.append(self)
        return self

    def __exit__(self, *exc) -> None:
        if self._patch is not None:
            patches.restore(self._patch)
            self._patch = None
            if self in _ACTIVE:
                _ACTIVE.remove(self)

    @staticmethod
    def _signature(q, k, v, mask, dropout_p, is_causal, enable_gqa) -> tuple:
        return (q.device.type, q.dtype, q.shape[-1], v.shape[-1], None if mask is None else mask.dtype,
                bool(is_causal), dropout_p > 0, bool(enable_gqa), q.requires_grad)

    def _sdpa(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
              enable_gqa=False):
        original = self._original
        if _FP8 and not _FP8_FAILED and fa.fits(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa):
            out = _run_fp8(query, fa.quantize(query, key, value), scale)
            if out is not None:
                return out
        if fa4_fits(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa):
            out = _run_fa4(query, key, value, scale)
            if out is not None:
                self._note(query, FA4_CHOICE)
                return out
        sig = self._signature(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
        if sig not in self._decided:
            args = (query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
            choice = None if (self.force_chunked or query.device.type != "cuda") else _fused_choice(args)
            self._decided[sig] = choice
            self._log(sig, choice, query, key)
        choice = self._decided[sig]
        if choice is not None:
            try:
                with sdpa_kernel([choice]):
                    return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                    is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
            except RuntimeError as e:   # the kernel refused this particular shape: chunk this call
                if "No available kernel" not in str(e):
                    raise
                log.debug("attention: %s refused shape %s; chunking this call", _NAMES[choice], tuple(query.shape))
        rows = chunk_rows(query, key, self.chunk_budget_bytes)
        if rows >= query.shape[-2] and not self.force_chunked:
            return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                            scale=scale, enable_gqa=enable_gqa)
        return chunked_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, rows=rows,
                            sdpa=original)

    def _note(self, query: torch.Tensor, choice: str) -> None:
        """Record (and log, when it changed) the kernel that ran an unmasked call of this dtype and head size."""
        what = f"{str(query.dtype).replace('torch.', '')}, head dim {query.shape[-1]}, no mask"
        if self.choices.get(what) != choice:
            self.choices[what] = choice
            log.info("attention%s (%s): %s", f" in {self.label}" if self.label else "", what, choice)

    def _log(self, sig: tuple, choice: SDPBackend | None, query, key) -> None:
        dtype = str(sig[1]).replace("torch.", "")
        what = f"{dtype}, head dim {sig[2]}, {'masked' if sig[4] is not None else 'no mask'}"
        if choice is not None:
            text = f"{_NAMES[choice]} kernel"
        else:
            full = query.shape[:-2].numel() * query.shape[-2] * key.shape[-2] * MATH_BYTES_PER_SCORE
            rows = chunk_rows(query, key, self.chunk_budget_bytes)
            text = (f"no fused kernel: math in chunks of {rows} query rows (≤ {self.chunk_budget_bytes / GIB:.2f}"
                    f" GiB each; unchunked would need {full / GIB:.1f} GiB at this size)")
            note = self._gate_note()
            if note:
                text += f"; {note}"
        self.choices[what] = text
        log.info("attention%s (%s): %s", f" in {self.label}" if self.label else "", what, text)

    def _gate_note(self) -> str | None:
        if self.gate_note is None and self.device.type == "cuda":

            runtime = detect_runtime(self.device)
            self.gate_note = aotriton_note(runtime.backend, runtime.arch, os.environ) or ""
        return self.gate_note
