"""One video on several GPUs, end to end: the same job through the command line (`python -m cli generate`, the
real loading path from a `--model-dir`) once per `--gpus-per-job` value, compared.

Each run is its own CLI process (HF_HUB_OFFLINE=1, a fresh prompt cache: every run encodes its prompt) on the
5 s / 25-step / 608×640 job (TeaCache off, eager blocks, 20 GB VRAM cap, 6 GB preserved, seed 31337), the models
saved by benchmarks/hostram_weights.py (full-size random weights in the real repos' layout, ~42 GB; `--tiny`: the
tiny models, a 1.2 s / 3-step 64×64 job on the CPU). Per run: the process's wall time, the job's stage times
(job.json `timings`, each stage's peak reserved VRAM), every process's loading (the models set up, the weights
read into host RAM: from the log, where the helpers' lines come too, jobs/split.py), each GPU's peak memory as `nvidia-smi` sees it (sampled every
0.2 s), and the final video. Every run is compared with the run of the fewest GPUs: the ratios of the wall time,
the job's total and its sampling (`transformer`), and the max / mean absolute difference of the latents and of
final.mp4's decoded frames (0–255).

    python3 benchmarks/split_job.py --save-weights /tmp/w --out /tmp/sj --gpus 2,1       # save ~80 s, then 2 jobs
    python3 benchmarks/split_job.py --model-dir /tmp/w --out /tmp/sj --gpus 1,2
    python3 benchmarks/split_job.py --tiny --out /tmp/sj --gpus 1,2                      # CPU, gloo (a rehearsal)

Results: OUT/split_job.json (rewritten after each run, so a run cut short keeps the ones before), OUT/log-N.txt.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

if not __package__:          # `python3 benchmarks/<this>.py`: run again as a module (benchmarks/_script.py)
    import _script

    _script.as_module(__file__)

from benchmarks.hostram_weights import save_weights  # noqa: E402

log = logging.getLogger("benchmarks.split_job")

PROMPT = "a red fox runs through fresh snow"
_PROCESS = r"\d\d:\d\d:\d\d INFO (?:\[(?P<process>\S+)\] )?"        # cli/log.py's line, a helper's (jobs/split.py)
_READINGS = {
    "models_s": re.compile(_PROCESS + r"jobs\.models: the \S+ models for mode \S+ loaded in (?P<s>[\d.]+) s"),
    "host_read_s": re.compile(_PROCESS + r"memory\.hostram: host plan: (?P<gb>[\d.]+) GB read from the weight files "
                              r"into RAM in (?P<s>[\d.]+) s")}


def job_args(tiny: bool, image: Path, n: int, host_ram_gb: float, outputs: Path) -> list[str]:
    """The command line of one run (`n` GPUs, or CPU processes with --tiny)."""
    job = ["--seconds", "1.2", "--steps", "3", "--resolution", "64", "--device", "cpu"] if tiny else \
        ["--seconds", "5", "--steps", "25", "--vram-cap-gb", "20", "--preserved-gb", "6"]
    return ["generate", "--image", str(image), "--prompt", PROMPT, "--seed", "31337", "--teacache", "0",
            "--no-compile", *job, "--gpus-per-job", str(n), "--host-ram-gb", str(host_ram_gb * n),
            "--outputs", str(outputs), "-v"]


def _sample_gpus(peaks: dict, stop: threading.Event) -> None:
    """Each GPU's largest memory.used (MiB) while `stop` is not set (nothing where nvidia-smi is absent)."""
    smi = shutil.which("nvidia-smi")
    while smi and not stop.wait(0.2):
        try:
            out = subprocess.run([smi, "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=5).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        for line in out.splitlines():
            index, used = (x.strip() for x in line.split(","))
            peaks[index] = max(peaks.get(index, 0), int(used))


def _meminfo() -> dict:
    """MemTotal / MemAvailable / Cached in GiB (a lent machine's memory grows as it is used: it is recorded)."""
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
    except OSError:
        return {}
    keys = ("MemTotal", "MemAvailable", "Cached")
    return {k: int(v.split()[0]) / 2**20 for k, v in (x.split(":", 1) for x in lines) if k in keys}


def loading_times(log_text: str) -> dict:
    """Each process's loading from its log lines ("main": the first process, else a helper's device):
    `models_s` (the models set up, their weights not read yet), `host_read_s` / `host_read_gb` (the weights read
    into host RAM at the job's start, memory/hostram.py)."""
    found: dict = {}
    for line in log_text.splitlines():
        for key, pattern in _READINGS.items():
            m = pattern.search(line)          # (a progress bar can start the terminal's line)
            if m:
                got = found.setdefault(m.group("process") or "main", {})
                got[key] = float(m.group("s"))
                if "gb" in pattern.groupindex:
                    got["host_read_gb"] = float(m.group("gb"))
    return found


def compare(first: Path, other: Path) -> dict:
    """Max / mean absolute difference of two job folders' latents and final.mp4 frames."""
    from safetensors.torch import load_file

    out = {}
    a, b = load_file(str(first / "latents.safetensors")), load_file(str(other / "latents.safetensors"))
    diffs = [(a[k].float() - b[k].float()).abs() for k in sorted(a) if k in b and a[k].shape == b[k].shape]
    if diffs:
        out["latents_max_abs"] = max(float(d.max()) for d in diffs)
        out["latents_mean_abs"] = sum(float(d.sum()) for d in diffs) / sum(d.numel() for d in diffs)
    try:
        from video.mp4 import read_frames

        fa, fb = read_frames(first / "final.mp4"), read_frames(other / "final.mp4")
    except ImportError:
        return out
    if fa.shape == fb.shape:
        d = abs(fa.astype("int16") - fb.astype("int16"))
        out.update(frames=int(fa.shape[0]), frames_max_abs=int(d.max()), frames_mean_abs=float(d.mean()))
    else:
        out["frames_shapes"] = [list(fa.shape), list(fb.shape)]
    return out


def run_one(n: int, model_dir: Path, image: Path, out: Path, tiny: bool, host_ram_gb: float,
            timeout: float, jobs_dir: Path) -> dict:
    """One CLI run with --gpus-per-job n (its job folder under `jobs_dir`); its figures."""
    from benchmarks._script import repo_env

    outputs = jobs_dir / f"jobs-{n}"
    prompts = jobs_dir / f"prompt-cache-{n}"
    for folder in (outputs, prompts):
        shutil.rmtree(folder, ignore_errors=True)
    env = repo_env(dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", STEADYFRAME_PROMPT_CACHE=str(prompts)))
    cmd = [sys.executable, "-m", "cli", *job_args(tiny, image, n, host_ram_gb, outputs), "--model-dir", str(model_dir)]
    peaks: dict = {}
    result_before = _meminfo()
    stop = threading.Event()
    sampler = threading.Thread(target=_sample_gpus, args=(peaks, stop), daemon=True)
    sampler.start()
    logfile = out / f"log-{n}.txt"
    t0 = time.perf_counter()
    with open(logfile, "w") as f:
        try:
            rc = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    wall = time.perf_counter() - t0
    stop.set()
    sampler.join()
    result = {"gpus_per_job": n, "returncode": rc, "wall_s": wall, "command": " ".join(cmd[1:]),
              "gpu_peak_used_mib": peaks, "meminfo_before": result_before,
              "loading": loading_times(logfile.read_text(errors="replace"))}
    jobs = sorted(p.parent for p in outputs.glob("*/job.json"))
    if jobs:
        info = json.loads((jobs[-1] / "job.json").read_text())
        stages = info.get("memory", {}).get("stages", [])
        result.update(job_dir=str(jobs[-1]), status=info.get("status"), timings=info.get("timings"),
                      stages=[{k: s.get(k) for k in ("name", "seconds", "peak_reserved")} for s in stages],
                      peak_reserved_gib=max((s.get("peak_reserved") or 0 for s in stages), default=0) / 2**30,
                      transformer_per_section_s=[s.get("seconds") for s in stages if s.get("name") == "transformer"],
                      final_sha256=info.get("final_sha256"))
    result["meminfo_after"] = _meminfo()
    log.info("--gpus-per-job %d: rc %s, %.1f s (log: %s)", n, rc, wall, logfile)
    return result


def summarize(runs: list[dict]) -> dict:
    """Every run against the run of the fewest GPUs: the ratios and the differences of the results."""
    first = min(runs, key=lambda r: r["gpus_per_job"])
    out = {}
    for r in runs:
        if r is first or r.get("status") != "done" or first.get("status") != "done":
            continue
        t1, tn = first["timings"], r["timings"]
        out[f"{r['gpus_per_job']}/{first['gpus_per_job']}"] = {
            "wall": r["wall_s"] / first["wall_s"],
            "job_total": tn["total"] / t1["total"],
            "sampling": tn["transformer"] / t1["transformer"],
            "other_stages_s": [t1["total"] - t1["transformer"], tn["total"] - tn["transformer"]],
            **compare(Path(first["job_dir"]), Path(r["job_dir"]))}
    return out


def main(argv=None) -> int:
    import rocm

    rocm.apply_env_profile()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for the results")
    ap.add_argument("--save-weights", type=Path, help="save full-size random models here first (real layout)")
    ap.add_argument("--model-dir", type=Path, help="the saved models (what --save-weights wrote)")
    ap.add_argument("--gpus", default="1,2", help="the --gpus-per-job values, in turn (default 1,2)")
    ap.add_argument("--tiny", action="store_true", help="the tiny models on the CPU (a rehearsal)")
    ap.add_argument("--host-ram-gb", type=float, default=100.0,
                    help="host-RAM budget per process (each run gets N times it; default 100: the models held)")
    ap.add_argument("--timeout", type=float, default=540, help="seconds per run (default 540)")
    ap.add_argument("--jobs-dir", type=Path, help="where the job folders go (default: --out)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    tmp = None
    if args.tiny and args.model_dir is None and args.save_weights is None:
        tmp = tempfile.TemporaryDirectory(prefix="steadyframe-split-job-")
        args.save_weights = Path(tmp.name)
    results: dict = {"runs": []}
    target = args.out / "split_job.json"
    try:
        if args.save_weights:
            results["save"] = save_weights(args.save_weights, args.tiny)
            args.model_dir = args.model_dir or args.save_weights
            target.write_text(json.dumps(results, indent=1, default=str))
        if args.model_dir is None:
            ap.error("--model-dir (or --save-weights) is needed")
        from benchmarks.section import _image

        image = args.out / "input.png"
        _image(*((64, 64) if args.tiny else (608, 640))).save(image)
        for n in (int(x) for x in args.gpus.split(",")):
            results["runs"].append(run_one(n, args.model_dir, image, args.out, args.tiny, args.host_ram_gb,
                                           args.timeout, args.jobs_dir or args.out))
            results["compared"] = summarize(results["runs"])
            target.write_text(json.dumps(results, indent=1, default=str))
    finally:
        if tmp is not None:
            tmp.cleanup()
    print(json.dumps(results.get("compared", {}), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
