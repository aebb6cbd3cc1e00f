"""Section planning: pure bookkeeping for FramePack's next-frame-section generation.

Both modes are described here without models:
- "original" (inverted anti-drifting): sections are generated from the end of the video towards its start. Each
  section sees the start image latent as prefix, `padding` blank windows, its own window, and the latents already
  generated after it (1x, 2x, 4x compressed history). The last section generated is the start of the video.
- "f1" (forward): each section is generated after its context; history is read from the end of what was made.

Every function is pure (plain ints and lists, or tensor slicing without side effects) and tested without models.
The counting is closed-form (O(1) per section, O(sections) for a whole plan), and `make_plan` refuses lengths,
windows and frame rates beyond the request limits before it builds anything: the live hints call it on raw input.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from configs.generation import LIMITS
from video.blend import soft_append

VAE_TIME_RATIO = 4                     # pixel frames per latent frame of the HunyuanVideo VAE (causal)
HISTORY_ORIGINAL = (1, 2, 16)          # clean 1x, 2x, 4x frames, read from the start of the history
HISTORY_F1 = (16, 2, 1)                # 4x, 2x, 1x frames, read from the end of the history


def section_count(seconds: float, window: int, fps: int = 30) -> int:
    """FramePack's section count: max(round(seconds·fps / (window·4)), 1)."""
    return max(int(round(seconds * fps / (window * VAE_TIME_RATIO))), 1)


def latent_paddings(count: int) -> list[int]:
    """Blank-window paddings of the original mode, in generation order (the last one, 0, is the video's start)."""
    if count > 4:
        return [3] + [2] * (count - 3) + [1, 0]
    return list(reversed(range(count)))


def pixel_frames(latent_frames: int) -> int:
    """Frames the causal VAE decodes from `latent_frames` latents."""
    return (latent_frames - 1) * VAE_TIME_RATIO + 1 if latent_frames > 0 else 0


def overlap_frames(window: int) -> int:
    """Pixel frames cross-faded between a newly decoded part and the video so far."""
    return (window - 1) * VAE_TIME_RATIO + 1


@dataclass(frozen=True)
class SectionIndices:
    """RoPE frame indices of each part of the transformer's input for one section."""
    latents: list[int]
    clean: list[int]          # 1x clean latents (prefix + post/history frame)
    history_2x: list[int]
    history_4x: list[int]


@dataclass(frozen=True)
class Section:
    index: int                # 0-based, in generation order
    count: int
    padding: int              # original mode: blank windows between prefix and window; f1: 0

    @property
    def is_first(self) -> bool:
        return self.index == 0

    @property
    def is_last(self) -> bool:
        return self.index == self.count - 1


@dataclass(frozen=True)
class SectionPlan:
    mode: str                 # "original" | "f1"
    window: int               # latent frames per section
    count: int

    @property
    def sections(self) -> list[Section]:
        pads = latent_paddings(self.count) if self.mode == "original" else [0] * self.count
        return [Section(i, self.count, pads[i]) for i in range(self.count)]

    @property
    def history_sizes(self) -> tuple[int, int, int]:
        return HISTORY_ORIGINAL if self.mode == "original" else HISTORY_F1

    def indices(self, section: Section, prefix: int = 1) -> SectionIndices:
        """`prefix`: clean latents before the blank padding in the original mode (1: the start latent; more when an
        extension toward an end frame gives the input video's last latents, pipeline/extend.py)."""
        w = self.window
        if self.mode == "original":
            pad = section.padding * w
            # [prefix 1 (or more) | blank pad | window w | post 1 | 2x 2 | 4x 16]
            start_latents = prefix + pad
            post = start_latents + w
            return SectionIndices(
                latents=list(range(start_latents, post)),
                clean=[*range(prefix), post],
                history_2x=list(range(post + 1, post + 3)),
                history_4x=list(range(post + 3, post + 19)),
            )
        # f1: [prefix 1 | 4x 16 | 2x 2 | 1x 1 | window w]
        return SectionIndices(
            latents=list(range(20, 20 + w)),
            clean=[0, 19],
            history_2x=[17, 18],
            history_4x=list(range(1, 17)),
        )

    def real_latent_frames(self, section: Section) -> int:
        """Latent frames of the video after `section`: the generated windows, plus the start latent once it is
        part of the video (from the start in f1, with the last section in the original mode)."""
        with_start = self.mode == "f1" or section.is_last
        return (section.index + 1) * self.window + (1 if with_start else 0)

    def decode_frames(self, section: Section) -> int:
        """Latent frames decoded after `section`: all on the first, then the newest 2w (2w + 1 on the original
        mode's last section, which adds the start latent)."""
        if section.is_first:
            return self.real_latent_frames(section)
        if self.mode == "original" and section.is_last:
            return 2 * self.window + 1
        return 2 * self.window

    def video_frames_after(self, section: Section) -> int:
        """Pixel frames in the video after `section` has been decoded and blended, in closed form: the first
        decode, then every later one adds its frames minus the cross-fade (4·w; 4·w + 4 for the original mode's last
        section, which adds the start latent)."""
        return self.frames_after(section.index)

    def frames_after(self, index: int) -> int:
        """`video_frames_after` by 0-based section index (no Section objects needed)."""
        if not 0 <= index < self.count:
            raise IndexError(f"section {index} of a {self.count}-section plan")
        first = Section(0, self.count, 0)
        total = pixel_frames(self.decode_frames(first)) + index * self.window * VAE_TIME_RATIO
        if self.mode == "original" and index == self.count - 1 and index > 0:
            total += VAE_TIME_RATIO
        return total

    @property
    def total_frames(self) -> int:
        return self.frames_after(self.count - 1)

    def frame_counts(self) -> list[int]:
        return [self.frames_after(i) for i in range(self.count)]


def _bounded(name: str, value, lo, hi, *, kind=float):
    """`value` as `kind` if it is a finite number in [lo, hi]; ValueError naming `name` otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"{name}: a number is required, got {value!r}")
    try:
        v = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{name}: {str(value)[:40]!r} is not a number") from None
    if not math.isfinite(v) or not lo <= v <= hi or (kind is int and v != int(v)):
        raise ValueError(f"{name}: {v:g} is not {'a whole number ' if kind is int else ''}between {lo} and {hi}")
    return kind(v)


def make_plan(mode: str, seconds: float, window: float, fps: float = 30) -> SectionPlan:
    """The plan of a request's length; raises ValueError (naming the field) for values beyond the request
    limits, before building anything."""
    if mode not in ("original", "f1"):
        raise ValueError(f"mode: {str(mode)[:40]!r} is not one of 'original', 'f1'")
    seconds = _bounded("seconds", seconds, *LIMITS.seconds)
    frames: int = _bounded("latent window", window, *LIMITS.latent_window, kind=int)
    rate: int = _bounded("fps", fps, *LIMITS.fps, kind=int)
    return SectionPlan(mode, frames, section_count(seconds, frames, rate))


# ---- tensor bookkeeping (pure slicing; tensors are (B, C, T, H, W)) ---------------------------------------------


def empty_history(plan: SectionPlan, start_latent: torch.Tensor) -> torch.Tensor:
    """The history before the first section: zeros for the compressed context (+ the start latent in f1)."""
    b, c, _, h, w = start_latent.shape
    zeros = torch.zeros(b, c, sum(plan.history_sizes), h, w, dtype=torch.float32, device=start_latent.device)
    if plan.mode == "f1":
        return torch.cat([zeros, start_latent.float()], dim=2)
    return zeros


@dataclass(frozen=True)
class SectionContext:
    clean: torch.Tensor       # (B, C, 2, H, W): start latent + post/1x frame
    history_2x: torch.Tensor
    history_4x: torch.Tensor


def section_context(plan: SectionPlan, section: Section, history: torch.Tensor, start_latent: torch.Tensor,
                    end_latent: torch.Tensor | None = None) -> SectionContext:
    """Clean-latent slices for `section` from the history. In the original mode the end image's latent takes the
    first section's post slot. `start_latent` is the 1x prefix: the start latent, or (original mode, see
    `SectionPlan.indices`' `prefix`) several latents."""
    sizes = list(plan.history_sizes)
    if plan.mode == "original":
        one, two, four = history[:, :, : sum(sizes)].split(sizes, dim=2)
        if end_latent is not None and section.is_first:
            one = end_latent.float()
    else:
        four, two, one = history[:, :, -sum(sizes):].split(sizes, dim=2)
    return SectionContext(torch.cat([start_latent.float(), one], dim=2), two, four)


def append_section(plan: SectionPlan, section: Section, history: torch.Tensor, generated: torch.Tensor,
                   start_latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Add a section's latents to the history. Returns (new history, the real latents so far in video order)."""
    real_count = plan.real_latent_frames(section)
    if plan.mode == "original":
        if section.is_last:
            generated = torch.cat([start_latent.float(), generated], dim=2)
        history = torch.cat([generated, history], dim=2)
        return history, history[:, :, :real_count]
    history = torch.cat([history, generated], dim=2)
    return history, history[:, :, -real_count:]


def real_latents_after(plan: SectionPlan, section: Section, real_now: torch.Tensor, sections_done: int
                       ) -> torch.Tensor:
    """The real latents as they were right after `section` (one of the first `sections_done`), cut from those after
    `sections_done` sections. In the original mode the newest latents come first, and the last section also put
    the start latent in front of them."""
    if plan.mode == "original":
        if section.index == sections_done - 1:
            return real_now
        start = 1 if sections_done == plan.count else 0
        return real_now[:, :, start + (sections_done - 1 - section.index) * plan.window:]
    return real_now[:, :, : plan.real_latent_frames(section)]


def latents_to_decode(plan: SectionPlan, section: Section, real: torch.Tensor) -> torch.Tensor:
    n = plan.decode_frames(section)
    return real[:, :, :n] if plan.mode == "original" else real[:, :, -n:]


def join_video(plan: SectionPlan, video: torch.Tensor | None, decoded: torch.Tensor) -> torch.Tensor:
    """Blend a newly decoded part into the video so far (it goes before it in the original mode)."""
    if video is None:
        return decoded
    overlap = overlap_frames(plan.window)
    return soft_append(decoded, video, overlap) if plan.mode == "original" else soft_append(video, decoded, overlap)


def blend_latents(start: torch.Tensor, other: torch.Tensor, strength: float) -> torch.Tensor:
    """(1 − strength)·start + strength·other, in float32 (a keyframe's share of a section's start slot); strength 1
    is `other` itself, bit for bit."""
    if strength == 1.0:
        return other.float()
    return torch.lerp(start.float(), other.float(), float(strength))
