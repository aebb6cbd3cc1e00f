"""Extend a video: F1 (forward) mode continues after the input's last frame.

The input is a video file (pipeline/video_input.py) or a finished F1 job folder of ours. Its latents become the
history FramePack F1 reads its 4x/2x/1x clean context from (pipeline/sections.py): the newest latents, at the end.
The job then runs like a job whose first `sections_done` sections are the input, with `seconds` more after it:

- a job folder: its checkpoint is the history it had at its end (no VAE encode). Its sections are decoded again
  (as a resume does) so the seam blends exactly as the longer job's would, and with the job's own seed the random
  generator goes on from the saved state: extending a job by N sections gives the very video (and latents) the job
  would have made with N more sections.
- a video file: the last 4·d·w + 1 frames (d = the sections of context needed to fill the 19-latent F1 history,
  fewer for a short clip) are VAE-encoded; history = [zeros, those latents], as `empty_history` + d sections
  would have it. The start image (the SigLIP conditioning and F1's anchor latent at RoPE index 0) is the video's
  last frame, encoded alone. The random generator draws the tail's VAE posterior, the last frame's, then the noise.

The output is the input's frames followed by the new part. The input's frames are kept (uint8, bit for bit) except
the last `overlap` − 1, which cross-fade into the new part exactly as between two sections (`soft_append`); the
first new section's decode starts with the input's last w latents, so the blend joins like-for-like frames.

The original (inverted, anti-drifting) mode generates from the end of the video towards its start, so an input video
fits it in two ways (FramePack-Studio's "Video" and "Video with Endframe"):

- backward (no end image): the new sections go BEFORE the input, which stands for the plan's first sections (the
  end of the video, generated first). The first 4·(d·w − 1) + 1 frames (d·w latents, enough to fill the 19-latent
  original history, fewer for a short clip) are VAE-encoded; history = [those latents, zeros], as after d sections.
  The start image (the prefix latent at RoPE index 0, the SigLIP conditioning, and the first frame of the output)
  is the video's first frame. The output ends with the input's frames, kept bit for bit but the first
  `overlap` − 1, which cross-fade with the new part exactly as between two sections.
- toward an end frame (an end image given): the new sections go AFTER the input and end at the end image (its
  latent is the first section's post latent, as in a plain original job; `end_embed_weight` blends the SigLIP
  conditioning). The input's last latents are the clean prefix (indices 0 … k − 1 before the blank padding); they
  ride at the end of the history (after the 19 zero latents the original mode never reads), so a checkpoint keeps
  them. The start latent (the input's last frame, encoded alone) begins the new part; that repeated frame is left
  out when the input's frames (all of them, bit for bit) are put before it once the last section is decoded.

`context_frames` (configs/controls.py) limits how many of the input's latents the new sections see: F1 the newest
(the older ones read as zeros), backward the first, toward an end frame the last (the prefix). The latents
themselves stay in the history (the seam's decode uses them); only what the transformer reads is limited. 0 means
automatic: all 19 the history holds, but 5 toward an end frame, where the prefix is uncompressed (each of its latents
costs as many tokens as a generated one; 19 would more than double a section's tokens).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from common.errors import InputError
from common.files import file_sha256
from jobfolder.folder import CHECKPOINT, finished_video, load_job
from pipeline import sections as sec
from pipeline.video_input import FIELD, InputVideo, load_video

F1_HISTORY = sum(sec.HISTORY_F1)             # 19 latents of clean context
ORIGINAL_HISTORY = sum(sec.HISTORY_ORIGINAL)  # 19 as well: 1x 1, 2x 2, 4x 16
FORWARD, BACKWARD, TO_END = "forward", "backward", "to end frame"
TO_END_CONTEXT = 5      # context frames "automatic" toward an end frame: each is a full-size latent of the prefix


@dataclass(frozen=True)
class ExtendSource:
    """The checked input of an extension: what the job starts from."""
    kind: str                                 # "video" | "job"
    path: Path
    sha256: str                               # the video file's; a job's final video's
    sections_done: int                        # sections of the plan the input stands for (toward an end frame: 0)
    video: InputVideo | None = None           # kind "video"
    tail_frames: int = 0                      # kind "video": frames VAE-encoded (from its start when backward)
    direction: str = FORWARD                  # FORWARD (F1), BACKWARD or TO_END (original mode)
    history: torch.Tensor | None = None       # kind "job": its checkpoint
    real: torch.Tensor | None = None
    start_latent: torch.Tensor | None = None
    rng_state: torch.Tensor | None = None
    job_seed: int | None = None
    preset: str | None = None

    @property
    def frames(self) -> np.ndarray | None:
        return self.video.frames if self.video is not None else None

    def record(self) -> dict:
        """job.json's "source"."""
        out = {"kind": self.kind, "path": str(self.path), "sha256": self.sha256,
               "sections_as_context": self.sections_done}
        if self.direction != FORWARD:
            out["direction"] = self.direction
        if self.video is not None:
            v = self.video
            out.update(frames=len(v.frames), fps=v.fps, source_size=list(v.source_size),
                       source_fps=round(v.source_fps, 3), rotation=v.rotation, variable_rate=v.variable_rate,
                       encoded_frames=self.tail_frames)
        else:
            out.update(seed=self.job_seed, preset=self.preset)
        return out

    def problem(self, components) -> str | None:
        """Why the loaded models cannot extend this input, or None."""
        if self.preset is not None and self.preset != components.preset.name:
            return (f"video: job {self.path.name} was made with the {self.preset} preset; load it to extend the "
                    f"job, or extend its final.mp4 as a video")
        return None


def context_sections(latent_count: int, window: int) -> int:
    """Sections of an input of `latent_count` latents used as context: enough to fill the F1 history, at most what
    the input has."""
    return max(1, min(math.ceil((F1_HISTORY - 1) / window), (latent_count - 1) // window))


def direction(request) -> str:
    """Where an extension's new part goes: FORWARD (F1), BACKWARD (original), TO_END (original with an end image)."""
    if request.mode == "f1":
        return FORWARD
    return TO_END if request.end_image is not None else BACKWARD


def context_count(context_frames: int, way: str) -> int:
    """The input's latents the new sections see: `context_frames`, or for 0 (automatic) all the 19 the history
    holds, 5 toward an end frame (there they are the uncompressed prefix, each as costly as a generated latent)."""
    if context_frames:
        return int(context_frames)
    return TO_END_CONTEXT if way == TO_END else ORIGINAL_HISTORY


def backward_sections(latent_count: int, window: int) -> int:
    """Backward: sections of an input of `latent_count` latents standing for the end of the video: enough to fill
    the original history (19 latents), at most what the input has."""
    return max(1, min(math.ceil(ORIGINAL_HISTORY / window), latent_count // window))


def min_frames(window: int) -> int:
    """The shortest input video (frames): one section's latents plus the anchor (4·w + 1)."""
    return sec.VAE_TIME_RATIO * window + 1


def job_source(job_dir: Path, request) -> tuple[ExtendSource, Image.Image]:
    from jobfolder.checkpoint import load_checkpoint

    def refused(why: str, advice: str = "") -> InputError:
        return InputError(FIELD, f"{{file}}: {why}", path=job_dir, advice=advice)

    try:
        info = load_job(job_dir)
    except (OSError, ValueError) as e:
        raise refused(f"job.json cannot be read ({str(e)[:100]})") from None
    given = info.get("settings")
    settings = given if isinstance(given, dict) else {}
    if info.get("status") not in ("done", "stopped"):
        raise refused(f"the job is {info.get('status')!r}, not finished", "Resume it first (or wait for it).")
    if settings.get("mode") != "f1":
        raise refused(f"the job was made in {settings.get('mode')!r} mode; only F1 jobs continue from their "
                      f"latents", "Extend its final.mp4 as a video instead.")
    if settings.get("latent_window") != request.latent_window:
        raise InputError("latent window", f"the job {job_dir.name} was made with latent window "
                                          f"{settings.get('latent_window')}; extend it with the same window")
    if settings.get("fps", 30) != request.fps:
        raise InputError("fps", f"the job {job_dir.name} is at {settings.get('fps')} fps; extend it at the same rate")
    final = finished_video(job_dir) if info.get("status") == "done" else None
    video = final or (job_dir / info["videos"][-1] if info.get("videos") else None)
    if not (job_dir / CHECKPOINT).is_file() or video is None or not Path(video).is_file():
        raise refused("the job has no saved latents or no video", "Extend its video file instead.")
    tensors, meta = load_checkpoint(job_dir)
    image = Image.open(job_dir / "input.png").convert("RGB")
    kept = info.get("models")
    models = kept if isinstance(kept, dict) else {}
    source = ExtendSource("job", job_dir, file_sha256(Path(video)), int(meta["sections_done"]),
                          history=tensors["history"], real=tensors["real"], start_latent=tensors["start_latent"],
                          rng_state=tensors["rng_state"], job_seed=settings.get("seed"), preset=models.get("preset"))
    return source, image


def load_source(request, resolution: int) -> tuple[ExtendSource, Image.Image]:
    """The checked input of `request.input_video` and the start image. Raises InputError naming the field."""
    path = Path(request.input_video).expanduser()
    way = direction(request)
    if path.is_dir() and (path / "job.json").is_file():
        if way != FORWARD:
            raise InputError("mode", f"a job folder ({path.name}) continues from its saved latents in F1 mode only; "
                                     f"choose mode 'f1', or extend its final.mp4 as a video in the original mode")
        return job_source(path, request)
    w = request.latent_window
    video = load_video(path, resolution, request.fps, min_frames(w))
    return video_source(video, request), Image.fromarray(video.frames[0 if way == BACKWARD else -1])


def video_source(video: InputVideo, request) -> ExtendSource:
    """The ExtendSource of a decoded input video for `request` (its direction, window and context frames)."""
    w, way, r = request.latent_window, direction(request), sec.VAE_TIME_RATIO
    latents = 1 + (len(video.frames) - 1) // r
    if way == BACKWARD:
        done = backward_sections(latents, w)
        return ExtendSource("video", video.path, video.sha256, done, video=video, tail_frames=r * (done * w - 1) + 1,
                            direction=way)
    if way == TO_END:
        prefix = min(context_count(request.context_frames, way), latents)
        return ExtendSource("video", video.path, video.sha256, 0, video=video, tail_frames=r * (prefix - 1) + 1,
                            direction=way)
    done = context_sections(latents, w)
    return ExtendSource("video", video.path, video.sha256, done, video=video, tail_frames=r * done * w + 1)


def check_request(request) -> None:
    """What an extension refuses whatever its input is (before the input is read)."""
    if request.image is not None:
        raise InputError("image", "give a start image or a video to extend, not both (extending starts from the "
                                  "video's last frame, or its first when the original mode extends it backward); "
                                  "remove one of them")
    if request.end_image is not None and request.mode != "original":
        raise InputError("end image", "only the original mode extends a video toward an end image (F1 has no end "
                                      "frame); choose mode 'original', or remove the end image")


def extended_plan(plan: sec.SectionPlan, source: ExtendSource) -> sec.SectionPlan:
    """The job's plan with the input's sections before the new ones."""
    return sec.SectionPlan(plan.mode, plan.window, plan.count + source.sections_done)


def video_history(tail_latents: torch.Tensor) -> torch.Tensor:
    """F1's history for an input video's encoded tail: zeros for the context it does not fill, then its latents."""
    b, c, _, h, w = tail_latents.shape
    zeros = torch.zeros(b, c, F1_HISTORY, h, w, dtype=torch.float32)
    return torch.cat([zeros, tail_latents.float()], dim=2)


def backward_history(head_latents: torch.Tensor) -> torch.Tensor:
    """The original mode's history for an input video's encoded head (backward): its latents, then the zeros the
    history starts with, as after the sections the input stands for."""
    b, c, _, h, w = head_latents.shape
    return torch.cat([head_latents.float(), torch.zeros(b, c, ORIGINAL_HISTORY, h, w, dtype=torch.float32)], dim=2)


def limited_history(plan: sec.SectionPlan, history: torch.Tensor, sections_done: int, context_frames: int
                    ) -> torch.Tensor:
    """The history as the transformer reads it with `context_frames` of the input's latents: the input's other
    latents read as zeros (F1: all but its newest; original, backward: all but its first). The input's latents lie
    at a fixed place: F1 after the 19 zeros the history starts with (d·w + 1 of them, the start latent included);
    original before the 19 zeros it ends with (d·w). Pure: `history` is not changed."""
    f1 = plan.mode == "f1"
    span = sections_done * plan.window + (1 if f1 else 0)
    if context_frames >= span:
        return history
    out = history.clone()
    if f1:
        out[:, :, F1_HISTORY: F1_HISTORY + span - context_frames] = 0
    else:
        end = history.shape[2] - ORIGINAL_HISTORY
        out[:, :, end - span + context_frames: end] = 0
    return out


def prefix_latents(source: ExtendSource) -> int:
    """Toward an end frame: the input's latents in the clean prefix (kept at the history's end)."""
    return 1 + (source.tail_frames - 1) // sec.VAE_TIME_RATIO


def section_inputs(plan: sec.SectionPlan, section: sec.Section, history: torch.Tensor, start_latent: torch.Tensor,
                   end_latent: torch.Tensor | None, source: ExtendSource, context_frames: int
                   ) -> tuple[sec.SectionContext, sec.SectionIndices]:
    """The clean latents and RoPE indices of an extension's `section`: the input's latents the transformer sees
    (`context_frames` of them); toward an end frame, the input's last latents as the prefix."""
    if source.direction == TO_END:
        prefix = history[:, :, -prefix_latents(source):]
        return (sec.section_context(plan, section, history, prefix, end_latent),
                plan.indices(section, prefix.shape[2]))
    seen = limited_history(plan, history, source.sections_done, context_count(context_frames, source.direction))
    return sec.section_context(plan, section, seen, start_latent, end_latent), plan.indices(section)


def lead_frames(source: ExtendSource | None, section: sec.Section) -> np.ndarray | None:
    """Toward an end frame: the input's frames, which go before the video once its last section (the one next to
    the input) is decoded; else None."""
    if source is None or source.direction != TO_END or not section.is_last:
        return None
    return source.frames


def frames_to_model(frames: np.ndarray) -> torch.Tensor:
    """(T, H, W, 3) uint8 -> (1, 3, T, H, W) float32 in [-1, 1]."""
    x = torch.from_numpy(np.ascontiguousarray(frames)).float().div_(127.5).sub_(1.0)
    return x.permute(3, 0, 1, 2).unsqueeze(0)


def starting_point(run: Any):
    """(start latent, end latent, history, sections done) of an extension; `run` is the orchestrator's JobRun. A
    job folder gives its checkpoint (and, with its own seed, its random state); a video is encoded. The random
    generator draws the VAE posteriors in this order: the encoded frames (F1: the tail; backward: the head; toward
    an end frame: the prefix), the start frame alone, the end image; then the sections' noise."""

    source: ExtendSource = run.prepared.source
    if source.kind == "job":
        if run.request.seed == source.job_seed:
            run.generator.set_state(source.rng_state)
        return source.start_latent, None, source.history, source.sections_done
    backward = source.direction == BACKWARD
    yield run.progress("VAE encode", 0, 0, f"encoding the {'start' if backward else 'end'} of the input video")
    vae = run.models.vae
    frames, end = source.frames, None
    assert frames is not None                           # (a video to extend has its frames)
    with run.timing("VAE encode"), torch.no_grad(), run.memory.stage("VAE encode", vae=vae), \
            run.fallback.guarded("VAE encode"):
        def encode(frames: np.ndarray) -> torch.Tensor:
            x = frames_to_model(frames).to(run.device, vae.dtype)
            return (vae.encode(x).latent_dist.sample(generator=run.generator)
                    * vae.config.scaling_factor).float().cpu()

        if backward:
            encoded = encode(frames[: source.tail_frames])
            start = encode(frames[:1])
        else:
            encoded = encode(frames[-source.tail_frames:])
            start = encode(frames[-1:])
            if source.direction == TO_END:
                end = encode(np.array(run.prepared.end_image.convert("RGB"))[None])
    yield from run.drained()
    if backward:
        return start, None, backward_history(encoded), source.sections_done
    if source.direction == TO_END:      # the prefix rides at the end, past what the original mode reads
        return start, end, torch.cat([sec.empty_history(run.plan, start), encoded], dim=2), 0
    return start, None, video_history(encoded), source.sections_done
