"""Where the VAE decode's time goes, and what each speed option buys, for the decodes of the issue's job.

The job: 5 s at 608×640, window 9, so the decodes are 9 latent frames (33 pixel frames, first section), 18 (69,
middle sections) and 19 (73, last). For the first two shapes, under the VRAM cap (default 20 GB), each row decodes
the same random latents with the full-size HunyuanVideo VAE (random fp16 weights):
- `baseline`: the tiling the job's policy picks under the cap (memory/vae.py), fp16, the default speed settings
  (configs/video.py: the fast padding and GroupNorm of pipeline/vae_ops.py on a GPU): what the job runs today;
  every other row is compared with it;
- `PyTorch's pad and GroupNorm` (the decode before pipeline/vae_ops.py) and `PyTorch's GroupNorm` (fast padding
  only: its difference from the row before must be 0);
- `cudnn.benchmark`, `channels_last` and both (configs/video.py VaeDecodeSpeed; pipeline/decode_speed.py);
- `bf16`: the VAE in bfloat16;
- other tilings (diffusers' default 256 px / 16 frames, whole frames / 16 frames, 384 px, 512 px / 16 frames).
Per row: `first_s` (the untimed warm-up: cuDNN's algorithm search happens there), `s` (median of --reps),
peak allocated GB, and the difference from the baseline: max and mean |Δ| in pixel units ([-1, 1]) and the max
difference in uint8 levels of the frames the video gets. Tilings that do not fit the cap are reported as "oom".
The baseline keeps the room for cuDNN's workspace that the job keeps (memory.vae.cudnn_workspace_reserve), and the
script starts with the app's environment profile (rocm.apply_env_profile: the allocator's expandable segments on
NVIDIA), so its decodes are the job's. A profile of one baseline decode (`--profile-shape`, default the middle
sections') lists the top operators by GPU time (CPU time with --tiny), grouped as well into convolutions,
normalization, activations, copies/padding, upsampling, attention and the rest.

    python3 benchmarks/vae_decode.py --out vae_decode.json               # GPU, ~4 min on an H100
    python3 benchmarks/vae_decode.py --out vd.json --rows none           # the baselines and the profile, ~1 min
    python3 benchmarks/vae_decode.py --tiny --out vae_decode.json        # tiny VAE on the CPU (checks the script)
"""
from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from pathlib import Path

import torch

if not __package__:          # `python3 benchmarks/<this>.py`: run again as a module (benchmarks/_script.py)
    import _script

    _script.as_module(__file__)

from common.units import GIB  # noqa: E402

log = logging.getLogger("benchmarks.vae_decode")
SHAPES = {"first section": (9, 76, 80), "middle sections": (18, 76, 80)}      # 33 and 69 pixel frames
TINY_SHAPES = {"first section": (5, 8, 8), "middle sections": (9, 8, 8)}    # small: the CPU's conv3d is slow


def rows_to_run(baseline, tiled, tiny: bool) -> list[tuple[str, object, object, torch.dtype | None]]:
    """`baseline`: the job's tiling (the streamed decoder's grid on a GPU); `tiled`: the tiles diffusers' decoder
    gets under the same cap (the decode before the streamed decoder), which the speed options apply to."""
    from configs.video import VaeDecodeSpeed
    from memory.vae import VaeTiling
    from memory.vae_grid import GridTiling

    plain = VaeDecodeSpeed()
    rows = [("baseline", baseline, plain, None)]
    if isinstance(baseline, GridTiling):
        rows += [("streamed, NCDHW", baseline, VaeDecodeSpeed(stream_channels_last=False), None),
                 ("diffusers' decoder and tiles", tiled, plain, None)]
    rows += [("PyTorch's pad and GroupNorm", tiled, VaeDecodeSpeed(fast_pad=False, fast_group_norm=False), None),
             ("PyTorch's GroupNorm", tiled, VaeDecodeSpeed(fast_group_norm=False), None),
             ("cudnn.benchmark", tiled, VaeDecodeSpeed(cudnn_benchmark=True), None),
             ("channels_last", tiled, VaeDecodeSpeed(channels_last=True), None),
             ("cudnn.benchmark + channels_last", tiled, VaeDecodeSpeed(cudnn_benchmark=True, channels_last=True),
              None),
             ("bf16", baseline, plain, torch.bfloat16)]
    others = [VaeTiling(32, 16), VaeTiling(0, 16)] if tiny else \
        [VaeTiling(256, 16), VaeTiling(0, 16), VaeTiling(384, 0), VaeTiling(512, 16)]
    rows += [(f"tiling {t.describe()}", t, plain, None) for t in others if t not in (baseline, tiled)]
    return rows


def bench_vae(tiny: bool):
    """(vae, device, shapes): the tiny preset's VAE on the CPU, else the full-size one (random fp16 weights) on the
    GPU where there is one, with the job's decode shapes."""
    device = torch.device("cuda") if torch.cuda.is_available() and not tiny else torch.device("cpu")
    if tiny:
        from pipeline.components import load_components

        vae, shapes = load_components("tiny", "original").vae, TINY_SHAPES
    else:
        from benchmarks.fullsize import build_models

        vae, shapes = build_models(roles=("vae",))["vae"], SHAPES
    return vae.to(device).eval(), device, shapes


def _levels(pixels: torch.Tensor) -> torch.Tensor:
    """The uint8 levels the video gets (video.mp4.pixels_to_frames' arithmetic)."""
    return ((pixels.float().clamp(-1, 1) + 1.0) * 127.5 + 0.5).to(torch.uint8)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _decode(vae, z, tiling, speed, device) -> torch.Tensor:
    """One decode as the job runs it: the streamed decoder for a grid (channels-last where the job uses it),
    diffusers' decoder with `speed` for its tiles."""
    from memory.vae import streamed_decode
    from memory.vae_grid import GridTiling, grid_decode
    from pipeline.decode_speed import decode_speed

    if isinstance(tiling, GridTiling):
        return grid_decode(vae, z, tiling, streamed_decode(device)["channels_last"] and speed.stream_channels_last)
    tiling.apply(vae)
    with decode_speed(vae, device, speed):
        return vae.decode(z).sample


@torch.no_grad()
def run_row(vae, z, tiling, speed, dtype, device, reps: int) -> tuple[dict, torch.Tensor | None]:
    original = vae.dtype
    if dtype is not None:
        vae.to(dtype)
    zz = z.to(vae.dtype)
    times, out, first = [], None, None
    try:
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
        for i in range(reps + 1):
            out = None
            _sync(device)
            t0 = time.perf_counter()
            out = _decode(vae, zz, tiling, speed, device)
            _sync(device)
            (times.append if i else (lambda s: None))(time.perf_counter() - t0)
            first = first if i else time.perf_counter() - t0
        peak = (torch.cuda.max_memory_allocated(device) - base) / GIB if device.type == "cuda" else None
        return {"first_s": first, "s": statistics.median(times), "peak_gb": peak}, out
    except torch.OutOfMemoryError:
        return {"error": "oom"}, None
    finally:
        if dtype is not None:
            vae.to(original)


# Operator name fragments -> group (first match wins; aten ops and the kernels' own names both appear).
OP_GROUPS = (("attention", ("attention", "softmax", "flash", "fmha", "bmm", "mask")),
             ("convolution", ("conv", "cudnn", "implicit_gemm", "xmma", "gemm", "winograd", "fprop")),
             ("normalization", ("norm", "moments", "welford", "reduce_kernel", "mean", "var")),
             ("activation", ("silu", "gelu", "sigmoid", "swish")),
             ("upsampling", ("upsample", "interpolate")),
             ("copies, padding, concatenation", ("copy", "cat", "pad", "contiguous", "clone", "fill", "index",
                                                 "elementwise", "to_", "_to")),
             ("arithmetic", ("add", "mul", "div", "sub")))


def op_group(name: str) -> str:
    low = name.lower()
    return next((g for g, keys in OP_GROUPS if any(k in low for k in keys)), "other")


def profile_decode(vae, z, tiling, device, top: int = 20, speed=None) -> tuple[list[dict], list[dict]]:
    """(the top operators by self time, the shares of the operator groups) of one decode with the job's speed
    settings (`speed`: others, e.g. VaeDecodeSpeed(fast_pad=False, fast_group_norm=False) for the decode before)."""
    from torch.profiler import ProfilerActivity, profile

    from configs.video import VaeDecodeSpeed

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch.no_grad(), profile(activities=activities) as prof:
        _decode(vae, z, tiling, speed or VaeDecodeSpeed(), device)
        _sync(device)
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    events = [e for e in prof.key_averages() if getattr(e, key, 0) > 0]
    if device.type == "cuda":         # the kernels only (operator entries repeat their kernels' time)
        events = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA
                  and e.key != "Command Buffer Full"]
    total = sum(getattr(e, key) for e in events) or 1
    events.sort(key=lambda e: getattr(e, key), reverse=True)
    ops = [{"op": e.key, "calls": e.count, "ms": getattr(e, key) / 1000, "share": getattr(e, key) / total}
           for e in events]
    groups: dict[str, float] = {}
    for o in ops:
        g = op_group(o["op"])
        groups[g] = groups.get(g, 0.0) + o["ms"]
    ms_total = sum(groups.values()) or 1.0
    grouped = [{"group": g, "ms": ms, "share": ms / ms_total}
               for g, ms in sorted(groups.items(), key=lambda kv: kv[1], reverse=True)]
    return ops[:top], grouped


@torch.no_grad()
def _whole(vae, z, device, cap_gb: float) -> torch.Tensor:
    """The streamed decoder on whole frames, with the cap lifted for it on a GPU."""
    from memory.vae import streamed_decode
    from memory.vae_grid import GridTiling, grid_decode

    if device.type == "cuda":
        torch.cuda.set_per_process_memory_fraction(1.0, torch.cuda.current_device())
    try:
        return grid_decode(vae, z, GridTiling(1, 1), streamed_decode(device)["channels_last"])
    finally:
        if device.type == "cuda":
            total = torch.cuda.get_device_properties(device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, cap_gb * GIB / total), torch.cuda.current_device())
            torch.cuda.empty_cache()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tiny", action="store_true", help="the tiny preset's VAE (CPU is fine)")
    ap.add_argument("--cap-gb", type=float, default=20.0)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--budget-s", type=float, default=270.0, help="rows left when this is spent are skipped")
    ap.add_argument("--rows", default="", help="semicolon-separated row names to run (default: all); baseline always")
    ap.add_argument("--shapes", type=int, default=2, help="how many of the job's decode shapes (1 or 2)")
    ap.add_argument("--profile-shape", type=int, default=-1, help="which of the shapes run is profiled (-1: last)")
    ap.add_argument("--profile-native", action="store_true",
                    help="profile diffusers' decoder with PyTorch's pad and GroupNorm (the decode before "
                         "pipeline/vae_ops.py and the streamed decoder)")
    ap.add_argument("--whole-reference", action="store_true",
                    help="also compare every row with the streamed decoder on whole frames (the cap lifted for it): "
                         "how far each tiling is from a decode without tiles")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    import rocm
    from configs.video import VaeDecodeSpeed
    from memory.vae import VaeDecodePolicy, cudnn_workspace_reserve, streamed_decode

    rocm.apply_env_profile()      # what app.py does first (the allocator's mode included): measure the same

    vae, device, shapes = bench_vae(args.tiny)
    reserve = cudnn_workspace_reserve(device)
    policy = VaeDecodePolicy(workspace_reserve=reserve, **streamed_decode(device))      # the job's choice of tiles
    before = VaeDecodePolicy(workspace_reserve=reserve, streamed=False)               # diffusers' decoder's
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.cap_gb * GIB / total), torch.cuda.current_device())
    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "cudnn": torch.backends.cudnn.version() if device.type == "cuda" else None,
              "cap_gb": args.cap_gb if device.type == "cuda" else None, "vae_dtype": str(vae.dtype),
              "date": time.strftime("%Y-%m-%d"), "reps": args.reps, "shapes": {}}
    started = time.perf_counter()
    gen = torch.Generator().manual_seed(0)
    wanted = {r.strip() for r in args.rows.split(";") if r.strip()}
    for name, shape in list(shapes.items())[: args.shapes]:
        z = torch.randn(1, 16, *shape, generator=gen).to(device, vae.dtype)
        available = None
        if device.type == "cuda":
            available = int(args.cap_gb * GIB) - torch.cuda.memory_allocated(device) - (512 << 20)
        baseline = policy.plan(vae, shape, available)[0]
        whole = _whole(vae, z, device, args.cap_gb) if args.whole_reference else None
        rows, reference = [], None
        for label, tiling, speed, dtype in rows_to_run(baseline, before.plan(vae, shape, available)[0], args.tiny):
            if wanted and label != "baseline" and label not in wanted:
                continue
            if time.perf_counter() - started > args.budget_s:
                rows.append({"row": label, "error": "skipped: time budget"})
                continue
            row, out = run_row(vae, z, tiling, speed, dtype, device, args.reps)
            row = {"row": label, "tiling": tiling.describe(), **row}
            if out is not None:
                if reference is None:
                    reference = out
                diff = (out.float() - reference.float()).abs()
                row.update(max_abs=diff.max().item(), mean_abs=diff.mean().item(),
                           max_levels=(_levels(out).int() - _levels(reference).int()).abs().max().item())
                if whole is not None:
                    levels = (_levels(out).int() - _levels(whole).int()).abs()
                    row.update(whole_max_levels=levels.max().item(), whole_mean_levels=levels.float().mean().item())
                out = None
            rows.append(row)
            log.info("%s | %s", name, row)
        base_s = rows[0].get("s")
        for row in rows:
            if base_s and row.get("s"):
                row["x_baseline"] = row["s"] / base_s
        result["shapes"][name] = {"latents": shape, "rows": rows}
        reference = whole = None
    name, shape = list(shapes.items())[: args.shapes][args.profile_shape]
    z = torch.randn(1, 16, *shape, generator=gen).to(device, vae.dtype)
    available = int(args.cap_gb * GIB) - torch.cuda.memory_allocated(device) - (512 << 20) \
        if device.type == "cuda" else None
    tiling = (before if args.profile_native else policy).plan(vae, shape, available)[0]
    result["profile_of"] = {"shape": name, "latents": shape, "tiling": tiling.describe(),
                            "native_ops": args.profile_native}
    speed = VaeDecodeSpeed(fast_pad=False, fast_group_norm=False) if args.profile_native else VaeDecodeSpeed()
    result["profile"], result["profile_groups"] = profile_decode(vae, z, tiling, device, speed=speed)
    result["total_s"] = time.perf_counter() - started
    args.out.write_text(json.dumps(result, indent=1, default=str))

    print(f"\n{result['device']}, torch {result['torch']}, cuDNN {result['cudnn']}, cap {args.cap_gb:g} GB")
    for name, shape in result["shapes"].items():
        frames = (shape["latents"][0] - 1) * 4 + 1
        print(f"\n{name}: {frames} frames, latents {tuple(shape['latents'])}\n"
              "| row | tiling | first s | s | × baseline | peak GB | max abs | mean abs | max levels |\n"
              "|---|---|---|---|---|---|---|---|---|"
              + ("\n(levels from whole frames: max / mean)" if args.whole_reference else ""))
        for r in shape["rows"]:
            if "error" in r:
                print(f"| {r['row']} | {r.get('tiling', '')} | {r['error']} | | | | | | |")
                continue
            peak = f"{r['peak_gb']:.2f}" if r["peak_gb"] is not None else ""
            print(f"| {r['row']} | {r['tiling']} | {r['first_s']:.3f} | {r['s']:.3f} | {r.get('x_baseline', 1):.2f} "
                  f"| {peak} | {r['max_abs']:.4f} | {r['mean_abs']:.5f} | {r['max_levels']} |"
                  + (f" {r['whole_max_levels']} / {r['whole_mean_levels']:.2f} |" if "whole_max_levels" in r else ""))
    of = result["profile_of"]
    print(f"\nbaseline decode profile, {of['shape']} ({of['tiling']}), self time:\n| op | calls | ms | share |\n"
          "|---|---|---|---|")
    for p in result["profile"]:
        print(f"| {p['op']} | {p['calls']} | {p['ms']:.1f} | {100 * p['share']:.1f}% |")
    print("\n| group | ms | share |\n|---|---|---|")
    for g in result["profile_groups"]:
        print(f"| {g['group']} | {g['ms']:.1f} | {100 * g['share']:.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
