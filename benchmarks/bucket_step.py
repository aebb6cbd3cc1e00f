"""One FramePack transformer step at the 960 bucket (912×960, window 9: 40,375 tokens) under the 20 GB VRAM cap
(the rest of the transformer streamed block by block) vs fully resident: seconds per step, × resident, and the peak
VRAM of each (the capped one must stay ≤ the cap).

The step is the pipeline's (`FramepackDenoiser` after `begin_section`, benchmarks/transformer_step.py's section
inputs) on the full-size transformer with random weights (benchmarks/fullsize.py). The capped run keeps the
preserved memory the plan asks for at this size: at least the default, and at least the step's working set
(activations + streaming slots, memory/resolution.py) plus 1 GB. Peaks are PyTorch's max allocated / reserved
within the stage; the cap is `set_per_process_memory_fraction`.

    python3 benchmarks/bucket_step.py --out bucket_step.json          # full size, random weights (GPU)
    python3 benchmarks/bucket_step.py --tiny                          # tiny preset at a small bucket (CPU smoke)
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import time
from pathlib import Path

import torch

if not __package__:          # `python3 benchmarks/<this>.py`: run again as a module (benchmarks/_script.py)
    import _script

    _script.as_module(__file__)

from common.units import GIB  # noqa: E402

log = logging.getLogger("benchmarks.bucket_step")

TARGET = 960            # the bucket target measured (its square-ish bucket: 912×960)
TINY_TARGET = 128       # --tiny: a small bucket the tiny model runs in seconds on a CPU
CAP_GB = 20.0


def working_set_gb(tr, height: int, width: int, window: int, slots: int) -> float:
    """Activations (memory.plan.activation_bytes at this size) + streaming slots of the largest block, GiB."""
    from memory.hostpack import HostPack
    from memory.plan import activation_bytes, framepack_tokens

    cfg = tr.config
    hidden = cfg.num_attention_heads * cfg.attention_head_dim
    dtype_bytes = next(tr.parameters()).element_size()
    act = activation_bytes(framepack_tokens(height, width, window), hidden, dtype_bytes)
    return (act + slots * max(c.nbytes for c in HostPack.of(tr).blocks)) / GIB


def run(name: str, tr, inputs, device, cap_gb: float, preserved_gb: float, size: tuple[int, int], warmup: int,
        steps: int) -> dict:
    from benchmarks.transformer_step import time_steps
    from memory.manager import MemoryManager
    from pipeline.denoiser import FramepackDenoiser

    mm = MemoryManager(device=device, cap_gb=cap_gb, preserved_gb=preserved_gb, plan_on_cpu=device.type == "cpu")
    mm.set_workload(size[0], size[1], 9)
    mm.apply_cap()
    with mm.stage("transformer", transformer=tr) as rec:
        times, out = time_steps(FramepackDenoiser(tr, 0.0, steps), inputs, device, warmup, steps)
    return {"config": name, "output": out, "cap_gb": cap_gb, "preserved_gb": preserved_gb,
            "s_per_step": statistics.median(times), "times": times, "peak_allocated": rec.peak_allocated,
            "peak_reserved": rec.peak_reserved, "placement": rec.placement["transformer"],
            "streamed_bytes": rec.streamed_bytes_per_pass}


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    ap.add_argument("--tiny", action="store_true", help="the tiny preset at a small bucket (a CPU smoke run)")
    ap.add_argument("--cap-gb", type=float, default=CAP_GB)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    from benchmarks.transformer_step import build_transformer, section_inputs
    from memory.hostpack import HostPack
    from memory.plan import framepack_tokens
    from pipeline.buckets import nearest_bucket

    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    tr, _, _, image_tokens = build_transformer(args.tiny)
    height, width = nearest_bucket(1, 1, TINY_TARGET if args.tiny else TARGET)
    pack = HostPack.of(tr)
    pack.set_pinned(device.type == "cuda")
    inputs = section_inputs(tr, height, width, 9, image_tokens)
    total_gb = torch.cuda.get_device_properties(device).total_memory / GIB if device.type == "cuda" else 1e3
    working = working_set_gb(tr, height, width, 9, slots=2)
    if args.tiny:           # a cap that streams all but one block of the tiny model, the working set preserved
        preserved = working + 0.01
        cap_gb = (pack.rest.nbytes + pack.blocks[0].nbytes) / GIB + preserved
    else:
        preserved = max(6.0, math.ceil(working + 1.0))
        cap_gb = args.cap_gb
    results = [run("resident", tr, inputs, device, total_gb, 0.0, (height, width), args.warmup, args.steps),
               run(f"{cap_gb:.3g} GB cap, streamed", tr, inputs, device, cap_gb, preserved, (height, width),
                   args.warmup, args.steps)]
    base, ref = results[0]["s_per_step"], results[0].pop("output")
    for r in results[1:]:
        out = r.pop("output")
        r["max_abs_diff"] = float((out.float() - ref.float()).abs().max())
    for r in results:
        r["x_resident"] = r["s_per_step"] / base
        r["within_cap"] = r["peak_allocated"] <= r["cap_gb"] * GIB if r["config"] != "resident" else None
    tokens = framepack_tokens(height, width, 9, image_tokens)
    meta = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "tiny": args.tiny, "bucket": [height, width], "tokens": tokens,
            "working_set_gb": working, "model_bytes": pack.nbytes, "date": time.strftime("%Y-%m-%d")}
    if args.out:
        args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    print(f"\n{meta['device']}, torch {meta['torch']}, bucket {width}×{height}, {tokens:,} tokens, "
          f"model {pack.nbytes / GIB:.1f} GiB, working set ≈ {working:.2f} GiB")
    print("| config | s/step | × resident | peak allocated GiB | peak reserved GiB | ≤ cap | streamed GiB/step |\n"
          "|---|---|---|---|---|---|---|")
    for r in results:
        cap = "" if r["within_cap"] is None else ("yes" if r["within_cap"] else "NO")
        print(f"| {r['config']} | {r['s_per_step']:.3f} | {r['x_resident']:.2f} | {r['peak_allocated'] / GIB:.2f} | "
              f"{r['peak_reserved'] / GIB:.2f} | {cap} | {r['streamed_bytes'] / GIB:.2f} |")
    return results


if __name__ == "__main__":
    main()
