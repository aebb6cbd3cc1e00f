"""One job's transformer sampling on 1 GPU and split over N GPUs (issue 48/49), full-size random bf16 weights.

Each of N processes (one per GPU, NCCL with a gloo side, as jobs/split.py joins them) builds the full-size FramePack
transformer with the same seeded random weights (benchmarks/fullsize.py) and packs/pins its host copy. The first
section of the 5 s 608×640 job (window 9: 18.3k image tokens + 985 prompt/image-prompt tokens) is sampled with
the real sampler (UniPC, `--steps` steps, real CFG off as in the app's default) under the 20 GB cap with the
app's streaming (preserved 6 GB), first by process 0 alone (the 1-GPU baseline), then by all N with the job split
(pipeline/split.py). Reported: seconds per sampling step and the ratio, per-GPU peak reserved memory against the
cap, the streamed bytes, and the latents' max / mean absolute difference and relative norm against the 1-GPU run.

`--modes` compares builds of the split in the same call against the same 1-GPU run: `new` (the code as it is),
`old` (as before issue 48's second pass: the Ulysses-anything exchange asks for the share sizes at every
all-to-all, and each GPU's residency is planned as for a whole job) and `exchange` (sizes known, the whole job's
plan). The output norm and projection on each share (the second pass's other change) is in every mode.

Communication: per block the three all-to-alls of q, k, v and the one of the attention's output, and
the final all-gather of the projected window tokens: with `--profile`, two split steps under torch.profiler, the GPU time of
NCCL's kernels against the step's wall time (an upper bound: an NCCL kernel also counts the time it waits for the
other GPUs to arrive), and the bytes each GPU sends per step from the token counts.

    python3 benchmarks/split.py --gpus 2 --out split.json            # 1 vs 2 GPUs
    python3 benchmarks/split.py --gpus 4 --out split4.json           # 1 vs 4 GPUs (issue 49)
    python3 benchmarks/split.py --gpus 2 --tiny --device cpu --out t.json   # tiny preset, gloo on the CPU
    python3 benchmarks/split.py --gpus 2 --cap-gb 1000 --variants eager,compiled --profile --out r.json  # resident
    python3 benchmarks/split.py --gpus 2 --modes old,exchange,new --out m.json   # before/after in one call
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


MODES = {"new": (True, True), "exchange": (True, False), "old": (False, False)}   # (sizes known, share's plan)


def _sample(tr, inputs, device, steps: int, cap_gb: float, split=None, compiled_on: bool = False,
            mode: str = "new") -> dict:
    """One section sampled (UniPC, `steps` steps) under the cap; per-step times, the latents, the stage's record.
    `mode` (a split's): see MODES and the module's docstring."""
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
    known, share_plan = MODES[mode]
    if split is not None:
        split.attach(tr)
        if share_plan:
            mm.set_workload(mm.workload.height, mm.workload.width, mm.workload.window, split.size)
        split.sizes_known = known
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
            split.sizes_known = True
    return {"times": times, "latents": latents, "peak_reserved": rec.peak_reserved,
            "peak_allocated": rec.peak_allocated, "streamed_bytes": rec.streamed_bytes_per_pass,
            "placement": rec.placement["transformer"], "load_s": rec.load_s, "tokens": tokens}


def _profile_steps(tr, inputs, device, cap_gb: float, split, compiled_on: bool, steps: int = 2) -> dict:
    """Split steps under torch.profiler (after one unprofiled): the GPU time of NCCL's kernels per step (the
    exchanges, and any wait for the other GPUs inside them) against the step's wall time."""
    from torch.profiler import ProfilerActivity, profile

    from memory.manager import MemoryManager
    from pipeline import compiled
    from pipeline.denoiser import FramepackDenoiser

    ctx, idx, shape, image, texts, noise = inputs
    compiled.install(tr).enabled = compiled_on
    mm = MemoryManager(device=device, cap_gb=cap_gb, preserved_gb=6.0, plan_on_cpu=device.type == "cpu")
    mm.apply_cap()
    split.attach(tr)
    try:
        with mm.stage("transformer", transformer=tr):
            den = FramepackDenoiser(tr, 0.0, steps + 1, split=split)
            den.begin_section(ctx, idx, shape, image, texts, 10.0)
            x, t = noise.to(device), torch.tensor([900.0], device=device)
            den(x, t)
            _sync(device)
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                t0 = time.perf_counter()
                for _ in range(steps):
                    den(x, t)
                _sync(device)
                wall = (time.perf_counter() - t0) / steps
            den.end_section()
    finally:
        split.detach()
    nccl = sum(e.self_device_time_total for e in prof.key_averages() if "nccl" in e.key.lower()) / 1e6 / steps
    kernels = sum(e.self_device_time_total for e in prof.key_averages()) / 1e6 / steps
    return {"step_s": wall, "nccl_kernel_s": nccl, "all_kernels_s": kernels, "share": nccl / wall}


def _bytes_per_step(tr, tokens: dict, size: int) -> dict:
    """What one GPU sends per step: per block the q, k, v and output all-to-alls of its share ((size-1)/size of
    each leaves it) in bf16, and the final gather of its projected window tokens (float32, the projection's
    outputs a token), once to each other GPU."""
    cfg = tr.config
    width = cfg.num_attention_heads * cfg.attention_head_dim
    blocks = cfg.num_layers + cfg.num_single_layers
    local = -(-tokens["image"] // size) + -(-tokens["text"] // size)
    a2a = blocks * 4 * local * width * 2 * (size - 1) / size
    gather = -(-tokens["window"] // size) * tr.proj_out.out_features * 4 * (size - 1)
    return {"all_to_all": a2a, "gather": gather, "total": a2a + gather, "local_tokens": local}


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
    t0 = time.perf_counter()
    tr, height, width, image_tokens = build_transformer(args.tiny)
    split = _join_group(rank, size, port, device, 1 if args.anything else tr.config.num_attention_heads)
    pack = HostPack.of(tr)
    pack.set_pinned(device.type == "cuda")
    build_s = time.perf_counter() - t0
    inputs = section_inputs(tr, height, width, 9, image_tokens)
    cap = args.cap_gb if not args.tiny else 1e3
    result = {"rank": rank, "device": str(device), "build_s": build_s}
    variants = [v for v in args.variants.split(",") if v]
    modes = [m for m in args.modes.split(",") if m]
    for variant in variants:
        on = variant == "compiled"
        if rank == 0:
            one = _sample(tr, inputs, device, args.steps, cap, None, on)
            result[f"one_{variant}"] = one
        dist.barrier()
        for mode in modes:
            result[f"split_{variant}_{mode}"] = _sample(tr, inputs, device, args.steps, cap, split, on, mode)
            dist.barrier()
    tokens = result[f"split_{variants[0]}_{modes[0]}"]["tokens"]
    result["tokens"] = tokens
    result["bytes"] = _bytes_per_step(tr, tokens, size)
    if args.profile and device.type == "cuda":
        result["profile"] = _profile_steps(tr, inputs, device, cap, split, "compiled" in variants[-1])
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
    ap.add_argument("--profile", action="store_true", help="profile two split steps: NCCL's share of a step")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--modes", default="new", help=f"builds of the split to measure, comma-separated: "
                    f"{', '.join(MODES)} (the module's docstring)")
    ap.add_argument("--anything", action="store_true", help="always diffusers' Ulysses-anything exchange (share "
                    "sizes sent at every attention), also where the shares could be equal")
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
    for variant, mode in [(v, m) for v in args.variants.split(",") if v for m in args.modes.split(",") if m]:
        key = f"split_{variant}_{mode}"
        one, split = first[f"one_{variant}"], first[key]
        a, b = one["latents"], split["latents"]
        s1, sn = statistics.median(one["times"][1:]), statistics.median(split["times"][1:])
        rows.append({
            "variant": variant, "mode": mode, "gpus": args.gpus, "steps": args.steps,
            "one_gpu_s_per_step": s1, "split_s_per_step": sn, "ratio": sn / s1,
            "one_gpu_sampling_s": sum(one["times"]), "split_sampling_s": sum(split["times"]),
            "sampling_ratio": sum(split["times"]) / sum(one["times"]),
            "peak_reserved_gib": {"one": one["peak_reserved"] / GIB,
                                  **{r["device"]: r[key]["peak_reserved"] / GIB for r in results}},
            "streamed_gib_per_step": {"one": one["streamed_bytes"] / GIB,
                                      **{r["device"]: r[key]["streamed_bytes"] / GIB for r in results}},
            "placement": {"one": one["placement"], "split": split["placement"]},
            "latents_max_abs_diff": float((a - b).abs().max()), "latents_mean_abs_diff": float((a - b).abs().mean()),
            "latents_rel_norm": float((a - b).norm() / a.norm()),
        })
    for row in rows:
        row["bytes_sent_per_gpu_per_step"] = first["bytes"]["total"]
        row["profile"] = {r["device"]: r.get("profile") for r in results}
    meta = {"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() and args.device != "cpu" else "cpu",
            "torch": torch.__version__, "tokens": first["tokens"], "build_s": [r["build_s"] for r in results],
            "date": time.strftime("%Y-%m-%d"), "cap_gb": args.cap_gb}
    return {"meta": meta, "rows": rows}


if __name__ == "__main__":
    main()
