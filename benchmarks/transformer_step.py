"""One FramePack transformer step: fully resident vs streamed under a VRAM cap vs a synchronous per-block swap.

The step is the pipeline's own (`FramepackDenoiser` after `begin_section`) with the real context of the first
section at the 608×640 bucket, window 9: the noisy window, clean 1x/2x/4x latents, 729 SigLIP tokens and 256
text tokens (~18.5k tokens). Each configuration runs inside `MemoryManager.stage("transformer")` (the cap is
`set_per_process_memory_fraction`), `--warmup` steps, then the median of `--steps` timed steps; peaks are
PyTorch's max allocated / reserved within the stage. The synchronous baselines keep the same resident blocks as
the 20 GB plan; every other block is copied with no overlap: from the same pinned host pack (blocking copy), or
with `.to(device)` before and `.to("cpu")` after its forward (a naive swap: pageable copies both ways).

    python3 benchmarks/transformer_step.py --out step.json            # full size, random weights (GPU)
    python3 benchmarks/transformer_step.py --tiny --out step.json     # tiny preset (CPU or GPU)
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

log = logging.getLogger("benchmarks.transformer_step")


def section_inputs(tr, height: int, width: int, window: int, image_tokens: int, seed: int = 0):
    """The denoiser's section inputs with the real shapes (random values)."""
    from pipeline import sections as sec
    from pipeline.text import TextEmbeddings

    g = torch.Generator().manual_seed(seed)
    lh, lw = height // 8, width // 8
    plan = sec.make_plan("original", 3.6, window)
    section = plan.sections[0]
    start = torch.randn(1, 16, 1, lh, lw, generator=g)
    ctx = sec.section_context(plan, section, sec.empty_history(plan, start), start, start)
    cfg = tr.config
    texts = {"cond": TextEmbeddings(torch.randn(1, 256, cfg.text_embed_dim, generator=g), torch.ones(1, 256),
                                    torch.randn(1, cfg.pooled_projection_dim, generator=g))}
    image = torch.randn(1, image_tokens, cfg.image_proj_dim, generator=g)
    noise = torch.randn(1, cfg.in_channels, window, lh, lw, generator=g)
    return ctx, plan.indices(section), (window, lh, lw), image, texts, noise


STEP_MARK = "timed step"


def time_steps(denoiser, inputs, device, warmup: int, steps: int) -> tuple[list[float], torch.Tensor]:
    ctx, idx, shape, image, texts, noise = inputs
    denoiser.begin_section(ctx, idx, shape, image, texts, 10.0)
    x, t = noise.to(device), torch.tensor([900.0])
    times = []
    for i in range(warmup + steps):
        synchronize(device)
        t0 = time.perf_counter()
        with torch.profiler.record_function(STEP_MARK):      # (a profiled run finds the step by it)
            out = denoiser(x, t)
            synchronize(device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    denoiser.end_section()
    return times, out.float().cpu()


def run_config(name, tr, inputs, device, cap_gb, preserved_gb, depth, warmup, steps) -> dict:
    from memory.manager import MemoryManager
    from pipeline.denoiser import FramepackDenoiser

    mm = MemoryManager(device=device, cap_gb=cap_gb, preserved_gb=preserved_gb, prefetch_depth=depth,
                       plan_on_cpu=device.type == "cpu")
    mm.apply_cap()
    with mm.stage("transformer", transformer=tr) as rec:
        times, out = time_steps(FramepackDenoiser(tr, 0.0, steps), inputs, device, warmup, steps)
    return {"config": name, "output": out, "cap_gb": cap_gb, "preserved_gb": preserved_gb, "prefetch_depth": depth,
            "s_per_step": statistics.median(times), "times": times, "load_s": rec.load_s, "unload_s": rec.unload_s,
            "peak_allocated": rec.peak_allocated, "peak_reserved": rec.peak_reserved,
            "placement": rec.placement["transformer"], "streamed_bytes": rec.streamed_bytes_per_pass,
            "stream_misses": rec.stream_misses, "attention": rec.attention}


def run_sync_swap(tr, inputs, device, cap_gb, preserved_gb, warmup, steps, pinned: bool = False) -> dict:
    """Baselines with the plan's resident blocks and no overlap for the others: `.to(device)` before /
    `.to("cpu")` after each block (`pinned=False`), or a blocking copy from the pinned host pack (`pinned=True`)."""
    from memory.chunkload import load_chunks, unload_chunks
    from memory.hostpack import HostPack
    from memory.manager import MemoryManager
    from pipeline.denoiser import FramepackDenoiser
    from rocm.sdpa import AttentionGuard

    mm = MemoryManager(device=device, cap_gb=cap_gb, preserved_gb=preserved_gb, plan_on_cpu=device.type == "cpu")
    mm.apply_cap()
    pack = HostPack.of(tr)
    plan = mm.budget.transformer_plan(tr, pack)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    streamed = set(plan.streamed)
    held = load_chunks([pack.rest] + [c for i, c in enumerate(pack.blocks) if i not in streamed], device)
    chunk_of = {id(pack.block_modules[i]): pack.blocks[i] for i in streamed}
    copies = {}

    def load(module, args):
        if pinned:
            copies[id(module)] = load_chunks([chunk_of[id(module)]], device, non_blocking=False)
        else:
            module.to(device)

    def unload(module, args, output):
        if pinned:
            unload_chunks([chunk_of[id(module)]])
            copies.pop(id(module))
        else:
            module.to("cpu")

    handles = []
    for i in sorted(streamed):
        handles.append(pack.block_modules[i].register_forward_pre_hook(load))
        handles.append(pack.block_modules[i].register_forward_hook(unload))
    try:
        with AttentionGuard(device):
            times, out = time_steps(FramepackDenoiser(tr, 0.0, steps), inputs, device, warmup, steps)
    finally:
        for h in handles:
            h.remove()
        if pinned:
            unload_chunks(pack.chunks)
        else:
            tr.to("cpu")
        del held
    peak_a = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
    peak_r = torch.cuda.max_memory_reserved(device) if device.type == "cuda" else 0
    name = "sync copy from pinned pack (no overlap)" if pinned else "sync swap (.to per block)"
    return {"config": name, "output": out, "cap_gb": cap_gb, "preserved_gb": preserved_gb, "prefetch_depth": 0,
            "s_per_step": statistics.median(times), "times": times, "peak_allocated": peak_a, "peak_reserved": peak_r,
            "placement": plan.describe(), "streamed_bytes": plan.streamed_bytes}


def transformer_on_device(tiny: bool):
    """(the device to measure on, the transformer as `build_transformer` gives it, its height, width and image tokens,
    the seconds building it took)."""
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    t0 = time.perf_counter()
    tr, height, width, image_tokens = build_transformer(tiny)
    return device, tr, height, width, image_tokens, time.perf_counter() - t0


def build_transformer(tiny: bool):
    if tiny:
        from pipeline.components import load_components

        return load_components("tiny", "original").transformer, 64, 64, 16
    from benchmarks.fullsize import build_models

    return build_models(roles=("transformer",))["transformer"], 608, 640, 729


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--depths", default="1,2", help="prefetch depths to measure under each cap")
    ap.add_argument("--no-sync", action="store_true", help="skip the synchronous swap baseline")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    from memory.hostpack import HostPack

    device, tr, height, width, image_tokens, build_s = transformer_on_device(args.tiny)
    pack = HostPack.of(tr)
    pin_s = pack.set_pinned(device.type == "cuda")
    inputs = section_inputs(tr, height, width, 9, image_tokens)
    total_gb = torch.cuda.get_device_properties(device).total_memory / GIB if device.type == "cuda" else 1e3
    if args.tiny:       # caps that stream half / all but one of the tiny model's blocks, 1 GB preserved
        def cap(n):
            return 1.0 + (pack.rest.nbytes + sum(c.nbytes for c in pack.blocks[:n])) / GIB
        caps = {"cap A": (cap(max(1, len(pack.blocks) // 2)), 1.0), "cap B": (cap(1), 1.0)}
    else:
        caps = {"20 GB cap": (20.0, 6.0), "12 GB cap": (12.0, 6.0)}
    results = [run_config("resident", tr, inputs, device, total_gb, 6.0, 1, args.warmup, args.steps)]
    for name, (cap_gb, preserved) in caps.items():
        for depth in [int(d) for d in args.depths.split(",")]:
            results.append(run_config(f"{name}, prefetch {depth}", tr, inputs, device, cap_gb, preserved, depth,
                                      args.warmup, args.steps))
    if not args.no_sync:     # the `.to()` baseline last: it leaves the weights outside the host pack
        cap_gb, preserved = next(iter(caps.values()))
        results.append(run_sync_swap(tr, inputs, device, cap_gb, preserved, args.warmup, args.steps, pinned=True))
        results.append(run_sync_swap(tr, inputs, device, cap_gb, preserved, args.warmup, args.steps))
    base, ref = results[0]["s_per_step"], results[0]["output"]
    for r in results:
        r["x_resident"] = r["s_per_step"] / base
        out = r.pop("output")
        r["same_output_as_resident"] = bool(torch.equal(out, ref))
        r["max_abs_diff"] = float((out - ref).abs().max())
    meta = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "tiny": args.tiny, "tokens": None, "build_s": build_s, "pin_s": pin_s,
            "model_bytes": pack.nbytes, "date": time.strftime("%Y-%m-%d")}
    from memory.plan import framepack_tokens

    meta["tokens"] = framepack_tokens(height, width, 9, image_tokens)
    args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    print(f"\n{meta['device']}, torch {meta['torch']}, {meta['tokens']} tokens, model {pack.nbytes / 1e9:.1f} GB")
    print("| config | s/step | × resident | peak allocated GiB | peak reserved GiB | streamed GiB/step | "
          "output = resident |\n|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['config']} | {r['s_per_step']:.3f} | {r['x_resident']:.3f} | {r['peak_allocated'] / GIB:.2f} | "
              f"{r['peak_reserved'] / GIB:.2f} | {r['streamed_bytes'] / GIB:.1f} | "
              f"{'exact' if r['same_output_as_resident'] else r['max_abs_diff']} |")


if __name__ == "__main__":
    main()
