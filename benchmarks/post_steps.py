"""After the video (issue 42): ×2 frame interpolation (RIFE 4.25, full size), ×2 upscaling (RRDBNet as
Real-ESRGAN x2plus: 64 features, 23 blocks) and face restoration (RetinaFace MobileNet-0.25 on every frame, then
GFPGAN v1.4's network on one 512×512 face per frame, bf16 on the GPU) with random weights, on the frames of a 5 s 608×640 video (129 frames),
through the job's own code (post/process.py: uint8 frames in and out, batches of 8, fp16 on the GPU, a chunk of 16
frames at a time as the post job runs it) under the VRAM cap. Decoding and encoding the video (PyAV, on the CPU) are
not in these figures.

    python3 benchmarks/post_steps.py [--frames 129] [--height 608] [--width 640] [--cap-gb 20] [--tiny]

Prints one JSON object: frames per second (output frames, and new frames for the interpolation), peak memory, the
FLOP per frame of the convolutions and the arithmetic bound (FLOP per frame ÷ the GPU's dense fp16 peak)."""
from __future__ import annotations

if __name__ == "__main__" and not __package__:
    from _script import as_module

    as_module(__file__)

import argparse
import functools
import json
import time
from fractions import Fraction

import numpy as np
import torch

from common.units import GIB
from post import esrgan, facedetect, faces, rife
from post.facedetect import find_faces
from post.process import FACE_TEMPLATE, dtype_for, interpolate, restore_faces, upscale
from post.steps import CHUNK

PEAK_FP16 = {"H100": 989.4e12, "H200": 989.4e12}     # dense fp16/bf16 tensor-core FLOP/s (NVIDIA SXM datasheets)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(device, fn):
    _sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    out = fn()
    _sync(device)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
    return out, time.perf_counter() - t0, peak


def run_interpolation(net, frames, device, dtype) -> int:
    """×2 over the whole clip, chunk by chunk as the post job does: the output frames made."""
    made = 0
    n = len(frames)
    for start in range(0, n - 1, CHUNK):
        end = min(start + CHUNK, n - 1)
        times = [Fraction(k, 2) for k in range(2 * start, 2 * end)] + ([Fraction(n - 1)] if end == n - 1 else [])
        made += len(interpolate(net, frames[start:end + 1], times, start, device, dtype))
    return made


def run_upscale(model, frames, device, dtype, free) -> int:
    made = 0
    for start in range(0, len(frames), CHUNK):
        made += len(upscale(model, 2, frames[start:start + CHUNK], device, dtype, free))
    return made


def run_faces(model, detector, frames, device, dtype) -> int:
    """The face step as the job runs it: the detector on every frame (random weights find no face, so one face
    where a portrait has it is added to what it finds), each face aligned, restored and pasted back."""
    h, w = frames[0].shape[:2]
    side = 0.5 * min(h, w)
    portrait = (FACE_TEMPLATE / 512.0 - 0.5) * side + np.array([w / 2, h * 0.4])

    def find(frame):
        return find_faces(detector, frame, device)[:1] or [portrait]

    made = 0
    for start in range(0, len(frames), CHUNK):
        made += len(restore_faces(model, frames[start:start + CHUNK], 1.0, device, dtype, find))
    return made


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--frames", type=int, default=129)
    p.add_argument("--height", type=int, default=608)
    p.add_argument("--width", type=int, default=640)
    p.add_argument("--cap-gb", type=float, default=20.0)
    p.add_argument("--tiny", action="store_true", help="the tiny twins on small frames (a CPU check of the script)")
    args = p.parse_args()
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    dtype = dtype_for(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak_flops = next((v for k, v in PEAK_FP16.items() if k in name), None)
    free = None
    if device.type == "cuda":                 # the cap as MemoryManager.apply_cap sets it
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.cap_gb * GIB / total), device)
    h, w = (48, 64) if args.tiny else (args.height, args.width)
    rng = np.random.default_rng(0)
    base = rng.integers(0, 256, (h + 64, w + 64, 3), dtype=np.uint8)
    frames = [np.ascontiguousarray(base[k % 64:k % 64 + h, (2 * k) % 64:(2 * k) % 64 + w]) for k in range(args.frames)]
    torch.manual_seed(0)
    result = {"device": name, "torch": torch.__version__, "frames_in": args.frames, "size": [h, w],
              "cap_gb": args.cap_gb, "dtype": str(dtype)}

    net = (rife.tiny_ifnet() if args.tiny else rife.IFNet().eval()).to(device, dtype)
    run_interpolation(net, frames[:CHUNK + 1], device, dtype)                     # warm-up
    made, seconds, peak = _timed(device, functools.partial(run_interpolation, net, frames, device, dtype))
    flop = rife.flop_per_frame(net, h, w)
    result["interpolate_x2"] = {
        "output_frames": made, "new_frames": made - args.frames, "seconds": round(seconds, 3),
        "output_fps": round(made / seconds, 1), "new_fps": round((made - args.frames) / seconds, 1),
        "peak_allocated_gib": round(peak / GIB, 2), "gflop_per_new_frame": round(flop / 1e9, 1),
        "bound_new_fps": round(peak_flops / flop, 0) if peak_flops else None}
    del net
    torch.cuda.empty_cache() if device.type == "cuda" else None

    if args.tiny:
        model, spec = esrgan.tiny_upscaler(2)
    else:
        spec = esrgan.UpscalerSpec("RRDBNet", 2, 64, 23, 32)
        model = esrgan.build(spec).eval()
    model = model.to(device, dtype)
    if device.type == "cuda":
        free = int(args.cap_gb * GIB) - torch.cuda.memory_allocated(device)
    run_upscale(model, frames[:8], device, dtype, free)                           # warm-up
    made, seconds, peak = _timed(device, functools.partial(run_upscale, model, frames, device, dtype, free))
    flop = esrgan.flop_per_frame(spec, h, w)
    result["upscale_x2"] = {
        "frames": made, "seconds": round(seconds, 3), "fps": round(made / seconds, 2),
        "out_size": [2 * h, 2 * w], "peak_allocated_gib": round(peak / GIB, 2),
        "gflop_per_frame": round(flop / 1e9, 1), "bound_fps": round(peak_flops / flop, 1) if peak_flops else None}
    del model
    torch.cuda.empty_cache() if device.type == "cuda" else None

    face_dtype = dtype_for(device, "face")
    face = (faces.tiny_face_model() if args.tiny else faces.GFPGAN().eval()).to(device, face_dtype)
    detector = facedetect.RetinaFace().eval().to(device)
    run_faces(face, detector, frames[:8], device, face_dtype)                      # warm-up
    made, seconds, peak = _timed(device, functools.partial(run_faces, face, detector, frames, device, face_dtype))
    flop = faces.flop_per_face(face.spec)
    result["faces"] = {
        "frames": made, "seconds": round(seconds, 3), "fps": round(made / seconds, 2), "dtype": str(face_dtype),
        "face_size": face.spec.size, "peak_allocated_gib": round(peak / GIB, 2),
        "gflop_per_frame": round(flop / 1e9, 1), "bound_fps": round(peak_flops / flop, 1) if peak_flops else None}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
