"""Time estimates: how long the rest of a running job takes, and how long a whole job takes.

`Remaining` follows one job's progress (stage, section, step, elapsed: what every Progress event carries) and
estimates the time left from everything that is still to run: the sampling steps of this and the later sections,
and the VAE decode of every section not yet decoded, at the decode time per latent frame measured in this job.

A step's time is measured between two steps of a section: the time from a section's start to its first step also
holds loading the transformer, preparing compiled kernels (the first section) and the first use of each kernel, so
it is kept apart (`start_times`); a later section is expected to cost that much more than its steps only once a
later section's start has been measured (the first one's is mostly one-time work).

Until the first decode of the job has finished, the decode time per frame is the one measured on an earlier job
(`decode_prior`, when the caller has one), else a latent frame's decode is assumed to take `DECODE_PRIOR` sampling
steps (BENCHMARKS.md, the 3-section job on an H100: 0.29–0.36 s a latent frame at 1.3 s a step; assuming instead a
section's decode as long as its sampling put section 1's estimate ~70 % too high, issue 33) and each section's
decode at least as long as this job's VAE encode stage (the same model loaded for one frame): assumptions, replaced
by the measurement as soon as there is one.

`JobRates` are the speeds of a finished job (per step, per decoded latent frame, fixed stages), used to estimate
jobs that have not started (the queue's waiting time, the expected time of a job). A step's time grows with the
latent tokens the transformer sees (the frame size × the latent window, `step_tokens`) and a decode's with the frame
size, so a job of another size is estimated at the timed job's speed per token and per pixel.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from memory.plan import framepack_tokens

DECODE_PRIOR = 0.25     # before any decode is measured: a latent frame's decode ≈ this many sampling steps


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


def decode_frames(plan) -> list[int]:
    """Latent frames decoded after each section of a pipeline.sections.SectionPlan."""
    return [plan.decode_frames(s) for s in plan.sections]


@dataclass
class Remaining:
    sections: int
    steps: int
    frames: list[int]                      # latent frames decoded after each section (decode_frames(plan))
    step_times: list[float] = field(default_factory=list)
    start_times: list[tuple[int, float]] = field(default_factory=list)   # (section, its start to its first step)
    decode_s: float = 0.0                  # decode time measured so far, and the latent frames it decoded
    decoded_frames: int = 0
    first_decode: tuple[float, int] | None = None     # the job's first decode (seconds, frames): one-time work too
    decode_prior: float | None = None      # seconds per decoded latent frame measured on an earlier job
    encode_s: float = 0.0                  # this job's VAE encode stage
    _last: tuple | None = None             # (stage, section, step, elapsed) of the previous update

    @classmethod
    def for_plan(cls, plan, steps: int, decode_prior: float | None = None) -> "Remaining":
        return cls(plan.count, steps, decode_frames(plan), decode_prior=decode_prior)

    def update(self, stage: str, section: int, step: int, elapsed_s: float) -> float | None:
        """Record a progress point and return the estimated seconds left (None before sampling has timed a step)."""
        last = self._last
        if last is not None:
            l_stage, l_section, l_step, l_elapsed = last
            spent = max(elapsed_s - l_elapsed, 0.0)
            if stage == "sampling" and l_stage == "sampling" and step > l_step and section == l_section:
                if l_step == 0:          # the section's start: loading, kernels, then its first step(s)
                    self.start_times.append((section, spent - (step - 1) * (self.per_step or 0.0)))
                else:
                    self.step_times.append(spent / (step - l_step))
            elif l_stage == "VAE decode" and (stage, section, step) != (l_stage, l_section, l_step):
                frames = self.frames[min(max(l_section, 1), self.sections) - 1]
                if self.first_decode is None:
                    self.first_decode = (spent, frames)
                else:
                    self.decode_s += spent
                    self.decoded_frames += frames
            elif l_stage == "VAE encode" and stage != l_stage:
                self.encode_s += spent
        self._last = (stage, section, step, elapsed_s)
        return self.estimate(stage, section, step)

    @property
    def per_step(self) -> float | None:
        recent = self.step_times[-self.steps:]
        if recent:
            return sum(recent) / len(recent)
        if self.steps == 1 and self.start_times:          # one step a section: its start is all there is
            return self.start_times[-1][1]
        return None

    def start_extra(self) -> float:
        """What a section's start costs more than a step (loading the transformer), from the latest section after
        the first (the first's start holds one-time work: compiling, the first use of every kernel); 0 before."""
        later = [t for section, t in self.start_times if section > 1]
        per_step = self.per_step or 0.0
        return max(later[-1] - per_step, 0.0) if later else 0.0

    def decode_per_frame(self) -> float | None:
        """Seconds per decoded latent frame: measured (on the decodes after the first, once there are some: the
        first also starts the VAE and the video's writer), else the prior."""
        if self.decoded_frames:
            return self.decode_s / self.decoded_frames
        if self.first_decode is not None and self.first_decode[1]:
            return self.first_decode[0] / self.first_decode[1]
        if self.decode_prior is not None:
            return self.decode_prior
        per_step = self.per_step
        if per_step is None:
            return None
        # a section's decode is at least this job's VAE encode stage (the same model, one frame): where decoding is
        # slow next to a step (the CPU, the tiny preset) that bound, not the GPU's ratio, is what holds
        return max(DECODE_PRIOR * per_step, self.encode_s / max(min(self.frames), 1))

    @property
    def decode_measured(self) -> bool:
        return self.first_decode is not None

    def estimate(self, stage: str, section: int, step: int) -> float | None:
        per_step, per_frame = self.per_step, self.decode_per_frame()
        if per_step is None or per_frame is None:
            return None
        n = min(max(section, 1), self.sections)
        if stage == "sampling":
            steps_left = (self.steps - step) + (self.sections - n) * self.steps
            starts_left = self.sections - n + (step == 0)    # at step 0 this section's start is still running
            first_undecoded = n                        # this section's decode is still to come
        else:                                          # "VAE decode" of section n (or a stage after sampling)
            steps_left = (self.sections - n) * self.steps
            starts_left = self.sections - n
            first_undecoded = n if stage == "VAE decode" else n + 1
        frames_left = sum(self.frames[first_undecoded - 1:])
        return steps_left * per_step + starts_left * self.start_extra() + frames_left * per_frame


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
