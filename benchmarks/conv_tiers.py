"""Time each convolution tier of ``rocm.ConvFallback`` on the HunyuanVideo VAE decoder's real conv shapes.

    python3 benchmarks/conv_tiers.py --out bench_conv_tiers.json           # CUDA GPU, full-size VAE (~3 min H100)
    python benchmarks/conv_tiers.py --device cpu --small --out /tmp/x.json  # logic check on CPU (seconds)

What it does:
1. Builds ``AutoencoderKLHunyuanVideo`` with its default config (= the real one) on the meta device, materialises
   it on the target device with random weights (no download), fp16 on GPU / fp32 on CPU.
2. Enables diffusers' VAE tiling (its defaults unless ``--tile``) and records every F.conv3d/F.conv2d call of one
   tiled decode of 33 frames at 608x640 (latents 1x16x9x76x80).
3. Times each distinct conv shape per tier (1 native, 2 vendor off, 3 decomposition, 4 decomposition with the
   vendor off, 5 CPU with ``--cpu``),
   median of ``--reps`` after a warm-up, and checks tiers 2-4 against tier 1. Totals are weighted by how often the
   decode calls each shape.
4. Optionally (default on GPU) times the whole tiled decode with the fallback forced to each tier.
Writes JSON to ``--out`` and prints markdown tables.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import statistics
import sys
import time
from pathlib import Path

if not __package__:          # `python3 benchmarks/<this>.py`: run again as a module (benchmarks/_script.py)
    import _script

    _script.as_module(__file__)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from rocm import tiers as tier_ops  # noqa: E402
from rocm.allocator import synchronize  # noqa: E402
from rocm.conv_fallback import ConvFallback  # noqa: E402
from rocm.signature import ConvSpec, normalize_call  # noqa: E402

logger = logging.getLogger("conv_tiers")
FULL_LATENTS = (1, 16, 9, 76, 80)       # 33 frames at 608x640
SMALL_LATENTS = (1, 16, 3, 6, 6)        # 9 frames at 48x48
SMALL_VAE = dict(block_out_channels=(8, 8, 8, 8), layers_per_block=1, norm_num_groups=4)
SMALL_TILE = (32, 24, 16, 12)


def build_vae(small: bool, device: torch.device, dtype: torch.dtype):
    from diffusers import AutoencoderKLHunyuanVideo

    with torch.device("meta"):
        vae = AutoencoderKLHunyuanVideo(**(SMALL_VAE if small else {}))
    vae = vae.to_empty(device=device)
    gen = torch.Generator(device="cpu").manual_seed(0)
    initialised = set()
    with torch.no_grad():
        for module in vae.modules():
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()
                initialised.update(id(p) for p in module.parameters(recurse=False))
        for p in vae.parameters():
            if id(p) not in initialised:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    return vae.to(dtype).eval()


def enable_tiling(vae, tile):
    if tile is None:
        vae.enable_tiling()
    else:
        h, stride, frames, frame_stride = tile
        vae.enable_tiling(tile_sample_min_height=h, tile_sample_min_width=h, tile_sample_stride_height=stride,
                          tile_sample_stride_width=stride, tile_sample_min_num_frames=frames,
                          tile_sample_stride_num_frames=frame_stride)
    return {k: getattr(vae, k) for k in sorted(vars(vae)) if k.startswith("tile_sample")}


def record_conv_calls(vae, latents):
    """Run one decode with F.conv2d/conv3d wrapped; -> ({(op, input, weight, spec, bias): count}, seconds)."""
    calls: collections.Counter = collections.Counter()
    saved = F.conv2d, F.conv3d

    def hook(op, native):
        def wrapped(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
            norm = normalize_call(op, x, w, stride, padding, dilation, groups)
            if norm is not None:
                xn, spec, _ = norm
                calls[(op, tuple(xn.shape), tuple(w.shape), spec, b is not None)] += 1
            return native(x, w, b, stride, padding, dilation, groups)
        return wrapped

    F.conv2d, F.conv3d = hook("conv2d", saved[0]), hook("conv3d", saved[1])
    try:
        started = time.perf_counter()
        with torch.no_grad():
            vae.decode(latents)
        synchronize(latents.device)
        elapsed = time.perf_counter() - started
    finally:
        F.conv2d, F.conv3d = saved
    return calls, elapsed


def time_tier(tier, spec: ConvSpec, x, w, b, reps: int, warmup: int, vendor: bool):
    for _ in range(warmup):
        out = tier_ops.forward(tier, spec, x, w, b, vendor_in_decomposition=vendor)
    synchronize(x.device)
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        out = tier_ops.forward(tier, spec, x, w, b, vendor_in_decomposition=vendor)
        synchronize(x.device)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000.0, out


def bench_shapes(calls, device, dtype, tiers, reps, warmup, budget_s, vendor):
    rows = []
    started = time.perf_counter()
    # most expensive first (calls x input size x output channels), so a budget cut drops the cheap ones
    order = sorted(calls.items(), key=lambda kv: -kv[1] * torch.Size(kv[0][1]).numel() * kv[0][2][0])
    gen = torch.Generator(device="cpu").manual_seed(1)
    with torch.no_grad():
        for index, ((op, xs, ws, spec, has_bias), count) in enumerate(order):
            if index % 20 == 0:
                logger.info("shape %d/%d, %.0f s", index, len(order), time.perf_counter() - started)
            row = {"op": op, "input": list(xs), "weight": list(ws), "stride": list(spec.stride),
                   "padding": list(spec.padding), "dilation": list(spec.dilation), "groups": spec.groups,
                   "count": count, "ms": {}, "rel": {}, "max_rel_err": {}, "errors": {}}
            rows.append(row)
            if time.perf_counter() - started > budget_s:
                row["errors"]["all"] = "skipped: time budget"
                continue
            x = torch.randn(xs, generator=gen).to(device, dtype)
            w = (torch.randn(ws, generator=gen) / (ws[1] * torch.Size(ws[2:]).numel()) ** 0.5).to(device, dtype)
            b = torch.randn(ws[0], generator=gen).to(device, dtype) if has_bias else None
            ref = None
            for tier in tiers:
                try:
                    ms, out = time_tier(tier, spec, x, w, b, reps, warmup, vendor)
                except (RuntimeError, torch.OutOfMemoryError) as exc:
                    row["errors"][str(tier)] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                    continue
                row["ms"][str(tier)] = round(ms, 4)
                if ref is None:
                    ref = out.float()
                else:
                    err = (out.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6)
                    row["max_rel_err"][str(tier)] = float(err)
                del out
            t1 = row["ms"].get(str(tiers[0]))
            if t1:
                row["rel"] = {t: round(v / t1, 3) for t, v in row["ms"].items()}
            del x, w, b, ref
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows


def totals(rows, tiers):
    timed = [r for r in rows if all(str(t) in r["ms"] for t in tiers)]
    ms = {str(t): round(sum(r["ms"][str(t)] * r["count"] for r in timed), 2) for t in tiers}
    base = ms.get(str(tiers[0])) or None
    return {"shapes_timed": len(timed), "shapes_total": len(rows),
            "calls_timed": sum(r["count"] for r in timed), "ms_weighted": ms,
            "relative": {t: round(v / base, 3) for t, v in ms.items()} if base else {}}


def bench_e2e(vae, latents, tiers, vendor):
    """Whole tiled decode: plain, then with the fallback forced to each tier; max |diff| vs plain."""
    out = {}
    with torch.no_grad():
        vae.decode(latents)      # warm-up
        synchronize(latents.device)
        started = time.perf_counter()
        ref = vae.decode(latents).sample.float()
        synchronize(latents.device)
        out["plain_s"] = round(time.perf_counter() - started, 3)
        for tier in tiers:
            fb = ConvFallback(tiers=(tier,), persist=False, probe=None, vendor_in_decomposition=vendor)
            try:
                with fb.active():
                    started = time.perf_counter()
                    got = vae.decode(latents).sample.float()
                    synchronize(latents.device)
                    out[f"tier{tier}_s"] = round(time.perf_counter() - started, 3)
                out[f"tier{tier}_max_abs_diff"] = float((got - ref).abs().max())
                del got
            except RuntimeError as exc:
                out[f"tier{tier}_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            if latents.device.type == "cuda":
                torch.cuda.empty_cache()
    return out


def markdown(result, tiers, limit):
    lines = ["| conv input -> weight | calls | tier 1 ms | " + " | ".join(f"tier {t} x" for t in tiers[1:]) + " |",
             "|---|---:|---:|" + "---:|" * (len(tiers) - 1)]
    rows = sorted(result["shapes"], key=lambda r: -(r["ms"].get(str(tiers[0]), 0) * r["count"]))
    for r in rows[:limit]:
        t1 = r["ms"].get(str(tiers[0]))
        cells = [f"{r['rel'][str(t)]:.2f}" if str(t) in r["rel"] else ("err" if str(t) in r["errors"] else "-")
                 for t in tiers[1:]]
        lines.append(f"| {tuple(r['input'])} -> {tuple(r['weight'])} | {r['count']} | "
                     f"{'-' if t1 is None else f'{t1:.3f}'} | " + " | ".join(cells) + " |")
    tot = result["totals"]
    rel = tot["relative"]
    lines.append(f"| **all {tot['shapes_timed']} shapes, weighted by calls ({tot['calls_timed']})** | "
                 f"{tot['calls_timed']} | {tot['ms_weighted'].get(str(tiers[0]), 0):.1f} | "
                 + " | ".join(f"**{rel.get(str(t), float('nan')):.2f}**" for t in tiers[1:]) + " |")
    e2e = result.get("e2e")
    if e2e:
        lines += ["", "| whole tiled decode | seconds | x plain | max abs diff vs plain |", "|---|---:|---:|---:|",
                  f"| plain (no fallback) | {e2e['plain_s']:.2f} | 1.00 | 0 |"]
        for t in tiers:
            if f"tier{t}_s" in e2e:
                lines.append(f"| fallback forced to tier {t} | {e2e[f'tier{t}_s']:.2f} | "
                             f"{e2e[f'tier{t}_s'] / e2e['plain_s']:.2f} | {e2e[f'tier{t}_max_abs_diff']:.3g} |")
            elif f"tier{t}_error" in e2e:
                lines.append(f"| fallback forced to tier {t} | error | - | {e2e[f'tier{t}_error'][:60]} |")
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    p.add_argument("--small", action="store_true", help="tiny VAE and latents (logic check)")
    p.add_argument("--out", type=Path, required=True, help="JSON output path")
    p.add_argument("--tile", default=None, help="H,STRIDE,FRAMES,FRAME_STRIDE in pixels/frames "
                   "(default: diffusers' enable_tiling() defaults)")
    p.add_argument("--tiers", default="1,2,3", help="tiers to time (first one is the baseline)")
    p.add_argument("--cpu", action="store_true", help="also time tier 5 (CPU fp32; slow on full-size shapes)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--budget-s", type=float, default=150.0, help="time budget for the per-shape timings")
    p.add_argument("--e2e", dest="e2e", action="store_true", default=None, help="time whole decodes per tier")
    p.add_argument("--no-e2e", dest="e2e", action="store_false")
    p.add_argument("--no-vendor-in-decomposition", action="store_true",
                   help="tier 3's inner conv2d without MIOpen/cuDNN (the RDNA1 setting)")
    p.add_argument("--rows", type=int, default=25, help="shape rows in the printed table")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU: use --device cpu --small")
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    tiers = [int(t) for t in args.tiers.split(",")] + ([5] if args.cpu and "5" not in args.tiers else [])
    tile = tuple(int(v) for v in args.tile.split(",")) if args.tile else (SMALL_TILE if args.small else None)
    vendor = not args.no_vendor_in_decomposition
    started = time.perf_counter()
    vae = build_vae(args.small, device, dtype)
    tiling = enable_tiling(vae, tile)
    shape = SMALL_LATENTS if args.small else FULL_LATENTS
    latents = torch.randn(shape, generator=torch.Generator(device="cpu").manual_seed(0)).to(device, dtype)
    logger.info("VAE built in %.1f s; tiling %s", time.perf_counter() - started, tiling)
    calls, decode_s = record_conv_calls(vae, latents)
    logger.info("one tiled decode: %d conv calls, %d distinct shapes, %.2f s", sum(calls.values()), len(calls),
                decode_s)
    rows = bench_shapes(calls, device, dtype, tiers, args.reps, args.warmup, args.budget_s, vendor)
    logger.info("per-shape timings done at %.0f s", time.perf_counter() - started)
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU",
        "torch": torch.__version__, "cuda": torch.version.cuda, "hip": getattr(torch.version, "hip", None),
        "cudnn_benchmark": torch.backends.cudnn.benchmark, "dtype": str(dtype).replace("torch.", ""),
        "small": args.small, "latents": list(shape), "tiling": tiling, "tiers": tiers,
        "vendor_in_decomposition": vendor, "reps": args.reps, "warmup": args.warmup,
        "first_decode_s": round(decode_s, 3), "conv_calls": sum(calls.values()), "distinct_shapes": len(calls),
        "shapes": rows, "totals": totals(rows, tiers),
    }
    if args.e2e if args.e2e is not None else device.type == "cuda":
        result["e2e"] = bench_e2e(vae, latents, [t for t in tiers if t != tier_ops.CPU], vendor)
    result["elapsed_s"] = round(time.perf_counter() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    sys.stdout.write(markdown(result, tiers, args.rows) + "\n")
    logger.info("wrote %s (%.0f s)", args.out, result["elapsed_s"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
