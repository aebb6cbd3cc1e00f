"""The one runner: every job, however it was started, is an entry of the one queue on disk (jobs/store.py) and is
run from there, in line order, by the one process that holds the queue's lease.

    runner = Runner(store, executor, preflight).start()
    job = runner.submit(request, owner=..., origin="cli")       # pre-flight, then queued: a QueuedJob
    job.events                                                  # its typed events (pipeline/events.py), then ENDED
    runner.stop(job.entry)                                      # a typed answer (Stop)

- **Adding** (`submit`, `submit_many`, `enqueue`): the one pre-flight (jobs/preflight.py) checks the job whole, then
  it is added to the store with its own copies of its files. What was prepared is kept with it when it runs in this
  process (its images are decoded once); an entry added by another process, or one left by a process that died, is
  prepared from its stored values when its turn comes.
- **Running**: a dispatcher thread takes the queue's lease (one process runs a queue at a time: the app, or a
  command line when no app runs on that outputs folder) and runs the first waiting entries, as many at once as the
  executor has slots (jobs/local.py: one, in this process; farm/executor.py: one per worker). Taking the lease puts
  the entries a dead holder left running back first in line; each continues in its job folder (pipeline/resume.py).
  The store follows each job: its folder as soon as it has one, its progress, its end.
- **Events**: a job followed here puts its typed events (pipeline/events.py) in its `QueuedJob.events`, ending with
  its Done, Failed or Cancelled and then `ENDED`; `listeners` see each of them as it comes (jobs/follow.py's
  `QueueLine` learns the speed and the running jobs' estimates from them). `stop` drops a waiting entry at once and
  stops a running one at its next step, and says which it did (`Stop`). An entry someone waits on (`waited_on`: a
  page's or API call's) leaves the queue when its job ends (the caller has the result); the queue's own, the command
  line's and a batch's stay with their status until they are cleared.

The runner knows nothing of pages: which tab started which job, its refusals and the batching of events for the
page are ui/sessions.py's; where a waiting job stands in line and how long it waits are jobs/follow.py's.
"""
from __future__ import annotations

import dataclasses
import enum
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
from typing import Callable

from common.errors import InputError
from jobfolder.folder import mark_stopped
from jobs import jsonl
from jobs import store as qs
from jobs.local import Work
from jobs.preflight import Preflight
from jobs.text import progress_line
from pipeline.cancel import CancelToken
from pipeline.events import Cancelled, Done, Failed, Preview, Progress, SectionVideo, Started
from post.job import folders_of, is_post_folder
from post.job import is_done as post_done
from post.job import prepare_resume as post_resume
from post.steps import is_post, request_from

log = logging.getLogger(__name__)

POLL_S = 1.0                # the dispatcher looks at the store this often (entries added by other processes)
RENEW_S = 5.0               # the lease is renewed this often (jobs/store.py LEASE_STALE_S: taken over after 30 s)
PROGRESS_EVERY_S = 0.5      # a job's progress written to the store at most this often
LEAVES_WHEN_DONE = ("page", "api")       # origins whose entry leaves the queue when the job ends (caller has it)

ENDED = object()            # the last item of a job's `events`: its end is recorded (the store, `finished`)


class Busy(RuntimeError):
    """A job that cannot be added now: its folder has an entry waiting or running (ui/sessions.py's SessionBusy: a
    tab's job is unfinished)."""


class Stop(enum.Enum):
    """What `Runner.stop` did to an entry."""
    DROPPED = "dropped"          # it was waiting: it left the queue and will not run
    STOPPING = "stopping"        # it runs here (or started meanwhile): it stops at its next step
    ELSEWHERE = "elsewhere"      # another process (the app or a command line) runs it
    NOTHING = "nothing"          # no such entry in the queue


@dataclass
class QueuedJob:
    """A queue entry this process follows: started here, or run here (its job folder is a jobfolder.folder.Job once
    it has one: `job_dir`)."""
    entry: str
    origin: str = "queue"
    owner: str | None = None
    work: Work | None = None                # prepared when it was added here (None: prepared when it runs)
    cancel: CancelToken = field(default_factory=CancelToken)
    created: float = field(default_factory=time.monotonic)
    started: bool = False                   # it holds one of the executor's slots (or held one)
    finished: bool = False
    result: object = None                   # its Done, Failed or Cancelled
    job_dir: Path | None = None             # its folder, once it has one
    waited_on: bool = False                 # a page or API call waits on its result (it has the events)
    events: queue.Queue = field(default_factory=queue.Queue)     # its typed events, then ENDED
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
    """How many jobs may wait in the queue on disk: in all, and of one client (Entry.client: its login, else its
    address, as ui/guard.py client_key keys it; so without --auth one address cannot fill the queue for the
    others). The app sets them (clients cannot fill the disk queue); the command line has none."""
    total: int = 1000
    per_client: int = 200

    def check(self, store: qs.QueueStore, client: str | None, adding: int) -> None:
        """Raises InputError("queue") when `adding` more jobs of `client` would pass a cap."""
        waiting = store.entries([qs.WAITING])
        if len(waiting) + adding > self.total:
            raise InputError("queue", f"{len(waiting)} jobs are waiting and the queue takes at most {self.total}; "
                                      f"add these when some have run")
        mine = sum(1 for e in waiting if added_by(e) == client) if client is not None else 0
        if mine + adding > self.per_client:
            who = "one user" if client is not None and client.startswith("login ") else "one address"
            raise InputError("queue", f"you have {mine} jobs waiting and {who} may have at most "
                                      f"{self.per_client}; add these when some have run")


def client_of(owner: str | None, client: str | None) -> str | None:
    """Who adds a job, as the queue's caps count it: the client the app named, else the login of its owner."""
    return client if client is not None else (f"login {owner}" if owner else None)


def added_by(entry: qs.Entry) -> str | None:
    """The client an entry counts against (an entry of a queue older than Entry.client: its owner's login)."""
    return client_of(entry.owner, entry.client)


def enqueue(store: qs.QueueStore, preflight, requests: list, *, owner: str | None = None, origin: str = "queue",
            checked: bool = False, client: str | None = None) -> list[tuple[qs.Entry, Work]]:
    """Check every request (the one pre-flight; `checked`: they are PreparedRequests it passed already) and add
    them all, in order and in one transaction: [(its entry, what it will run)]. Raises InputError naming the field
    (nothing is added then)."""
    prepared = list(requests) if checked else [preflight.prepare(r) for r in requests]
    prepared = [with_new_seed(p) for p in prepared]
    entries = store.add_many([entry_values(p.request) for p in prepared], owner=owner, origin=origin,
                             client=client_of(owner, client))
    return [(e, Work(e.id, with_copies(p, e), owner=owner)) for e, p in zip(entries, prepared)]


class Runner:
    def __init__(self, store: qs.QueueStore, executor, preflight, *, poll_s: float = POLL_S):
        self.store, self.executor, self.preflight = store, executor, preflight
        self.poll_s = poll_s
        self.token = secrets.token_hex(8)            # this process's name in the queue's lease
        self._jobs: dict[str, QueuedJob] = {}        # entry id -> the job followed here
        self._running: dict[str, QueuedJob] = {}
        self.listeners: list[Callable[[QueuedJob, object], None]] = []   # each sees every job's events (jobs/follow.py)
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
    def submit(self, job, *, owner: str | None = None, origin: str = "page", checked: bool = False,
               waited_on: bool = False, client: str | None = None) -> QueuedJob:
        """Check and queue one job: `job` is a Request, a PreparedRequest or a ResumeRequest (a folder to continue;
        `checked`: a PreparedRequest the pre-flight passed already). `waited_on`: the caller waits on its result (a
        page or an API call). `client`: who adds it (ui/guard.py client_key; the queue's caps count it). Raises
        InputError naming the field, Busy for a folder that has an entry already."""
        from pipeline.resume import ResumeRequest

        client = client_of(owner, client)
        with self._lock:
            left = self._folder_check(job.job_dir if isinstance(job, ResumeRequest) else None)
        if left is not None:                # the folder's entry, left by a runner that is gone: it continues it
            return self._follow(left, Work(left.id, resuming=job, owner=left.owner), waited_on)
        if self.caps is not None:
            self.caps.check(self.store, client, 1)
        if isinstance(job, ResumeRequest):
            entry = self.store.add(job.request.settings(), owner=owner, origin=origin, job_dir=job.job_dir.name,
                                   client=client)
            work = Work(entry.id, resuming=job, owner=owner)
        else:
            ((entry, work),) = enqueue(self.store, self.preflight, [job], owner=owner, origin=origin,
                                       checked=checked, client=client)
        return self._follow(entry, work, waited_on)

    def submit_many(self, requests: list, *, owner: str | None = None, origin: str = "queue",
                    checked: bool = False, client: str | None = None) -> list[QueuedJob]:
        """Check every job, then queue them all in this order (InputError: none is queued). `checked`: they are
        PreparedRequests the pre-flight passed already (jobs/jsonl.py prepare_lines)."""
        client = client_of(owner, client)
        if self.caps is not None:
            self.caps.check(self.store, client, len(requests))
        return [self._follow(entry, work, False) for entry, work in
                enqueue(self.store, self.preflight, requests, owner=owner, origin=origin, checked=checked,
                        client=client)]

    def submit_resume(self, job_dir: Path, *, owner: str | None = None, origin: str = "page",
                      waited_on: bool = False, client: str | None = None) -> QueuedJob:
        """Queue the continuation of a job folder of this runner's outputs. Raises InputError when it cannot be
        resumed (the message says why), Busy as `submit` does."""
        from pipeline.resume import prepare_resume

        job_dir = Path(job_dir).resolve()
        if job_dir.parent != self.outputs.resolve() or not job_dir.is_dir() or job_dir.name.startswith("."):
            raise InputError("job folder", f"{job_dir.name} is not a job folder of this app's outputs")
        if is_post_folder(job_dir):                # a post job continues at its next chunk
            checked = post_resume(job_dir, folders_of(self.preflight.config))
            with self._lock:
                self._folder_check(job_dir)
            client = client_of(owner, client)
            if self.caps is not None:
                self.caps.check(self.store, client, 1)
            entry = self.store.add(checked.request.settings(), owner=owner, origin=origin, job_dir=job_dir.name,
                                   client=client)
            return self._follow(entry, Work(entry.id, checked, owner=owner), waited_on)
        return self.submit(prepare_resume(job_dir), owner=owner, origin=origin, waited_on=waited_on,
                           client=client)

    def edit(self, entry_id: str, request) -> qs.Entry:
        """Replace a waiting entry's job with `request`, checked whole by the pre-flight (InputError naming the
        field: the entry stays as it was)."""
        prepared = self.preflight.prepare(request)
        entry = self.store.edit(entry_id, entry_values(prepared.request))
        job = self.get(entry_id)
        if job is not None:
            job.work = Work(entry.id, with_copies(prepared, entry), owner=job.owner)
        return entry

    def _folder_check(self, folder: Path | None) -> qs.Entry | None:
        """(Lock held.) Refuses a second entry for a job folder (Busy); returns the folder's unfinished entry when no
        live process runs the queue to run it (to be continued here)."""
        if folder is None:
            return None
        busy = [e for e in self.store.entries([qs.WAITING, qs.RUNNING]) if e.job_dir == Path(folder).name]
        if busy and (self._leased or self.store.runner_alive() or busy[0].id in self._jobs):
            raise Busy(f"job {Path(folder).name} is already running or waiting to run")
        return busy[0] if busy else None

    def _follow(self, entry: qs.Entry, work: Work, waited_on: bool) -> QueuedJob:
        job = QueuedJob(entry.id, entry.origin, work.owner, work, waited_on=waited_on)
        with self._lock:
            self._jobs[entry.id] = job
        self.wake()
        return job

    # ---- asking ------------------------------------------------------------------------------------------------------
    def get(self, entry_id) -> QueuedJob | None:
        with self._lock:
            return self._jobs.get(entry_id) if isinstance(entry_id, str) else None

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

    # ---- End ---------------------------------------------------------------------------------------------------------
    def stop(self, entry_id: str) -> Stop:
        """End for an entry: a waiting one is removed at once (its followers get Cancelled), a running one stops at
        its next step."""
        job = self.get(entry_id)
        if job is not None:
            job.cancel.cancel()
        entry = self.store.get(entry_id)
        if entry is not None and entry.status != qs.RUNNING:
            try:
                self.store.remove(entry_id)
            except InputError:                      # it started meanwhile: the token stops it
                return Stop.STOPPING
            if job is not None:
                self._end(job, Cancelled(), announce=True)
            return Stop.DROPPED
        if entry is not None and (job is None or not (job.started or self._leased)):
            return Stop.ELSEWHERE
        return Stop.STOPPING if entry is not None else Stop.NOTHING

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
        """Follow a job's event in the store (its folder, its progress, its end), in the runner and its listeners."""
        for listener in self.listeners:
            try:
                listener(job, event)
            except Exception as e:  # a listener's fault must not end the job; the details go to the log
                log.warning("listener of job %s: %s", job.entry, e, exc_info=True)
        if isinstance(event, (Progress, Preview, SectionVideo)):
            job.latest[type(event).__name__] = event
            job.version += 1
        if isinstance(event, Started):
            job.job_dir = event.job_dir
            self.store.update(job.entry, job_dir=event.job_dir.name)
        elif isinstance(event, Progress):
            if time.monotonic() - last > PROGRESS_EVERY_S:
                self.store.update(job.entry, progress=event.fraction, message=progress_line(event))
                return time.monotonic()
        elif isinstance(event, (Done, Failed)):
            job.result = event
            job.job_dir = event.job_dir or job.job_dir
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
            elif status is None or (job.origin in LEAVES_WHEN_DONE and job.waited_on):
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
        job.events.put(ENDED)


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
