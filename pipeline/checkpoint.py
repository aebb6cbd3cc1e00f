"""Latent checkpoints: after every section the job folder holds what is needed to continue (safetensors only)."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save

from common.files import atomic_write_bytes
from pipeline.jobs import CHECKPOINT

KEYFRAME_LATENT = "keyframe_latent_{}"       # the keyframes' VAE latents (pipeline/keyframes.py), in time order


def save_checkpoint(job, section, history: torch.Tensor, real: torch.Tensor, start_latent: torch.Tensor,
                    end_latent: torch.Tensor | None, generator: torch.Generator,
                    keyframe_latents: tuple = ()) -> Path:
    tensors = {"history": history.contiguous(), "real": real.contiguous(),
               "start_latent": start_latent.contiguous(), "rng_state": generator.get_state()}
    if end_latent is not None:
        tensors["end_latent"] = end_latent.contiguous()
    for i, latent in enumerate(keyframe_latents):
        tensors[KEYFRAME_LATENT.format(i)] = latent.contiguous()
    meta = {"sections_done": str(section.index + 1), "sections": str(section.count)}
    path = job.path(CHECKPOINT)
    atomic_write_bytes(path, save(tensors, metadata=meta))
    job.info["checkpoint"] = {"file": CHECKPOINT, "sections_done": section.index + 1}
    return path


def load_checkpoint(job_dir: Path) -> tuple[dict[str, torch.Tensor], dict]:
    path = Path(job_dir) / CHECKPOINT
    with safe_open(str(path), "pt") as f:
        meta = dict(f.metadata() or {})
    return load_file(str(path)), {k: json.loads(v) if v.isdigit() else v for k, v in meta.items()}


def keyframe_latents(tensors: dict) -> tuple:
    """The keyframes' latents a checkpoint holds, in time order."""
    out, i = [], 0
    while KEYFRAME_LATENT.format(i) in tensors:
        out.append(tensors[KEYFRAME_LATENT.format(i)])
        i += 1
    return tuple(out)
