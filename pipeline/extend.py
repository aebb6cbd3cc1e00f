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

The original (inverted) mode generates from the end backwards: it cannot continue a video, and is refused.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from pipeline import sections as sec
from common.errors import InputError
from common.files import file_sha256
from pipeline.video_input import FIELD, InputVideo, load_video
from pipeline.jobs import CHECKPOINT, finished_video, load_job
import time

F1_HISTORY = sum(sec.HISTORY_F1)             # 19 latents of clean context


@dataclass(frozen=True)
class ExtendSource:
    """The checked input of an extension: what the job starts from."""
    kind: str                                 # "video" | "job"
    path: Path
    sha256: str                               # the video file's; a job's final video's
    sections_done: int                        # sections of the plan the input stands for
    video: InputVideo | None = None           # kind "video"
    tail_frames: int = 0                      # kind "video": frames VAE-encoded from its end
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


def min_frames(window: int) -> int:
    """The shortest input video (frames): one section's latents plus the anchor (4·w + 1)."""
    return sec.VAE_TIME_RATIO * window + 1


def job_source(job_dir: Path, request) -> tuple[ExtendSource, Image.Image]:
    from pipeline.checkpoint import load_checkpoint

    def refused(why: str, advice: str = "") -> InputError:
        return InputError(FIELD, f"{{file}}: {why}", path=job_dir, advice=advice)

    try:
        info = load_job(job_dir)
    except (OSError, ValueError) as e:
        raise refused(f"job.json cannot be read ({str(e)[:100]})") from None
    settings = info.get("settings") if isinstance(info.get("settings"), dict) else {}
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
    models = info.get("models") if isinstance(info.get("models"), dict) else {}
    source = ExtendSource("job", job_dir, file_sha256(Path(video)), int(meta["sections_done"]),
                          history=tensors["history"], real=tensors["real"], start_latent=tensors["start_latent"],
                          rng_state=tensors["rng_state"], job_seed=settings.get("seed"), preset=models.get("preset"))
    return source, image


def load_source(request, resolution: int) -> tuple[ExtendSource, Image.Image]:
    """The checked input of `request.input_video` and the start image. Raises InputError naming the field."""
    path = Path(request.input_video).expanduser()
    if path.is_dir() and (path / "job.json").is_file():
        return job_source(path, request)
    w = request.latent_window
    video = load_video(path, resolution, request.fps, min_frames(w))
    latents = 1 + (len(video.frames) - 1) // sec.VAE_TIME_RATIO
    done = context_sections(latents, w)
    source = ExtendSource("video", path, video.sha256, done, video=video,
                          tail_frames=sec.VAE_TIME_RATIO * done * w + 1)
    return source, Image.fromarray(video.frames[-1])


def check_request(request) -> None:
    """What an extension refuses whatever its input is (before the input is read)."""
    if request.mode != "f1":
        raise InputError("mode", "the original (inverted) mode generates from the end of the video backwards, so it "
                                 "cannot continue a video; choose mode 'f1' to extend one")
    if request.image is not None:
        raise InputError("image", "give a start image or a video to extend, not both (extending starts from the "
                                  "video's last frame); remove one of them")
    if request.end_image is not None:
        raise InputError("end image", "an end image cannot be used when extending a video; remove it")


def extended_plan(plan: sec.SectionPlan, source: ExtendSource) -> sec.SectionPlan:
    """The job's plan with the input's sections before the new ones."""
    return sec.SectionPlan(plan.mode, plan.window, plan.count + source.sections_done)


def video_history(tail_latents: torch.Tensor) -> torch.Tensor:
    """F1's history for an input video's encoded tail: zeros for the context it does not fill, then its latents."""
    b, c, _, h, w = tail_latents.shape
    zeros = torch.zeros(b, c, F1_HISTORY, h, w, dtype=torch.float32)
    return torch.cat([zeros, tail_latents.float()], dim=2)


def frames_to_model(frames: np.ndarray) -> torch.Tensor:
    """(T, H, W, 3) uint8 -> (1, 3, T, H, W) float32 in [-1, 1]."""
    x = torch.from_numpy(np.ascontiguousarray(frames)).float().div_(127.5).sub_(1.0)
    return x.permute(3, 0, 1, 2).unsqueeze(0)


def starting_point(run, drain):
    """(start latent, end latent (None), history, sections done) of an extension; `run` is the orchestrator's
    JobRun. A job folder gives its checkpoint (and, with its own seed, its random state); a video is encoded."""

    source: ExtendSource = run.prepared.source
    if source.kind == "job":
        if run.request.seed == source.job_seed:
            run.generator.set_state(source.rng_state)
        return source.start_latent, None, source.history, source.sections_done
    yield run.progress("VAE encode", 0, 0, "encoding the end of the input video")
    vae = run.models.vae
    t = time.monotonic()
    with torch.no_grad(), run.memory.stage("VAE encode", vae=vae), run.fallback.active():
        def encode(frames: np.ndarray) -> torch.Tensor:
            x = frames_to_model(frames).to(run.device, vae.dtype)
            return (vae.encode(x).latent_dist.sample(generator=run.generator)
                    * vae.config.scaling_factor).float().cpu()

        tail = encode(source.frames[-source.tail_frames:])
        start = encode(source.frames[-1:])
    run._timed("VAE encode", time.monotonic() - t)
    yield from drain()
    return start, None, video_history(tail), source.sections_done
