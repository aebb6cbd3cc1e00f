"""Which attention kernel runs the transformer's attention on this device, how fast, and why (AOTriton's gate).

PyTorch's ROCm wheels run flash / memory-efficient SDPA through AOTriton, and keep those kernels off on the archs
AOTriton calls experimental unless ``TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL=1`` was set before torch first
checked (configs/rocm_profiles.py has the sources); SDPA then silently takes the math kernel
(``rocm.sdpa.aotriton_note`` says so for a device). ``attention_check`` (``python -m rocm doctor``) times
FramePack's attention shape (bf16, head 128, ~18k tokens, with and without a key-padding mask) on every SDPA
backend, and through the app's own ``rocm.sdpa.AttentionGuard``, which decides what the app will use.
"""

from __future__ import annotations

import logging
import time
import warnings
from typing import Callable

from common.units import GIB
from rocm.allocator import synchronize

logger = logging.getLogger(__name__)


def _backends():
    from torch.nn.attention import SDPBackend

    return {"flash": SDPBackend.FLASH_ATTENTION, "memory-efficient": SDPBackend.EFFICIENT_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}


def _timed(fn, device, reps: int, warmup: int) -> float:
    """Median milliseconds of ``fn()`` over ``reps`` runs after ``warmup`` (synchronised around each)."""

    times = []
    for i in range(warmup + reps):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        if i >= warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return round(times[len(times) // 2], 3)


def _why_not(exc: BaseException, caught) -> str:
    reasons = [str(w.message).strip().splitlines()[0] for w in caught if str(w.message).strip()]
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return "; ".join(dict.fromkeys(reasons + [first]))[:300]


def _case(device, dtype, tokens, heads, head_dim, masked, reps, warmup, budget_bytes, free_bytes, progress):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    from rocm.sdpa import MATH_BYTES_PER_SCORE, AttentionGuard  # the app's own choice (lazy import)

    gen = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = (torch.randn(1, heads, tokens, head_dim, generator=gen).to(device, dtype) for _ in range(3))
    mask = None
    if masked:      # diffusers' FramePack transformer: a boolean key-padding mask, (B, 1, 1, N)
        mask = torch.ones(1, 1, 1, tokens, dtype=torch.bool, device=device)
        mask[..., tokens - max(1, tokens // 20):] = False
    label = "with mask" if masked else "no mask"
    row = {"masked": masked, "backends": {}}
    math_bytes = heads * tokens * tokens * MATH_BYTES_PER_SCORE
    for name, backend in _backends().items():
        if progress:
            progress(f"attention {label}: {name}")
        if name == "math" and free_bytes is not None and math_bytes > free_bytes // 2:
            row["backends"][name] = {"ran": False, "reason": f"not run: the full score matrix needs "
                                                             f"{math_bytes / GIB:.1f} GiB"}
            continue
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with sdpa_kernel([backend]):
                    ms = _timed(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask), device, reps,
                                warmup)
                row["backends"][name] = {"ran": True, "ms": ms}
            except RuntimeError as exc:      # no kernel for this call on this device (or out of memory)
                row["backends"][name] = {"ran": False, "reason": _why_not(exc, caught)}
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if progress:
        progress(f"attention {label}: the app's choice")
    with AttentionGuard(device, budget_bytes, label="doctor") as guard:
        ms = _timed(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask), device, reps, warmup)
    choice = next(iter(guard.choices.values()), "PyTorch's own SDPA dispatch (no guard off the GPU)")
    row["app"] = {"uses": choice, "ms": ms}
    return row


def attention_check(device, *, tokens: int, heads: int, head_dim: int, dtype: str = "bfloat16", reps: int = 3,
                    warmup: int = 1, budget_bytes: int = GIB,
                    progress: Callable[[str], None] | None = None) -> dict:
    """Time each SDPA backend and the app's path on (1, heads, tokens, head_dim), with and without a mask."""
    import torch

    device = torch.device(device)
    torch_dtype = getattr(torch, dtype)
    free = None
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
    cases = [_case(device, torch_dtype, tokens, heads, head_dim, masked, reps, warmup, budget_bytes, free, progress)
             for masked in (False, True)]
    return {"ran": True, "device": str(device), "shape": {"batch": 1, "heads": heads, "tokens": tokens,
                                                           "head_dim": head_dim, "dtype": dtype},
            "reps": reps, "cases": cases}
