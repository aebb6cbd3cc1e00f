"""MagCache off vs on (issue 32): one section of 25 sampling steps of the full-size transformer, random weights.

The pipeline's own step (`FramepackDenoiser` after `begin_section`, the first section's real context at 608×640,
window 9: ~18.5k tokens, as benchmarks/transformer_step.py builds it) driven by the real sampler (`sample_section`,
UniPC, cfg 1) from the same noise, resident on the GPU (no cap), for MagCache off and at each `--thresholds` value,
with eager and with compiled blocks (`--blocks`; the app compiles them on a GPU by default). Per run: the block stack's
runs counted by a hook (= steps computed), the steps MagCache skipped and which, the section's seconds (synchronized),
seconds per computed step, × off (same blocks), and the section latents' relative difference from off's. MagCache's
decisions read no tensor (pipeline/magcache.py), so the skipped steps are the same on random and real weights;
the difference of the latents is NOT a quality figure (random weights; no quality claim is made). Each variant runs
`--repeats` times, interleaved (off, 0.1, 0.15, off, ...); the table gives the median seconds. A compiled pass first
runs one untimed section (kernel preparation, reported).

    python3 benchmarks/magcache.py --out $OUT                  # full size (GPU): magcache.json + magcache.md
    python3 benchmarks/magcache.py --tiny --blocks eager --repeats 1 --out /tmp/mc     # tiny preset (CPU or GPU)
"""
from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from pathlib import Path

import torch

if not __package__:          # `python3 benchmarks/<this>.py`: run again as a module (benchmarks/_script.py)
    import _script

    _script.as_module(__file__)

from common.units import GIB  # noqa: E402
from rocm.allocator import synchronize  # noqa: E402

log = logging.getLogger("benchmarks.magcache")


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative Frobenius norm of a - b against b."""
    a, b = a.float().cpu(), b.float().cpu()
    return float((a - b).norm() / b.norm())


def run_section(tr, inputs, device, steps: int, threshold: float, mode: str) -> dict:
    """One section sampled from the inputs' noise with MagCache at `threshold` (0 = off): seconds, block runs."""
    from pipeline.denoiser import FramepackDenoiser
    from pipeline.sampling import sample_section

    ctx, idx, shape, image, texts, noise = inputs
    den = FramepackDenoiser(tr, 0.0, steps, magcache_threshold=threshold, mode=mode)
    den.begin_section(ctx, idx, shape, image, texts, 10.0)
    runs = []
    hook = tr.transformer_blocks[0].register_forward_pre_hook(lambda *a: runs.append(1))
    try:
        x = noise.to(device)
        synchronize(device)
        t0 = time.perf_counter()
        gen = sample_section(den, x, sampler="unipc", steps=steps, cfg=1.0, rescale=0.0)
        while True:
            try:
                next(gen)
            except StopIteration as done:
                latents = done.value
                break
        synchronize(device)
        seconds = time.perf_counter() - t0
    finally:
        hook.remove()
        den.end_section()
    cache = den.magcache["cond"] if den.magcache else None
    return {"seconds": seconds, "computed": len(runs), "skipped": cache.skipped if cache else 0,
            "latents": latents.float().cpu()}


def schedule(threshold: float, steps: int, mode: str) -> str:
    """MagCache's decisions for one section: C computed, S skipped (what the runs must show)."""
    from pipeline.magcache import MagCache

    if threshold <= 0:
        return "C" * steps
    cache = MagCache(threshold, steps, mode)
    cache.store(0.0)
    return "".join("S" if cache.should_skip() else "C" for _ in range(steps))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for magcache.json and magcache.md")
    ap.add_argument("--tiny", action="store_true", help="the tiny preset instead of the full-size transformer")
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--mode", choices=("original", "f1"), default="original", help="which calibrated ratios")
    ap.add_argument("--thresholds", default="0.1,0.15", help="MagCache thresholds to compare with off")
    ap.add_argument("--blocks", default="eager,compiled", help="eager and/or compiled blocks")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    from benchmarks.transformer_step import section_inputs, transformer_on_device
    from memory.manager import MemoryManager
    from memory.plan import framepack_tokens
    from pipeline import compiled

    device, tr, height, width, image_tokens, build_s = transformer_on_device(args.tiny)
    inputs = section_inputs(tr, height, width, 9, image_tokens)
    thresholds = [0.0] + [float(t) for t in args.thresholds.split(",") if t]
    total_gb = torch.cuda.get_device_properties(device).total_memory / GIB if device.type == "cuda" else 1e3
    mm = MemoryManager(device=device, cap_gb=total_gb, preserved_gb=6.0, plan_on_cpu=device.type == "cpu")
    mm.apply_cap()
    results, prepare = [], {}
    with mm.stage("transformer", transformer=tr) as rec:
        for blocks_name in [b for b in args.blocks.split(",") if b]:
            blocks = compiled.for_job(tr, device, job="on" if blocks_name == "compiled" else "off")
            if blocks_name == "compiled" and not blocks.enabled:
                log.warning("compiled blocks are not available here (%s): skipped", compiled.unavailable(device))
                continue
            t = time.perf_counter()               # warm-up: kernels (compiled), allocator, attention choice
            run_section(tr, inputs, device, min(args.steps, 3), 0.0, args.mode)
            prepare[blocks_name] = time.perf_counter() - t
            runs = {th: [] for th in thresholds}
            for _ in range(args.repeats):
                for th in thresholds:
                    runs[th].append(run_section(tr, inputs, device, args.steps, th, args.mode))
                    log.info("%s, MagCache %g: %.2f s, %d computed", blocks_name, th, runs[th][-1]["seconds"],
                             runs[th][-1]["computed"])
            off = statistics.median(r["seconds"] for r in runs[0.0])
            for th in thresholds:
                rs = runs[th]
                seconds = statistics.median(r["seconds"] for r in rs)
                expected = schedule(th, args.steps, args.mode)
                results.append({
                    "blocks": blocks_name, "magcache": th, "steps": args.steps, "mode": args.mode,
                    "computed": rs[0]["computed"], "skipped": rs[0]["skipped"], "schedule": expected,
                    "schedule_held": all(r["computed"] == expected.count("C") and r["skipped"] == expected.count("S")
                                         for r in rs),
                    "seconds": seconds, "seconds_each": [r["seconds"] for r in rs],
                    "s_per_computed_step": seconds / max(1, rs[0]["computed"]), "x_off": seconds / off,
                    "speedup": off / seconds, "latents_rel_diff_vs_off": rel(rs[0]["latents"], runs[0.0][0]["latents"]),
                    "repeatable": all(torch.equal(r["latents"], rs[0]["latents"]) for r in rs)})
    meta = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "tiny": args.tiny, "build_s": build_s, "date": time.strftime("%Y-%m-%d"),
            "tokens": framepack_tokens(height, width, 9, image_tokens), "size": f"{width}x{height}",
            "prepare_s": prepare, "repeats": args.repeats, "peak_reserved": rec.peak_reserved,
            "weights": "random (no quality claim)"}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "magcache.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    lines = [f"{meta['device']}, torch {meta['torch']}, {meta['size']}, {meta['tokens']} tokens, one section of "
             f"{args.steps} UniPC steps ({args.mode} mode), resident, median of {args.repeats}; random weights",
             "",
             "| blocks | MagCache | steps computed | skipped (S) | section s | s per computed step | × off | speed-up "
             "| latents rel. diff vs off (random weights) |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in results:
        held = "" if r["schedule_held"] else " (≠ schedule!)"
        lines.append(f"| {r['blocks']} | {'off' if r['magcache'] == 0 else r['magcache']} | "
                     f"{r['computed']}/{r['steps']}{held} | {r['schedule']} | {r['seconds']:.2f} | "
                     f"{r['s_per_computed_step']:.3f} | {r['x_off']:.3f} | {r['speedup']:.2f}× | "
                     f"{r['latents_rel_diff_vs_off']:.2e} |")
    prep = ", ".join(f"{k} {v:.1f} s" for k, v in prepare.items())
    lines += ["", f"Warm-up section (3 steps; compiled: kernel preparation): {prep}. Build {build_s:.1f} s. "
                  f"Peak reserved {rec.peak_reserved / GIB:.2f} GiB."]
    (args.out / "magcache.md").write_text("\n".join(lines) + "\n")
    print("\n" + "\n".join(lines))


if __name__ == "__main__":
    main()
