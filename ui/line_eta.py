"""Where a job stands in the runner's line and how long it will wait (ui/runner.py's JobRunner mixes this in;
farm/runner.py overrides `_waiting`): the jobs ahead, their remaining or expected time at the speed of the last
finished job (pipeline/eta.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipeline.events import Done

if TYPE_CHECKING:
    from ui.runner import Ticket


@dataclass(frozen=True)
class Waiting:
    """The job waits for the GPU: `ahead` jobs are before it in line (one of them may be running); `wait_s` is the
    estimated time until it starts (None when there is nothing to estimate from yet)."""
    ahead: int
    wait_s: float | None


def plan_of(request):
    """The section plan of a request (pipeline.sections)."""
    from pipeline import sections

    return sections.make_plan(request.mode, request.seconds, request.latent_window, request.fps)


class LineEstimates:
    """(Mixed into JobRunner: uses its `_line`, `_running` and `rates`; the lock is held by the callers of
    `_waiting`.)"""

    def _waiting(self, ticket: Ticket, now: float) -> Waiting | None:
        if ticket not in self._line:
            return None
        ahead = self._line[: self._line.index(ticket)]
        if not ahead and self._running in (None, ticket):
            return None
        if self._running is not None and self._running is not ticket and self._running not in ahead:
            ahead = [self._running, *ahead]
        wait = 0.0
        for t in ahead:
            left = self._time_left(t, now)
            if left is None:
                return Waiting(len(ahead), None)
            wait += left
        return Waiting(len(ahead), wait)

    def _time_left(self, ticket: Ticket, now: float) -> float | None:
        if ticket.started and ticket.eta_s is not None:
            return max(ticket.eta_s - (now - ticket.eta_at), 0.0)
        expected = self.expected_seconds(ticket.request)
        if expected is not None and ticket.started:
            return max(expected - (now - ticket.created), 0.0)
        return expected

    def expected_seconds(self, request) -> float | None:
        """How long a whole job with this request is expected to take, at the last complete job's speed."""
        if self.rates is None or request is None:
            return None
        try:
            return self.rates.job_seconds(plan_of(request), int(request.steps))
        except (ValueError, TypeError, OverflowError):
            return None

    def _learn(self, ticket: Ticket, done: Done) -> None:
        from pipeline.eta import JobRates

        if done.stopped or ticket.resume is not None:
            return
        rates = JobRates.from_timings(done.timings, plan_of(ticket.request), int(ticket.request.steps))
        if rates is not None:
            self.rates = rates
