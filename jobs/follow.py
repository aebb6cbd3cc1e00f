"""Following a queued job: where it stands in line while it waits and how long it will wait (`QueueLine.waiting`),
the expected time of a job (`expected_seconds`), and its events as they come (`QueueLine.follow`: Waiting while it
waits, then the job's own). The page (ui/sessions.py) and the command line (cli/commands.py) both follow their jobs
through one QueueLine on their runner; the runner itself only runs the queue (jobs/runner.py).

The line learns from the runner's events (`Runner.listeners`): the speed of the last finished job (jobs/line.py
`Speed`) and each running job's latest estimate of its time left."""
from __future__ import annotations

import logging
import queue
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator

from configs.generation import DEFAULTS
from jobfolder.folder import load_job
from jobs import store as qs
from jobs.line import Speed, Waiting
from jobs.runner import ENDED, QueuedJob, Runner
from pipeline.events import Done, Failed, Progress
from post.steps import is_post

log = logging.getLogger(__name__)

WAIT_TICK_S = 1.0           # a waiting job's place and expected wait are looked at again this often
LEARN_FOLDERS_MAX = 50      # the newest job folders of outputs/ looked at for a finished job's speed (`learn_from`)


class QueueLine:
    """The ETAs of one runner's queue, learnt from its events (it registers itself as the runner's listener)."""

    def __init__(self, runner: Runner):
        self.runner = runner
        self.speed = Speed(getattr(runner.preflight, "default_resolution", None))   # a job's expected time
        self._estimates: dict[str, tuple[float, float]] = {}   # entry -> (its latest time left, when it was made)
        self._lock = threading.Lock()
        runner.listeners.append(self.note)

    def note(self, job: QueuedJob, event: object) -> None:
        """(The runner's listener.) A running job's estimate; a finished job's speed."""
        if isinstance(event, Progress) and event.eta_s is not None:
            with self._lock:
                self._estimates[job.entry] = (event.eta_s, time.monotonic())
        elif isinstance(event, (Done, Failed)):
            with self._lock:
                self._estimates.pop(job.entry, None)
            if isinstance(event, Done) and not event.stopped and job.work is not None \
                    and job.work.resuming is None and job.work.post is None:
                self.speed.learn(job.work.request, event.timings)

    def learn_from(self, outputs: Path) -> bool:
        """Before this process has timed a job: the speed of the newest job in `outputs` that ended done (the app's
        or an earlier command's), from its job.json's settings and timings, so that a command line following a
        queue that another process runs, or a batch whose first job has not ended, can say the expected waits
        (before, "no wait estimate yet" while the app had timed many jobs). True when a speed is known."""
        if self.speed.rates is not None:
            return True
        try:
            folders = sorted((p for p in Path(outputs).iterdir() if (p / "job.json").is_file()),
                             key=lambda p: p.name, reverse=True)[:LEARN_FOLDERS_MAX]
        except OSError:
            return False
        for folder in folders:
            try:
                info = load_job(folder)
            except (OSError, ValueError):
                continue
            settings, timings = info.get("settings"), info.get("timings")
            if info.get("status") != "done" or not isinstance(settings, dict) or not isinstance(timings, dict) \
                    or is_post(settings):
                continue
            try:
                self.speed.learn(_settings_request(settings), timings)
            except (ValueError, TypeError, OverflowError):
                continue
            if self.speed.rates is not None:
                log.info("expected times at the speed of job %s", folder.name)
                return True
        return False

    def expected_seconds(self, request) -> float | None:
        return self.speed.expected_seconds(request)

    def waiting(self, job: QueuedJob) -> Waiting | None:
        """Where a waiting job stands in line (None once it runs, or when it is not in the queue any more)."""
        if job.started or job.finished:
            return None
        entries = self.runner.store.entries([qs.WAITING, qs.RUNNING])
        ids = [e.id for e in entries]
        if job.entry not in ids:
            return None
        mine = ids.index(job.entry)
        if entries[mine].status == qs.RUNNING:          # another process (the app) runs it: it waits no more
            return None
        ahead = [e for i, e in enumerate(entries) if i != mine and (e.status == qs.RUNNING or
                                                                    (i < mine and e.status == qs.WAITING))]
        if not ahead:
            return None
        now = time.monotonic()
        return self.speed.waiting([self._time_left(e, now) for e in ahead])

    def _time_left(self, entry: qs.Entry, now: float) -> float | None:
        job = self.runner.get(entry.id)
        with self._lock:
            estimate = self._estimates.get(entry.id)
        if job is not None and job.started and estimate is not None:
            eta_s, at = estimate
            return max(eta_s - (now - at), 0.0)
        if is_post(entry.settings):             # a post job's time is known once it runs (its chunks' pace)
            return None
        expected = self.speed.expected_seconds(_settings_request(entry.settings))
        if expected is None:
            return None
        if entry.status == qs.RUNNING:
            return max(expected * (1.0 - entry.progress), 0.0)
        return expected

    def follow(self, job: QueuedJob, tick_s: float | None = None) -> Iterator[object | None]:
        """The job's events as they come: Waiting while it waits (when its place or the expected wait changes),
        then the job's own, ending with Done, Failed or Cancelled (its end is recorded then). With `tick_s`, None
        after that long without events (a page moves its clock on, a command line looks at the store). Closing it
        early leaves the job running (a browser that went away: the job ends in outputs/)."""
        last_wait = None
        while True:
            waits = not job.started and not job.finished
            timeout = min(tick_s or WAIT_TICK_S, WAIT_TICK_S) if waits else tick_s
            try:
                event = job.events.get(timeout=timeout)
            except queue.Empty:
                if not job.started and not job.finished:
                    place = self.waiting(job)
                    if place is not None and place != last_wait:
                        last_wait = place
                        yield place
                        continue
                if tick_s is not None:
                    yield None
                continue
            if event is ENDED:
                return
            yield event


def _settings_request(settings: dict):
    """The parts of a stored entry's settings an estimate needs (jobs/line.py), with the defaults."""
    return SimpleNamespace(mode=settings.get("mode", DEFAULTS.mode), seconds=settings.get("seconds", DEFAULTS.seconds),
                           latent_window=settings.get("latent_window", DEFAULTS.latent_window),
                           fps=settings.get("fps", DEFAULTS.fps), steps=settings.get("steps", DEFAULTS.steps),
                           resolution=settings.get("resolution"), width=settings.get("width", 0),
                           height=settings.get("height", 0))
