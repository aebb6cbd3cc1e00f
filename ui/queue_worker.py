"""The queue worker: runs the waiting jobs of the queue on disk (jobs/store.py), first in line first,
through the app's JobRunner, so they share the one GPU, the runner's line and its End handling with the jobs
started from the page and by /video. It takes the next queued job only when the runner's line is empty, so a
queued job waits in the store (where it can still be reordered, edited or removed) until the GPU is free.

A queued job runs under the session "queue:<entry id>"; `stop(entry_id)` is its End. An entry that was running
when the app stopped is continued from its job folder's last finished section (JobRunner.reserve_resume); one that
had not finished a section yet starts again from its settings.
"""
from __future__ import annotations

import logging
import threading

from jobs import store as qs
from common.errors import InputError
from pipeline.events import Cancelled, Done, Failed, Progress, Started
from ui.runner import JobRunner, SessionBusy, Waiting

log = logging.getLogger(__name__)

POLL_S = 2.0            # how often the worker looks for a queued job when it has none (or the GPU is taken)
PROGRESS_EVERY_S = 0.5  # progress written to the database at most this often


def session_of(entry_id: str) -> str:
    return f"queue:{entry_id}"


class QueueWorker:
    def __init__(self, store: qs.QueueStore, runner: JobRunner, default_resolution: int, *, poll_s: float = POLL_S):
        self.store, self.runner = store, runner
        self.default_resolution = default_resolution
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.current: str | None = None             # the entry being run

    def start(self) -> "QueueWorker":
        self._thread = threading.Thread(target=self._loop, name="queue-worker", daemon=True)
        self._thread.start()
        return self

    def close(self, timeout: float | None = None) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def wake(self) -> None:
        """Look for work now (a job was added)."""
        self._wake.set()

    def stop(self, entry_id: str) -> str:
        """End for a queued job: a waiting one is removed at once, a running one stops at its next step (its video
        so far is kept, and it can be resumed from the gallery)."""
        entry = self.store.require(entry_id)
        if entry.status in (qs.RUNNING, qs.IN_LINE):      # a queued job running, or a job of the app's line
            return self.runner.cancel_entry(entry.id)
        self.store.remove(entry.id)
        return f"Removed job {entry.id} from the queue."

    # ---- the loop ---------------------------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                ran = self.step()
            except Exception as e:  # the worker must outlive a bad entry; the details go to the log
                log.error("queue worker: %s", e, exc_info=True)
                ran = False
            if not ran:
                self._wake.wait(self.poll_s)
                self._wake.clear()

    def step(self) -> bool:
        """Run the first waiting entry to its end when the GPU is free; False when there was nothing to run."""
        if not self.runner.idle:
            return False
        entry = self.store.next_waiting()
        if entry is None or not self.store.claim(entry.id):
            return False
        self.current = entry.id
        try:
            self._run(entry)
        finally:
            self.current = None
        return True

    def _ticket(self, entry: qs.Entry):
        session = session_of(entry.id)
        if entry.job_dir:
            folder = self.runner.outputs / entry.job_dir
            try:
                return self.runner.reserve_resume(session, folder, entry=entry.id, owner=entry.owner)
            except InputError as e:         # no finished section yet (or already complete): start it again
                if "already complete" in str(e):
                    return None
                log.info("queued job %s starts again: %s", entry.id, e)
        from pipeline.request import Request

        problem = qs.copy_problem(entry.images)
        if problem is not None:
            raise InputError("video", problem)
        return self.runner.reserve(session, Request.from_mapping(entry.values(), unknown="ignore"), entry=entry.id,
                                   owner=entry.owner)

    def _run(self, entry: qs.Entry) -> None:
        import time

        from ui.view import progress_line, waiting_text

        try:
            ticket = self._ticket(entry)
        except (InputError, SessionBusy) as e:
            self.store.update(entry.id, status=qs.FAILED, message=str(e)[:500])
            return
        if ticket is None:
            self.store.update(entry.id, status=qs.DONE, progress=1.0, message="complete")
            return
        last = 0.0
        result = None
        try:
            for batch in self.runner.run(ticket, tick_s=self.poll_s):
                for event in batch:
                    if isinstance(event, Started):     # a restart continues it in its folder from here on
                        self.store.update(entry.id, job_dir=event.job_dir.name)
                    elif isinstance(event, Progress) and time.monotonic() - last > PROGRESS_EVERY_S:
                        last = time.monotonic()
                        self.store.update(entry.id, progress=event.fraction, message=progress_line(event))
                    elif isinstance(event, Waiting):
                        self.store.update(entry.id, message=waiting_text(event))
                    elif isinstance(event, (Done, Failed, Cancelled)):
                        result = event
        finally:
            self.runner.forget(ticket)
        self._finish(entry, ticket, result)

    def _finish(self, entry: qs.Entry, ticket, result) -> None:
        job_dir = ticket.job_dir.name if ticket.job_dir is not None else None
        if isinstance(result, Done):
            status = qs.STOPPED if result.stopped else qs.DONE
            message = f"{status}: {result.frames} frames" + (f", {result.video.name}" if result.video else "")
            self.store.update(entry.id, status=status, progress=1.0 if not result.stopped else 0.0,
                              message=message, job_dir=job_dir)
        elif isinstance(result, Failed):
            self.store.update(entry.id, status=qs.FAILED, message=result.message[:500], job_dir=job_dir)
        else:                       # End while it waited for the GPU (behind a job from the page): removed
            self.store.update(entry.id, status=qs.STOPPED)
            self.store.remove(entry.id)
            return
        self.store.release_images(entry.id)          # the job folder keeps the user's images
