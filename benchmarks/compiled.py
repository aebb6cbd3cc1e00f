"""Compiled transformer blocks and fp8 compute against today's eager bf16 (issue 30), full-size random weights.

`step`: one transformer step (the pipeline's FramepackDenoiser after `begin_section`, the first section's real
context at 608×640, window 9) resident and under the 20 GB cap (preserved 6, prefetch 1, streamed as the app
streams), for eager bf16, compiled blocks and fp8 compute (compiled, weights kept in fp8); with `--variants`, also
attn8 (compiled + fp8 attention, rocm/fp8_attention.py) and fp8+attn8 (fp8 compute + fp8 attention; after fp8, which
converts the transformer); a variant ending in `/fa4` (eager/fa4, compiled/fa4, fp8/fa4) has the bf16 attention
through FlashAttention-4 where installed (rocm/sdpa.py), the others through PyTorch's fused kernels; the median of `--steps` steps after `--warmup`, the first compiled call timed apart
(kernel preparation), the arithmetic floor beside each (block Linears 2.5e14 FLOP + attention 2.5e14 a step at the
GPU's dense bf16 / fp8 peaks). Error against eager bf16 (relative Frobenius norm): one step's output, and a whole
section's latents (25 sampling steps of the real sampler from the same noise).

`jobs`: whole jobs through the orchestrator (all five full-size models, 20 GB cap, preserved 6) in one process, one
per `--jobs` entry: eager | compiled | lora (compiled + one random rank-16 LoRA on every block Linear) | teacache
(compiled + TeaCache 0.15) | attn8 (compiled + fp8 attention) | fp8 (compiled + fp8 compute; converts the
transformer, so it and fp8+attn8 (fp8 compute + fp8 attention) come last), and their joins with `+` (fp8+attn8+lora,
fp8+attn8+teacache: the LoRA or TeaCache on that variant); as in `step`, a job ending in
`/fa4` (eager/fa4, compiled/fa4, fp8/fa4, ...) has the bf16 attention through FlashAttention-4 where installed, the
others through PyTorch's fused kernels (so `eager` is today's eager job whether or not flash-attn-4 is here). Per job: end
to end, the transformer's sampling, the kernel preparation, the graphs dynamo compiled during the job (0 = no
recompile). The final latents of each job are saved in `--latents` (`<variant>-<n>.safetensors`, a `/` written
as `_`) and compared with the first job's (and, with `--compare`, with the latents another process saved); `--out`
is written again after each job (a run cut short keeps the jobs it finished).

    python3 benchmarks/compiled.py step --out step.json
    TORCHINDUCTOR_CACHE_DIR=/tmp/ind python3 benchmarks/compiled.py jobs --jobs eager,compiled --latents lat \
        --out cold.json          # a fresh process: the first compiled job compiles (cold cache)
    TORCHINDUCTOR_CACHE_DIR=/tmp/ind python3 benchmarks/compiled.py jobs --jobs compiled,compiled --latents lat \
        --compare lat/eager-0.safetensors --out warm.json     # a restarted process: warm cache, then a second job
    python3 benchmarks/compiled.py jobs --jobs eager,compiled/fa4,compiled/fa4 --latents lat --out fa4.json
    python3 benchmarks/compiled.py jobs --tiny --jobs eager,compiled --force --out t.json     # CPU, tiny preset
"""
from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path

import torch

if not __package__:          # `python3 benchmarks/<this>.py`: run again as a module (benchmarks/_script.py)
    import _script

    _script.as_module(__file__)

from common.units import GIB  # noqa: E402

log = logging.getLogger("benchmarks.compiled")
LINEAR_FLOP, ATTENTION_FLOP = 2.5e14, 2.5e14      # one full-size step at 608×640, window 9 (issue 46)
DENSE_PEAKS = (989e12, 1979e12)                    # H100 / H200 dense bf16, fp8 FLOP/s (the floor's peaks)


def split_variant(variant: str) -> tuple[str, bool]:
    """A variant's kind (what comes before any `/`) and whether its bf16 attention may run through FlashAttention-4
    (the suffix `/fa4`; without it the variant runs inside `rocm.sdpa.flash_attention_4(False)`)."""
    kind, _, kernel = variant.partition("/")
    if kernel not in ("", "fa4"):
        raise SystemExit(f"unknown attention kernel {kernel!r} in {variant!r} (only /fa4)")
    return kind, kernel == "fa4"


def floor_s(variant: str) -> float:
    """The step's arithmetic floor: its products at the dense peak of the precision they run in."""
    bf16, fp8 = DENSE_PEAKS
    variant = split_variant(variant)[0]
    return (LINEAR_FLOP / (fp8 if variant.startswith("fp8") else bf16)
            + ATTENTION_FLOP / (fp8 if variant.endswith("attn8") else bf16))


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative Frobenius norm of a - b against b."""
    a, b = a.float().cpu(), b.float().cpu()
    return float((a - b).norm() / b.norm())


# ---- step -------------------------------------------------------------------------------------------------------
def _section_latents(tr, inputs, device, steps: int) -> torch.Tensor:
    """A whole section sampled with the real sampler (no CFG) from the inputs' noise, resident."""
    from memory.manager import MemoryManager
    from pipeline.denoiser import FramepackDenoiser
    from pipeline.sampling import sample_section

    ctx, idx, shape, image, texts, noise = inputs
    mm = MemoryManager(device=device, cap_gb=1e3, preserved_gb=6.0, plan_on_cpu=device.type == "cpu")
    mm.apply_cap()           # (the last step's 20 GB cap is a process-wide limit: lift it)
    with mm.stage("transformer", transformer=tr):
        den = FramepackDenoiser(tr, 0.0, steps)
        den.begin_section(ctx, idx, shape, image, texts, 10.0)
        gen = sample_section(den, noise.to(device), sampler="unipc", steps=steps, cfg=1.0, rescale=0.0)
        try:
            while True:
                next(gen)
        except StopIteration as done:
            out = done.value
        den.end_section()
    return out.float().cpu()


def step_main(args) -> None:
    from benchmarks.transformer_step import section_inputs, transformer_on_device
    from memory.hostpack import HostPack
    from pipeline import compiled
    from rocm.sdpa import flash_attention_4, fp8_attention

    if args.plain_blocks:         # diffusers' forwards compiled as they are (before pipeline/block_forms.py)
        from pipeline import block_forms

        block_forms.compiled_form = lambda cls: cls.forward
        block_forms.fuse_blocks = lambda blocks: None
    device, tr, height, width, image_tokens, build_s = transformer_on_device(args.tiny)
    pack = HostPack.of(tr)
    pack.set_pinned(device.type == "cuda")
    inputs = section_inputs(tr, height, width, 9, image_tokens)
    total_gb = torch.cuda.get_device_properties(device).total_memory / GIB if device.type == "cuda" else 1e3
    if args.tiny:
        caps = {"resident": (total_gb, 1.0), "cap": (1.0 + (pack.rest.nbytes + pack.blocks[0].nbytes) / GIB, 1.0)}
    else:
        caps = {"resident": (total_gb, 6.0), "20 GB cap": (20.0, 6.0)}
    blocks = compiled.install(tr)
    results, sections = [], {}
    variants = [v for v in args.variants.split(",") if v]
    for variant in variants:
        if variant.startswith("fp8") and not any(isinstance(m, compiled.Fp8Linear) for m in tr.modules()):
            recipe = "rowwise" if args.tiny else compiled.fp8_recipe(device)
            compiled.use_fp8_compute(tr, recipe, device)
        kind, fa4 = split_variant(variant)
        with fp8_attention(kind.endswith("attn8")), flash_attention_4(fa4):
            _step_variant(args, variant, tr, inputs, device, caps, blocks, results, sections)
    cosines = _attention_cosines(tr, inputs, device, caps, blocks) if args.attn_cosine else None
    _report(args, device, build_s, variants, results, sections, cosines)


def _attention_cosines(tr, inputs, device, caps, blocks) -> list | None:
    """Every fp8 attention call of one eager step (resident) against bf16 attention of the same q/k/v (PyTorch's
    fused kernel): [(cosine of the whole output, the worst output row)] in call order (one per block that ran in
    fp8), or None where no call ran in fp8. Eager, so each call's q/k/v are at hand; the kernel and the
    quantization are those the compiled blocks call."""
    import torch.nn.functional as F

    from benchmarks.transformer_step import run_config
    from rocm import fp8_attention as fa
    from rocm import sdpa

    seen: list = []
    last: dict = {}
    quantize, run_fp8 = fa.quantize, sdpa._run_fp8

    def remember(query, key, value, *a, **kw):
        last["qkv"] = (query, key, value)
        return quantize(query, key, value, *a, **kw)

    def compared(query, z, scale):
        out = run_fp8(query, z, scale)
        if out is not None and "qkv" in last:
            q, k, v = last.pop("qkv")
            with sdpa.fp8_attention(False):          # (the guard's bf16 choice; in fp8 this would call itself)
                ref = F.scaled_dot_product_attention(q, k, v, scale=scale).float()
            got = out.float()
            seen.append((F.cosine_similarity(got.flatten(), ref.flatten(), dim=0).item(),
                         F.cosine_similarity(got, ref, dim=-1).min().item()))
        return out

    enabled = blocks.enabled
    blocks.enabled = False
    fa.quantize, sdpa._run_fp8 = remember, compared
    try:
        with sdpa.fp8_attention(True):
            run_config("attention cosines", tr, inputs, device, *caps["resident"], 1, 0, 1)
    except Exception as e:        # a figure missing, not the run: the step table above is kept
        log.error("attention cosines failed: %s", e, exc_info=True)
    finally:
        fa.quantize, sdpa._run_fp8 = quantize, run_fp8
        blocks.enabled = enabled
    if seen:
        log.info("attention cosines over %d calls: whole min %.5f, worst row min %.5f", len(seen),
                 min(c for c, _ in seen), min(r for _, r in seen))
    return seen or None


def _step_variant(args, variant, tr, inputs, device, caps, blocks, results, sections) -> None:
    """One variant's kernel preparation, its steps at each place, and its section's latents (appended)."""
    from benchmarks.transformer_step import run_config
    from pipeline import compiled

    blocks.enabled = split_variant(variant)[0] != "eager"
    prepare_s = None
    if blocks.enabled:        # the first call compiles (timed here, not in the steps)
        before = compiled.compiled_graphs()
        t = time.perf_counter()
        run_config("warm-up", tr, inputs, device, *caps["resident"], 1, 0, 1)
        prepare_s = time.perf_counter() - t
        log.info("%s: kernels prepared in %.1f s (%d graphs)", variant, prepare_s,
                 compiled.compiled_graphs() - before)
    for name, (cap_gb, preserved) in caps.items():
        before = compiled.compiled_graphs()
        r = run_config(f"{variant}, {name}", tr, inputs, device, cap_gb, preserved, 1, args.warmup, args.steps)
        r.update(variant=variant, where=name, prepare_s=prepare_s, floor_s=floor_s(variant),
                 graphs_compiled=compiled.compiled_graphs() - before)
        results.append(r)
    if args.profile:
        results[-len(caps)]["profile"] = _profile_step(variant, tr, inputs, device, caps["resident"])
    if args.section_steps:
        sections[variant] = _section_latents(tr, inputs, device, args.section_steps)


KERNEL_KINDS = (   # (kind, what a kernel's name contains), first match wins; names as CUDA and the CPU's aten ops give them
    ("fused elementwise (Inductor)", ("triton_", "cpp_fused")),   # first: their names can hold "attention"
    ("attention", ("flash", "fmha", "attention", "attn", "sdpa", "cudnn_generated", "FlashAttn")),
    ("matrix products", ("gemm", "cutlass", "nvjet", "xmma", "cublas", "scaled_mm", "aten::mm", "aten::addmm",
                         "aten::bmm", "aten::linear")),
    ("copies", ("Memcpy", "Memset", "aten::copy_", "aten::to")),
)


def _profile_step(variant, tr, inputs, device, resident) -> dict:
    """One resident step of `variant` under torch.profiler: the device time of its kernels by kind (matrix products,
    attention, Inductor's fused elementwise kernels, copies, the rest) and the 30 longest, so the gap between the
    step and its floor is shown kernel by kernel. The stage's weight loading is in "copies"."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.transformer_step import run_config

    cuda = device.type == "cuda"
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]) as prof:
        run_config(f"{variant}, profiled", tr, inputs, device, *resident, 1, 0, 1)
    kernels: dict[str, float] = {}
    for e in prof.key_averages():
        if cuda and (e.device_type != DeviceType.CUDA or e.is_user_annotation):     # kernels, copies, memsets
            continue
        t = (e.self_device_time_total if cuda else e.self_cpu_time_total) / 1e3      # ms
        if t > 0 and (cuda or e.key.startswith(("aten::", "cpp_fused", "triton_", "steadyframe::"))):
            kernels[e.key] = kernels.get(e.key, 0.0) + t
    kinds: dict[str, float] = {}
    for name, t in kernels.items():
        kind = next((k for k, marks in KERNEL_KINDS if any(m in name for m in marks)), "other")
        kinds[kind] = kinds.get(kind, 0.0) + t
    total = sum(kinds.values())
    top = sorted(kernels.items(), key=lambda kv: -kv[1])[:30]
    print(f"\n{variant}: one profiled step, {total:.1f} ms of {'device' if cuda else 'CPU'} time by kind")
    for kind, t in sorted(kinds.items(), key=lambda kv: -kv[1]):
        print(f"  {kind:32s} {t:9.1f} ms  {100 * t / total:5.1f} %")
    for name, t in top:
        print(f"    {t:9.2f} ms  {name[:110]}")
    idle = _step_idle(prof) if cuda else None
    return {"total_ms": round(total, 2), "kinds_ms": {k: round(v, 2) for k, v in kinds.items()},
            "top_ms": [(n[:200], round(t, 3)) for n, t in top], "idle": idle}


def _step_idle(prof) -> dict | None:
    """Where the GPU waits inside the profiled run's last timed step: its events read off the profiler and handed to
    `idle_gaps`, printed."""
    from torch.autograd import DeviceType

    from benchmarks.transformer_step import STEP_MARK

    events = prof.events()
    marks = [e for e in events if e.name == STEP_MARK and e.device_type == DeviceType.CPU]
    if not marks:
        return None
    step = marks[-1].time_range
    kernels, host = [], []
    for e in events:
        r = e.time_range
        if r.end < step.start or r.start > step.end or e.name == STEP_MARK:
            continue
        (kernels if e.device_type == DeviceType.CUDA else host).append((e.name, r.start, r.end))
    idle = idle_gaps(kernels, (step.start, step.end), host)
    print(f"  the last timed step: {idle['step_ms']:.1f} ms, kernels busy {idle['busy_ms']:.1f} ms, GPU idle "
          f"{idle['idle_ms']:.1f} ms (before the first kernel {idle['lead_ms']:.1f}, after the last "
          f"{idle['tail_ms']:.1f}); host waits: {idle['syncs']}")
    for g in idle["gaps"][:15]:
        print(f"    {g['ms']:7.3f} ms after {g['after'][:40]!r} before {g['before'][:40]!r}; host in {g['host']}")
    by_host: dict[str, list[float]] = {}
    for g in idle["gaps"]:
        by_host.setdefault(" > ".join(g["host"][-2:]), []).append(g["ms"])
    for where, ms in sorted(by_host.items(), key=lambda kv: -sum(kv[1]))[:10]:
        print(f"  {sum(ms):8.2f} ms in {len(ms):4d} gaps, the host in {where[:120]}")
    return idle


def idle_gaps(kernels, window, host, *, min_us: float = 50.0) -> dict:
    """The GPU's idle time inside `window` (start, end in µs): `kernels` are (name, start, end) on the device (they
    may overlap, on several streams), `host` the host's (name, start, end) ops and runtime calls. Every gap of at
    least `min_us` between busy stretches, longest first, with the kernels on either side and the host ops spanning
    its start (innermost last), so a gap is put to what the host was doing then; and the host's synchronizing
    runtime calls counted (each drains the device's queue). Written here because the profiler's tables sum time per
    name and give no timeline."""
    start, end = window
    spans = sorted((max(s, start), min(e, end), n) for n, s, e in kernels if e > start and s < end)
    gaps, busy, cursor, last = [], 0.0, start, "(the step's start)"
    for s, e, name in spans:
        if s > cursor:
            gaps.append((cursor, s, last, name))
        if e > cursor:
            busy += e - max(s, cursor)
            cursor, last = e, name
    lead = (spans[0][0] - start) if spans else end - start
    tail = end - cursor
    rows = []
    for s, e, before, after in gaps:
        if e - s < min_us:
            continue
        around = sorted((hs, hs - he, n) for n, hs, he in host if hs <= s < he)     # outermost first
        rows.append({"ms": (e - s) / 1e3, "after": before, "before": after, "host": [n for *_, n in around][-3:]})
    rows.sort(key=lambda r: -r["ms"])
    syncs: dict[str, int] = {}
    for n, _, _ in host:
        if n.startswith("cuda") and ("Synchronize" in n or n == "cudaMemcpy"):
            syncs[n] = syncs.get(n, 0) + 1
    return {"step_ms": (end - start) / 1e3, "busy_ms": busy / 1e3, "idle_ms": (end - start - busy) / 1e3,
            "lead_ms": lead / 1e3, "tail_ms": tail / 1e3, "gaps": rows, "syncs": syncs}


def _report(args, device, build_s, variants, results, sections, cosines=None) -> None:
    base = {r["where"]: r for r in results if r["variant"] == variants[0]}
    for r in results:
        ref = base[r["where"]]
        r["x_eager"] = r["s_per_step"] / ref["s_per_step"]
        r["x_eager_resident"] = r["s_per_step"] / base["resident"]["s_per_step"]
    for r in results:
        r["step_rel_err"] = rel(r["output"], base[r["where"]]["output"])
        r["section_rel_err"] = rel(sections[r["variant"]], sections[variants[0]]) if sections else None
    for r in results:
        r.pop("output")
    meta = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "tiny": args.tiny, "build_s": build_s, "date": time.strftime("%Y-%m-%d"),
            "section_steps": args.section_steps}
    args.out.write_text(json.dumps({"meta": meta, "results": results, "attention_cosines": cosines}, indent=1,
                                   default=str))
    if cosines:
        print(f"fp8 attention against bf16, {len(cosines)} calls of one step: whole-output cosine min "
              f"{min(c for c, _ in cosines):.5f} (mean {sum(c for c, _ in cosines) / len(cosines):.5f}), worst row "
              f"{min(r for _, r in cosines):.5f}")
    print(f"\n{meta['device']}, torch {meta['torch']}")
    print("| variant | where | s/step | floor s | × eager (same place) | × eager resident | kernels prepared s | "
          "graphs in timed steps | peak reserved GiB | step rel. err | section rel. err |\n"
          "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        sec_err = "–" if r["section_rel_err"] is None else f"{r['section_rel_err']:.2e}"
        prep = "–" if r["prepare_s"] is None else f"{r['prepare_s']:.1f}"
        print(f"| {r['variant']} | {r['where']} | {r['s_per_step']:.3f} | {r['floor_s']:.2f} | {r['x_eager']:.3f} | "
              f"{r['x_eager_resident']:.3f} | {prep} | {r['graphs_compiled']} | {r['peak_reserved'] / GIB:.2f} | "
              f"{r['step_rel_err']:.2e} | {sec_err} |")


# ---- jobs -------------------------------------------------------------------------------------------------------
def write_random_lora(tr, folder: Path, rank: int = 16, seed: int = 7) -> str:
    """A LoRA file in diffusers' layout with random rank-`rank` factors on every block Linear; its name."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, m in tr.named_modules():
        if isinstance(m, torch.nn.Linear) and "transformer_blocks." in name:
            tensors[f"transformer.{name}.lora_A.weight"] = (torch.randn(rank, m.in_features, generator=g)
                                                            / m.in_features ** 0.5).to(torch.bfloat16)
            tensors[f"transformer.{name}.lora_B.weight"] = (torch.randn(m.out_features, rank, generator=g)
                                                            * 1e-3).to(torch.bfloat16)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "bench.safetensors"))
    return "bench.safetensors"


def jobs_main(args) -> None:
    from safetensors.torch import load_file, save_file

    from benchmarks.fullsize import build_components
    from benchmarks.section import _ensure_video_writer, _image
    from jobfolder.checkpoint import load_checkpoint
    from memory.manager import MemoryManager
    from pipeline import compiled
    from pipeline.events import Done
    from pipeline.orchestrator import generate
    from pipeline.request import Request, prepare
    from rocm.sdpa import flash_attention_4

    _ensure_video_writer()
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    t0 = time.perf_counter()
    comps = build_components(args.tiny)
    build_s = time.perf_counter() - t0
    height, width = (64, 64) if args.tiny else (608, 640)
    lora_dir = Path(tempfile.mkdtemp())
    lora_name = None
    args.latents.mkdir(parents=True, exist_ok=True)
    rows, first, seen = [], None, {}
    meta = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "build_s": build_s, "date": time.strftime("%Y-%m-%d"),
            "cache": str(compiled.cache_folder())}
    with tempfile.TemporaryDirectory() as outputs:
        for n, variant in enumerate(v for v in args.jobs.split(",") if v):
            kind, fa4 = split_variant(variant)
            parts = kind.split("+")        # e.g. fp8+attn8+lora: fp8 compute, fp8 attention and the LoRA together
            lora, teacache = "lora" in parts, "teacache" in parts
            if lora and lora_name is None:
                lora_name = write_random_lora(comps.transformer, lora_dir)
            if kind.startswith("fp8"):
                recipe = "rowwise" if device.type == "cpu" else compiled.fp8_recipe(device)
                if not any(isinstance(m, compiled.Fp8Linear) for m in comps.transformer.modules()):
                    compiled.use_fp8_compute(comps.transformer, recipe, device)
            request = Request(image=_image(height, width), prompt="a red fox runs through fresh snow",
                              seconds=args.short_seconds if lora or teacache else args.seconds,
                              steps=args.steps, seed=31337, teacache=0.15 if teacache else 0.0,
                              loras=f"{lora_name}:0.8" if lora else "",
                              compile="off" if kind == "eager" else "on",
                              fp8_attention="on" if "attn8" in parts else "off")
            memory = MemoryManager(device=device, cap_gb=args.cap_gb, preserved_gb=args.preserved_gb)
            memory.set_workload(height, width, 9)
            memory.prepare(**comps.models())
            graphs = compiled.compiled_graphs()
            t = time.perf_counter()
            with flash_attention_4(fa4):
                events = list(generate(prepare(request, comps.preset.default_resolution), comps, memory,
                                       outputs=Path(outputs) / f"job{n}", lora_dir=lora_dir,
                                       compile="force" if args.force else "auto"))
            total = time.perf_counter() - t
            end = events[-1]
            if not isinstance(end, Done):
                raise SystemExit(f"job {n} ({variant}) failed: {end.message}\n{end.detail}")
            sampling = sum(r.ended - r.started for r in memory.records if r.name == "transformer")
            saved, _ = load_checkpoint(end.job_dir)          # the job folder's one reader of its latents
            latents = saved["history"]
            save_file({"history": latents}, str(args.latents / f"{variant.replace('/', '_')}-{n}.safetensors"))
            row = {"job": n, "variant": variant, "seconds": request.seconds, "total_s": total, "sampling_s": sampling,
                   "preparing_kernels_s": float(end.timings.get("preparing kernels", 0.0)),
                   "graphs_compiled": compiled.compiled_graphs() - graphs,
                   "peak_reserved": max(r.peak_reserved for r in memory.records), "frames": end.frames,
                   "timings": dict(end.timings)}
            earlier = seen.get((variant, request.seconds))
            row["same_as_last_such_job"] = None if earlier is None else all(
                torch.equal(saved[k], earlier[k]) for k in saved)
            row["differs_in"] = None if earlier is None else [k for k in saved if not torch.equal(saved[k], earlier[k])]
            seen[(variant, request.seconds)] = saved
            if first is None:
                first = (variant, latents)
            elif latents.shape == first[1].shape:
                row["latents_rel_err_vs_first"] = rel(latents, first[1])
            for other in args.compare or []:
                ref = load_file(str(other))["history"]
                if ref.shape == latents.shape:
                    row.setdefault("latents_rel_err_vs", {})[Path(other).name] = rel(latents, ref)
            rows.append(row)
            args.out.write_text(json.dumps({"meta": meta, "jobs": rows}, indent=1, default=str))   # after each job
            log.info("job %d (%s): %.1f s end to end, %.1f s sampling, %d graphs compiled", n, variant, total,
                     sampling, row["graphs_compiled"])
    print(f"\n{meta['device']}, torch {meta['torch']}, build {build_s:.0f} s, kernel cache {meta['cache']}")
    print("| job | variant | video s | end to end s | sampling s | preparing kernels s | graphs compiled | "
          "peak reserved GiB | latents vs first (rel.) | vs --compare | bits = last such job |\n"
          "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|")
    for r in rows:
        vs = r.get("latents_rel_err_vs_first")
        cmp = ", ".join(f"{k}: {v:.2e}" for k, v in r.get("latents_rel_err_vs", {}).items()) or "–"
        print(f"| {r['job']} | {r['variant']} | {r['seconds']:g} | {r['total_s']:.2f} | {r['sampling_s']:.2f} | "
              f"{r['preparing_kernels_s']:.1f} | {r['graphs_compiled']} | {r['peak_reserved'] / GIB:.2f} | "
              f"{'–' if vs is None else f'{vs:.2e}'} | {cmp} | {r['same_as_last_such_job']} {r['differs_in'] or ''} |")


def main(argv=None) -> None:
    import rocm

    rocm.apply_env_profile()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    s = sub.add_parser("step")
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--tiny", action="store_true")
    s.add_argument("--variants", default="eager,compiled,fp8")
    s.add_argument("--warmup", type=int, default=2)
    s.add_argument("--steps", type=int, default=4)
    s.add_argument("--section-steps", type=int, default=25, help="0: no whole-section error")
    s.add_argument("--attn-cosine", action="store_true", help="fp8 attention against bf16 in every call of one step")
    s.add_argument("--plain-blocks", action="store_true", help="compile diffusers' block forwards as they are, "
                   "without pipeline/block_forms.py's forms (the GELU epilogue, the split output product)")
    s.add_argument("--profile", action="store_true", help="one more resident step per variant under torch.profiler: "
                   "its kernels' time by kind")
    j = sub.add_parser("jobs")
    j.add_argument("--out", type=Path, required=True)
    j.add_argument("--tiny", action="store_true")
    j.add_argument("--jobs", default="eager,compiled,compiled")
    j.add_argument("--seconds", type=float, default=5.0)
    j.add_argument("--short-seconds", type=float, default=1.2, help="the lora and teacache jobs' length")
    j.add_argument("--steps", type=int, default=25)
    j.add_argument("--cap-gb", type=float, default=20.0)
    j.add_argument("--preserved-gb", type=float, default=6.0)
    j.add_argument("--latents", type=Path, default=Path("latents"))
    j.add_argument("--compare", type=Path, action="append")
    j.add_argument("--force", action="store_true", help="compile also on the CPU (tiny preset)")
    for p in (s, j):
        p.add_argument("--qkv-setting", type=Path, help="rocm/fp8_qkv.py's launch setting from this JSON file "
                       "(benchmarks/fp8_qkv.py --best) instead of its default")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.qkv_setting:
        from rocm import fp8_qkv

        fp8_qkv.SETTING = fp8_qkv.Setting(**json.loads(args.qkv_setting.read_text()))
        logging.getLogger("benchmarks.compiled").info("q/k/v passes: %s", fp8_qkv.SETTING)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    (step_main if args.what == "step" else jobs_main)(args)


if __name__ == "__main__":
    main()
