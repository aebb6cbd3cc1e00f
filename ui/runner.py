"""The job runner: one GPU job at a time, a cancel token per browser session, a worker thread per job.

Gradio's queue (concurrency_limit=1 on the generate event) orders the jobs and tells users their position. The
runner adds what the queue cannot: the End button of a session reaches that session's job (running or still
waiting) through a ticket registry, and the pipeline runs in its own thread that always finishes its job cleanly
(job.json written, models unloaded) even if the browser goes away; a lock makes sure the next job starts only then.
A ticket runs a new job (pipeline.generate) or continues an interrupted one from its folder (pipeline.resume): the
same queue, End button and event stream for both. The API (ui/api.py) runs its jobs through the same runner.
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

from pipeline.cancel import CancelToken
from pipeline.events import Cancelled, Done, Failed, LogLine, MemoryReport, Progress, SectionVideo
from pipeline.request import PreparedRequest, prepare
from pipeline.resume import ResumeRequest, prepare_resume

log = logging.getLogger(__name__)

__all__ = ["Cancelled", "JobRunner", "MemoryReport", "SessionBusy", "Ticket"]   # (the events: pipeline.events)


@dataclass
class Ticket:
    session: str
    prepared: PreparedRequest | None = None    # the checked request, its images decoded once (at submit)
    resuming: ResumeRequest | None = None      # a checked job folder to continue instead of a new job
    job_dir: Path | None = None                # the job's folder, once the pipeline has said it
    id: str = field(default_factory=lambda: secrets.token_hex(8))
    cancel: CancelToken = field(default_factory=CancelToken)
    created: float = field(default_factory=time.monotonic)
    started: bool = False
    finished: bool = False
    detached: bool = False                     # its tab was closed while it ran: forgotten when it ends

    @property
    def request(self):
        """The validated pipeline Request."""
        return self.prepared.request if self.prepared is not None else None

    @property
    def resume(self) -> Path | None:
        """The job folder this ticket continues (None: a new job)."""
        return self.resuming.job_dir if self.resuming is not None else None


class SessionBusy(RuntimeError):
    pass


_END = object()


class JobRunner:
    def __init__(self, models, outputs: Path, vram_cap_gb: float, device=None, host_ram_gb: float | None = None,
                 weight_storage: str = "native"):
        self.models = models                    # ui.models.ComponentCache
        self.outputs = Path(outputs)
        self.vram_cap_gb = vram_cap_gb
        self.host_ram_gb = host_ram_gb          # None: what the machine can spare (memory.hostbudget)
        self.weight_storage = weight_storage
        self.device = device                    # None: memory.default_device()
        self._tickets: dict[str, Ticket] = {}
        self._errors: dict[str, str] = {}
        self._lock = threading.Lock()
        self._gpu = threading.Lock()

    # ---- sessions -----------------------------------------------------------------------------------------------
    def reserve(self, session: str, job) -> Ticket:
        """A ticket for the session's next job. `job`: a Request (checked and its images decoded here; raises
        InputError naming the field), a PreparedRequest (pipeline.prepare, as the API does) or a ResumeRequest
        (reserve_resume). A session has at most one unfinished job; a job folder is resumed by one ticket at a
        time."""
        if isinstance(job, ResumeRequest):
            prepared, resuming = job.prepared, job
        elif isinstance(job, PreparedRequest):
            prepared, resuming = job, None
        else:
            prepared, resuming = prepare(job, self.models.preset.default_resolution), None
        folder = resuming.job_dir if resuming is not None else None
        with self._lock:
            old = self._tickets.get(session)
            if old is not None and not old.finished:
                raise SessionBusy("this tab already has a job running or waiting; press End to stop it")
            if folder is not None and any(not t.finished and folder in (t.resume, t.job_dir)
                                          for t in self._tickets.values()):
                raise SessionBusy(f"job {folder.name} is already running or waiting to run")
            ticket = self._tickets[session] = Ticket(session, prepared, resuming)
            self._errors.pop(session, None)
            return ticket

    def reserve_resume(self, session: str, job_dir: Path) -> Ticket:
        """A ticket that continues the interrupted job in `job_dir`, a folder of this runner's outputs. Raises
        pipeline.errors.InputError when the folder cannot be resumed (the message says why), SessionBusy as
        reserve() does. The folder's status is read again when the job runs (it may have finished meanwhile)."""
        from pipeline.errors import InputError

        job_dir = Path(job_dir).resolve()
        if job_dir.parent != self.outputs.resolve() or not job_dir.is_dir():
            raise InputError("job folder", f"{job_dir.name} is not a job folder of this app's outputs")
        return self.reserve(session, prepare_resume(job_dir))       # a damaged job.json: InputError

    def forget(self, ticket: Ticket) -> None:
        """Drop a finished ticket (API calls: nothing refers to it afterwards)."""
        with self._lock:
            if ticket.finished and self._tickets.get(ticket.session) is ticket:
                del self._tickets[ticket.session]

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
            elif ticket is not None:
                ticket.detached = True
            self._errors.pop(session, None)

    def release(self, ticket: Ticket) -> None:
        with self._lock:
            ticket.finished = True
            if ticket.detached and self._tickets.get(ticket.session) is ticket:
                del self._tickets[ticket.session]

    @property
    def open_tickets(self) -> int:
        """Tickets held for sessions (one per open tab that started a job; API calls hold one while they run)."""
        with self._lock:
            return len(self._tickets)

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
            out.put(Failed(f"{type(e).__name__}: {e}".splitlines()[0][:300], traceback.format_exc()))
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
                log.error("job %s cannot run: %s", ticket.id, e)       # the terminal hears it too, not only the page
                failure = Failed(str(e), traceback.format_exc())
        for line in lines:
            out.put(line)
        if components is None:
            out.put(failure)
            return
        memory = MemoryManager(device=self.device or default_device(), cap_gb=self.vram_cap_gb,
                               preserved_gb=request.preserved_gb, host_ram_gb=self.host_ram_gb,
                               weight_storage=self.weight_storage)
        if ticket.resuming is not None:
            from pipeline.resume import resume

            events = resume(ticket.resuming, components, memory, cancel=ticket.cancel)
        else:
            events = generate(ticket.prepared, components, memory, cancel=ticket.cancel, outputs=self.outputs)
        try:
            for event in events:
                if isinstance(event, SectionVideo):
                    ticket.job_dir = Path(event.path).parent
                elif isinstance(event, (Done, Failed)):
                    if isinstance(event, Failed) and event.job_dir is None:    # refused before a job folder existed
                        log.error("job %s failed: %s", ticket.id, event.message)
                    ticket.job_dir = event.job_dir or ticket.job_dir
                    out.put(MemoryReport(list(memory.timeline), list(memory.records), str(memory.device)))
                out.put(event)
        finally:
            events.close()
            del components, events
