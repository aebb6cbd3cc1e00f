"""Where a waiting job stands in the queue and how long it will wait: the jobs ahead of it (running or waiting),
each one's remaining time (a running job's latest estimate) or expected time at the speed of the last finished job
(pipeline/eta.py `JobRates`)."""
from __future__ import annotations

from dataclasses import dataclass

from pipeline.eta import JobRates, frame_size


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
