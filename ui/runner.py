"""The job runner: one GPU job at a time, a cancel token per browser session, a worker thread per job.

Gradio's queue (concurrency_limit=1 on the generate event) orders the jobs and tells users their position. The
runner adds what the queue cannot: the End button of a session reaches that session's job (running or still
waiting) through a ticket registry, and the pipeline runs in its own thread that always finishes its job cleanly
(job.json written, models unloaded) even if the browser goes away; a lock makes sure the next job starts only then.
"""
from __future__ import annotations

import logging
import queue
import secrets
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from pipeline.events import Done, Failed, LogLine, Progress, SectionVideo
from pipeline.orchestrator import CancelToken

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MemoryReport:
    """Sent after a job: the memory timeline and stage records of its MemoryManager."""
    timeline: list
    records: list
    device: str


@dataclass(frozen=True)
class Cancelled:
    """The session pressed End while its job was still waiting: nothing ran."""
    message: str = "Cancelled before it started."


@dataclass
class Ticket:
    session: str
    request: object = None                     # the validated pipeline Request
    id: str = field(default_factory=lambda: secrets.token_hex(8))
    cancel: CancelToken = field(default_factory=CancelToken)
    created: float = field(default_factory=time.monotonic)
    started: bool = False
    finished: bool = False


class SessionBusy(RuntimeError):
    pass


_END = object()


class JobRunner:
    def __init__(self, models, outputs: Path, vram_cap_gb: float, device=None):
        self.models = models                    # ui.models.ComponentCache
        self.outputs = Path(outputs)
        self.vram_cap_gb = vram_cap_gb
        self.device = device                    # None: memory.default_device()
        self._tickets: dict[str, Ticket] = {}
        self._errors: dict[str, str] = {}
        self._lock = threading.Lock()
        self._gpu = threading.Lock()

    # ---- sessions -----------------------------------------------------------------------------------------------
    def reserve(self, session: str, request) -> Ticket:
        """A ticket for the session's next job. A session has at most one unfinished job."""
        with self._lock:
            old = self._tickets.get(session)
            if old is not None and not old.finished:
                raise SessionBusy("this tab already has a job running or waiting; press End to stop it")
            ticket = self._tickets[session] = Ticket(session, request)
            self._errors.pop(session, None)
            return ticket

    def current(self, session: str) -> Ticket | None:
        """The session's newest ticket (finished or not)."""
        with self._lock:
            return self._tickets.get(session)

    def get(self, ticket_id: str | None) -> Ticket | None:
        with self._lock:
            return next((t for t in self._tickets.values() if t.id == ticket_id), None)

    def cancel(self, session: str) -> str:
        """End: stop the session's running job at its next step (keeping its video), or drop its waiting job."""
        with self._lock:
            ticket = self._tickets.get(session)
        if ticket is None or ticket.finished:
            return "Nothing to stop."
        ticket.cancel.cancel()
        if ticket.started:
            return "Stopping at the next step; the video made so far is kept…"
        ticket.finished = True      # it never started: the session may start another job right away
        return "Cancelled: the waiting job will not run."

    def drop_waiting(self, session: str) -> None:
        """The tab was closed: its waiting job is dropped; a running one finishes (its video lands in outputs/)."""
        with self._lock:
            ticket = self._tickets.get(session)
            if ticket is not None and not ticket.started:
                ticket.cancel.cancel()
                ticket.finished = True
            if ticket is not None and ticket.finished:
                del self._tickets[session]
            self._errors.pop(session, None)

    def release(self, ticket: Ticket) -> None:
        ticket.finished = True

    def remember_error(self, session: str, message: str) -> None:
        with self._lock:
            self._errors[session] = message

    def last_error(self, session: str) -> str | None:
        with self._lock:
            return self._errors.get(session)

    @property
    def busy(self) -> bool:
        return self._gpu.locked()

    # ---- running --------------------------------------------------------------------------------------------------
    def run(self, ticket: Ticket) -> Iterator[list]:
        """Run the ticket's request and yield lists of events as they come (whatever piled up since the last
        list, so a slow browser never falls behind). A list holds at most one SectionVideo, as its last item, so
        every section's video reaches the browser. If the browser goes away (this generator is closed early) the
        job still runs to its end and is saved in outputs/."""
        events: queue.Queue = queue.Queue()
        worker = threading.Thread(target=self._work, args=(ticket, events),
                                  name=f"job-{ticket.session[:8]}", daemon=True)
        ticket.started = True
        worker.start()
        finished = False
        try:
            while not finished:
                batch = [events.get()]
                while batch[-1] is not _END and not isinstance(batch[-1], SectionVideo):
                    try:
                        batch.append(events.get_nowait())
                    except queue.Empty:
                        break
                if batch[-1] is _END:
                    finished = True
                    batch.pop()
                if batch:
                    yield batch
        finally:
            if not finished:
                log.info("the browser left; job %s runs to its end in the background", ticket.id)

    def _work(self, ticket: Ticket, out: queue.Queue) -> None:
        t0, request = time.monotonic(), ticket.request
        try:
            if self._gpu.locked():
                out.put(Progress("waiting for the GPU", 0, 0, 0, request.steps, 0.0, None,
                                 "waiting for the previous job to finish"))
            with self._gpu:
                if ticket.cancel.cancelled:
                    out.put(Cancelled())
                    return
                self._run_job(ticket, request, out, t0)
        except Exception as e:  # the worker must always end its stream; the details go to the log
            log.error("job runner failed: %s", e, exc_info=True)
            out.put(Failed(f"{type(e).__name__}: {e}".splitlines()[0][:300], traceback.format_exc(), None, None))
        finally:
            self.release(ticket)
            out.put(_END)

    def _run_job(self, ticket: Ticket, request, out: queue.Queue, t0: float) -> None:
        if not self.models.is_loaded(request.mode):
            preset = self.models.preset
            what = "building the tiny models" if preset.tiny else \
                f"loading the models (first Start; downloads up to {preset.download_gb(request.mode):g} GB once)"
            out.put(Progress("loading models", 0, 0, 0, request.steps, time.monotonic() - t0, None, what))
            out.put(LogLine("info", what))
        from memory import MemoryManager, default_device        # heavy imports: after the first message
        from pipeline.errors import WeightsNotFound
        from pipeline.logcapture import capture_logs
        from pipeline.orchestrator import generate

        with capture_logs() as lines:
            try:
                components = self.models.get(request.mode)
            except WeightsNotFound as e:
                components = None
                failure = Failed(str(e), traceback.format_exc(), None, None)
        for line in lines:
            out.put(line)
        if components is None:
            out.put(failure)
            return
        memory = MemoryManager(device=self.device or default_device(), cap_gb=self.vram_cap_gb,
                               preserved_gb=request.preserved_gb)
        try:
            for event in generate(request, components, memory, cancel=ticket.cancel, outputs=self.outputs):
                if isinstance(event, (Done, Failed)):
                    out.put(MemoryReport(list(memory.timeline), list(memory.records), str(memory.device)))
                out.put(event)
        finally:
            del components
