"""Does the VAE decode give the same frames whatever else is free under the cap? And what does it cost?

Issue 9's b2 run found two jobs in one process with identical latents and identical VAE tilings but different
frames. With `cudnn.benchmark` off, PyTorch (aten/src/ATen/native/cudnn/Conv_v8.cpp) takes cuDNN's heuristic
engine configs in order and keeps the first whose workspace it can allocate at that moment (the choice is cached per
thread). So when a convolution's preferred workspace does not fit in what is free, another algorithm runs, with
other rounding. This script decodes the same latents with the same tiling, each decode in a new thread (an empty
plan cache), with a filler tensor leaving `slack` bytes free above the decode's own peak, for several slacks, and
reports per decode: time, peak, the SHA-256 of the uint8 frames and the max difference in levels from the decode
with the most room. Then the same with `torch.backends.cudnn.deterministic = True`, and with a workspace reserve
(`--reserve-mb`: the policy's tiling is chosen for `available - reserve`).

`--fragment`: instead, in one process: a decode on a clean allocator; then one after a stage-like history (a large
block freed, a small tensor that stays alive allocated from it, the cache emptied: the survivor keeps the whole
segment reserved, so the free part of the cap is cut into pieces); then one after the survivor is gone. Run it with
and without `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` to see whether that allocator mode removes the effect.

    python3 benchmarks/vae_repeat.py --out vae_repeat.json          # GPU, ~4 min on an H100
    python3 benchmarks/vae_repeat.py --fragment --out frag.json     # GPU, ~1 min
    python3 benchmarks/vae_repeat.py --tiny --out vae_repeat.json   # tiny VAE on the CPU (checks the script)
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
import threading
import time
from pathlib import Path

import torch

if not __package__:          # `python3 benchmarks/<this>.py`: run again as a module (benchmarks/_script.py)
    import _script

    _script.as_module(__file__)

from benchmarks.vae_decode import _levels, bench_vae  # noqa: E402  (the same VAE, shapes and uint8 levels)
from common.units import GIB, MIB  # noqa: E402

log = logging.getLogger("benchmarks.vae_repeat")
SLACKS_MB = (8192, 2048, 1024, 512, 256, 128, 64, 0)


def _in_thread(fn):
    """Run `fn` in a new thread (cuDNN v8 plans are cached per thread) and return its result or raise its error."""
    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as e:          # noqa: BLE001 - handed back to the caller
            box["error"] = e
    t = threading.Thread(target=target)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


@torch.no_grad()
def decode_once(vae, z, tiling, device, slack: int | None, cap: int, peak: int | None, deterministic: bool):
    """One decode in a new thread with `slack` bytes free above `peak` (None: no filler)."""
    filler = None
    if device.type == "cuda":
        torch.cuda.empty_cache()
        if slack is not None and peak is not None:
            free = cap - torch.cuda.memory_reserved(device)
            size = free - peak - slack
            if size > 0:
                filler = torch.empty(size, dtype=torch.uint8, device=device)
        torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0

    def run():
        with torch.backends.cudnn.flags(enabled=True, benchmark=False, deterministic=deterministic):
            tiling.apply(vae)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            out = vae.decode(z).sample
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            return out, time.perf_counter() - t0
    try:
        out, s = _in_thread(run)
    except torch.OutOfMemoryError:
        return {"error": "oom"}, None
    finally:
        del filler
    used = torch.cuda.max_memory_allocated(device) - base if device.type == "cuda" else 0
    levels = _levels(out).cpu()
    return {"s": s, "peak_gb": used / GIB, "sha": hashlib.sha256(levels.numpy().tobytes()).hexdigest()[:16]}, levels


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--cap-gb", type=float, default=20.0)
    ap.add_argument("--reserve-mb", type=int, default=1024, help="workspace reserve for the last variant")
    ap.add_argument("--budget-s", type=float, default=330.0)
    ap.add_argument("--fragment", action="store_true", help="clean / fragmented / clean again (see the docstring)")
    ap.add_argument("--fragment-gb", type=float, default=12.0)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    from memory.vae import VaeDecodePolicy, memory_estimate

    vae, device, shapes = bench_vae(args.tiny)
    cap = int(args.cap_gb * GIB)
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), torch.cuda.current_device())
    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "cudnn": torch.backends.cudnn.version() if device.type == "cuda" else None,
              "cap_gb": args.cap_gb, "date": time.strftime("%Y-%m-%d"), "shapes": {}}
    started = time.perf_counter()
    gen = torch.Generator().manual_seed(0)
    if args.fragment:
        return fragment(vae, shapes["middle sections"], device, cap, gen, args, result)
    for name, shape in shapes.items():
        z = torch.randn(1, 16, *shape, generator=gen).to(device, vae.dtype)
        available = cap - torch.cuda.memory_allocated(device) - (512 << 20) if device.type == "cuda" else None
        variants = [("default", available, False), ("deterministic", available, True)]
        if available is not None:
            variants.append((f"reserve {args.reserve_mb} MB", available - args.reserve_mb * MIB, False))
        rows = []
        for label, room, det in variants:
            tiling = VaeDecodePolicy().plan(vae, shape, room)[0]
            est = memory_estimate(tiling, shape, vae.config.block_out_channels[0], 2)
            first, ref = decode_once(vae, z, tiling, device, None, cap, None, det)
            peak = int(first.get("peak_gb", 0) * GIB) if "error" not in first else None
            rows.append({"variant": label, "tiling": tiling.describe(), "estimate_gb": est / GIB,
                         "slack_mb": None, **first, "max_levels": 0 if ref is not None else None})
            for slack in SLACKS_MB if device.type == "cuda" else (0,):
                if time.perf_counter() - started > args.budget_s:
                    rows.append({"variant": label, "slack_mb": slack, "error": "skipped: time budget"})
                    continue
                row, levels = decode_once(vae, z, tiling, device, slack * MIB, cap, peak, det)
                if levels is not None and ref is not None:
                    row["max_levels"] = (levels.int() - ref.int()).abs().max().item()
                rows.append({"variant": label, "tiling": tiling.describe(), "slack_mb": slack, **row})
                log.info("%s | %s", name, rows[-1])
        result["shapes"][name] = {"latents": shape, "rows": rows}
    result["total_s"] = time.perf_counter() - started
    args.out.write_text(json.dumps(result, indent=1, default=str))
    print(f"\n{result['device']}, torch {result['torch']}, cuDNN {result['cudnn']}, cap {args.cap_gb:g} GB")
    for name, shape in result["shapes"].items():
        print(f"\n{name}: latents {tuple(shape['latents'])}\n| variant | tiling | slack MB | s | peak GB | sha | "
              "max levels vs no filler |\n|---|---|---:|---:|---:|---|---:|")
        for r in shape["rows"]:
            if "error" in r:
                print(f"| {r['variant']} | {r.get('tiling', '')} | {r['slack_mb']} | {r['error']} | | | |")
                continue
            print(f"| {r['variant']} | {r['tiling']} | {r['slack_mb'] if r['slack_mb'] is not None else 'none'} "
                  f"| {r['s']:.3f} | {r['peak_gb']:.2f} | {r['sha']} | {r.get('max_levels')} |")
    return 0


def fragment(vae, shape, device, cap: int, gen, args, result: dict) -> int:
    import os

    from memory.vae import VaeDecodePolicy

    z = torch.randn(1, 16, *shape, generator=gen).to(device, vae.dtype)
    available = cap - torch.cuda.memory_allocated(device) - (512 << 20) if device.type == "cuda" else None
    tiling = VaeDecodePolicy().plan(vae, shape, available)[0]
    rows, survivor = [], None
    for label in ("clean (warm-up)", "clean", "fragmented", "clean again"):
        if label == "fragmented" and device.type == "cuda":
            big = torch.empty(int(args.fragment_gb * GIB), dtype=torch.uint8, device=device)
            del big                                   # cached, not returned
            survivor = torch.empty(32 * MIB, dtype=torch.uint8, device=device)    # split from the cached block
            torch.cuda.empty_cache()
        if label == "clean again":
            survivor = None
        row, _ = decode_once(vae, z, tiling, device, None, cap, None, False)
        row.update(case=label, reserved_before_gb=torch.cuda.memory_reserved(device) / GIB
                   if device.type == "cuda" else 0.0)
        rows.append(row)
        print(row, flush=True)
    del survivor
    result.update(fragment=rows, tiling=tiling.describe(), alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""))
    args.out.write_text(json.dumps(result, indent=1, default=str))
    print(f"PYTORCH_CUDA_ALLOC_CONF={result['alloc_conf']!r} tiling {result['tiling']}")
    for r in rows:
        print(f"| {r['case']} | {r.get('s', float('nan')):.3f} | {r.get('sha', r.get('error'))} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
