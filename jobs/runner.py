"""The one runner: every job, however it was started, is an entry of the one queue on disk (jobs/store.py) and is
run from there, in line order, by the one process that holds the queue's lease.

    runner = Runner(store, executor, preflight).start()
    job = runner.submit(request, session=..., owner=..., origin="page")     # pre-flight, then queued
    for events in runner.stream(job):                                       # Waiting ..., then the job's events
        ...

- **Adding** (`submit`, `submit_many`, `enqueue`): the one pre-flight (jobs/preflight.py) checks the job whole, then
  it is added to the store with its own copies of its files. What was prepared is kept with it when it runs in this
  process (its images are decoded once); an entry added by another process, or one left by a process that died, is
  prepared from its stored values when its turn comes.
- **Running**: a dispatcher thread takes the queue's lease (one process runs a queue at a time: the app, or a
  command line when no app runs on that outputs folder) and runs the first waiting entries, as many at once as the
  executor has slots (jobs/local.py: one, in this process; farm/executor.py: one per worker). Taking the lease puts
  the entries a dead holder left running back first in line; each continues in its job folder (pipeline/resume.py).
  The store follows each job: its folder as soon as it has one, its progress, its end.
- **Streams**: a job started here (a page's Start, an API call) streams its events to whoever asked (`stream`: lists
  of events, at most one SectionVideo per list, as its last item); while it waits, `Waiting` events say its place in
  line and the expected wait. End (`cancel` for a session, `stop` for an entry) drops a waiting job at once and stops
  a running one at its next step. A page's or API call's entry leaves the queue when its job ends (the caller has
  the result); the queue's own, the command line's and a batch's stay with their status until they are cleared.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import queue
import secrets
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator

from common.errors import InputError
from configs.generation import DEFAULTS
from jobs import jsonl
from jobs import store as qs
from jobs.line import Speed, Waiting
from jobs.local import Work
from jobs.preflight import Preflight
from jobs.text import progress_line
from pipeline.cancel import CancelToken
from pipeline.events import Cancelled, Done, Failed, Preview, Progress, SectionVideo, Started
from pipeline.jobs import mark_stopped
from post.job import folders_of, is_post_folder
from post.job import is_done as post_done
from post.job import prepare_resume as post_resume
from post.steps import is_post, request_from

log = logging.getLogger(__name__)

POLL_S = 1.0                # the dispatcher looks at the store this often (entries added by other processes)
RENEW_S = 5.0               # the lease is renewed this often (jobs/store.py LEASE_STALE_S: taken over after 30 s)
PROGRESS_EVERY_S = 0.5      # a job's progress written to the store at most this often
WAIT_TICK_S = 1.0           # a waiting job's place and expected wait are looked at again this often
LEAVES_WHEN_DONE = ("page", "api")       # origins whose entry leaves the queue when the job ends (caller has it)

_END = object()


class SessionBusy(RuntimeError):
    pass


@dataclass
class QueuedJob:
    """A queue entry this process follows: started here, or run here (its job folder is a pipeline.jobs.Job once
    it has one: `job_dir`)."""
    entry: str
    origin: str = "queue"
    session: str | None = None              # the page or API client that started it (None: none is waiting on it)
    owner: str | None = None
    work: Work | None = None                # prepared when it was added here (None: prepared when it runs)
    cancel: CancelToken = field(default_factory=CancelToken)
    created: float = field(default_factory=time.monotonic)
    started: bool = False                   # it holds one of the executor's slots (or held one)
    finished: bool = False
    result: object = None                   # its Done, Failed or Cancelled
    job_dir: Path | None = None             # its folder, once it has one
    eta_s: float | None = None              # its latest estimate of the time left, and when it was made
    eta_at: float = 0.0
    events: queue.Queue = field(default_factory=queue.Queue)
    streamed: bool = False
    lost: bool = False                      # the lease was lost while it ran: the queue entry is the new holder's
    latest: dict = field(default_factory=dict)   # its newest Progress, Preview and SectionVideo (by type name):
    version: int = 0                             # what any page shows of it (ui/panel_run.py), and their count

    @property
    def id(self) -> str:
        return self.entry

    @property
    def request(self):
        return self.work.request if self.work is not None else None


def entry_values(request) -> dict:
    """A Request's values as the store keeps them: its settings and its files (paths, or images given as data)."""
    return {**request.settings(), **{name: getattr(request, name, None) for name in jsonl.FILE_NAMES}}


def with_copies(prepared, entry: qs.Entry):
    """The prepared request reading the queue's copies of its files (the user's may be gone when it runs)."""

    copies = {k: entry.images[k] for k in jsonl.FILE_NAMES if entry.images.get(k)}
    source = prepared.source
    if source is not None and source.kind == "video" and copies.get("input_video"):
        source = dataclasses.replace(source, path=Path(copies["input_video"]))
    return dataclasses.replace(prepared, request=dataclasses.replace(prepared.request, **copies), source=source)


NEW_SEED_MAX = 2**32 - 1             # a fresh seed of the `new_seed` control (as FramePack-Studio's: 32 bits)


def with_new_seed(prepared):
    """The `new_seed` control: a job queued with it on gets a fresh random seed now, once, and is queued (and its
    job.json written) with that seed and the control off, so that its settings make the same video again."""
    request = prepared.request
    if getattr(request, "new_seed", "off") != "on":
        return prepared
    seed = secrets.randbelow(NEW_SEED_MAX + 1)
    return dataclasses.replace(prepared, request=dataclasses.replace(request, seed=seed, new_seed="off"))


def with_new_seed_switch(prepared, value: str):
    """`prepared` with its `new_seed` control set to `value` ("on"/"off": a command's --new-seed for a whole file)."""
    return dataclasses.replace(prepared, request=dataclasses.replace(prepared.request, new_seed=value))


@dataclass(frozen=True)
class QueueCaps:
    """How many jobs may wait in the queue on disk: in all, and of one owner (a login). The app sets them (clients
    cannot fill the disk queue); the command line has none."""
    total: int = 1000
    per_owner: int = 200

    def check(self, store: qs.QueueStore, owner: str | None, adding: int) -> None:
        """Raises InputError("queue") when `adding` more jobs of `owner` would pass a cap."""
        waiting = store.entries([qs.WAITING])
        if len(waiting) + adding > self.total:
            raise InputError("queue", f"{len(waiting)} jobs are waiting and the queue takes at most {self.total}; "
                                      f"add these when some have run")
        mine = sum(1 for e in waiting if e.owner == owner) if owner is not None else 0
        if mine + adding > self.per_owner:
            raise InputError("queue", f"you have {mine} jobs waiting and one user may have at most "
                                      f"{self.per_owner}; add these when some have run")


def enqueue(store: qs.QueueStore, preflight, requests: list, *, owner: str | None = None, origin: str = "queue",
            checked: bool = False) -> list[tuple[qs.Entry, Work]]:
    """Check every request (the one pre-flight; `checked`: they are PreparedRequests it passed already) and add
    them all, in order and in one transaction: [(its entry, what it will run)]. Raises InputError naming the field
    (nothing is added then)."""
    prepared = list(requests) if checked else [preflight.prepare(r) for r in requests]
    prepared = [with_new_seed(p) for p in prepared]
    entries = store.add_many([entry_values(p.request) for p in prepared], owner=owner, origin=origin)
    return [(e, Work(e.id, with_copies(p, e), owner=owner)) for e, p in zip(entries, prepared)]


class Runner:
    def __init__(self, store: qs.QueueStore, executor, preflight, *, poll_s: float = POLL_S):
        self.store, self.executor, self.preflight = store, executor, preflight
        self.poll_s = poll_s
        self.speed = Speed(getattr(preflight, "default_resolution", None))   # a job's expected time
        self.token = secrets.token_hex(8)            # this process's name in the queue's lease
        self._jobs: dict[str, QueuedJob] = {}        # entry id -> the job followed here
        self._sessions: dict[str, QueuedJob] = {}    # session -> its newest job
        self._running: dict[str, QueuedJob] = {}
        self._errors: dict[str, str] = {}
        self._lock = threading.RLock()     # re-entrant: a signal handler of the main thread may ask it
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None
        self._job_threads: dict[str, threading.Thread] = {}     # entry id -> the thread running it here
        self._leased, self._renewed = False, 0.0
        self.only: set[str] | None = None            # run only these entries (a command line's own jobs), else all
        self.caps: QueueCaps | None = None           # the app's limits on waiting jobs (none: the command line)

    @property
    def outputs(self) -> Path:
        return self.store.outputs

    @property
    def models(self):
        return getattr(self.executor, "models", None)

    # ---- adding -----------------------------------------------------------------------------------------------------
    def submit(self, job, *, session: str | None = None, owner: str | None = None, origin: str = "page",
               checked: bool = False) -> QueuedJob:
        """Check and queue one job: `job` is a Request, a PreparedRequest or a ResumeRequest (a folder to continue;
        `checked`: a PreparedRequest the pre-flight passed already). A session has at most one unfinished job
        (SessionBusy). Raises InputError naming the field."""
        from pipeline.resume import ResumeRequest

        with self._lock:
            left = self._busy_check(session, job.job_dir if isinstance(job, ResumeRequest) else None)
        if left is not None:                # the folder's entry, left by a runner that is gone: it continues it
            return self._follow(left, Work(left.id, resuming=job, owner=left.owner), session)
        if self.caps is not None:
            self.caps.check(self.store, owner, 1)
        if isinstance(job, ResumeRequest):
            entry = self.store.add(job.request.settings(), owner=owner, origin=origin, job_dir=job.job_dir.name)
            work = Work(entry.id, resuming=job, owner=owner)
        else:
            ((entry, work),) = enqueue(self.store, self.preflight, [job], owner=owner, origin=origin,
                                       checked=checked)
        return self._follow(entry, work, session)

    def submit_many(self, requests: list, *, owner: str | None = None, origin: str = "queue",
                    checked: bool = False) -> list[QueuedJob]:
        """Check every job, then queue them all in this order (InputError: none is queued). `checked`: they are
        PreparedRequests the pre-flight passed already (jobs/jsonl.py prepare_lines)."""
        if self.caps is not None:
            self.caps.check(self.store, owner, len(requests))
        return [self._follow(entry, work, None) for entry, work in
                enqueue(self.store, self.preflight, requests, owner=owner, origin=origin, checked=checked)]

    def submit_resume(self, job_dir: Path, *, session: str | None = None, owner: str | None = None,
                      origin: str = "page") -> QueuedJob:
        """Queue the continuation of a job folder of this runner's outputs. Raises InputError when it cannot be
        resumed (the message says why), SessionBusy as `submit` does."""
        from pipeline.resume import prepare_resume

        job_dir = Path(job_dir).resolve()
        if job_dir.parent != self.outputs.resolve() or not job_dir.is_dir() or job_dir.name.startswith("."):
            raise InputError("job folder", f"{job_dir.name} is not a job folder of this app's outputs")
        if is_post_folder(job_dir):                # a post job continues at its next chunk
            checked = post_resume(job_dir, folders_of(self.preflight.config))
            with self._lock:
                self._busy_check(session, job_dir)
            entry = self.store.add(checked.request.settings(), owner=owner, origin=origin, job_dir=job_dir.name)
            return self._follow(entry, Work(entry.id, checked, owner=owner), session)
        return self.submit(prepare_resume(job_dir), session=session, owner=owner, origin=origin)

    def edit(self, entry_id: str, request) -> qs.Entry:
        """Replace a waiting entry's job with `request`, checked whole by the pre-flight (InputError naming the
        field: the entry stays as it was)."""
        prepared = self.preflight.prepare(request)
        entry = self.store.edit(entry_id, entry_values(prepared.request))
        job = self.get(entry_id)
        if job is not None:
            job.work = Work(entry.id, with_copies(prepared, entry), owner=job.owner)
        return entry

    def _busy_check(self, session: str | None, folder: Path | None) -> qs.Entry | None:
        """(Lock held.) Refuses a second job of a session, and a second entry for a job folder (the folder's
        unfinished entry, when no live process runs the queue to run it: to be continued here)."""
        old = self._sessions.get(session) if session else None
        if old is not None and not old.finished:
            raise SessionBusy("this tab already has a job running or waiting; press End to stop it")
        if folder is not None:
            busy = [e for e in self.store.entries([qs.WAITING, qs.RUNNING]) if e.job_dir == Path(folder).name]
            if busy and (self._leased or self.store.runner_alive() or busy[0].id in self._jobs):
                raise SessionBusy(f"job {Path(folder).name} is already running or waiting to run")
            return busy[0] if busy else None
        return None

    def _follow(self, entry: qs.Entry, work: Work, session: str | None) -> QueuedJob:
        job = QueuedJob(entry.id, entry.origin, session, work.owner, work)
        with self._lock:
            self._jobs[entry.id] = job
            if session:
                self._sessions[session] = job
                self._errors.pop(session, None)
        self.wake()
        return job

    # ---- asking ------------------------------------------------------------------------------------------------------
    def get(self, entry_id) -> QueuedJob | None:
        with self._lock:
            return self._jobs.get(entry_id) if isinstance(entry_id, str) else None

    def current(self, session: str) -> QueuedJob | None:
        """The session's newest job (finished or not)."""
        with self._lock:
            return self._sessions.get(session)

    def remember_error(self, session: str, message: str) -> None:
        with self._lock:
            self._errors[session] = message

    def last_error(self, session: str) -> str | None:
        with self._lock:
            return self._errors.get(session)

    def running(self) -> list[QueuedJob]:
        """The jobs running in this process now, in the order they started."""
        with self._lock:
            return list(self._running.values())

    @property
    def busy(self) -> bool:
        """A job runs in this process."""
        with self._lock:
            return bool(self._running)

    @property
    def idle(self) -> bool:
        """Nothing runs and nothing waits."""
        return not self.busy and not self.store.entries([qs.WAITING, qs.RUNNING])

    def placements(self) -> dict[str, str]:
        """Which worker runs which entry (a farm's)."""
        return self.executor.placements()

    def expected_seconds(self, request) -> float | None:
        return self.speed.expected_seconds(request)

    def waiting(self, job: QueuedJob) -> Waiting | None:
        """Where a waiting job stands in line (None once it runs, or when it is not in the queue any more)."""
        if job.started or job.finished:
            return None
        entries = self.store.entries([qs.WAITING, qs.RUNNING])
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
        job = self.get(entry.id)
        if job is not None and job.started and job.eta_s is not None:
            return max(job.eta_s - (now - job.eta_at), 0.0)
        if is_post(entry.settings):             # a post job's time is known once it runs (its chunks' pace)
            return None
        expected = self.speed.expected_seconds(_settings_request(entry.settings))
        if expected is None:
            return None
        if entry.status == qs.RUNNING:
            return max(expected * (1.0 - entry.progress), 0.0)
        return expected

    # ---- End ---------------------------------------------------------------------------------------------------------
    def cancel(self, session: str) -> str:
        """End: stop the session's running job at its next step (keeping its video), or drop its waiting job."""
        job = self.current(session)
        if job is None or job.finished:
            return "Nothing to stop."
        return self.stop(job.entry)

    def stop(self, entry_id: str) -> str:
        """End for an entry: a waiting one is removed at once, a running one stops at its next step."""
        job = self.get(entry_id)
        if job is not None:
            job.cancel.cancel()
        entry = self.store.get(entry_id)
        if entry is not None and entry.status != qs.RUNNING:
            try:
                self.store.remove(entry_id)
            except InputError:                      # it started meanwhile: the token stops it
                return "Stopping at the next step; the video made so far is kept…"
            if job is not None:
                self._end(job, Cancelled(), announce=True)
            return "Cancelled: the waiting job will not run." if job is not None and job.session else \
                f"Removed job {entry_id} from the queue."
        if entry is not None and (job is None or not (job.started or self._leased)):
            return "That job runs in another process (the app or a command line); stop it there."
        return "Stopping at the next step; the video made so far is kept…" if entry is not None else "Nothing to stop."

    def drop_waiting(self, session: str) -> None:
        """The tab was closed: its waiting job is dropped; a running one finishes (its video lands in outputs/)."""
        job = self.current(session)
        if job is not None and not job.started and not job.finished:
            self.stop(job.entry)
        with self._lock:
            if job is not None and job.finished:
                self._sessions.pop(session, None)
            self._errors.pop(session, None)

    # ---- streams ----------------------------------------------------------------------------------------------------
    def stream(self, job: QueuedJob, tick_s: float | None = None) -> Iterator[list]:
        """The job's events as they come, in lists (whatever piled up since the last list; at most one SectionVideo,
        as the last item, so every section's video reaches a page): Waiting while it waits (when its place or the
        expected wait changes), then the job's events, ending with Done, Failed or Cancelled. With `tick_s`, an
        empty list after that long without events (a page moves its clock on). Closing the stream early leaves the
        job running (a browser that went away: the job ends in outputs/)."""
        job.streamed = True
        last_wait, finished = None, False
        while not finished:
            timeout = tick_s if job.started or job.finished else min(tick_s or WAIT_TICK_S, WAIT_TICK_S)
            try:
                batch = [job.events.get(timeout=timeout)]
            except queue.Empty:
                if not job.started and not job.finished:
                    place = self.waiting(job)
                    if place is not None and place != last_wait:
                        last_wait = place
                        yield [place]
                        continue
                if tick_s is not None:
                    yield []
                continue
            while batch[-1] is not _END and not isinstance(batch[-1], SectionVideo):
                try:
                    batch.append(job.events.get_nowait())
                except queue.Empty:
                    break
            if batch[-1] is _END:
                finished = True
                batch.pop()
            if batch:
                yield batch

    # ---- running ----------------------------------------------------------------------------------------------------
    def start(self) -> "Runner":
        self._thread = threading.Thread(target=self._loop, name="queue-runner", daemon=True)
        self._thread.start()
        return self

    def wake(self) -> None:
        self._wake.set()

    def close(self, timeout: float | None = None) -> list[str]:
        """End the runner: no job starts any more, the jobs running here are asked to stop at their next step (what
        they made is kept; each ends "stopped" in its job.json and in the queue) and are waited for, up to `timeout`
        seconds in all; then the lease is given back. Returns the entries it stopped (`still_running()`: those that
        had not ended when the time was up)."""
        stopping = self.stop_all()
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in [self._thread, *self._threads_of(stopping)]:
            if thread is not None:
                thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        if self._leased and not self.still_running():
            self.store.release_lease(self.token)
            self._leased = False
        if stopping:
            log.info("runner closed: %d running job(s) stopped", len(stopping))
        return [job.entry for job in stopping]

    def stop_all(self) -> list[QueuedJob]:
        """The process is stopping (a signal; safe to call from its handler: nothing waits): no job starts any more
        and the jobs running here stop at their next step. Returns those jobs."""
        self._closing.set()
        self._wake.set()
        with self._lock:
            stopping = list(self._running.values())
        for job in stopping:
            job.cancel.cancel()
        return stopping

    def _threads_of(self, jobs: list[QueuedJob]) -> list[threading.Thread]:
        with self._lock:
            return [t for t in (self._job_threads.get(j.entry) for j in jobs) if t is not None]

    def still_running(self) -> list[str]:
        """The entries whose job threads still run in this process."""
        with self._lock:
            return [entry for entry, thread in self._job_threads.items() if thread.is_alive()]

    def abandon(self, reason: str) -> list[Path]:
        """The process ends before its running jobs could stop at a step (a second Ctrl-C, a stop that outlived its
        wait): each is marked stopped now, in the queue and in its job.json, with `reason` (what it wrote is kept,
        and a resume continues it). Returns their job folders."""
        folders = []
        for entry_id in self.still_running():
            entry = self.store.get(entry_id)
            if entry is None:
                continue
            if entry.status not in qs.FINISHED:
                self.store.update(entry_id, status=qs.STOPPED, message=reason)
            if entry.job_dir:
                folder = self.outputs / entry.job_dir
                mark_stopped(folder, reason)
                folders.append(folder)
        return folders

    @property
    def runs_the_queue(self) -> bool:
        """This process holds the queue's lease (it runs the jobs)."""
        return self._leased

    def _loop(self) -> None:
        while not self._closing.is_set():
            try:
                if self._hold_lease():
                    self._dispatch()
            except Exception as e:  # the runner must outlive a bad entry; the details go to the log
                log.error("queue runner: %s", e, exc_info=True)
            self._wake.wait(self.poll_s)
            self._wake.clear()

    def _hold_lease(self) -> bool:
        now = time.monotonic()
        if self._leased and now - self._renewed < RENEW_S:
            return True
        if self._leased:
            self._leased = self.store.renew_lease(self.token)
            if not self._leased:
                self._lost_lease()
        else:
            self._leased = self.store.take_lease(self.token)
        self._renewed = now
        return self._leased

    def _still_runs_the_queue(self) -> bool:
        """A running job's question before each write to its folder (pipeline/cancel.py `fence`): does this process
        still hold the lease? It may have been taken since the loop's last renewal; then every job here is lost. A
        database that cannot be read now does not stop a job (the loop's next renewal decides)."""
        try:
            if self.store.holds_lease(self.token):
                return True
        except Exception as e:  # a locked or damaged database: the renewal, every RENEW_S, decides
            log.warning("queue lease not checked: %s", e)
            return True
        with self._lock:
            lost, self._leased = self._leased, False
        if lost:
            self._lost_lease()
        return False

    def _lost_lease(self) -> None:
        """Another process took the queue's lease (this one stopped renewing it for longer than a holder on another
        computer may): it runs the queue's jobs now, so those running here stop at once and write nothing more
        (never two runners on one job)."""
        with self._lock:
            running = list(self._running.values())
        log.error("this process lost the queue's lease to another; %s",
                  f"its {len(running)} running job(s) stop here and continue there" if running else "nothing ran")
        for job in running:
            job.lost = True
            job.cancel.lose()

    def _dispatch(self) -> None:
        while not self._closing.is_set():
            with self._lock:
                if len(self._running) >= self.executor.slots:
                    return
            entry = self.store.next_waiting(self.only)
            if entry is None or not self.store.claim(entry.id):
                return
            with self._lock:
                job = self._jobs.get(entry.id)
                if job is None:                      # added by another process, or left by a process that died
                    job = QueuedJob(entry.id, entry.origin, owner=entry.owner)
                    self._jobs[entry.id] = job
                job.started = True
                job.cancel.fence = self._still_runs_the_queue
                self._running[entry.id] = job
                thread = self._job_threads[entry.id] = threading.Thread(target=self._run, args=(job, entry),
                                                                        name=f"job-{entry.id}", daemon=True)
            thread.start()

    def _run(self, job: QueuedJob, entry: qs.Entry) -> None:
        try:
            # an entry with a folder continues it (a runner that died left it running); else what was prepared here
            fresh = job.work is not None and (job.work.resuming is not None or not entry.job_dir)
            work = job.work if fresh else self._work_from(entry)
            if work is None:                          # its folder is complete already
                self._end(job, Done(self.outputs / str(entry.job_dir), None, 0, False), announce=True)
                return
            job.work = work
            last = 0.0
            for event in self.executor.run(work, job.cancel):
                last = self._note(job, event, last)
                job.events.put(event)
            if job.result is None:
                self._end(job, Failed("the job ended without a result"), announce=True)
            else:
                self._end(job, job.result)
        except InputError as e:                       # a stored entry that cannot run (any more)
            self._end(job, Failed(str(e)), announce=True)
        except Exception as e:  # the runner must always end the job's stream; the details go to the log
            log.error("job %s: %s", job.entry, e, exc_info=True)
            self._end(job, Failed(f"{type(e).__name__}: {e}".splitlines()[0][:300], traceback.format_exc()),
                      announce=True)
        finally:
            with self._lock:
                self._running.pop(job.entry, None)
                self._job_threads.pop(job.entry, None)
            self.wake()

    def _work_from(self, entry: qs.Entry) -> Work | None:
        """What a stored entry runs: its job folder continued, or its request prepared (checked) again."""
        from pipeline.request import Request
        from pipeline.resume import AlreadyComplete, prepare_resume

        if entry.job_dir and is_post_folder(self.outputs / entry.job_dir):
            if post_done(self.outputs / entry.job_dir):
                return None
            return Work(entry.id, post_resume(self.outputs / entry.job_dir, folders_of(self.preflight.config)),
                        owner=entry.owner)
        if is_post(entry.settings):
            return Work(entry.id, self.preflight.prepare(request_from(entry.values())), owner=entry.owner)
        if entry.job_dir:
            folder = self.outputs / entry.job_dir
            if (folder / "job.json").is_file():
                try:
                    return Work(entry.id, resuming=prepare_resume(folder), owner=entry.owner)
                except AlreadyComplete:
                    return None
        problem = jsonl.copy_problem(entry.images)
        if problem is not None:
            raise InputError("video", problem)
        prepared = self.preflight.prepare(Request.from_mapping(entry.values(), unknown="ignore"))
        return Work(entry.id, prepared, owner=entry.owner)

    def _note(self, job: QueuedJob, event, last: float) -> float:
        """Follow a job's event in the store (its folder, its progress, its end) and in the runner."""
        if isinstance(event, (Progress, Preview, SectionVideo)):
            job.latest[type(event).__name__] = event
            job.version += 1
        if isinstance(event, Started):
            job.job_dir = event.job_dir
            self.store.update(job.entry, job_dir=event.job_dir.name)
        elif isinstance(event, Progress):
            if event.eta_s is not None:
                job.eta_s, job.eta_at = event.eta_s, time.monotonic()
            if time.monotonic() - last > PROGRESS_EVERY_S:
                self.store.update(job.entry, progress=event.fraction, message=progress_line(event))
                return time.monotonic()
        elif isinstance(event, (Done, Failed)):
            job.result = event
            job.job_dir = event.job_dir or job.job_dir
            if isinstance(event, Done) and not event.stopped and job.work is not None \
                    and job.work.resuming is None and job.work.post is None:
                self.speed.learn(job.work.request, event.timings)
        return last

    def _end(self, job: QueuedJob, result, *, announce: bool = False) -> None:
        """The job is over: its entry's status in the store (or the entry out of the queue: a page's or API call's,
        or one that never ran), and its stream ended (`announce`: with `result`, which the job itself did not
        send)."""
        if isinstance(result, Done):
            status = qs.STOPPED if result.stopped else qs.DONE
            message = f"{status}: {result.frames} frames" + (f", {result.video.name}" if result.video else "")
        elif isinstance(result, Failed):
            status, message = qs.FAILED, result.message[:500]
            log.error("job %s failed: %s", job.entry, result.message)
        else:
            status, message = None, ""
        job.result, job.finished = result, True
        try:
            if job.lost:
                pass                                  # the entry is run by the process that took the lease
            elif status is None or (job.origin in LEAVES_WHEN_DONE and job.session is not None):
                self.store.forget(job.entry)
            else:
                changes = dict(status=status, message=message, progress=1.0 if status == qs.DONE else 0.0)
                if job.job_dir is not None:
                    changes["job_dir"] = Path(job.job_dir).name
                self.store.update(job.entry, **changes)
                self.store.release_images(job.entry)      # the job folder keeps the user's images
        except Exception as e:  # a record that cannot be written must not keep the stream open
            log.warning("queue record of job %s: %s", job.entry, e)
        if announce:
            job.events.put(result)
        job.events.put(_END)


def _settings_request(settings: dict):
    """The parts of a stored entry's settings an estimate needs (pipeline/eta.py), with the defaults."""
    return SimpleNamespace(mode=settings.get("mode", DEFAULTS.mode), seconds=settings.get("seconds", DEFAULTS.seconds),
                           latent_window=settings.get("latent_window", DEFAULTS.latent_window),
                           fps=settings.get("fps", DEFAULTS.fps), steps=settings.get("steps", DEFAULTS.steps),
                           resolution=settings.get("resolution"), width=settings.get("width", 0),
                           height=settings.get("height", 0))


def exit_code_after(runner: Runner, code: int, reason: str) -> int:
    """`code`, for a process whose runner is closed. A job thread still inside a step (the stop was not waited
    for: a second signal, or a step longer than the wait) cannot outlive the interpreter's exit: its native threads
    would end the process with "terminate called without an active exception" (exit 134). Its job is marked stopped
    (`Runner.abandon`, with `reason`) and the process ends here at once, its output flushed."""
    if not runner.still_running():
        return code
    for folder in runner.abandon(reason):
        log.warning("the job in %s was stopped during a step; it resumes from its last section", folder)
    log.info("ending the process now (a job thread is still inside a step)")
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    logging.shutdown()
    os._exit(code)


def open_runner(config, executor, *, device_type: str, preflight=None) -> tuple[Runner, str | None]:
    """The runner of `config.outputs`' queue (not started) with the one pre-flight (`preflight`, or one made here),
    and the store's warning (a damaged database moved aside)."""

    store, found = qs.QueueStore.open(config.outputs.expanduser().resolve())
    preflight = preflight or Preflight(config, getattr(executor, "models", None), device_type)
    return Runner(store, executor, preflight), found.warning
