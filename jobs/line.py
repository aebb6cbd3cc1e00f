"""Where a waiting job stands in the queue and how long it will wait: the jobs ahead of it (running or waiting),
each one's remaining time (a running job's latest estimate: pipeline/eta.py `Remaining`) or expected time at the
speed of the last finished job (`JobRates`).

`JobRates` are the speeds of a finished job (per step, per decoded latent frame, fixed stages), used to estimate
jobs that have not started (the queue's waiting time, the expected time of a job). A step's time grows with the
latent tokens the transformer sees (the frame size × the latent window, `step_tokens`) and a decode's with the frame
size, so a job of another size is estimated at the timed job's speed per token and per pixel.
"""
from __future__ import annotations

from dataclasses import dataclass

from memory.plan import framepack_tokens
from pipeline.eta import decode_frames


def step_tokens(height: int, width: int, window: int) -> int:
    """Latent tokens one transformer step of a section sees (the noisy window and the clean 1x/2x/4x context, not
    the image and text tokens, which do not depend on the size)."""
    return framepack_tokens(int(height), int(width), int(window), image_tokens=0, text_tokens=0)


def frame_size(request, default_resolution: int | None = None) -> tuple[int, int] | None:
    """(height, width) of a request's frames as far as its settings say: the custom size, else the square bucket
    of its resolution (a bucket's area ≈ resolution², whatever the start image's aspect); None when the resolution
    is the preset's and `default_resolution` is not known."""
    width, height = int(getattr(request, "width", 0) or 0), int(getattr(request, "height", 0) or 0)
    if width > 0 and height > 0:
        return height, width
    resolution = getattr(request, "resolution", None) or default_resolution
    if not resolution:
        return None
    side = max(16, int(round(float(resolution) / 16)) * 16)
    return side, side


@dataclass(frozen=True)
class JobRates:
    """Speeds measured on a finished job: seconds per sampling step, per decoded latent frame, and the fixed part
    (text, image encoders, video writing) of the job; `tokens` and `pixels`: a step's latent tokens and a frame's
    pixels in that job (0: not known, then every job is estimated as if of that size)."""
    per_step: float
    per_frame: float
    fixed: float
    tokens: int = 0
    pixels: int = 0

    @classmethod
    def from_timings(cls, timings: dict, plan, steps: int, size: tuple[int, int] | None = None
                     ) -> "JobRates | None":
        """From a complete job's Done.timings (`size`: its frames' height, width); None when they lack what is
        needed."""
        try:
            transformer, decode, total = (float(timings[k]) for k in ("transformer", "VAE decode", "total"))
        except (KeyError, TypeError, ValueError):
            return None
        frames = sum(decode_frames(plan))
        if plan.count <= 0 or steps <= 0 or frames <= 0:
            return None
        fixed = max(total - transformer - decode, 0.0)
        kernels = float(timings.get("preparing kernels", 0.0) or 0.0)     # (in "transformer") kept for later jobs
        tokens, pixels = (step_tokens(size[0], size[1], plan.window), size[0] * size[1]) if size else (0, 0)
        return cls(max(transformer - kernels, 0.0) / (plan.count * steps), decode / frames, fixed, tokens, pixels)

    def job_seconds(self, plan, steps: int, size: tuple[int, int] | None = None) -> float:
        """Estimated time of a whole job with this plan and steps (`size`: its frames' height, width; None: the
        timed job's), at the timed job's speed per latent token and per pixel."""
        per_step, per_frame = self.per_step, self.per_frame
        if size is not None and self.tokens and self.pixels:
            per_step *= step_tokens(size[0], size[1], plan.window) / self.tokens
            per_frame *= size[0] * size[1] / self.pixels
        return self.fixed + plan.count * steps * per_step + sum(decode_frames(plan)) * per_frame


@dataclass(frozen=True)
class Waiting:
    """The job waits for the GPU: `ahead` jobs are before it in line (some of them may be running); `wait_s` is the
    estimated time until it starts (None when there is nothing to estimate from yet)."""
    ahead: int
    wait_s: float | None


def plan_of(request):
    """The section plan of a request (pipeline.sections)."""
    from pipeline import sections

    return sections.make_plan(request.mode, request.seconds, request.latent_window, request.fps)


class Speed:
    """The speed of the last finished job, learnt from its timings: what the expected time of a job is, at that
    job's speed per latent token and per pixel (a job of another resolution or latent window takes longer or less).
    `default_resolution`: the preset's, for a request whose resolution is the preset's (None)."""

    def __init__(self, default_resolution: int | None = None):
        self.rates: JobRates | None = None      # once a job has finished
        self.default_resolution = default_resolution

    def learn(self, request, timings: dict) -> None:
        rates = JobRates.from_timings(timings, plan_of(request), int(request.steps),
                                      frame_size(request, self.default_resolution))
        if rates is not None:
            self.rates = rates

    def expected_seconds(self, request) -> float | None:
        """How long a whole job with this request is expected to take, at the last finished job's speed."""
        if self.rates is None or request is None:
            return None
        try:
            return self.rates.job_seconds(plan_of(request), int(request.steps),
                                          frame_size(request, self.default_resolution))
        except (ValueError, TypeError, OverflowError, AttributeError):
            return None

    def waiting(self, ahead: list[float | None]) -> Waiting:
        """A job with these jobs ahead of it (each one's time left, None when unknown)."""
        if any(t is None for t in ahead):
            return Waiting(len(ahead), None)
        return Waiting(len(ahead), float(sum(t for t in ahead if t is not None)))
