"""Host RAM: the real loading path and the host-RAM budget, measured on one job inside Linux memory cgroups.

1. `--save-weights DIR` (benchmarks/hostram_weights.py): full-size models with random weights (benchmarks/fullsize.py),
   built one at a time and saved as safetensors in the real repos' layout and sharding (configs, tokenizers, feature
   extractor), ~42 GB.
2. `--config a|b|c|cold|fp8step --model-dir DIR --out RESULTS`: one configuration in a child process that loads the
   models through the real path (`--model-dir`, HF_HUB_OFFLINE=1) and runs the 5 s / 25-step / 608×640 job (TeaCache
   off, 20 GB VRAM cap, 6 GB preserved):
     a     as today: no host limit (the default budget of a large machine), bf16
     b     inside a cgroup v2 with memory.max = 24 GiB, --host-ram-gb 24, bf16
     c     inside memory.max = 16 GiB, --host-ram-gb 16, fp8 storage
     cold  (b) after `sync; echo 3 > /proc/sys/vm/drop_caches`, stopped after the first sampling step
     b2    (b), then the same job again in the same process (the prompt cache skips the text encoders)
     b0    (b) with the late read and the parking off (STEADYFRAME_LATE_LOAD=0 STEADYFRAME_PARK=0)
     fp8step  one transformer step (real shapes, random inputs) with bf16 and with fp8 weights: relative error
   `--config all` runs all of them in turn; `--report` combines RESULTS/*.json into a table, with the
   relative error of (c)'s latents against (a)'s (whole job, and the first section generated).
   Every config starts with the weight files evicted from the page cache (what it reads is charged to its own
   cgroup, as on a machine with that much RAM); `cold` drops the whole page cache. Per config: end-to-end job time, per-stage times, load and host-arrangement time, time to the first step (since
   the child process started), cgroup memory.peak, RSS peaks sampled every 50 ms (anon, file, shmem), pinned bytes
   (the host plan's), VRAM peak, bytes read from the weight files, and the raw-frame sha256 of the video.
   If cgroup v2 with the memory controller is not writable here, the script says so and runs without the limit
   (the host plan still obeys --host-ram-gb).
3. `--tiny`: the same with the tiny preset saved to a temporary folder (CPU is fine): budgets "tight" (the smallest
   plan of each storage) instead of 24/16 GiB, a 1.2 s job of 3 steps.

    python3 benchmarks/hostram.py --save-weights /tmp/w --out /tmp/r --config a          # first command (~8 min)
    python3 benchmarks/hostram.py --model-dir /tmp/w --out /tmp/r --config b             # each ≤ 4 min
    python3 benchmarks/hostram.py --model-dir /tmp/w --out /tmp/r --report
    python3 benchmarks/hostram.py --tiny --out /tmp/r --config all --report
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

if not __package__:          # `python3 benchmarks/<this>.py`: run again as a module (benchmarks/_script.py)
    import _script

    _script.as_module(__file__)

from benchmarks.hostram_report import report  # noqa: E402
from benchmarks.hostram_weights import save_weights  # noqa: E402
from benchmarks.machine_memory import Cgroup, drop_caches, evict_weight_files, sample_rss  # noqa: E402
from common.environment import read_environment  # noqa: E402
from common.units import GIB  # noqa: E402

log = logging.getLogger("benchmarks.hostram")


@dataclass(frozen=True)
class Config:
    name: str
    what: str
    budget_gb: float | str | None          # None: the machine's default; "tight": the smallest plan (tiny runs)
    storage: str = "native"
    cgroup_gb: float | None = None
    cold: bool = False
    jobs: int = 1                          # > 1: the same job again in the same process (the prompt is cached)
    env: tuple[tuple[str, str], ...] = ()  # environment of the child (switches compared within one run)


CONFIGS = {
    "a": Config("a", "as today: no host limit, bf16", None),
    "b": Config("b", "cgroup 24 GiB, --host-ram-gb 24, bf16", 24, cgroup_gb=24),
    "c": Config("c", "cgroup 16 GiB, --host-ram-gb 16, fp8", 16, "fp8", cgroup_gb=16),
    "cold": Config("cold", "(b) with the page cache dropped, until the first step", 24, cgroup_gb=24, cold=True),
    "fp8step": Config("fp8step", "one transformer step, bf16 vs fp8 weights", None),
    "b2": Config("b2", "(b), then the same job again (its prompt cached)", 24, cgroup_gb=24, jobs=2),
    "b0": Config("b0", "(b) with every file-homed block read before each section (no late read, no parking)", 24,
                 cgroup_gb=24, env=(("STEADYFRAME_LATE_LOAD", "0"), ("STEADYFRAME_PARK", "0"))),
}
TINY_CONFIGS = {
    "a": Config("a", "no host limit", None),
    "b": Config("b", "the smallest plan, native", "tight", cgroup_gb=3),
    "c": Config("c", "the smallest plan, fp8", "tight", "fp8", cgroup_gb=3),
    "cold": Config("cold", "(b) with the page cache dropped, until the first step", "tight", cold=True),
    "fp8step": Config("fp8step", "one transformer step, native vs fp8 weights", None),
    "b2": Config("b2", "(b), then the same job again (its prompt cached)", "tight", jobs=2),
    "b0": Config("b0", "(b) without late read and parking", "tight", cgroup_gb=3,
                 env=(("STEADYFRAME_LATE_LOAD", "0"), ("STEADYFRAME_PARK", "0"))),
}


def _preset(tiny: bool):
    from configs.presets import HUNYUAN

    if not tiny:
        return HUNYUAN
    fp32 = {r: dataclasses.replace(getattr(HUNYUAN, r), dtype="float32")
            for r in ("text_encoder", "text_encoder_2", "vae", "image_encoder", "transformer", "transformer_f1")}
    return dataclasses.replace(HUNYUAN, default_resolution=64, **fp32)


# ---- 2a. the child: one configuration ---------------------------------------------------------------------------
def _since_start() -> float:
    import psutil

    return time.time() - psutil.Process().create_time()


def _job_request(tiny: bool):
    from benchmarks.section import _image
    from pipeline.request import Request

    h, w = (64, 64) if tiny else (608, 640)
    return Request(image=_image(h, w), prompt="a red fox runs through fresh snow", seconds=1.2 if tiny else 5.0,
                   steps=3 if tiny else 25, teacache=0.0, seed=31337)


def _memory(cfg: Config, tiny: bool):
    import torch

    from memory.manager import MemoryManager

    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    budget = None if cfg.budget_gb in (None, "tight") else float(cfg.budget_gb)
    env = read_environment()           # the configuration's switches (b0 turns the late read and the parking off)
    switches = {k: v for k, v in (("late_load", env.late_load), ("park", env.park)) if v is not None}
    memory = MemoryManager(device=device, cap_gb=20.0, preserved_gb=6.0, host_ram_gb=budget,
                           weight_storage=cfg.storage, **switches)
    memory.apply_cap()
    return memory


def _arrange(memory, comps, cfg: Config, request) -> float:
    """The host arrangement before the job (reported as load time; the job's own call is then a no-op)."""
    from memory.hostplan import FRAMEPACK_STAGES, HostBudgetError
    from pipeline import sections as sec
    from pipeline.request import prepare

    prepared = prepare(request, comps.preset.default_resolution)
    memory.set_workload(prepared.height, prepared.width, request.latent_window)
    plan = sec.make_plan("original", request.seconds, request.latent_window)
    frames = plan.frame_counts()[-1]
    if cfg.budget_gb == "tight":            # the smallest budget this job's plan accepts, for a fixed overhead
        from memory.hostbudget import job_working_bytes, process_overhead
        from memory.hostpack import HostPack

        held = sum(HostPack.of(m).host_bytes for m in comps.models().values())
        memory.host_overhead = (process_overhead(held, memory.device.type == "cuda")
                                + job_working_bytes(frames, prepared.height, prepared.width, request.latent_window))
        memory.host_ram_gb = 0.001
        try:
            memory.arrange_host(comps.models(), FRAMEPACK_STAGES, plan.count, frames)
        except HostBudgetError as e:
            memory.host_ram_gb = e.minimum / GIB
    t0 = time.perf_counter()
    memory.arrange_host(comps.models(), FRAMEPACK_STAGES, plan.count, frames)
    return time.perf_counter() - t0


def fp8_step(model_dir: Path, tiny: bool) -> dict:
    """One denoiser step on the real loading path with bf16 weights, then with fp8 weights; relative error."""
    import torch

    from benchmarks.transformer_step import section_inputs
    from memory import fp8
    from memory.hostplan import StageUse
    from pipeline.components import load_components
    from pipeline.denoiser import FramepackDenoiser

    comps = load_components(_preset(tiny), "original", model_dir=model_dir)
    tr = comps.transformer
    h, w = (64, 64) if tiny else (608, 640)
    inputs = section_inputs(tr, h, w, 9, 16 if tiny else 729, seed=0)
    ctx, idx, shape, image, texts, noise = inputs
    out = {}
    for storage in ("native", "fp8"):
        memory = _memory(Config("x", "", None, storage), tiny)
        memory.set_workload(h, w, 9)
        memory.arrange_host({"transformer": tr}, [StageUse("transformer", ("transformer",), "section")])
        with memory.stage("transformer", transformer=tr) as rec, torch.no_grad():
            den = FramepackDenoiser(tr, 0.0, 1)
            den.begin_section(ctx, idx, shape, image, texts, 10.0)
            out[storage] = den(noise.to(memory.device), torch.tensor([900.0])).float().cpu()
            den.end_section()
        out[f"{storage}_placement"] = rec.placement["transformer"]
    return {"step_relative_error": fp8.relative_error(out["fp8"], out["native"]),
            "placement_native": out["native_placement"], "placement_fp8": out["fp8_placement"]}


def _job_fingerprint(job_dir) -> dict:
    """What tells two runs of one job apart, stage by stage: the latents' hash (the sampling's result), the VAE
    decode attempts (tiling, memory available, retries: tiles change pixels), and the frames' hash."""
    if not job_dir:
        return {}
    import torch

    folder = Path(job_dir)
    info = json.loads((folder / "job.json").read_text())
    latents = folder / "latents.safetensors"
    stages = info.get("memory", {}).get("stages", [])
    digest = None
    if latents.is_file():                    # the tensors only: the file's metadata names the job
        from safetensors.torch import load_file

        tensors = load_file(str(latents))
        digest = hashlib.sha256(b"".join(tensors[k].contiguous().view(-1).view(torch.uint8).numpy().tobytes()
                                         for k in sorted(tensors))).hexdigest()
    return {"latents_sha256": digest,
            "vae_attempts": [a for s in stages for a in s.get("vae_attempts", [])],
            "vae_tilings": [(a.get("tiling"), a.get("fallback"), a.get("ok")) for s in stages
                            for a in s.get("vae_attempts", [])],
            "video_sha256": hashlib.sha256("".join(x["frames_sha256"] for x in info["sections"]).encode())
            .hexdigest() if info.get("sections") else None}


def child(cfg: Config, model_dir: Path, result: Path, tiny: bool) -> None:
    started = _since_start()
    import torch

    from pipeline.cancel import CancelToken
    from pipeline.events import Done, Failed, Progress
    from pipeline.orchestrator import generate
    from pipeline.request import prepare

    if cfg.name == "fp8step":
        result.write_text(json.dumps(fp8_step(model_dir, tiny), indent=1))
        return
    from benchmarks.section import _ensure_video_writer
    from pipeline.components import load_components

    video = _ensure_video_writer()
    t0 = time.perf_counter()
    comps = load_components(_preset(tiny), "original", model_dir=model_dir)
    load_s = time.perf_counter() - t0
    memory = _memory(cfg, tiny)
    request = _job_request(tiny)
    arrange_s = _arrange(memory, comps, cfg, request)
    prepared = prepare(request, comps.preset.default_resolution)
    outputs = result.parent / "jobs" / cfg.name

    def run_job(memory):
        cancel, first_step, last = CancelToken(), None, None
        t0 = time.perf_counter()
        for ev in generate(prepared, comps, memory, cancel=cancel, outputs=outputs):
            if first_step is None and isinstance(ev, Progress) and ev.stage == "sampling" and ev.step >= 1:
                first_step = _since_start()
                if cfg.cold:
                    cancel.cancel()
            last = ev
        return last, time.perf_counter() - t0, first_step

    last, job_s, first_step = run_job(memory)
    repeats = []
    for _ in range(cfg.jobs - 1):                   # a new manager per job, as the app makes
        again = _memory(cfg, tiny)
        again.host_ram_gb, again.host_overhead = memory.host_ram_gb, memory.host_overhead
        r_last, r_s, _ = run_job(again)
        r_info = json.loads((Path(r_last.job_dir) / "job.json").read_text()) if r_last.job_dir else {}
        repeats.append({"job_s": r_s, "status": type(r_last).__name__, "timings": r_info.get("timings"),
                        "stages": [st["name"] for st in r_info.get("memory", {}).get("stages", [])],
                        **_job_fingerprint(r_last.job_dir)})
    out = {"config": cfg.name, "what": cfg.what, "device": torch.cuda.get_device_name() if torch.cuda.is_available()
           else "cpu", "torch": torch.__version__, "video_written": video, "python_started_s": started,
           "load_s": load_s, "arrange_s": arrange_s, "job_s": job_s, "first_step_since_start_s": first_step,
           "status": type(last).__name__, "message": getattr(last, "message", ""), "repeats": repeats}
    job_dir = getattr(last, "job_dir", None)
    if job_dir:
        info = json.loads((Path(job_dir) / "job.json").read_text())
        stages = info.get("memory", {}).get("stages", [])
        out.update(job_dir=str(job_dir), timings=info.get("timings"), host=info.get("memory", {}).get("host"),
                   vram_peak_reserved=max((s["peak_reserved"] for s in stages), default=0),
                   file_bytes_in_stages=sum(s.get("file_bytes", 0) for s in stages),
                   stages=[{k: s.get(k, 0) for k in ("name", "seconds", "load_s", "file_bytes", "parked_bytes",
                                                     "peak_reserved")} for s in stages], **_job_fingerprint(job_dir))
    if isinstance(last, Failed):
        out["detail"] = last.detail[-3000:]
    assert isinstance(last, (Done, Failed))
    result.write_text(json.dumps(out, indent=1, default=str))


# ---- 2b. the parent: cgroup, sampling, one child per configuration ----------------------------------------------
def run_config(cfg: Config, model_dir: Path, results: Path, tiny: bool, timeout: float) -> dict:
    result = results / f"{cfg.name}.json"
    result.unlink(missing_ok=True)
    # every config starts with the weight files out of the page cache; `cold` drops the whole page cache (libraries
    # too) — only on full-size runs (the lent GPU machine), never on a shared development machine
    evicted = evict_weight_files(model_dir)
    cache = (drop_caches() if not tiny else "not dropped (--tiny)") if cfg.cold else "weight files evicted"
    cg = Cgroup(cfg.name, int(cfg.cgroup_gb * GIB)) if cfg.cgroup_gb else None
    if cg is not None and cg.path is None:
        log.warning("config %s: %s; running without a cgroup limit (the host plan still obeys its budget)", cfg.name,
                    cg.reason)
    prompts = results / "prompt-cache" / cfg.name              # every config encodes its prompt (a fresh cache)
    if prompts.exists():
        import shutil

        shutil.rmtree(prompts)
    from benchmarks._script import repo_env

    env = repo_env(dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", STEADYFRAME_PROMPT_CACHE=str(prompts),
                        **dict(cfg.env)))
    cmd = [sys.executable, "-m", "benchmarks.hostram", "--child", cfg.name, "--model-dir", str(model_dir),
           "--out", str(results)] + (["--tiny"] if tiny else [])
    peaks: dict = {}
    stop = threading.Event()
    with open(results / f"{cfg.name}.log", "w") as logf:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=logf, stderr=subprocess.STDOUT,
                                preexec_fn=cg.enter if cg is not None and cg.path else None)
        sampler = threading.Thread(target=sample_rss, args=(proc.pid, peaks, stop), daemon=True)
        sampler.start()
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        wall = time.perf_counter() - t0
        stop.set()
        sampler.join()
    out = json.loads(result.read_text()) if result.exists() else {"config": cfg.name, "status": "no result"}
    out.update(returncode=rc, wall_s=wall, rss_peak=peaks, page_cache=cache, evicted_bytes=evicted,
               budget_gb=cfg.budget_gb,
               storage=cfg.storage, **(cg.read() if cg is not None else {"cgroup": None}))
    if cg is not None:
        cg.remove()
    result.write_text(json.dumps(out, indent=1, default=str))
    log.info("config %s: %s, job %.1f s, rc %s (log: %s)", cfg.name, out.get("status", "done"),
             out.get("job_s") or 0, rc, results / f"{cfg.name}.log")
    return out


def main(argv=None) -> int:
    import rocm

    rocm.apply_env_profile()        # what app.py does first (the allocator's mode included): measure the same
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for the results (one JSON per config)")
    ap.add_argument("--save-weights", type=Path, help="save full-size random models here in the real layout")
    ap.add_argument("--model-dir", type=Path, help="the saved models (what --save-weights wrote)")
    ap.add_argument("--config", help="a, b, c, cold, fp8step, or all (comma-separated allowed)")
    ap.add_argument("--report", action="store_true", help="combine the results in --out into a table")
    ap.add_argument("--tiny", action="store_true", help="the tiny preset, saved to a temporary folder (CPU is fine)")
    ap.add_argument("--timeout", type=float, default=540, help="seconds per config (default 540)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    configs = TINY_CONFIGS if args.tiny else CONFIGS
    if args.child:
        child(configs[args.child], args.model_dir, args.out / f"{args.child}.json", args.tiny)
        return 0
    tmp = None
    if args.tiny and args.model_dir is None and args.save_weights is None:
        tmp = tempfile.TemporaryDirectory(prefix="steadyframe-hostram-")
        args.save_weights = Path(tmp.name)
    try:
        if args.save_weights:
            saved = save_weights(args.save_weights, args.tiny)
            (args.out / "save.json").write_text(json.dumps(saved, indent=1))
            log.info("weights saved: %.1f GB on disk in %.0f s", saved["bytes_on_disk"] / 1e9, saved["seconds"])
            args.model_dir = args.model_dir or args.save_weights
        if args.config:
            names = list(configs) if args.config == "all" else args.config.split(",")
            unknown = [n for n in names if n not in configs]
            if unknown:
                ap.error(f"--config: unknown {', '.join(unknown)}; choose from {', '.join(configs)} or all")
            if args.model_dir is None:
                ap.error("--config needs --model-dir (or --save-weights)")
            for name in names:
                run_config(configs[name], args.model_dir, args.out, args.tiny, args.timeout)
        if args.report:
            report(args.out)
    finally:
        if tmp is not None:
            tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
