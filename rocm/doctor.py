"""``python -m rocm doctor``: what this machine is, what SteadyFrame will do on it, and what to fix.

Collects backend, versions, GPU/arch (from the hardware, override noted)/VRAM/driver, whether the wheel has
kernels for the arch, the effective environment with warnings, the conv plan, the stored conv verdicts, the
attention backends timed on the transformer's shape (and which one the app will use), and (on a GPU) a probe
table: every tier of the plan on VAE-decoder-shaped convolutions, each in a child process with a timeout (it
writes no verdicts). ``collect`` returns plain data (for ``--json``); ``rocm.doctor_text.render_text`` formats it;
``progress`` (a callable taking one line) hears about each probe and timing while they run.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import platform
import sys

import torch

from common.units import GIB
from configs.rocm_profiles import DEFAULTS
from rocm import fallbacks, fp8_attention
from rocm.arch import detect_arch, resolve_runtime, visible_devices_note
from rocm.arch import device_facts as torch_device_facts
from rocm.attention import attention_check
from rocm.conv_plan import conv_plan
from rocm.env import apply_env_profile, apply_late_profile, check_environment
from rocm.paths import cache_dir
from rocm.probe import HangProbe, ProbeJob
from rocm.sdpa import aotriton_note
from rocm.signature import ConvSignature
from rocm.tiers import TIER_NAMES
from rocm.verdicts import list_files, verdict_path
from rocm.verdicts import reset as reset_verdicts

logger = logging.getLogger(__name__)

# Decoder convs of HunyuanVideo's VAE at diffusers' default tile (256 px, 16 frames => 5 latent frames), causal
# padding included: (name, input shape, weight shape).
VAE_PROBE_SHAPES = (
    ("mid block 512ch @ 32x32, 5 frames", (1, 512, 7, 34, 34), (512, 512, 3, 3, 3)),
    ("up block 1 512ch @ 64x64", (1, 512, 7, 66, 66), (512, 512, 3, 3, 3)),
    ("up block 2 512->256ch @ 128x128, 9 frames", (1, 512, 11, 130, 130), (256, 512, 3, 3, 3)),
    ("up block 3 128ch @ 256x256, 17 frames", (1, 128, 19, 258, 258), (128, 128, 3, 3, 3)),
)
SMALL_PROBE_SHAPES = (
    ("small 8ch @ 16x16, 3 frames", (1, 8, 5, 18, 18), (8, 8, 3, 3, 3)),
    ("small 8->4ch @ 32x32, 5 frames", (1, 8, 7, 34, 34), (4, 8, 3, 3, 3)),
)


def probe_signatures(runtime, *, small: bool, dtype: str):
    shapes = SMALL_PROBE_SHAPES if small else VAE_PROBE_SHAPES
    device_type = "cpu" if runtime.backend == "cpu" else "cuda"
    return [(name, ConvSignature("conv3d", x, w, (1, 1, 1), (0, 0, 0), (1, 1, 1), 1, dtype, device_type,
                                 runtime.arch)) for name, x, w in shapes]


def _attention_flags() -> dict:
    out = {"sdpa_flash_enabled": torch.backends.cuda.flash_sdp_enabled(),
           "sdpa_mem_efficient_enabled": torch.backends.cuda.mem_efficient_sdp_enabled(),
           "sdpa_math_enabled": torch.backends.cuda.math_sdp_enabled()}
    if torch.cuda.is_available():
        for name in ("is_flash_attention_available",):
            fn = getattr(torch.backends.cuda, name, None)
            if fn is not None:
                out["flash_attention_built"] = bool(fn())
    for pkg in ("flash_attn", "flash_attn_interface", "cudnn", "xformers", "sageattention"):
        out[f"package_{pkg}"] = importlib.util.find_spec(pkg) is not None
    return out


def planned_probe_tiers(plan, requested) -> tuple[list[int], dict[str, str]]:
    """The requested tiers the plan runs for the VAE's 3D convolutions (the probe's shapes): on RDNA1 never tier 1
    (MIOpen there can crash or hang the GPU), on RDNA2-4 conv3d from tier 3 (so no MIOpen 3D, no 7.7 GB vol2col
    column buffer under a timeout); and why each other one is skipped."""
    name = (plan.family or "device").upper()
    tiers, skipped = [], {}
    for t in requested:
        if t not in plan.tiers:
            skipped[str(t)] = f"not in the {name} plan (the app never runs it here)"
        elif t < plan.conv3d_first_tier:
            skipped[str(t)] = (f"the {name} plan starts 3D convolutions at tier {plan.conv3d_first_tier} (the app "
                               f"never runs tier {t} for them)")
        else:
            tiers.append(t)
    return tiers, skipped


def _probe_table(runtime, *, tiers, small, timeout_s, dtype, progress=None) -> list[dict]:
    vendor = conv_plan(runtime).vendor_in_decomposition
    named = probe_signatures(runtime, small=small, dtype=dtype)
    jobs = [(name, ProbeJob(sig, tier, vendor)) for name, sig in named for tier in tiers]
    device = "cpu" if runtime.backend == "cpu" else "cuda"
    probe = HangProbe(timeout_s=timeout_s)
    results = []
    with probe.session():                     # one warm child for the table; a hang gets a fresh one
        for i, (name, job) in enumerate(jobs, start=1):
            if progress:
                progress(f"probe {i}/{len(jobs)}: tier {job.tier} on {name} (up to {timeout_s:g} s)")
            results += probe.run([job], device=device)
    names = {sig.key: name for name, sig in named}
    return [{"shape": names[r.key], "signature": r.signature, "tier": r.tier, "outcome": r.outcome,
             "elapsed_s": round(r.elapsed_s, 3), "message": r.message[:200]} for r in results]


OVERRIDE_PAGE_FAULTS = ("gfx1031", "gfx1032", "gfx1103")    # cards whose override is reported to fault in MIOpen


def _recommendations(rep: dict) -> list[str]:
    rec = []
    gpu, env = rep["gpu"], rep["environment"]
    rec += [note for note in env.get("profile_notes", []) if "integrated GPU" in note]
    if rep["backend"] == "cpu":
        rec.append("No GPU visible to PyTorch: SteadyFrame runs on the CPU (very slow). On AMD install a ROCm "
                   "build of PyTorch; on NVIDIA a CUDA build.")
        if rep["kfd_arch"]:
            rec.append(f"The KFD topology lists an AMD GPU ({rep['kfd_arch']}) but this PyTorch has no ROCm "
                       "support (CPU or CUDA wheel).")
    family = gpu.get("family")
    if family == "rdna1":
        rec.append("RDNA1 (gfx101x): convolutions default to tiers 2-3 (PyTorch's GPU kernels / 2D "
                   "decomposition, MIOpen off) because no official wheel ships gfx101x kernels and the usual "
                   "HSA_OVERRIDE_GFX_VERSION=10.3.0 crashes with memory aperture violations.")
    if family == "rdna1" and gpu.get("reported_arch") and gpu["reported_arch"] != gpu["arch"]:
        # "has kernels for this arch" is about the overridden ISA; whether unsetting helps is about the real one
        real_in_wheel = gpu["arch"] in (gpu.get("wheel_arches") or ())
        advice = ("This wheel has kernels for it too: unset the override." if real_in_wheel else
                  f"This wheel has no {gpu['arch']} kernels (built for "
                  f"{', '.join(gpu.get('wheel_arches') or ()) or 'unknown arches'}), so without the override "
                  f"PyTorch cannot run on this card: keep it, or install a PyTorch built for {gpu['arch']} and "
                  f"then unset it.")
        rec.append(f"HSA_OVERRIDE_GFX_VERSION makes this {gpu['arch']} (RDNA1, read from the KFD topology) look "
                   f"like {gpu['reported_arch']} to PyTorch. That override is widely reported to crash RDNA1 cards "
                   "(memory aperture violations); SteadyFrame plans for the real gfx101x (convolutions without "
                   f"MIOpen) either way. {advice}")
    if family in ("rdna2", "rdna3", "rdna4"):
        rec.append(f"{family.upper()}: 3D convs start at tier 3 (exact 2D decomposition; MIOpen has no 3D "
                   "heuristics and no fast 3D solver on RDNA).")
    if gpu.get("arch") in OVERRIDE_PAGE_FAULTS and gpu.get("reported_arch") and gpu["reported_arch"] != gpu["arch"]:
        rec.append(f"HSA_OVERRIDE_GFX_VERSION on {gpu['arch']} (reported as {gpu['reported_arch']}) is reported to "
                   "page-fault inside MIOpen; if convolutions crash, unset it where your PyTorch has "
                   f"{gpu['arch']} kernels.")
    if gpu.get("wheel_has_arch") is False and rep["backend"] == "rocm":
        rec.append(f"This PyTorch wheel has no kernels for {gpu['arch']} (built for {', '.join(gpu['wheel_arches'])})"
                   ": GPU kernels will fail; install a ROCm wheel built for your card.")
    if rep["backend"] == "rocm" and rep["torch_settings"].get("cudnn_benchmark"):
        rec.append("torch.backends.cudnn.benchmark is on: MIOpen searches exhaustively on every new shape. "
                   "SteadyFrame turns it off (rocm.apply_torch_settings).")
    # (the RDNA1 override has its own advice above: it may be what lets PyTorch run at all)
    if any(w["severity"] == "warning" and not (family == "rdna1" and w["variable"] == "HSA_OVERRIDE_GFX_VERSION")
           for w in env["warnings"]):
        rec.append("Fix or unset the environment variables flagged above.")
    if rep["backend"] == "rocm" and not rep["kfd_arch"]:
        rec.append(f"No KFD topology (Windows, WSL2 or a container): the architecture is the one PyTorch names "
                   f"({gpu['arch']}), so an HSA_OVERRIDE_GFX_VERSION would hide the real card. The profile is applied "
                   "once torch names the GPU (MIOpen's variables and AOTriton's gate, before their first use); no "
                   "allocator setting is made, and expandable segments are never set on ROCm.")
    if gpu.get("total_memory_gib") and gpu["total_memory_gib"] < 25:
        rec.append("Under 25 GB of VRAM: keep VAE decode tiled (memory/ does) and the transformer unloaded "
                   "before decoding.")
    att = rep["attention"]
    check = att.get("check", {})
    if check.get("ran"):
        chunked = [c for c in check["cases"] if "math in chunks" in c["app"]["uses"]]
        if chunked:
            rec.append("No fused attention kernel for the transformer's attention here: the app runs the math "
                       "kernel in chunks (correct, but slow)."
                       + (f" {att['aotriton']}." if att.get("aotriton") else ""))
    elif rep["backend"] != "cpu" and not (att.get("flash_attention_built") or att.get("package_flash_attn")
                                          or att.get("package_xformers") or att.get("sdpa_mem_efficient_enabled")):
        rec.append("No memory-efficient attention kernel: the math SDPA fallback needs 15-30 GB at FramePack's "
                   "~18k tokens; the app chunks the queries instead (slow).")
    for row in rep.get("probe", {}).get("rows", []):
        if row["outcome"] in ("error", "timeout", "crash"):
            rec.append(f"Probe: tier {row['tier']} {row['outcome']} on {row['shape']}. This table writes no "
                       "verdicts; the app probes each new shape itself on first use (in a child process) and "
                       "skips a tier that fails there.")
        elif row["outcome"] != "ok":
            rec.append(f"Probe: tier {row['tier']} could not be judged on {row['shape']} ({row['outcome']}: "
                       f"{row['message'][:100]}).")
    if not rec:
        rec.append("Nothing to fix.")
    return rec


def _verdicts(rt, env, reset: bool) -> dict:
    folder = cache_dir(env)
    removed = [str(p) for p in reset_verdicts(folder)] if reset else None
    if removed is not None and fallbacks.path(folder).exists() and fallbacks.forget(folder):
        removed.append(str(fallbacks.path(folder)))
    current = verdict_path(folder, rt)
    here = fallbacks.machine_key(fallbacks.gpu_label(rt.device_name, rt.reported_arch), rt.torch_version)
    return {"cache_dir": str(folder), "current_file": str(current), "reset": removed,
            "files": list_files(folder, current),
            "fallbacks": [{"machine": key, "current": key == here, "feature": feature, "error": entry.get("error")}
                          for key, features in fallbacks.entries(folder).items() if isinstance(features, dict)
                          for feature, entry in features.items() if isinstance(entry, dict)]}


def _attention(rt, env, run: bool, small: bool, progress) -> dict:
    out = _attention_flags()
    out["aotriton"] = aotriton_note(rt.backend, rt.arch, env)
    out["fp8_attention"] = fp8_attention.describe("cpu" if rt.backend == "cpu" else "cuda")
    if not run:
        out["check"] = {"ran": False, "reason": "no GPU (--attention times a small shape on the CPU)"
                        if rt.backend == "cpu" else "disabled (--no-attention)"}
        return out
    d = DEFAULTS
    tokens, heads = (d.attention_small_tokens, 2) if small else (d.attention_tokens, d.attention_heads)
    device = "cpu" if rt.backend == "cpu" else "cuda"
    try:
        out["check"] = attention_check(device, tokens=tokens, heads=heads, head_dim=d.attention_head_dim,
                                       dtype="bfloat16", progress=progress)
    except RuntimeError as exc:          # the device itself failed (not one backend): report, do not crash
        out["check"] = {"ran": False, "reason": f"failed: {type(exc).__name__}: {str(exc)[:200]}"}
    return out


def collect(*, probe: bool | None = None, probe_timeout_s: float = 30.0, probe_tiers=(1, 2, 3),
            small: bool | None = None, topology_nodes=None, environ=None, device_facts=None,
            attention: bool | None = None, reset: bool = False, progress=None) -> dict:
    """Gather the doctor report as plain data. ``probe`` / ``attention`` = None: run on a GPU, skip on CPU.
    ``reset``: delete the stored conv verdicts and remembered fallbacks (compiled blocks, fp8 compute) first. ``topology_nodes`` / ``device_facts``: a simulated KFD
    topology / torch device (tests). ``progress``: called with one line per step while probing and timing."""
    env = dict(os.environ if environ is None else environ)
    facts = device_facts or torch_device_facts()
    kfd = detect_arch(topology_nodes, env, facts.index)      # the GPU torch's device is, under *_VISIBLE_DEVICES
    rt = resolve_runtime(facts, kfd if facts.backend == "rocm" else None, env)
    rep: dict = {
        "python": sys.version.split()[0], "platform": platform.platform(), "backend": rt.backend,
        "torch": rt.torch_version, "hip": rt.hip_version, "cuda": rt.cuda_version,
        "miopen" if rt.backend == "rocm" else "cudnn": (torch.backends.cudnn.version()
                                                       if torch.backends.cudnn.is_available() else None),
        "kfd_arch": kfd.gfx if kfd else None,
        "gpu": {"name": rt.device_name, "arch": rt.arch, "arch_source": rt.arch_source,
                "reported_arch": rt.reported_arch, "family": rt.family, "driver": rt.driver_version,
                "total_memory_gib": round(rt.total_memory / GIB, 2) if rt.total_memory else None,
                "wheel_arches": list(rt.wheel_arches), "wheel_has_arch": rt.wheel_has_arch,
                "gpu_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
                "visible_devices": visible_devices_note(env),
                "kfd_gpus": [{"node": n.node, "arch": n.gfx, "integrated": n.integrated,
                              "used": kfd is not None and n == kfd.chosen} for n in (kfd.nodes if kfd else ())]},
        "torch_settings": {"cudnn_enabled": torch.backends.cudnn.enabled,
                           "cudnn_benchmark": torch.backends.cudnn.benchmark},
    }
    miopen = getattr(torch.backends, "miopen", None)
    if miopen is not None and hasattr(miopen, "immediate"):
        rep["torch_settings"]["miopen_immediate"] = miopen.immediate
    gfx = rt.arch if rt.backend == "rocm" else (kfd.gfx if kfd else None)     # the hardware's, never the override
    profile_preview = apply_env_profile(dict(env), topology_nodes=topology_nodes, torch_version=facts.torch_version,
                                        device_index=facts.index)
    when = "at start"
    if not profile_preview.applied and rt.backend == "rocm" and kfd is None and rt.reported_arch:
        # WSL2, Windows, a container: no KFD topology before torch; the app applies it once torch names the GPU
        profile_preview, when = apply_late_profile(rt.reported_arch, dict(env)), "after torch starts (no KFD topology)"
    rep["environment"] = {
        "profile": profile_preview.family, "profile_applied": when if profile_preview.applied else None,
        "profile_notes": [w.message for w in profile_preview.warnings if w.variable == "GPU"],
        "profile_would_set": profile_preview.set,
        "user_kept": {k: v[0] for k, v in profile_preview.kept.items()},
        "relevant": {k: v for k, v in sorted(env.items())
                     if k.startswith(("MIOPEN_", "HSA_", "PYTORCH_", "HIP_", "ROCR_", "CUDA_VISIBLE", "STEADYFRAME_",
                                      "TORCH_ROCM_"))},
        "warnings": [{"variable": w.variable, "value": w.value, "message": w.message, "severity": w.severity}
                     for w in check_environment(env, gfx=gfx)],
    }
    plan = conv_plan(rt)
    rep["conv_plan"] = {
        "tiers": list(plan.tiers), "conv3d_first_tier": plan.conv3d_first_tier,
        "vendor_in_decomposition": plan.vendor_in_decomposition, "family": plan.family,
        "tier_names": {str(k): v for k, v in TIER_NAMES.items()},
        "notes": list(plan.notes),
        "verdict_file": str(verdict_path(cache_dir(env), rt)),
    }
    rep["verdicts"] = _verdicts(rt, env, reset)
    small = (rt.backend == "cpu") if small is None else small
    run_attention = (rt.backend != "cpu" and torch.cuda.is_available()) if attention is None else attention
    rep["attention"] = _attention(rt, env, run_attention, small, progress)
    do_probe = (rt.backend != "cpu") if probe is None else probe
    if do_probe:
        dtype = "float32" if rt.backend == "cpu" else "float16"
        tiers, skipped = planned_probe_tiers(plan, probe_tiers)
        rows = _probe_table(rt, tiers=tiers, small=small, timeout_s=probe_timeout_s, dtype=dtype,
                            progress=progress)
        rep["probe"] = {"ran": True, "device": rt.backend, "timeout_s": probe_timeout_s, "small_shapes": small,
                        "tiers": tiers, "skipped_tiers": skipped, "rows": rows}
    else:
        rep["probe"] = {"ran": False, "reason": "no GPU (--probe runs it on the CPU with small shapes)"
                        if rt.backend == "cpu" else "disabled (--no-probe)"}
    rep["recommendations"] = _recommendations(rep)
    return rep


def run_doctor(**kwargs) -> dict:
    return collect(**kwargs)
