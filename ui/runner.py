"""The job runner: one GPU job at a time in click order, a cancel token per browser session, a worker thread per job.

Jobs run in the order they were reserved (Start clicked, API call received), whatever order Gradio hands the
events over in: the runner keeps its own line of tickets. A waiting job's stream says, while it waits, its place
in line and the estimated wait (a `Waiting` event: the jobs ahead, their remaining or expected time at the speed
of the last finished job). The End button of a session reaches that session's job (running or still waiting)
through the ticket registry, and the pipeline runs in its own thread that always finishes its job cleanly
(job.json written, models unloaded) even if the browser goes away; the next job starts only then.
A ticket runs a new job (pipeline.generate) or continues an interrupted one from its folder (pipeline.resume): the
same line, End button and event stream for both. The API (ui/api.py) runs its jobs through the same runner.

The images of a new job are copied into a folder the ticket owns (outputs/.staged/<ticket>) when it is reserved:
Gradio's temporary upload may be swept (ui/tempfiles.py) while the job waits; the staged copy is read by the job,
which keeps the user's file in its job folder (pipeline.jobs.Job.keep_upload), and deleted when the ticket ends.
With a recorder (ui/line_record.py, set when the app opens its queue), a job is kept in the queue's store instead
(its copies there are the staged ones) while it waits or runs, so a restart of the app shows and continues it.
"""
from __future__ import annotations

import dataclasses
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
from pipeline.events import Cancelled, Done, Failed, LogLine, MemoryReport, Progress, SectionVideo, Started
from pipeline.request import PreparedRequest, prepare
from pipeline.resolution import check_fits
from pipeline.resume import ResumeRequest, prepare_resume
from ui.line_eta import LineEstimates, Waiting, plan_of  # noqa: F401  (Waiting, plan_of: the runner's API)
from ui.staging import stage_images, sweep_stale, unstage

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
    staged: Path | None = None                 # the folder holding this job's copies of its images
    claimed: bool = False                      # run() was called: a stream waits for it
    started: bool = False                      # it holds the GPU (or held it)
    finished: bool = False
    detached: bool = False                     # its tab was closed while it ran: forgotten when it ends
    eta_s: float | None = None                 # the latest estimate of its remaining time, and when it was made
    eta_at: float = 0.0
    first_since: float = 0.0                   # when it became first in line (orphan check)
    entry: str | None = None                   # its entry in the queue's store (ui/line_record.py, queue_worker.py)
    owner: str | None = None                   # the app's user who started it (ui/access.py; None: no logins)
    recorded: bool = False                     # that entry was made for it here (Start, /video): it goes with it

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
WAIT_TICK_S = 1.0               # a waiting job's estimate is refreshed this often
ORPHAN_S = 60.0                 # a ticket first in line whose stream never came (its tab died) is dropped after this


class JobRunner(LineEstimates):
    def __init__(self, models, outputs: Path, vram_cap_gb: float, device=None, host_ram_gb: float | None = None,
                 weight_storage: str = "native", lora_dir: Path | None = None):
        self.models = models                    # ui.models.ComponentCache
        self.lora_dir = lora_dir                # where the LoRA names of jobs are looked up (pipeline/lora.py)
        self.outputs = Path(outputs)
        self.vram_cap_gb = vram_cap_gb
        self.host_ram_gb = host_ram_gb          # None: what the machine can spare (memory.hostbudget)
        self.weight_storage = weight_storage
        self.device = device                    # None: memory.default_device()
        self.rates = None                       # pipeline.eta.JobRates of the last complete job, once there is one
        self._tickets: dict[str, Ticket] = {}
        self._line: list[Ticket] = []           # unfinished tickets in the order they were reserved
        self._running: Ticket | None = None
        self._errors: dict[str, str] = {}
        self._lock = threading.Lock()
        self._turn = threading.Condition(self._lock)
        self.recorder = None                    # ui/line_record.LineRecorder: the line kept in the queue's store
        sweep_stale(self.outputs)

    def check_loras(self, mode: str, spec) -> None:
        """A job's LoRAs read and checked against the transformer now (a queued job's, when it is added), not only
        when it runs. Raises InputError naming the file and the first bad key. Without the real weights on this
        computer yet, only the setting is checked; the files are checked when the job runs."""
        from pipeline import lora

        if not lora.parse_spec(spec):
            return
        model = self.models.transformer_for_checks(mode)
        if model is not None:
            lora.load_set(spec, self.lora_dir, model)

    # ---- sessions -----------------------------------------------------------------------------------------------
    def reserve(self, session: str, job, *, entry: str | None = None, owner: str | None = None) -> Ticket:
        """A ticket for the session's next job, last in line. `job`: a Request (checked and its images decoded
        here; raises InputError naming the field), a PreparedRequest (pipeline.prepare, as the API does) or a
        ResumeRequest (reserve_resume). A session has at most one unfinished job; a job folder is resumed by one
        ticket at a time. A new job's image files are copied into the ticket's own folder (the user's upload is
        kept in the job folder from there, whatever the temp-file sweeper does meanwhile). With a recorder, the job
        is also kept in the queue's store (its copies there are the staged ones); `entry`: it has an entry there
        already (the queue worker's job). `owner`: the user who starts it (job.json and the queue note it)."""
        if isinstance(job, ResumeRequest):
            prepared, resuming = job.prepared, job
        elif isinstance(job, PreparedRequest):
            prepared, resuming = job, None
        else:
            prepared, resuming = prepare(job, self.models.preset.default_resolution), None
        if resuming is None:        # a size that cannot fit under the cap is refused here, before anything loads
            check_fits(prepared, self.models.preset, self.vram_cap_gb, self.weight_storage)
        folder = resuming.job_dir if resuming is not None else None
        ticket = Ticket(session, prepared, resuming, entry=entry, owner=owner)
        kept = entry is None and self.recorder is not None and self.recorder.keep(ticket)   # its copies: the store's
        if not kept and resuming is None:
            staged, ticket.staged = stage_images(self.outputs, ticket.id, prepared.request)
            ticket.prepared = dataclasses.replace(prepared, request=staged)
        try:
            with self._lock:
                old = self._tickets.get(session)
                if old is not None and not old.finished:
                    raise SessionBusy("this tab already has a job running or waiting; press End to stop it")
                if folder is not None and any(not t.finished and folder in (t.resume, t.job_dir)
                                              for t in self._tickets.values()):
                    raise SessionBusy(f"job {folder.name} is already running or waiting to run")
                self._tickets[session] = ticket
                self._line.append(ticket)
                self._errors.pop(session, None)
                return ticket
        except SessionBusy:
            self._unstage(ticket)
            raise

    def reserve_resume(self, session: str, job_dir: Path, *, entry: str | None = None,
                       owner: str | None = None) -> Ticket:
        """A ticket that continues the interrupted job in `job_dir`, a folder of this runner's outputs. Raises
        common.errors.InputError when the folder cannot be resumed (the message says why), SessionBusy as
        reserve() does. The folder's status is read again when the job runs (it may have finished meanwhile)."""
        from common.errors import InputError

        job_dir = Path(job_dir).resolve()
        if job_dir.parent != self.outputs.resolve() or not job_dir.is_dir() or job_dir.name.startswith("."):
            raise InputError("job folder", f"{job_dir.name} is not a job folder of this app's outputs")
        return self.reserve(session, prepare_resume(job_dir), entry=entry, owner=owner)   # damaged: InputError

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
            self._leave_line(ticket)    # it never started: the session may start another job right away
        return "Cancelled: the waiting job will not run."

    def cancel_entry(self, entry_id: str) -> str:
        """End for the job of a queue entry (queued, or kept by the recorder), running or waiting."""
        with self._lock:
            ticket = next((t for t in self._tickets.values() if t.entry == entry_id and not t.finished), None)
        return self.cancel(ticket.session) if ticket is not None else "Nothing to stop."

    def drop_waiting(self, session: str) -> None:
        """The tab was closed: its waiting job is dropped; a running one finishes (its video lands in outputs/)."""
        with self._lock:
            ticket = self._tickets.get(session)
            if ticket is not None and not ticket.started:
                ticket.cancel.cancel()
                self._leave_line(ticket)
            if ticket is not None and ticket.finished:
                del self._tickets[session]
            elif ticket is not None:
                ticket.detached = True
            self._errors.pop(session, None)

    def release(self, ticket: Ticket) -> None:
        with self._lock:
            self._leave_line(ticket)
            if self._running is ticket:
                self._running = None
            if ticket.detached and self._tickets.get(ticket.session) is ticket:
                del self._tickets[ticket.session]

    def _leave_line(self, ticket: Ticket) -> None:
        """(Lock held.) The ticket is finished: out of the line, its staged images deleted, the next one woken."""
        ticket.finished = True
        if ticket in self._line:
            self._line.remove(ticket)
        self._unstage(ticket)
        self._turn.notify_all()

    @property
    def open_tickets(self) -> int:
        """Tickets held for sessions (one per open tab that started a job; API calls hold one while they run)."""
        with self._lock:
            return len(self._tickets)

    def sessions(self, *, detached: bool | None = None) -> list[str]:
        """Sessions holding a ticket (only those whose tab was closed while their job ran, with detached=True)."""
        with self._lock:
            return [s for s, t in self._tickets.items() if detached is None or t.detached == detached]

    def remember_error(self, session: str, message: str) -> None:
        with self._lock:
            self._errors[session] = message

    def last_error(self, session: str) -> str | None:
        with self._lock:
            return self._errors.get(session)

    @property
    def busy(self) -> bool:
        with self._lock:
            return self._running is not None

    @property
    def idle(self) -> bool:
        """No job runs and none waits in line (the queue worker, ui/queue_worker.py, starts the next then)."""
        with self._lock:
            return self._running is None and not self._line

    # ---- the line ---------------------------------------------------------------------------------------------------
    def waiting(self, ticket: Ticket) -> Waiting | None:
        """Where the ticket stands in line (None once it may run)."""
        with self._lock:
            return self._waiting(ticket, time.monotonic())

    def _unstage(self, ticket: Ticket) -> None:
        unstage(ticket.staged)
        ticket.staged = None
        if ticket.recorded and self.recorder is not None:        # out of the queue's store, with its copies
            ticket.recorded = False
            self.recorder.drop(ticket)

    # ---- running --------------------------------------------------------------------------------------------------
    def run(self, ticket: Ticket, tick_s: float | None = None) -> Iterator[list]:
        """Run the ticket's request and yield lists of events as they come (whatever piled up since the last
        list, so a slow browser never falls behind). A list holds at most one SectionVideo, as its last item, so
        every section's video reaches the browser. With `tick_s`, an empty list comes after that long without
        events (the page moves its clock on). If the browser goes away (this generator is closed early) the
        job still runs to its end and is saved in outputs/."""
        events: queue.Queue = queue.Queue()
        worker = threading.Thread(target=self._work, args=(ticket, events),
                                  name=f"job-{ticket.session[:8]}", daemon=True)
        ticket.claimed = True
        worker.start()
        finished = False
        try:
            while not finished:
                try:
                    batch = [events.get(timeout=tick_s)]
                except queue.Empty:
                    yield []
                    continue
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

    def _wait_turn(self, ticket: Ticket, out: queue.Queue) -> bool:
        """Wait until the ticket is first in line and the GPU is free, saying where it stands meanwhile; False
        when it was cancelled while waiting."""
        last = None
        with self._turn:
            while True:
                if ticket.cancel.cancelled or ticket.finished:
                    return False
                self._drop_orphan()
                if self._running is None and self._line and self._line[0] is ticket:
                    self._running, ticket.started = ticket, True
                    return True
                now = time.monotonic()
                place = self._waiting(ticket, now)
                if place is not None and place != last:
                    out.put(place)
                    last = place
                self._turn.wait(WAIT_TICK_S)

    def _drop_orphan(self) -> None:
        """(Lock held.) A ticket first in line whose stream never started (its tab died between Start and the
        run) would hold everyone up: dropped after ORPHAN_S."""
        head = self._line[0] if self._line else None
        if head is None or head.claimed or self._running is not None:
            return
        head.first_since = head.first_since or time.monotonic()
        if time.monotonic() - head.first_since > ORPHAN_S:
            log.info("dropping job %s: first in line for %.0f s but its page never asked for it", head.id, ORPHAN_S)
            head.cancel.cancel()
            self._leave_line(head)

    def _work(self, ticket: Ticket, out: queue.Queue) -> None:
        try:
            if not self._wait_turn(ticket, out):
                out.put(Cancelled())
                return
            if ticket.recorded and self.recorder is not None:
                self.recorder.started(ticket)
                out = self.recorder.tap(ticket, out)
            self._run_job(ticket, ticket.request, out, time.monotonic())
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
        from common.errors import WeightsNotFound
        from pipeline.eta import Remaining
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

            events = resume(ticket.resuming, components, memory, cancel=ticket.cancel, lora_dir=self.lora_dir)
        else:
            events = generate(ticket.prepared, components, memory, cancel=ticket.cancel, outputs=self.outputs,
                              lora_dir=self.lora_dir, owner=ticket.owner)
        # the ETA again, from the same events, with the decode speed of the last complete job until this job has
        # decoded a section (the pipeline alone has no earlier job to go by)
        eta = Remaining.for_plan(plan_of(request), int(request.steps),
                                 decode_prior=self.rates.per_frame if self.rates is not None else None)
        try:
            for event in events:
                if isinstance(event, Progress):
                    event = dataclasses.replace(event, eta_s=eta.update(event.stage, event.section, event.step,
                                                                        event.elapsed_s))
                if isinstance(event, Started):
                    ticket.job_dir = event.job_dir
                elif isinstance(event, Progress) and event.eta_s is not None:
                    ticket.eta_s, ticket.eta_at = event.eta_s, time.monotonic()
                elif isinstance(event, (Done, Failed)):
                    if isinstance(event, Done):
                        self._learn(ticket, event)
                    if isinstance(event, Failed) and event.job_dir is None:    # refused before a job folder existed
                        log.error("job %s failed: %s", ticket.id, event.message)
                    ticket.job_dir = event.job_dir or ticket.job_dir
                    out.put(MemoryReport(list(memory.timeline), list(memory.records), str(memory.device)))
                out.put(event)
        finally:
            events.close()
            del components, events
