"""One job's transformer sampling on 1 GPU and split over N GPUs (issue 48/49), full-size random bf16 weights.

Each of N processes (one per GPU, NCCL with a gloo side, as jobs/split.py joins them) builds the full-size FramePack
transformer with the same seeded random weights (benchmarks/fullsize.py) and packs/pins its host copy. The first
section of the 5 s 608×640 job (window 9: 18.3k image tokens + 985 prompt/image-prompt tokens) is sampled with
the real sampler (UniPC, `--steps` steps, real CFG off as in the app's default) under the 20 GB cap with the
app's streaming (preserved 6 GB), first by process 0 alone (the 1-GPU baseline), then by all N with the job split
(pipeline/split.py). Reported: seconds per sampling step and the ratio, per-GPU peak reserved memory against the
cap, the streamed bytes, and the latents' max / mean absolute difference and relative norm against the 1-GPU run.

Communication: the exchange of one step timed apart, on the same group with the same tensors as the step's: per
block the three all-to-alls of q, k, v and the one of the attention's output (with diffusers' size exchange), and
the final all-gather of the hidden tokens; its share = that time ÷ the split step's time (an upper bound of what
the step waits for: NCCL runs on its own stream, and nothing else overlaps it here).

    python3 benchmarks/split.py --gpus 2 --out split.json            # 1 vs 2 GPUs
    python3 benchmarks/split.py --gpus 4 --out split4.json           # 1 vs 4 GPUs (issue 49)
    python3 benchmarks/split.py --gpus 2 --tiny --device cpu --out t.json   # tiny preset, gloo on the CPU
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

log = logging.getLogger("benchmarks.split")


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _sample(tr, inputs, device, steps: int, cap_gb: float, split=None, compiled_on: bool = False) -> dict:
    """One section sampled (UniPC, `steps` steps) under the cap; per-step times, the latents, the stage's record."""
    from memory.manager import MemoryManager
    from pipeline import compiled
    from pipeline.denoiser import FramepackDenoiser
    from pipeline.samplers import SAMPLERS, flow_sigmas, shift_mu
    from pipeline.sampling import x0_model

    ctx, idx, shape, image, texts, noise = inputs
    blocks = compiled.install(tr)
    blocks.enabled = compiled_on
    mm = MemoryManager(device=device, cap_gb=cap_gb, preserved_gb=6.0, plan_on_cpu=device.type == "cpu")
    mm.apply_cap()
    if split is not None:
        split.attach(tr)
    times = []
    try:
        with mm.stage("transformer", transformer=tr) as rec:
            den = FramepackDenoiser(tr, 0.0, steps, split=split)
            den.begin_section(ctx, idx, shape, image, texts, 10.0)
            _, _, t, h, w = noise.shape
            p = tr.config.patch_size
            window = t * (h // p) * (w // p)
            context = den._const.context_tokens.shape[1]
            tokens = {"image": window + context, "window": window, "context": context,
                      "text": int(texts["cond"].mask.sum()) + den._const.image_tokens.shape[1]}
            model = x0_model(den, framepack_rounding=True)
            run = SAMPLERS["unipc"](model, noise.to(device).float(), flow_sigmas(steps, shift_mu(t, h, w, 2)))
            _sync(device)
            t0 = time.perf_counter()
            while True:
                try:
                    next(run)
                except StopIteration as done:
                    latents = done.value.float().cpu()
                    break
                _sync(device)
                now = time.perf_counter()
                times.append(now - t0)
                t0 = now
            den.end_section()
    finally:
        if split is not None:
            split.detach()
    return {"times": times, "latents": latents, "peak_reserved": rec.peak_reserved,
            "peak_allocated": rec.peak_allocated, "streamed_bytes": rec.streamed_bytes_per_pass,
            "placement": rec.placement["transformer"], "load_s": rec.load_s, "tokens": tokens}


def _exchange_time(split, tr, tokens: int, text: int, device, reps: int) -> dict:
    """The step's communication alone: per block 3 + 1 all-to-alls of this process's q/k/v/output shares (heads
    exchanged, diffusers' Ulysses-anything path with its size exchange) and the final gather of the hidden tokens."""
    from diffusers.models.attention_dispatch import all_to_all_single_any_o_async, all_to_all_single_any_qkv_async

    cfg = tr.config
    heads, dim = cfg.num_attention_heads, cfg.attention_head_dim
    blocks = cfg.num_layers + cfg.num_single_layers
    group = split.config.context_parallel_config._ulysses_mesh.get_group()
    local = split.shard(torch.empty(1, tokens + text, 1), dim=1).shape[1]
    dt = torch.bfloat16 if device.type == "cuda" else torch.float32
    qkv = torch.randn(1, local, heads, dim, device=device, dtype=dt)
    hidden = torch.randn(1, split.shard(torch.empty(1, tokens, 1), dim=1).shape[1], heads * dim, device=device,
                         dtype=dt)
    meta = {"NUM_QO_HEAD": heads, "Q_S_LOCAL": local}

    def step():
        for _ in range(blocks):
            q, k, v = (all_to_all_single_any_qkv_async(qkv, group, **meta)() for _ in range(3))
            all_to_all_single_any_o_async(q, group, **meta)()
        split.gather(hidden)

    step()
    _sync(device)
    times = []
    for _ in range(reps):
        torch.distributed.barrier()
        _sync(device)
        t0 = time.perf_counter()
        step()
        _sync(device)
        times.append(time.perf_counter() - t0)
    n = split.size
    # bytes this process sends per step: each all-to-all keeps 1/n of its input, sends the rest
    sent = blocks * 4 * qkv.numel() * qkv.element_size() * (n - 1) / n + hidden.numel() * hidden.element_size()
    return {"s": statistics.median(times), "bytes_sent_per_gpu": sent, "local_tokens": local}


def rank_main(rank: int, size: int, port: int, args, out_q) -> None:
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format=f"%(asctime)s [rank {rank}] %(name)s: %(message)s")
    import torch.distributed as dist

    from benchmarks.transformer_step import build_transformer, section_inputs
    from jobs.split import _join_group, split_devices
    from memory.hostpack import HostPack

    device = torch.device("cpu") if args.device == "cpu" else split_devices(size, torch.device("cuda", 0))[rank]
    if device.type == "cuda":
        torch.cuda.set_device(device)
    split = _join_group(rank, size, port, device)
    t0 = time.perf_counter()
    tr, height, width, image_tokens = build_transformer(args.tiny)
    pack = HostPack.of(tr)
    pack.set_pinned(device.type == "cuda")
    build_s = time.perf_counter() - t0
    inputs = section_inputs(tr, height, width, 9, image_tokens)
    cap = args.cap_gb if not args.tiny else 1e3
    result = {"rank": rank, "device": str(device), "build_s": build_s}
    variants = [v for v in args.variants.split(",") if v]
    for variant in variants:
        on = variant == "compiled"
        if rank == 0:
            one = _sample(tr, inputs, device, args.steps, cap, None, on)
            result[f"one_{variant}"] = one
        dist.barrier()
        both = _sample(tr, inputs, device, args.steps, cap, split, on)
        result[f"split_{variant}"] = both
        dist.barrier()
    tokens = result[f"split_{variants[0]}"]["tokens"]
    result["tokens"] = tokens
    result["exchange"] = _exchange_time(split, tr, tokens["image"], tokens["text"], device, args.comm_reps)
    split.finish()
    for k, v in list(result.items()):
        if isinstance(v, dict) and "latents" in v and rank != 0:
            v.pop("latents")
    out_q.put(result)
    dist.destroy_process_group()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--cap-gb", type=float, default=20.0)
    ap.add_argument("--variants", default="eager", help="eager and/or compiled, comma-separated")
    ap.add_argument("--comm-reps", type=int, default=5)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args(argv)
    import torch.multiprocessing as mp

    from jobs.split import _free_port

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=rank_main, args=(r, args.gpus, port, args, q)) for r in range(args.gpus)]
    for p in procs:
        p.start()
    results = [q.get() for _ in procs]
    for p in procs:
        p.join()
    results.sort(key=lambda r: r["rank"])
    report = summarize(results, args)
    args.out.write_text(json.dumps(report, indent=1, default=str))
    print(json.dumps(report, indent=1, default=str))


def summarize(results: list[dict], args) -> dict:
    first = results[0]
    rows = []
    for variant in [v for v in args.variants.split(",") if v]:
        one, split = first[f"one_{variant}"], first[f"split_{variant}"]
        a, b = one["latents"], split["latents"]
        s1, sn = statistics.median(one["times"][1:]), statistics.median(split["times"][1:])
        rows.append({
            "variant": variant, "gpus": args.gpus, "steps": args.steps,
            "one_gpu_s_per_step": s1, "split_s_per_step": sn, "ratio": sn / s1,
            "one_gpu_sampling_s": sum(one["times"]), "split_sampling_s": sum(split["times"]),
            "sampling_ratio": sum(split["times"]) / sum(one["times"]),
            "peak_reserved_gib": {"one": one["peak_reserved"] / GIB,
                                  **{r["device"]: r[f"split_{variant}"]["peak_reserved"] / GIB for r in results}},
            "streamed_gib_per_step": {"one": one["streamed_bytes"] / GIB,
                                      **{r["device"]: r[f"split_{variant}"]["streamed_bytes"] / GIB for r in results}},
            "latents_max_abs_diff": float((a - b).abs().max()), "latents_mean_abs_diff": float((a - b).abs().mean()),
            "latents_rel_norm": float((a - b).norm() / a.norm()),
        })
    ex = first["exchange"]
    for row in rows:
        row["exchange_s_per_step"] = ex["s"]
        row["exchange_share"] = ex["s"] / row["split_s_per_step"]
        row["exchange_bytes_sent_per_gpu"] = ex["bytes_sent_per_gpu"]
    meta = {"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() and args.device != "cpu" else "cpu",
            "torch": torch.__version__, "tokens": first["tokens"], "build_s": [r["build_s"] for r in results],
            "date": time.strftime("%Y-%m-%d"), "cap_gb": args.cap_gb}
    return {"meta": meta, "rows": rows}


if __name__ == "__main__":
    main()
