"""A whole job under the 20 GB cap with all five full-size models (random weights), through the real orchestrator.

`pipeline.orchestrator.generate` runs text encoders → VAE encode → image encoder → (transformer → VAE decode)
per section with `MemoryManager(cap_gb=20, preserved_gb=6)`. Reported per stage: seconds, load and unload time,
peaks; per VAE decode: frames, tiles, time and peak; end to end: total time and the share spent switching models
(load + unload), and the ratio of end to end to the transformer's sampling time (its stages, load and unload
included) with the rest split into encoders, VAE decode, the wait for the last video file (the section files are
written on a background thread while the next section samples; its total work is reported too) and other.
Packing and pinning the host copies happens once per process (`MemoryManager.prepare`, as the app does after
loading the models) and is reported apart. 3.6 s at window 9 = 3 sections: the decodes are 33, 69 and 73 frames.

    python3 benchmarks/section.py --out section.json                  # full size (GPU)
    python3 benchmarks/section.py --seconds 5 --steps 25 --out job.json --log job.log    # the issue-11 job
    python3 benchmarks/section.py --tiny --out section.json           # tiny preset (CPU or GPU)
    python3 benchmarks/section.py --seconds 2.4 --steps 25 --x264-params default --x264-params default \
        --x264-params stitchable=1 --out same.json      # the same job three times: same frames and bytes? encode cost

With several `--x264-params` the job runs once per value in the same process ("default": configs/video.py's), each
with a new memory manager as the app's jobs have; the report compares every run's raw frames (the hash the writer
records before encoding), its final.mp4 and the video writer's time with the first run's. The stage table is the
first run's.
"""
from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

if not __package__:          # `python3 benchmarks/<this>.py`: run again as a module (benchmarks/_script.py)
    import _script

    _script.as_module(__file__)

from common.units import GIB  # noqa: E402

log = logging.getLogger("benchmarks.section")


def _image(height: int, width: int):
    from PIL import Image

    y, x = np.mgrid[0:height, 0:width]
    arr = np.stack([x / width, y / height, (x + y) / (width + height)], axis=-1)
    return Image.fromarray((arr * 255).astype(np.uint8), "RGB")


def _ensure_video_writer() -> bool:
    try:
        import av

        return av is not None
    except ImportError:
        import video.section_writer as writer

        def write_nothing(segments, path, **_):
            Path(path).write_bytes(b"")
            return Path(path)

        writer.encode_segment = lambda frames, **_: b""
        writer.write_segments = write_nothing
        log.warning("PyAV is not installed: section videos are not written (timings exclude video encoding)")
        return False


def calibrate_vae(tiny: bool, out: Path) -> None:
    """Measured peak vs `memory.vae.memory_estimate` for a few tilings (no cap), to check ACT_FACTOR."""
    from benchmarks.fullsize import build_models
    from memory.vae import VaeTiling, memory_estimate, work

    device = torch.device("cuda")
    if tiny:
        from pipeline.components import load_components

        vae, shape = load_components("tiny", "original").vae, (9, 8, 8)
    else:
        vae, shape = build_models(roles=("vae",))["vae"], (9, 76, 80)
    vae.to(device)
    z = torch.randn(1, 16, *shape, device=device, dtype=vae.dtype)
    rows = []
    for tiling in (VaeTiling(256, 16), VaeTiling(0, 16), VaeTiling(384, 0)):
        tiling.apply(vae)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        with torch.no_grad():
            pixels = vae.decode(z).sample
        torch.cuda.synchronize()
        rows.append({"tiling": tiling.describe(), "seconds": time.perf_counter() - t0, "work": work(tiling, shape),
                     "peak": torch.cuda.max_memory_allocated() - base,
                     "estimate": memory_estimate(tiling, shape, vae.config.block_out_channels[0])})
        del pixels
        print(rows[-1], flush=True)
    out.write_text(json.dumps(rows, indent=1))


def _inject_vae_oom(memory) -> None:
    """Fault injection (rocm's test seam) during VAE decode only: tier 1 of every conv3d raises OOM."""
    from rocm import Fault, FaultPlan

    fallback = memory.conv_fallback
    decode = memory.decode_vae

    def decode_with_oom(vae, z):
        with fallback.injecting(FaultPlan([Fault(tier=1, kind="hip_oom", op="conv3d")])):
            return decode(vae, z)

    memory.decode_vae = decode_with_oom


def _conv_report(memory) -> dict:
    stats = memory.conv_fallback.stats()
    return {"calls_per_tier": stats.calls_per_tier, "exhausted": stats.exhausted, "report": stats.report()}


class _x264_params:
    """The job's section videos encoded with other x264 parameters ("default": configs/video.py's)."""

    def __init__(self, params: str):
        self.params = params

    def __enter__(self):
        import dataclasses
        import functools

        import pipeline.orchestrator as orch
        from configs.video import ENCODING

        self.orch, self.writer = orch, orch.SectionWriter
        if self.params != "default":
            encoding = dataclasses.replace(ENCODING, x264_params=self.params)
            orch.SectionWriter = functools.partial(self.writer, encoding=encoding)
        return self

    def __exit__(self, *exc):
        self.orch.SectionWriter = self.writer
        return False


def _run_record(n: int, params: str, end, total_s: float, first: dict | None) -> dict:
    """One run of the job: its raw frames' hashes (recorded by the writer before encoding), its final.mp4's, the
    video writer's time; compared with the first run."""
    import hashlib

    from video.mp4 import read_frames

    info = json.loads((end.job_dir / "job.json").read_text())
    final = Path(end.video)
    record = {"run": n, "x264_params": params, "total_s": total_s, "final": str(final),
              "frames_sha256": [s["frames_sha256"] for s in info["sections"]],
              "final_sha256": hashlib.sha256(final.read_bytes()).hexdigest(),
              "writer_s": float(end.timings.get("video writing, background", 0.0)),
              "waited_s": float(end.timings.get("video writing", 0.0))}
    same_frames = first is None or record["frames_sha256"] == first["frames_sha256"]
    same_file = first is None or record["final_sha256"] == first["final_sha256"]
    diff = "–"
    if first is not None and not same_file:
        a, b = read_frames(Path(first["final"])).astype(np.int16), read_frames(final).astype(np.int16)
        diff = (f"{np.abs(a - b).max()} / {np.abs(a - b).mean():.3f}" if a.shape == b.shape
                else f"shapes {a.shape} vs {b.shape}")
    record.update(same_frames=same_frames, same_file=same_file, level_diff=diff)
    return record


def end_to_end_split(records, timings: dict, total_s: float) -> dict:
    """End to end split into the transformer's sampling (its stages, load and unload included), the encoders, the
    VAE decode, the wait for the last video file and the rest; the ratio end to end / sampling."""
    def stage(*names):
        return sum(r.ended - r.started for r in records if r.name in names)

    parts = {"transformer sampling": stage("transformer"),
             "encoders (text, VAE encode, image)": stage("text encoders", "VAE encode", "image encoder"),
             "VAE decode": stage("VAE decode"),
             "video writing (waited for)": float(timings.get("video writing", 0.0))}
    parts["other"] = max(0.0, total_s - sum(parts.values()))
    sampling = parts["transformer sampling"]
    return {"parts": parts, "ratio": total_s / sampling if sampling else None,
            "video_background_s": float(timings.get("video writing, background", 0.0))}


def main(argv=None) -> None:
    import rocm

    rocm.apply_env_profile()        # what app.py does first (the allocator's mode included): measure the same
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=3.6)
    ap.add_argument("--cap-gb", type=float, default=20.0)
    ap.add_argument("--preserved-gb", type=float, default=6.0)
    ap.add_argument("--depth", type=int, default=1)
    ap.add_argument("--log", type=Path, default=None, help="also write the full log here")
    ap.add_argument("--calibrate-vae", action="store_true", help="only measure VAE decode peaks vs the estimate")
    ap.add_argument("--vae-cudnn-benchmark", action="store_true", help="configs.video VaeDecodeSpeed option")
    ap.add_argument("--vae-channels-last", action="store_true", help="configs.video VaeDecodeSpeed option")
    ap.add_argument("--vae-native-ops", action="store_true",
                    help="PyTorch's own replicate pad and GroupNorm in the decoder (the decode before "
                         "pipeline/vae_ops.py)")
    ap.add_argument("--vae-tiled", action="store_true",
                    help="diffusers' decoder in its tiles instead of the streamed decoder (the decode before "
                         "memory/vae_stream.py)")
    ap.add_argument("--inject-vae-oom", action="store_true",
                    help="every native conv3d of the VAE decoder raises HIP's out-of-memory error: the decode must "
                         "finish through smaller tiles and then the rocm conv fallback")
    ap.add_argument("--x264-params", action="append", default=None,
                    help="run the job once more with these x264 parameters ('default': configs/video.py's); "
                         "repeat the option to run the same job several times and compare the runs")
    args = ap.parse_args(argv)
    if args.calibrate_vae:
        logging.basicConfig(level=logging.INFO)
        return calibrate_vae(args.tiny, args.out)
    handlers = [logging.StreamHandler()] + ([logging.FileHandler(args.log)] if args.log else [])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", handlers=handlers)
    from benchmarks.fullsize import build_components
    from memory.manager import MemoryManager
    from pipeline import sections as sec
    from pipeline.events import Done, Failed
    from pipeline.orchestrator import generate
    from pipeline.request import Request, prepare

    video = _ensure_video_writer()
    if args.vae_cudnn_benchmark or args.vae_channels_last or args.vae_native_ops:
        import pipeline.orchestrator as orch
        from configs.video import VaeDecodeSpeed

        fast = not args.vae_native_ops
        orch.DECODE_SPEED = VaeDecodeSpeed(cudnn_benchmark=args.vae_cudnn_benchmark,
                                           channels_last=args.vae_channels_last, fast_pad=fast,
                                           fast_group_norm=fast)
    t0 = time.perf_counter()
    comps = build_components(args.tiny)
    build_s = time.perf_counter() - t0
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    height, width = (64, 64) if args.tiny else (608, 640)
    request = Request(image=_image(height, width), prompt="a red fox runs through fresh snow", seconds=args.seconds,
                      steps=args.steps, teacache=0.0, seed=31337)
    prepared = prepare(request, comps.preset.default_resolution)

    def run_job(outputs: Path, x264_params: str):
        memory = MemoryManager(device=device, cap_gb=args.cap_gb, preserved_gb=args.preserved_gb,
                               prefetch_depth=args.depth)
        if args.vae_tiled:
            memory.vae_policy.streamed = False
        memory.set_workload(height, width, 9)
        prepare_s = memory.prepare(**comps.models())
        if args.inject_vae_oom:
            _inject_vae_oom(memory)
        with _x264_params(x264_params):
            t0 = time.perf_counter()
            events = list(generate(prepared, comps, memory, outputs=outputs))
            total_s = time.perf_counter() - t0
        end = events[-1]
        if isinstance(end, Failed):
            raise SystemExit(f"job failed: {end.message}\n{end.detail}")
        assert isinstance(end, Done)
        return end, memory, total_s, prepare_s

    with tempfile.TemporaryDirectory() as outputs:
        runs = []
        for n, params in enumerate(args.x264_params or ["default"]):
            end, memory_n, total_n, prepare_n = run_job(Path(outputs) / f"run{n}", params)
            runs.append(_run_record(n, params, end, total_n, runs[0] if runs else None))
            if n == 0:
                memory, total_s, prepare_s, first_end = memory_n, total_n, prepare_n, end
        end = first_end
    plan = sec.make_plan("original", args.seconds, 9)
    decoded = [sec.pixel_frames(plan.decode_frames(s)) for s in plan.sections]
    stages, section, dec_i = [], 0, 0
    for r in memory.records:
        row = r.as_dict()
        if r.name == "transformer":
            section += 1
        row["section"] = max(section, 1)       # the encoders belong to the first section's time
        if r.name == "VAE decode":
            row["frames"] = decoded[dec_i]
            dec_i += 1
        stages.append(row)
    switch_s = sum(r.load_s + r.unload_s for r in memory.records)
    cap = memory.cap_bytes
    split = end_to_end_split(memory.records, end.timings, total_s)
    summary = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
               "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "tiny": args.tiny, "steps": args.steps,
               "sections": plan.count, "cap_gb": args.cap_gb, "preserved_gb": args.preserved_gb,
               "build_s": build_s, "prepare_s": prepare_s, "total_s": total_s, "switch_s": switch_s,
               "switch_share": switch_s / total_s, "video_written": video, "timings": end.timings,
               "peak_reserved": max(r.peak_reserved for r in memory.records),
               "peak_allocated": max(r.peak_allocated for r in memory.records),
               "peak_reserved_below_cap": cap is None or max(r.peak_reserved for r in memory.records) <= cap,
               "frames": end.frames, "stages": stages, "inject_vae_oom": args.inject_vae_oom, "split": split,
               "vae_speed": {"cudnn_benchmark": args.vae_cudnn_benchmark, "channels_last": args.vae_channels_last,
                             "native_ops": args.vae_native_ops, "streamed": bool(memory.vae_policy.streamed)},
               "conv_fallback": _conv_report(memory), "runs": runs}
    args.out.write_text(json.dumps(summary, indent=1, default=str))
    print(f"\n{summary['device']}, torch {summary['torch']}, cap {args.cap_gb:g} GB, preserved "
          f"{args.preserved_gb:g} GB, {plan.count} sections × {args.steps} steps, {end.frames} frames")
    print("| stage | section | s | load s | unload s | peak alloc GB | peak reserved GB | host RSS after GB | "
          "notes |\n|---|---|---|---|---|---|---|---|---|")
    for s in stages:
        notes = s.get("frames", "")
        if s["vae_attempts"]:
            notes = f"{s['frames']} frames, {s['vae_attempts'][-1]['tiling']}"
        elif s["streamed_bytes_per_pass"]:
            notes = f"{s['streamed_bytes_per_pass'] / GIB:.1f} GB streamed per pass"
        print(f"| {s['name']} | {s['section']} | {s['seconds']:.2f} | {s['load_s']:.3f} | {s['unload_s']:.3f} | "
              f"{s['peak_allocated'] / GIB:.2f} | {s['peak_reserved'] / GIB:.2f} | "
              f"{(s['host_rss_after'] or 0) / GIB:.1f} | {notes} |")
    print("\n| part of the job | s | share |\n|---|---|---|")
    for name, seconds in split["parts"].items():
        print(f"| {name} | {seconds:.2f} | {100 * seconds / total_s:.1f}% |")
    print(f"| **end to end** | {total_s:.2f} | **{split['ratio']:.3f}× the transformer's sampling** |")
    print(f"(video writing on the background thread: {split['video_background_s']:.2f} s of work, overlapped)")
    if len(runs) > 1:
        print("\n| run | x264 parameters | end to end s | video writer's work s | waited for the last file s | "
              "raw frames = run 0 | final.mp4 = run 0 | decoded final vs run 0: max / mean levels |\n"
              "|---|---|---|---|---|---|---|---|")
        for r in runs:
            print(f"| {r['run']} | {r['x264_params']} | {r['total_s']:.2f} | {r['writer_s']:.2f} | "
                  f"{r['waited_s']:.2f} | {r['same_frames']} | {r['same_file']} | {r['level_diff']} |")
    print(f"\nend to end {total_s:.1f} s; switching models {switch_s:.2f} s = {100 * switch_s / total_s:.1f}%; "
          f"peak reserved {summary['peak_reserved'] / GIB:.2f} GB (cap {args.cap_gb:g}); one-time pack+pin "
          f"{prepare_s:.1f} s; build {build_s:.1f} s")


if __name__ == "__main__":
    main()
