"""The app's line kept on disk: every job started with Start, Resume or a /video or /resume call is also an entry of
the queue's store (jobs/store.py) while it waits or runs, so a restart of the app (a crash, a kill, a
power cut) shows it and continues it.

While the app runs, such a job runs in the runner's line as before (ui/runner.py: click order, the page's live
previews, End); its entry (status "in line", then "running") follows it: its job folder once the first section is
saved, its progress. The queue's copies of its files (jobs/store.py copies them into outputs/.queue/) are
the ones the job reads, in place of the runner's own staging. When the job ends (done, stopped, failed, or End
while it waited) the entry leaves the queue at once. When the app stops first, the entry stays: at the next start
it waits in the queue (QueueStore.open), and the queue worker (ui/queue_worker.py) runs it like any queued job,
from its job folder's last finished section when it had one.
"""
from __future__ import annotations

import dataclasses
import logging
import sqlite3
import time
from pathlib import Path

from jobs import store as qs
from pipeline.events import Progress, Started

log = logging.getLogger(__name__)

PROGRESS_EVERY_S = 0.5          # a job's progress written to the database at most this often
IN_LINE_TEXT = "started with Start or /video: runs in the app's line (End removes it while it waits)"


class LineRecorder:
    """Keeps the runner's tickets in `store` (JobRunner.recorder). Every method but `keep` logs a database
    problem and goes on: the job itself never fails because its record could not be written."""

    def __init__(self, store: qs.QueueStore):
        self.store = store

    def keep(self, ticket) -> bool:
        """Add the ticket's job to the store, and make it read the store's copies of its files. False when it
        cannot be kept (its images are not files, the database cannot be written): it runs unrecorded."""
        prepared, resuming = ticket.prepared, ticket.resuming
        request = prepared.request
        files = {name: getattr(request, name, None) for name in qs.FILE_NAMES}
        if any(v is not None and not (isinstance(v, (str, Path)) and Path(v).exists()) for v in files.values()):
            log.info("job %s is not kept in the queue: its images are not files", ticket.id)
            return False
        values = {**request.settings(), **{k: str(v) for k, v in files.items() if v is not None}}
        try:
            (entry,) = self.store.add_many([values], status=qs.IN_LINE, message=IN_LINE_TEXT,
                                           job_dir=resuming.job_dir.name if resuming is not None else None,
                                           owner=ticket.owner)
        except (OSError, sqlite3.Error) as e:
            log.warning("job %s is not kept in the queue (it will not survive a restart): %s", ticket.id, e)
            return False
        ticket.entry, ticket.recorded = entry.id, True
        if resuming is None:            # the job reads the queue's copies (an upload may be swept while it waits)
            copies = {k: entry.images[k] for k in qs.FILE_NAMES if entry.images.get(k)}
            source = prepared.source
            if source is not None and source.kind == "video":
                source = dataclasses.replace(source, path=Path(copies["input_video"]))
            ticket.prepared = dataclasses.replace(prepared, request=dataclasses.replace(request, **copies),
                                                  source=source)
        return True

    def _update(self, ticket, **changes) -> None:
        try:
            self.store.update(ticket.entry, **changes)
        except (OSError, sqlite3.Error) as e:
            log.warning("queue record of job %s: %s", ticket.id, e)

    def started(self, ticket) -> None:
        self._update(ticket, status=qs.RUNNING, message="running (started with Start or /video)")

    def drop(self, ticket) -> None:
        """The job ended (or never ran): out of the queue."""
        try:
            self.store.forget(ticket.entry)
        except (OSError, sqlite3.Error) as e:
            log.warning("queue record of job %s: %s", ticket.id, e)

    def tap(self, ticket, out):
        """`out` (the job's event queue) with every event also noted in the ticket's entry."""
        return _Tap(self, ticket, out)


class _Tap:
    def __init__(self, recorder: LineRecorder, ticket, out):
        self.recorder, self.ticket, self.out = recorder, ticket, out
        self.last = 0.0

    def put(self, event) -> None:
        if isinstance(event, Started):         # from here on a restart continues it in its folder
            self.recorder._update(self.ticket, job_dir=event.job_dir.name)
        elif isinstance(event, Progress) and time.monotonic() - self.last > PROGRESS_EVERY_S:
            from ui.view import progress_line

            self.last = time.monotonic()
            self.recorder._update(self.ticket, progress=event.fraction, message=progress_line(event))
        self.out.put(event)
