"""Attention kernels at FramePack's full-size shape: bf16 backends against cuDNN's fp8 kernel (issue 46).

    python3 benchmarks/attention.py --out attention.json          # GPU; ~1 min on an H100 or H200
    python3 benchmarks/attention.py --tokens 512 --out /tmp/a.json   # a small shape (still a GPU)

The shape of one attention call of the 608x640 window-9 step (bf16, 1 x 24 heads x 18,485 tokens x head 128, laid
out as diffusers passes it: (batch, tokens, heads, dim) seen transposed). Timed (CUDA events, median of `--reps`
after warm-ups), each with its arithmetic floor beside it:

- PyTorch's SDPA backends in bf16: flash, memory-efficient, cuDNN (`sdpa_kernel` restricted to each);
- FlashAttention-4 (`flash_attn.cute`) where installed: its first call (the CuTe DSL compile), the kernel, and the
  app's bf16 path through the guard (which takes it on the GPUs of `rocm.sdpa.FA4_MAJORS`), eager and compiled;
- each fp8 kernel installed (rocm/fp8_attention.py: cuDNN's through the cuDNN frontend, FlashAttention-3's where
  built): the kernel alone on quantized inputs, the whole call with the quantization eager (the guard's eager path)
  and with the quantization compiled (`torch.compile`, as inside the compiled blocks);
- through the app's path: `AttentionGuard` with `fp8_attention(True)`, eager and inside a compiled function (the
  traced quantization + the `steadyframe::fp8_attention` operator).

Accuracy: cosine similarity of each fp8 output with cuDNN's bf16 output (whole tensor and the worst row), on
random N(0,1) q/k/v and on q/k/v with the outlier channels video DiTs show (SageAttention's observation: a few K
channels carry a large mean over tokens), with and without smoothing. Writes JSON (after every measurement, so a
run cut short keeps what it measured) and logs a table.
"""
from __future__ import annotations

import argparse
import functools
import json
import logging
import statistics
import time
from pathlib import Path

if not __package__:          # `python3 benchmarks/<this>.py`: run again as a module (benchmarks/_script.py)
    import _script

    _script.as_module(__file__)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from rocm import fp8_attention as fa  # noqa: E402
from rocm import sdpa  # noqa: E402

log = logging.getLogger("benchmarks.attention")
PEAKS = {"H100": (989e12, 1979e12, 3.35e12), "H200": (989e12, 1979e12, 4.8e12)}    # dense bf16, fp8; HBM B/s


def peaks(name: str) -> tuple[float, float, float]:
    for key, value in PEAKS.items():
        if key in name:
            return value
    return PEAKS["H100"]


def timed(fn, reps: int, warmup: int = 3) -> float:
    """Median milliseconds of `fn()` (CUDA events)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def cosine(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """(cosine of the whole tensors, the worst cosine of one output row) in float32."""
    a, b = a.float(), b.float()
    whole = F.cosine_similarity(a.flatten(), b.flatten(), dim=0).item()
    rows = F.cosine_similarity(a, b, dim=-1).min().item()
    return round(whole, 6), round(rows, 6)


def inputs(tokens: int, heads: int, dim: int, device, case: str, seed: int = 0):
    """q, k, v (1, heads, tokens, dim) bf16 in diffusers' layout; `case` "random" or "outlier"."""
    gen = torch.Generator(device=device).manual_seed(seed)
    shape = (1, tokens, heads, dim)
    q, k, v = (torch.randn(shape, generator=gen, device=device) for _ in range(3))
    if case == "outlier":     # a few K channels with a large mean over tokens (per head), V with a mean too
        bias = torch.zeros(1, 1, heads, dim, device=device)
        bias[..., :8] = 20 * torch.rand(1, 1, heads, 8, generator=gen, device=device)
        k = k + bias
        v = v + 2 * torch.randn(1, 1, heads, dim, generator=gen, device=device)
    return tuple(t.to(torch.bfloat16).transpose(1, 2) for t in (q, k, v))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=18485)
    ap.add_argument("--heads", type=int, default=24)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--no-compile", action="store_true", help="skip the compiled quantization and path")
    ap.add_argument("--out", type=Path, default=Path("attention.json"))
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    device = torch.device("cuda")
    name = torch.cuda.get_device_name(device)
    bf16_peak, fp8_peak, hbm = peaks(name)
    n, h, d = args.tokens, args.heads, args.dim
    flop = 4 * h * n * n * d
    result: dict = {"device": name, "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
                    "shape": [1, h, n, d], "flop_per_call": flop, "ms": {}, "floor_ms": {}, "cosine": {},
                    "notes": []}
    why = fa.unavailable(device)
    result["fp8_unavailable"] = why
    frontend = fa._frontend()
    result["cudnn_frontend"] = getattr(frontend, "__version__", None)

    def save() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))

    def record(label: str, fn, floor_ms: float | None) -> None:
        try:
            result["ms"][label] = round(timed(fn, args.reps), 3)
        except Exception as e:          # a kernel this build does not have: say which and go on
            result["ms"][label] = None
            result["notes"].append(f"{label}: {type(e).__name__}: {' '.join(str(e).split())[:200]}")
        if floor_ms is not None:
            result["floor_ms"][label] = round(floor_ms, 3)
        log.info("%-44s %s ms (floor %s)", label, result["ms"][label], result["floor_ms"].get(label))
        save()

    q, k, v = inputs(n, h, d, device, "random")
    bf16_floor, fp8_floor = flop / bf16_peak * 1e3, flop / fp8_peak * 1e3
    quant_floor = (3 * q.numel() * 2 * 2 + 3 * q.numel()) / hbm * 1e3     # bf16 read twice, fp8 written once
    for backend, label in ((SDPBackend.CUDNN_ATTENTION, "bf16 cudnn"), (SDPBackend.FLASH_ATTENTION, "bf16 flash"),
                           (SDPBackend.EFFICIENT_ATTENTION, "bf16 memory-efficient")):
        def run(backend=backend):
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k, v)
        record(label, run, bf16_floor)
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        reference = F.scaled_dot_product_attention(q, k, v)
    try:
        from flash_attn.cute import flash_attn_func  # FlashAttention-4 (flash-attn-4), (batch, tokens, heads, d)
    except ImportError as e:
        result["notes"].append(f"FlashAttention-4 not installed here ({e})")
        flash_attn_func = None
    if flash_attn_func is not None:
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        t0 = time.perf_counter()
        try:           # the first call compiles the kernel (CuTe DSL)
            first = flash_attn_func(qt, kt, vt)[0]
            torch.cuda.synchronize()
            result["fa4_first_call_s"] = round(time.perf_counter() - t0, 1)
            result["cosine"]["random, bf16 FlashAttention-4"] = cosine(first.transpose(1, 2), reference)
            log.info("FlashAttention-4: first call %.1f s, cosine %s", result["fa4_first_call_s"],
                     result["cosine"]["random, bf16 FlashAttention-4"])
        except Exception as e:
            result["notes"].append(f"FlashAttention-4 failed: {type(e).__name__}: {' '.join(str(e).split())[:300]}")
        record("bf16 FlashAttention-4", lambda: flash_attn_func(qt, kt, vt), bf16_floor)
        with sdpa.AttentionGuard(device, label="bench") as guard:
            record("the app's path: guard, bf16 (FlashAttention-4 where chosen), eager",
                   lambda: F.scaled_dot_product_attention(q, k, v), bf16_floor)
            if not args.no_compile:
                block16 = torch.compile(lambda a, b, c: F.scaled_dot_product_attention(a, b, c) * 1.0, dynamic=False)
                block16(q, k, v)
                record("the app's path: guard, bf16, inside a compiled function", lambda: block16(q, k, v),
                       bf16_floor)
            result["guard_bf16_choices"] = dict(guard.choices)
            result["cosine"]["guard bf16 path"] = cosine(F.scaled_dot_product_attention(q, k, v), reference)
        save()
    if why is not None:
        result["notes"].append(f"fp8: {why}")
        save()
        return 0

    kernels = [kernel for kernel, here in ((fa.CUDNN, fa._frontend() is not None),
                                           (fa.FA3, fa._fa3_on(device))) if here]
    result["fp8_kernels"] = kernels
    for kernel in kernels:       # each fp8 kernel alone, with the quantization eager and compiled (its own form)
        z = fa.quantize(q, k, v, kernel=kernel)
        record(f"fp8 {kernel} kernel alone (inputs quantized)", lambda: fa.run(z, q.dtype, kernel=kernel), fp8_floor)
        record(f"fp8 quantization alone ({kernel}), eager", lambda: fa.quantize(q, k, v, kernel=kernel), quant_floor)
        record(f"fp8 {kernel}, quantization eager", lambda: fa.attention(q, k, v, kernel=kernel),
               fp8_floor + quant_floor)
        if not args.no_compile:
            t0 = time.perf_counter()
            compiled_quantize = torch.compile(functools.partial(fa.quantize, kernel=kernel), dynamic=False)
            compiled_quantize(q, k, v)
            result[f"compile_quantize_s ({kernel})"] = round(time.perf_counter() - t0, 1)
            record(f"fp8 quantization alone ({kernel}), compiled", lambda: compiled_quantize(q, k, v), quant_floor)
            record(f"fp8 {kernel}, quantization compiled",
                   lambda: fa.run(compiled_quantize(q, k, v), q.dtype, kernel=kernel), fp8_floor + quant_floor)

    # accuracy against cuDNN's bf16 output
    for case in ("random", "outlier"):
        cq, ck, cv = (q, k, v) if case == "random" else inputs(n, h, d, device, case, seed=1)
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            ref = reference if case == "random" else F.scaled_dot_product_attention(cq, ck, cv)
        for kernel in kernels:
            result["cosine"][f"{case}, fp8 {kernel} (smoothed, per-head scales)"] = cosine(
                fa.attention(cq, ck, cv, kernel=kernel), ref)
            plain = fa.quantize(cq, ck, cv, smooth=False, per_head=False, kernel=kernel)
            result["cosine"][f"{case}, fp8 {kernel} plain per-tensor (no smoothing)"] = cosine(
                fa.run(plain, cq.dtype, kernel=kernel), ref)
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            result["cosine"][f"{case}, bf16 flash (for scale)"] = cosine(F.scaled_dot_product_attention(cq, ck, cv),
                                                                         ref)
        log.info("cosine %s: %s", case, {k_: v_ for k_, v_ in result["cosine"].items() if k_.startswith(case)})
        save()

    # the app's path: the guard with the job's switch on, eager and compiled
    with sdpa.AttentionGuard(device, label="bench") as guard, sdpa.fp8_attention(True):
        eager_out = F.scaled_dot_product_attention(q, k, v)
        result["cosine"]["guard eager path"] = cosine(eager_out, reference)
        record("guard, fp8 switch on, eager", lambda: F.scaled_dot_product_attention(q, k, v),
               fp8_floor + quant_floor)
        if not args.no_compile:
            block = torch.compile(lambda a, b, c: F.scaled_dot_product_attention(a, b, c) * 1.0, dynamic=False)
            t0 = time.perf_counter()
            out = block(q, k, v)
            result["compile_block_s"] = round(time.perf_counter() - t0, 1)
            result["cosine"]["guard compiled path"] = cosine(out, reference)
            record("guard, fp8 switch on, compiled", lambda: block(q, k, v), fp8_floor + quant_floor)
        result["guard_choices"] = dict(guard.choices)
        result["fp8_failed"] = list(sdpa._FP8_FAILED)
        result["fp8_kernel"] = fa.chosen()
    save()
    log.info("%s", json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
