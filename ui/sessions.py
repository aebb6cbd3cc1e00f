"""The page's and the API's side of the queue: which tab (a Gradio session) started which job, the refusal it was
last shown, End for a tab, and a job's events in the lists a page's stream takes. The runner (jobs/runner.py) only
runs the queue and knows nothing of tabs; where a waiting job stands and how long it waits come from the one
`QueueLine` of the runner (jobs/follow.py), which the command line follows its jobs through too.

    sessions = Sessions(runner)
    job = sessions.submit(request, session=..., owner=..., origin="page")  # one unfinished job per tab
    for events in sessions.stream(job):                                     # Waiting ..., then the job's events
        ...
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Iterator

from jobs.follow import QueueLine
from jobs.line import Waiting
from jobs.runner import Busy, QueuedJob, Runner, Stop
from pipeline.events import SectionVideo

NOTHING_TO_STOP = "Nothing to stop."
STOPPING = "Stopping at the next step; the video made so far is kept…"


class SessionBusy(Busy):
    """The tab has a job running or waiting already."""


def stop_text(outcome: Stop, entry_id: str, waited_on: bool) -> str:
    """What End (`Runner.stop`) did, in the page's and the API's words (`waited_on`: a tab or call waited on it)."""
    if outcome is Stop.DROPPED:
        return "Cancelled: the waiting job will not run." if waited_on else f"Removed job {entry_id} from the queue."
    if outcome is Stop.ELSEWHERE:
        return "That job runs in another process (the app or a command line); stop it there."
    return STOPPING if outcome is Stop.STOPPING else NOTHING_TO_STOP


def stop_in_words(runner: Runner, entry_id: str) -> str:
    """End for an entry (the queue panel, a watched job), in words."""
    job = runner.get(entry_id)
    return stop_text(runner.stop(entry_id), entry_id, job is not None and job.waited_on)


class Sessions:
    """The tabs' jobs on one runner (app.py builds one per app; the page's panels and the API call it)."""

    def __init__(self, runner: Runner, line: QueueLine | None = None):
        self.runner = runner
        self.line = line if line is not None else QueueLine(runner)
        self._current: dict[str, QueuedJob] = {}     # session -> its newest job
        self._errors: dict[str, str] = {}            # session -> the refusal it was shown last
        self._lock = threading.RLock()               # re-entrant: a signal handler of the main thread may ask it

    # ---- adding -----------------------------------------------------------------------------------------------------
    def submit(self, job, *, session: str | None = None, owner: str | None = None, origin: str = "page",
               checked: bool = False, client: str | None = None) -> QueuedJob:
        """`Runner.submit` for a tab: a session has at most one unfinished job (SessionBusy); its entry leaves the
        queue when the job ends (the tab has the result). Raises InputError naming the field."""
        self._refuse_second(session)
        return self._remember(session, self.runner.submit(job, owner=owner, origin=origin, checked=checked,
                                                          waited_on=session is not None, client=client))

    def submit_resume(self, job_dir: Path, *, session: str | None = None, owner: str | None = None,
                      origin: str = "page", client: str | None = None) -> QueuedJob:
        """`Runner.submit_resume` for a tab (SessionBusy as `submit`; `client`: who adds it, as `Runner.submit`)."""
        self._refuse_second(session)
        return self._remember(session, self.runner.submit_resume(job_dir, owner=owner, origin=origin,
                                                                 waited_on=session is not None, client=client))

    def _refuse_second(self, session: str | None) -> None:
        old = self.current(session) if session else None
        if old is not None and not old.finished:
            raise SessionBusy("this tab already has a job running or waiting; press End to stop it")

    def _remember(self, session: str | None, job: QueuedJob) -> QueuedJob:
        if session:
            with self._lock:
                self._current[session] = job
                self._errors.pop(session, None)
        return job

    # ---- asking -----------------------------------------------------------------------------------------------------
    def current(self, session: str) -> QueuedJob | None:
        """The session's newest job (finished or not)."""
        with self._lock:
            return self._current.get(session)

    def remember_error(self, session: str, message: str) -> None:
        with self._lock:
            self._errors[session] = message

    def last_error(self, session: str) -> str | None:
        with self._lock:
            return self._errors.get(session)

    def waiting(self, job: QueuedJob) -> Waiting | None:
        return self.line.waiting(job)

    def expected_seconds(self, request) -> float | None:
        return self.line.expected_seconds(request)

    # ---- End ---------------------------------------------------------------------------------------------------------
    def stop(self, entry_id: str) -> str:
        """End for an entry (a job the tab watches), in words."""
        return stop_in_words(self.runner, entry_id)

    def cancel(self, session: str) -> str:
        """End: stop the session's running job at its next step (keeping its video), or drop its waiting job."""
        job = self.current(session)
        if job is None or job.finished:
            return NOTHING_TO_STOP
        return self.stop(job.entry)

    def drop_waiting(self, session: str) -> None:
        """The tab was closed: its waiting job is dropped; a running one finishes (its video lands in outputs/)."""
        job = self.current(session)
        if job is not None and not job.started and not job.finished:
            self.runner.stop(job.entry)
        with self._lock:
            if job is not None and job.finished:
                self._current.pop(session, None)
            self._errors.pop(session, None)

    # ---- streams ----------------------------------------------------------------------------------------------------
    def stream(self, job: QueuedJob, tick_s: float | None = None) -> Iterator[list]:
        """The job's events (`QueueLine.follow`) in lists: whatever piled up since the last list, at most one
        SectionVideo, as the last item, so every section's video reaches a page. With `tick_s`, an empty list after
        that long without events (a page moves its clock on)."""
        batch: list = []
        for event in self.line.follow(job, tick_s):
            if event is None:
                yield []
                continue
            batch.append(event)
            if isinstance(event, SectionVideo) or job.events.empty():
                yield batch
                batch = []
        if batch:
            yield batch
