"""Transformer step time with 0, 1 and 3 LoRAs, through the pipeline's own path: the LoRAs are merged into every
device copy of a weight as it is loaded (memory/deltas.py), resident blocks once per stage and streamed blocks in
their slot on the side stream, every step. Same step as benchmarks/transformer_step.py (first section at the
608×640 bucket, window 9, ~18.5k tokens), under the 20 GB cap with 6 GB preserved (the default plan: blocks
streamed), `--warmup` steps then the median of `--steps`. Each LoRA has rank `--rank` on every Linear of the
transformer blocks and the single blocks (random factors, built in memory: file parsing is not timed).

    python3 benchmarks/lora_step.py --out lora_step.json                 # full size, random weights (GPU)
    python3 benchmarks/lora_step.py --tiny --out lora_step.json          # tiny preset (CPU smoke run)

Prints s/step and the ratio to the step without LoRAs (issue 13's target: ≤ 1.02× with 1 and 3 LoRAs).

`--variants merge,forward` also times the alternative the app does not use: LoRA layers in the forward pass
(y = W x + B (A x) on every hooked Linear, the factors of all LoRAs resident on the GPU, weights untouched), under
the same cap and streaming, so the choice is measured rather than assumed.
"""
from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import torch
from torch import nn

if not __package__:          # `python3 benchmarks/<this>.py`: run again as a module (benchmarks/_script.py)
    import _script

    _script.as_module(__file__)

from benchmarks.transformer_step import build_transformer, run_config, section_inputs  # noqa: E402
from common.units import GIB  # noqa: E402

log = logging.getLogger("benchmarks.lora_step")


def random_lora(tr: nn.Module, rank: int, seed: int, strength: float = 0.5):
    """A LoadedLora with random rank-`rank` factors (bf16, as LoRA files are) on every block Linear."""
    from pipeline.lora import LoadedLora

    g = torch.Generator().manual_seed(seed)
    factors = {}
    for name, m in tr.named_modules():
        if isinstance(m, nn.Linear) and ("transformer_blocks." in name):
            a = (torch.randn(rank, m.in_features, generator=g) / m.in_features ** 0.5).to(torch.bfloat16)
            b = (torch.randn(m.out_features, rank, generator=g) * 1e-3).to(torch.bfloat16)
            factors[name] = (a.float(), b.float())
    return LoadedLora(Path(f"random{seed}.safetensors"), f"random{seed}.safetensors", strength, "-", factors)


def forward_hooks(tr: nn.Module, chosen, device) -> list:
    """The unmerged variant: each Linear with LoRA factors adds B·(A·x) to its output (the same concatenated
    factors as the merge, memory/deltas.py, held on `device` in the weights' dtype for the whole stage)."""
    modules = dict(tr.named_modules())
    handles = []
    for name, delta in chosen.deltas().items():
        module = modules[name.removesuffix(".weight")]
        dtype = module.weight.dtype
        down, up = delta.down.to(device, dtype), delta.up.to(device, dtype)

        def hook(m, args, out, down=down, up=up):
            return out + torch.nn.functional.linear(torch.nn.functional.linear(args[0], down), up)
        handles.append(module.register_forward_hook(hook))
    return handles


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--counts", default="0,1,3", help="numbers of LoRAs to measure")
    ap.add_argument("--variants", default="merge", help="merge (the app's), forward (LoRA layers), or both: "
                                                        "merge,forward")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    from memory.hostpack import HostPack
    from pipeline import lora

    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    tr, height, width, image_tokens = build_transformer(args.tiny)
    pack = HostPack.of(tr)
    pack.set_pinned(device.type == "cuda")
    inputs = section_inputs(tr, height, width, 9, image_tokens)
    if args.tiny:                # a cap that streams all but one block of the tiny model
        cap_gb, preserved = 1.0 + (pack.rest.nbytes + pack.blocks[0].nbytes) / GIB, 1.0
    else:
        cap_gb, preserved = 20.0, 6.0
    loras = [random_lora(tr, args.rank, seed) for seed in range(max(int(c) for c in args.counts.split(",")))]
    results = []
    variants = args.variants.split(",")
    for count in [int(c) for c in args.counts.split(",")]:
        chosen = lora.LoraSet(loras[:count])
        for variant in variants if count else variants[:1]:
            handles = []
            if variant == "merge":
                lora.attach(tr, chosen)
            else:
                handles = forward_hooks(tr, chosen, device)
            try:
                r = run_config(f"{count} LoRA(s), rank {args.rank}, {variant}", tr, inputs, device, cap_gb,
                               preserved, 1, args.warmup, args.steps)
            finally:
                lora.detach(tr)
                for h in handles:
                    h.remove()
            r["loras"], r["variant"] = count, variant if count else "-"
            r["lora_layers"] = sum(len(lo.factors) for lo in chosen.loras)
            results.append(r)
    base, ref = results[0]["s_per_step"], results[0]["output"]
    merged = {r["loras"]: r["output"] for r in results if r["variant"] == "merge"}
    for r in results:
        r["x_no_lora"] = r["s_per_step"] / base
        out = r.pop("output")
        r["max_abs_diff_vs_no_lora"] = float((out - ref).abs().max())   # > 0: the LoRAs were applied
        if r["variant"] == "forward" and r["loras"] in merged:         # the two variants compute the same thing
            r["max_abs_diff_vs_merge"] = float((out - merged[r["loras"]]).abs().max())
    meta = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "tiny": args.tiny, "rank": args.rank, "cap_gb": cap_gb,
            "preserved_gb": preserved, "model_bytes": pack.nbytes, "date": time.strftime("%Y-%m-%d")}
    args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    print(f"\n{meta['device']}, torch {meta['torch']}, cap {cap_gb:.1f} GB, preserved {preserved:g} GB, "
          f"rank {args.rank}")
    print("| LoRAs | variant | s/step | × no LoRA | peak allocated GiB | max |Δ| vs merge | placement |\n"
          "|---|---|---|---|---|---|---|")
    for r in results:
        diff = r.get("max_abs_diff_vs_merge")
        print(f"| {r['loras']} | {r['variant']} | {r['s_per_step']:.3f} | {r['x_no_lora']:.3f} | "
              f"{r['peak_allocated'] / GIB:.2f} | {'' if diff is None else f'{diff:.3g}'} | {r['placement']} |")


if __name__ == "__main__":
    main()
