"""The job farm: four 2-section jobs through two workers against the same four jobs through one worker, in one run.

A local Ray with one worker per GPU (farm/, `--gpus 0,1`), each holding its own full-size models (random weights,
benchmarks/fullsize.py; ~42 GB of host RAM per worker) and its own MemoryManager under the VRAM cap. Both workers
build their models first (not timed); then the four jobs run on worker-1 alone (one after the other), then on both
workers (two at a time). Printed: each pass's wall time, the ratio two/one (the issue's target: ≤ 0.55), each job's
worker and time, and each GPU's peak reserved memory against the cap (from the jobs' job.json).

    python3 benchmarks/farm.py --gpus 0,1 --out farm.json                 # two GPUs, full size
    python3 benchmarks/farm.py --tiny --out farm.json                     # tiny preset, two CPU workers (smoke)
"""
from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path

import numpy as np

if not __package__:          # `python3 benchmarks/<this>.py`: run again as a module (benchmarks/_script.py)
    import _script

    _script.as_module(__file__)

from common.units import GIB  # noqa: E402

log = logging.getLogger("benchmarks.farm")
JOBS = 4


def random_components(preset, mode, model_dir):
    """The worker's models: the five full-size models with random weights (ComponentCache's loader signature)."""
    from benchmarks.fullsize import build_components

    return build_components(tiny=False)


def _jobs(args, image_path: Path) -> list:
    from pipeline.request import Request, prepare

    size = 64 if args.tiny else 640
    return [prepare(Request(image=str(image_path), prompt=f"a lighthouse in a storm, take {i}", seed=100 + i,
                            seconds=args.seconds, steps=args.steps, teacache=0.0, resolution=size,
                            preserved_gb=args.preserved_gb), size)
            for i in range(args.jobs)]


def _pass(farm, jobs: list, name: str) -> dict:
    from pipeline.cancel import CancelToken
    from pipeline.events import Done

    t = time.monotonic()
    last = farm.run_all({f"{name}-{i}": job for i, job in enumerate(jobs)}, CancelToken())
    wall = time.monotonic() - t
    rows = []
    for key, end in sorted(last.items()):
        if not isinstance(end, Done) or end.stopped:
            raise SystemExit(f"{key} did not finish: {getattr(end, 'message', end)}")
        info = json.loads((end.job_dir / "job.json").read_text())
        rows.append({"job": key, "worker": info["worker"], "node": info["node"], "seconds": info["timings"]["total"],
                     "sections": len(info["sections"]), "peak_reserved": info["memory"]["peak_reserved"],
                     "device": info["memory"]["device"]})
    log.info("%s: %d jobs in %.1f s", name, len(rows), wall)
    return {"wall_s": round(wall, 2), "jobs": rows}


def main(argv=None, farm=None) -> int:
    """The benchmark as its command line runs it. `farm`: a farm already started with two workers (the suite's,
    on its own Ray: tests/test_farm.py), used for both passes instead of starting one, and left running."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", default="0,1", help="the two GPUs (default 0,1)")
    ap.add_argument("--tiny", action="store_true", help="tiny preset on two CPU workers (a smoke test)")
    ap.add_argument("--seconds", type=float, default=2.4, help="video length: 2.4 s = 2 sections (default)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--jobs", type=int, default=JOBS, help=f"jobs per pass (default {JOBS})")
    ap.add_argument("--vram-cap-gb", type=float, default=20.0)
    ap.add_argument("--preserved-gb", type=float, default=6.0)
    ap.add_argument("--host-ram-gb", type=float, default=None, help="host budget per worker (default: automatic)")
    ap.add_argument("--outputs", type=Path, default=None, help="job folders (default: a temporary folder)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.tiny:
        args.steps, args.preserved_gb = min(args.steps, 2), 0.0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    from PIL import Image

    from configs.options import parse_gpus
    from configs.runtime import Config, FarmOptions
    from farm.dispatch import Farm
    from farm.workers import WorkerConfig

    with tempfile.TemporaryDirectory(prefix="farm-bench-") as tmp:
        outputs = (args.outputs or Path(tmp) / "outputs").resolve()
        image = Path(tmp) / "input.png"
        y, x = np.mgrid[0:480, 0:640]
        Image.fromarray((np.stack([x / 640, y / 480, (x + y) / 1120], -1) * 255).astype(np.uint8)).save(image)
        options = FarmOptions(cpu_workers=2) if args.tiny else FarmOptions(gpus=parse_gpus(args.gpus))
        config = WorkerConfig(Config(preset="tiny" if args.tiny else "hunyuan", outputs=outputs,
                                     vram_cap_gb=args.vram_cap_gb, host_ram_gb=args.host_ram_gb),
                              loader=None if args.tiny else "benchmarks.farm:random_components")
        owned = farm is None
        if owned:
            farm = Farm.start(options, config, num_cpus=2 if args.tiny else None)
        try:
            import ray

            t = time.monotonic()
            build = ray.get([s.actor.load.remote("original") for s in farm.slots])
            log.info("models built on %d workers in %.1f s (%s)", farm.size, time.monotonic() - t, build)
            jobs = _jobs(args, image)
            one = _pass(Farm(farm.slots[:1], owns_ray=False), jobs, "one-worker")
            two = _pass(farm, jobs, "two-workers")
            workers = farm.workers()
        finally:
            if owned:
                farm.shutdown()

    ratio = two["wall_s"] / one["wall_s"]
    cap = args.vram_cap_gb * GIB
    peaks = {}
    for row in one["jobs"] + two["jobs"]:
        peaks[row["worker"]] = max(peaks.get(row["worker"], 0), row["peak_reserved"])
    under_cap = all(p <= cap for p in peaks.values())
    print(f"\none worker : {args.jobs} jobs in {one['wall_s']:.1f} s")
    print(f"two workers: {args.jobs} jobs in {two['wall_s']:.1f} s")
    print(f"ratio two/one: {ratio:.3f} (target <= 0.55: {'met' if ratio <= 0.55 else 'NOT met'})")
    for name, peak in sorted(peaks.items()):
        print(f"{name}: peak reserved {peak / GIB:.2f} GiB (cap {args.vram_cap_gb:g} GB: "
              f"{'held' if peak <= cap else 'EXCEEDED'})")
    import torch

    args.out.write_text(json.dumps({
        "tiny": args.tiny, "seconds": args.seconds, "steps": args.steps, "vram_cap_gb": args.vram_cap_gb,
        "preserved_gb": args.preserved_gb, "workers": workers, "build_s": build, "one_worker": one,
        "two_workers": two, "ratio": round(ratio, 4), "peak_reserved": peaks, "cap_held": under_cap,
        "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}, indent=1))
    return 0 if under_cap else 1


if __name__ == "__main__":
    raise SystemExit(main())
