"""What the conv fallback costs when nothing is wrong, and which attention kernel runs, on one GPU.

    python3 benchmarks/fallback_overhead.py --out fallback_overhead.json       # full size, random weights (GPU)
    python3 benchmarks/fallback_overhead.py --tiny --out /tmp/x.json          # tiny preset, CPU is fine

1. Attention: ``rocm.attention.attention_check`` (what ``python -m rocm doctor`` reports): FramePack's attention
   shape (bf16, 24 heads x 18,485 tokens x head 128, the 608x640 window-9 step), with and without a boolean
   key-padding mask, on every SDPA backend, and through the app's ``AttentionGuard`` (what the app will use).
2. Transformer: one FramePack transformer step (``FramepackDenoiser`` with the real section context at 608x640,
   window 9; fully resident), plain vs with every convolution (its Conv3d patch embedders) routed through
   ``rocm.ConvFallback.active()`` at its normal tier (tier 1 on a healthy GPU), as the app now runs it.
3. VAE decode: the HunyuanVideo decoder on 1x16x9x76x80 latents (33 frames at 608x640, diffusers' default
   tiling), plain vs through the fallback.
Plain and fallback runs alternate (ABBA) after warm-ups; medians are compared within this one run. Outputs are
compared too (tier 1 is the same convolution: they must be identical). Writes JSON and prints a table.
"""
from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from pathlib import Path

if not __package__:          # `python3 benchmarks/<this>.py`: run again as a module (benchmarks/_script.py)
    import _script

    _script.as_module(__file__)

import rocm  # noqa: E402

rocm.apply_env_profile()            # before torch, as the app does (AOTriton's gate on RDNA3/4, MIOpen settings)

import torch  # noqa: E402

from rocm.allocator import synchronize  # noqa: E402

log = logging.getLogger("benchmarks.fallback_overhead")


def alternate(run_plain, run_fallback, device, warmup: int, reps: int):
    """ABBA-ordered timings of two callables -> (plain seconds, fallback seconds, last outputs)."""
    for _ in range(warmup):
        run_plain()
        run_fallback()
    times = {"plain": [], "fallback": []}
    outs = {}
    for i in range(reps):
        order = (("plain", run_plain), ("fallback", run_fallback))
        for name, fn in (order if i % 2 == 0 else order[::-1]):
            synchronize(device)
            t0 = time.perf_counter()
            outs[name] = fn()
            synchronize(device)
            times[name].append(time.perf_counter() - t0)
    return times["plain"], times["fallback"], outs


def summarize(name, plain, fb, outs, fallback, stats_before) -> dict:
    a, b = outs["plain"].float(), outs["fallback"].float()
    calls = fallback.stats().delta(stats_before)
    row = {"what": name, "plain_s": statistics.median(plain), "fallback_s": statistics.median(fb),
           "plain_times": plain, "fallback_times": fb, "conv_calls_per_tier": {str(k): v for k, v in calls.items()},
           "identical": bool(torch.equal(a, b)), "max_abs_diff": float((a - b).abs().max())}
    row["ratio"] = row["fallback_s"] / row["plain_s"]
    return row


def bench_transformer(tr, device, tiny: bool, warmup: int, reps: int, fallback) -> dict:
    from benchmarks.transformer_step import section_inputs
    from pipeline.denoiser import FramepackDenoiser

    height, width, image_tokens = (64, 64, 16) if tiny else (608, 640, 729)
    ctx, idx, shape, image, texts, noise = section_inputs(tr, height, width, 9, image_tokens)
    tr.to(device)
    den = FramepackDenoiser(tr, 0.0, reps)
    den.begin_section(ctx, idx, shape, image, texts, 10.0)
    x, t = noise.to(device), torch.tensor([900.0])

    def plain():
        return den(x, t)

    def through_fallback():
        with fallback.active():
            return den(x, t)

    before = fallback.stats()
    with torch.no_grad():
        p, f, outs = alternate(plain, through_fallback, device, warmup, reps)
    row = summarize("transformer step", p, f, outs, fallback, before)
    den.end_section()
    tr.to("cpu")
    return row


def bench_vae(vae, device, tiny: bool, warmup: int, reps: int, fallback) -> dict:
    shape = (1, 16, 3, 8, 8) if tiny else (1, 16, 9, 76, 80)
    vae.to(device)
    vae.enable_tiling()
    z = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(device, vae.dtype)

    def plain():
        return vae.decode(z).sample

    def through_fallback():
        with fallback.active():
            return vae.decode(z).sample

    before = fallback.stats()
    with torch.no_grad():
        p, f, outs = alternate(plain, through_fallback, device, warmup, reps)
    vae.to("cpu")
    return summarize(f"VAE decode {tuple(shape)}", p, f, outs, fallback, before)


def build(tiny: bool):
    if tiny:
        from pipeline.components import load_components

        c = load_components("tiny", "original")
        return c.transformer, c.vae
    from benchmarks.fullsize import build_models

    models = build_models(roles=("vae", "transformer"))
    return models["transformer"], models["vae"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tiny", action="store_true", help="tiny preset and small attention shape (CPU is fine)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--reps", type=int, default=6, help="timed runs of each of plain / fallback (ABBA order)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    from configs.rocm_profiles import DEFAULTS
    from rocm.arch import detect_runtime
    from rocm.attention import attention_check

    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    runtime = detect_runtime(device)
    started = time.perf_counter()
    small = args.tiny or device.type == "cpu"
    attention = attention_check(device, tokens=DEFAULTS.attention_small_tokens if small else DEFAULTS.attention_tokens,
                                heads=2 if small else DEFAULTS.attention_heads, head_dim=DEFAULTS.attention_head_dim,
                                dtype="bfloat16", reps=3, warmup=1, progress=lambda line: log.info("%s", line))
    t0 = time.perf_counter()
    tr, vae = build(args.tiny)
    build_s = time.perf_counter() - t0
    fallback = rocm.ConvFallback(persist=False, probe=None)      # the app's plan for this device, nothing written
    rows = [bench_transformer(tr, device, args.tiny, args.warmup, args.reps, fallback),
            bench_vae(vae, device, args.tiny, max(1, args.warmup - 1), args.reps, fallback)]
    meta = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "arch": runtime.arch, "arch_source": runtime.arch_source,
            "driver": runtime.driver_version, "tiny": args.tiny, "build_s": build_s,
            "total_s": time.perf_counter() - started, "date": time.strftime("%Y-%m-%d")}
    args.out.write_text(json.dumps({"meta": meta, "attention": attention, "fallback_overhead": rows}, indent=1))
    print(f"\n{meta['device']}, torch {meta['torch']}, arch {meta['arch']} ({meta['arch_source']})")
    shape = attention["shape"]
    print(f"\nattention: {shape['dtype']}, {shape['heads']} heads x {shape['tokens']} tokens x head {shape['head_dim']}")
    print("| mask | " + " | ".join(attention["cases"][0]["backends"]) + " | the app uses |")
    print("|---|" + "---|" * (len(attention["cases"][0]["backends"]) + 1))
    for case in attention["cases"]:
        cells = [f"{b['ms']:.2f} ms" if b["ran"] else "-" for b in case["backends"].values()]
        print(f"| {'yes' if case['masked'] else 'no'} | " + " | ".join(cells)
              + f" | {case['app']['uses']} ({case['app']['ms']:.2f} ms) |")
    print("\n| | plain s | through the fallback s | ratio | conv calls per tier | output |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['what']} | {r['plain_s']:.4f} | {r['fallback_s']:.4f} | {r['ratio']:.4f} | "
              f"{r['conv_calls_per_tier']} | {'identical' if r['identical'] else r['max_abs_diff']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
