"""Latent checkpoints: after every section the job folder holds what is needed to continue (safetensors only)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save

from common.files import atomic_write_bytes
from jobfolder.folder import CHECKPOINT

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


@dataclass
class SavedSections:
    """An interrupted job's checkpoint: the sections it finished, and what continues them (a resume's starting
    state: pipeline/strategy.py `Resumed`)."""
    history: torch.Tensor
    real: torch.Tensor
    start_latent: torch.Tensor
    end_latent: torch.Tensor | None
    rng_state: torch.Tensor
    sections_done: int
    keyframe_latents: tuple = ()             # the keyframes' latents (pipeline/keyframes.py), in time order


def saved_sections(job_dir: Path) -> SavedSections | None:
    """The job folder's checkpoint as SavedSections; None when it has none (no section was finished)."""
    if not (Path(job_dir) / CHECKPOINT).is_file():
        return None
    tensors, meta = load_checkpoint(job_dir)
    return SavedSections(tensors["history"], tensors["real"], tensors["start_latent"], tensors.get("end_latent"),
                         tensors["rng_state"], int(meta["sections_done"]), keyframe_latents(tensors))
