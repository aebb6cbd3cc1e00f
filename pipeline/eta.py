"""Time estimates: how long the rest of a running job takes, and how long a whole job takes.

`Remaining` follows one job's progress (stage, section, step, elapsed: what every Progress event carries) and
estimates the time left from everything that is still to run: the sampling steps of this and the later sections,
and the VAE decode of every section not yet decoded, at the decode time per latent frame measured in this job.
Until the first decode of the job has finished, the decode time per frame is the one measured on an earlier job
(`decode_prior`, when the caller has one: the app passes its last job's), else a section's decode is assumed to
take as long as its sampling (`DECODE_PRIOR`) and at least as long as this job's VAE encode stage (the same model
loaded for one frame): assumptions, replaced by the measurement as soon as there is one.

`JobRates` are the speeds of a finished job (per step, per decoded latent frame, fixed stages), used to estimate
jobs that have not started (the queue's waiting time, the expected time of a long job).
"""
from __future__ import annotations

from dataclasses import dataclass, field

DECODE_PRIOR = 1.0      # before any decode is measured: a section's decode ≈ this × its sampling time


def decode_frames(plan) -> list[int]:
    """Latent frames decoded after each section of a pipeline.sections.SectionPlan."""
    return [plan.decode_frames(s) for s in plan.sections]


@dataclass
class Remaining:
    sections: int
    steps: int
    frames: list[int]                      # latent frames decoded after each section (decode_frames(plan))
    step_times: list[float] = field(default_factory=list)
    decode_s: float = 0.0                  # decode time measured so far, and the latent frames it decoded
    decoded_frames: int = 0
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
                self.step_times.append(spent / (step - l_step))
            elif l_stage == "VAE decode" and (stage, section, step) != (l_stage, l_section, l_step):
                self.decode_s += spent
                self.decoded_frames += self.frames[min(max(l_section, 1), self.sections) - 1]
            elif l_stage == "VAE encode" and stage != l_stage:
                self.encode_s += spent
        self._last = (stage, section, step, elapsed_s)
        return self.estimate(stage, section, step)

    @property
    def per_step(self) -> float | None:
        recent = self.step_times[-self.steps:]
        return sum(recent) / len(recent) if recent else None

    def decode_per_frame(self) -> float | None:
        """Seconds per decoded latent frame: measured, else the prior (a section's sampling time)."""
        if self.decoded_frames:
            return self.decode_s / self.decoded_frames
        if self.decode_prior is not None:
            return self.decode_prior
        per_step = self.per_step
        if per_step is None:
            return None
        typical = max(self.frames[-1], 1)
        return max(DECODE_PRIOR * per_step * self.steps, self.encode_s) / typical

    @property
    def decode_measured(self) -> bool:
        return self.decoded_frames > 0

    def estimate(self, stage: str, section: int, step: int) -> float | None:
        per_step, per_frame = self.per_step, self.decode_per_frame()
        if per_step is None or per_frame is None:
            return None
        n = min(max(section, 1), self.sections)
        if stage == "sampling":
            steps_left = (self.steps - step) + (self.sections - n) * self.steps
            first_undecoded = n                        # this section's decode is still to come
        else:                                          # "VAE decode" of section n (or a stage after sampling)
            steps_left = (self.sections - n) * self.steps
            first_undecoded = n if stage == "VAE decode" else n + 1
        frames_left = sum(self.frames[first_undecoded - 1:])
        return steps_left * per_step + frames_left * per_frame


@dataclass(frozen=True)
class JobRates:
    """Speeds measured on a finished job: seconds per sampling step, per decoded latent frame, and the fixed part
    (text, image encoders, video writing) of the job."""
    per_step: float
    per_frame: float
    fixed: float

    @classmethod
    def from_timings(cls, timings: dict, plan, steps: int) -> "JobRates | None":
        """From a complete job's Done.timings; None when they lack what is needed."""
        try:
            transformer, decode, total = (float(timings[k]) for k in ("transformer", "VAE decode", "total"))
        except (KeyError, TypeError, ValueError):
            return None
        frames = sum(decode_frames(plan))
        if plan.count <= 0 or steps <= 0 or frames <= 0:
            return None
        fixed = max(total - transformer - decode, 0.0)
        return cls(transformer / (plan.count * steps), decode / frames, fixed)

    def job_seconds(self, plan, steps: int) -> float:
        """Estimated time of a whole job with this plan and steps."""
        return self.fixed + plan.count * steps * self.per_step + sum(decode_frames(plan)) * self.per_frame
