"""Tiny models laid out and driven as the real ones are, for every test that needs them: the real preset with fp32
weights (`HUNYUAN_FP32`) saved in the real repos' layout (`save_like_repos`; conftest's `saved` fixture), a
transformer's section inputs and two denoiser steps (`step_inputs`, `two_steps`), a file-homed transformer and a
CPU memory manager that keeps it resident (`file_transformer`, `resident_manager`), a VAE fault above a tile size
(`oom_above`), and a job's frames as one hash (`frames_hash`)."""
from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import torch

from common.units import GIB
from configs.presets import HUNYUAN
from pipeline.tiny import build_tiny_llama

# The real preset with fp32 weights (the tiny models' dtype; fp16/bf16 convolutions are slow on a CPU) ...
HUNYUAN_FP32 = dataclasses.replace(HUNYUAN, **{
    role: dataclasses.replace(getattr(HUNYUAN, role), dtype="float32")
    for role in ("text_encoder", "text_encoder_2", "vae", "image_encoder", "transformer", "transformer_f1")})
# ... and the tiny preset's resolution, so a short job runs fast.
HUNYUAN_FP32 = dataclasses.replace(HUNYUAN_FP32, default_resolution=64)
HOST_OVERHEAD = GIB // 2        # injected into a MemoryManager, so host budgets are exact (a job measures its own)


def save_like_repos(components, root: Path) -> None:
    """Save every component where the real repos keep it: <root>/<owner>/<repo>/<subfolder>/. The Llama is saved
    whole, as the repo holds it (the components' one is trimmed: memory/llama_trim.py)."""
    for role, src in HUNYUAN.sources(components.mode).items():
        folder = root / src.repo / (src.subfolder or "")
        folder.mkdir(parents=True, exist_ok=True)
        part = build_tiny_llama(components.preset) if role == "text_encoder" else getattr(components, role)
        part.save_pretrained(folder)


def step_inputs(tr, seed=0):
    """A section's inputs for the transformer `tr` at 64x64, window 9 (benchmarks/transformer_step.py)."""
    from benchmarks.transformer_step import section_inputs

    return section_inputs(tr, 64, 64, 9, 16, seed)


def two_steps(tr, inputs, teacache=0.0, steps=2):
    """Two denoiser steps (the second sees the first's output), as the sampler would run them."""
    from pipeline.denoiser import FramepackDenoiser

    ctx, idx, shape, image, texts, noise = inputs
    den = FramepackDenoiser(tr, teacache, steps)
    den.begin_section(ctx, idx, shape, image, texts, 10.0)
    x, outs = noise, []
    for t in (900.0, 500.0)[:steps]:
        out = den(x, torch.tensor([t]))
        outs.append(out)
        x = x - 0.1 * out
    den.end_section()
    return outs


def file_transformer(saved):
    """The transformer of the models saved under `saved`, every chunk's home its weight file, and its host pack."""
    from memory.hostpack import HostPack
    from pipeline.components import load_components

    tr = load_components(HUNYUAN_FP32, "original", model_dir=saved).transformer
    pack = HostPack.of(tr)
    assert len(pack.blocks) >= 2 and all(c.home == "file" for c in pack.chunks)
    return tr, pack


def resident_manager(pack, late: bool):
    """A CPU memory manager whose cap keeps every block of `pack` resident; `late`: blocks read late."""
    from memory.manager import MemoryManager

    cap_gb = (pack.rest.nbytes + sum(c.nbytes for c in pack.blocks)) / GIB + 0.001
    return MemoryManager(device="cpu", cap_gb=cap_gb, preserved_gb=0, plan_on_cpu=True, late_load=late)


def oom_above(limit, seen):
    """A VAE decode fault: out of memory for tiles larger than `limit` (and untiled); each tiling tried in `seen`."""
    def fault(tiling):
        seen.append(tiling)
        if tiling.size == 0 or tiling.size > limit:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")
    return fault


def frames_hash(last) -> str:
    """One hash of every section's frames of the job that ended with `last` (its Done)."""
    info = json.loads((last.job_dir / "job.json").read_text())
    return hashlib.sha256("".join(s["frames_sha256"] for s in info["sections"]).encode()).hexdigest()


def small_transformer():
    """The tiny preset's transformer 32 wide (2 heads of 16: multiples of 16, as the fp8 products need at full size),
    bf16, seeded."""
    from diffusers import HunyuanVideoFramepackTransformer3DModel

    from configs.presets import PRESETS

    cfg = dict(PRESETS["tiny"].tiny_configs["transformer"])
    cfg.update(num_attention_heads=2, attention_head_dim=16)
    torch.manual_seed(0)
    return HunyuanVideoFramepackTransformer3DModel(**cfg).eval().requires_grad_(False).to(torch.bfloat16)


def in_triton_interpreter(script: str) -> dict:
    """Run `script` in a process of its own with Triton's interpreter (TRITON_INTERPRET=1 must be set before Triton
    is imported: the tests of our Triton kernels on the CPU) and return the JSON object its last line prints."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(root))
    done = subprocess.run([sys.executable, "-c", script], cwd=root, env=env, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
