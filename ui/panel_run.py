"""Start, Resume, End and the running job: validate at once, wait in the runner's line (click order, the place and
the expected wait shown), then stream the job into the page. After a job: Start works again, the memory and
timings report opens, the past jobs and the selected job's details are read again."""
from __future__ import annotations

import hashlib
import logging
import threading
from dataclasses import dataclass

import gradio as gr

from common.errors import InputError
from jobs.runner import Busy
from jobs.text import waiting_text
from pipeline.events import Failed, Progress
from ui import doors, messages, plots
from ui import settings as st
from ui.context import AppContext
from ui.guard import HandlerGuard
from ui.layout import SHOW_PREVIEW_JS
from ui.media import published
from ui.panel_controls import LONG_JOB_SECTIONS, expected_time, section_count
from ui.panel_jobs import JobsPanel
from ui.view import QUEUED_TEXT, JobView, progress_html

log = logging.getLogger(__name__)

STOP_CALLS_MAX = 8      # End presses handled at once (each is a lock and a flag)
SUBMITS_MAX = 2         # Start/Resume checks (image decoding) at once; more wait in the queue
JOBS_MAX = 16           # job streams open at once (the runner's line orders them; one runs at a time)
TICK_S = 1.0            # the progress bar's clock moves this often between events
WATCH_S = 1.0           # a tab without a job of its own looks at the runner's running job this often
WATCH_CALLS_MAX = 16    # those looks at once (each reads the runner's latest events: no GPU, no file)
STARTED_FROM = {"page": "from a page (another tab, or this one before a reload)", "api": "from the API",
                "queue": "from the queue", "cli": "from the command line", "batch": "from a batch file"}


@dataclass
class Watch:
    """What a tab shows of a job it did not start (ui/panel_run.RunPanel.watch): the job, its view, and the events
    of the runner's snapshot (jobs/runner.QueuedJob.latest) it has shown."""
    job_id: str
    view: JobView
    seen: dict
    shown: str = ""             # the status line shown
NOT_STARTED = "Not started: change what the message above names, then press Start."


class RunPanel:
    def __init__(self, ctx: AppContext, jobs: JobsPanel):
        self.ctx, self.jobs, self.runner, self.sessions, self.ui = ctx, jobs, ctx.runner, ctx.sessions, ctx.ui
        self._confirmed: dict[str, str] = {}            # session -> the long job it was asked to confirm
        self._watching: dict[str, Watch] = {}           # session -> the job it shows and did not start
        self._ended: dict[str, tuple[str, str]] = {}    # session -> (its job, the last status its stream sent)
        self._lock = threading.Lock()

    # ---- Start / Resume -------------------------------------------------------------------------------------------
    def refuse(self, session, error: Exception):
        text = messages.input_error(error) if isinstance(error, InputError) else messages.plain(str(error))
        self.sessions.remember_error(session, text)
        log.info("job refused: %s", error)
        title = "Please check the input" if isinstance(error, InputError) else None
        raise gr.Error(text, title=title, print_exception=False) from None

    def started(self, job):
        place = self.sessions.waiting(job)
        text = waiting_text(place) if place is not None else "Starting…"
        return (job.id, gr.update(interactive=False), gr.update(interactive=True), text,
                progress_html(None, idle_text=QUEUED_TEXT))     # one line in the status, not the same one twice

    def needs_confirmation(self, session: str, job) -> str | None:
        """The question for a long job (more than LONG_JOB_SECTIONS sections) the session has not confirmed yet;
        None when it may start. Pressing Start again with the same settings confirms."""
        count = section_count(job.seconds, job.latent_window, job.mode)
        if count is None or count <= LONG_JOB_SECTIONS:
            return None
        key = hashlib.sha256(repr(sorted(job.settings().items())).encode()).hexdigest()
        with self._lock:
            if self._confirmed.pop(session, None) == key:
                return None
            self._confirmed[session] = key
        expected = expected_time(self.ctx, job.seconds, job.latent_window, job.mode, job.steps, job.resolution,
                                 job.width, job.height) or \
            "the expected time is not known yet (no job has been timed since the app started)"
        return (f"⚠ This video has **{count} sections**: {expected}. Press **Start** again to start it, or "
                "shorten it.")

    def submit(self, request: gr.Request, *values):
        user = self.ctx.access.user(request)
        try:
            job = st.request_from_values(dict(zip(st.CONTROLS, values)),        # the one door check
                                         door=doors.client(self.ctx.access, user, self.ctx.outputs,
                                                           doors.lora_folder(self.runner)))
            question = self.needs_confirmation(request.session_hash, job)
            if question is not None:
                return None, gr.skip(), gr.skip(), question, gr.skip()
            return self.started(self.sessions.submit(job, session=request.session_hash, owner=user,
                                                     origin="page",                 # the one pre-flight
                                                     client=self.ctx.access.client(request)))
        except (InputError, Busy) as e:
            self.refuse(request.session_hash, e)

    def submit_resume(self, job_id, request: gr.Request):
        user = self.ctx.access.user(request)
        try:
            if not job_id:
                raise InputError("job", "select a job in the gallery first")
            folder = self.ctx.access.job_folder(self.ctx.outputs, job_id, user, "job")
            return self.started(self.sessions.submit_resume(folder, session=request.session_hash, owner=user,
                                                            origin="page", client=self.ctx.access.client(request)))
        except (InputError, Busy) as e:
            self.refuse(request.session_hash, e)

    def show_submit_error(self, request: gr.Request):
        """The refusal in the status, and a progress line that agrees with it (not "Idle: … press Start")."""
        message = self.sessions.last_error(request.session_hash)
        if not message:
            return gr.skip(), gr.skip()
        return f"⚠ {message}", progress_html(None, idle_text=NOT_STARTED)

    # ---- the running job --------------------------------------------------------------------------------------------
    def run(self, job_id, request: gr.Request = None):
        ui, session = self.ui, getattr(request, "session_hash", None)
        job = self.runner.get(job_id)
        if job is None or job.cancel.cancelled and not job.started:
            yield {ui.status: gr.skip()}    # dropped while waiting (End or tab closed), or not started
            return
        view = JobView(fps=job.request.fps, mode=job.request.mode, seed=getattr(job.request, "seed", None))
        yield {ui.preview: None, ui.video: None, ui.log: "", ui.memory_plot: None,
               ui.timings: "_Shown after the job._"}
        for batch in self.sessions.stream(job, tick_s=TICK_S):
            for event in batch:
                view.apply(event)
            if not any(isinstance(event, Progress) for event in batch):   # (log lines alone do not stop the clock)
                view.tick()
            updates = self._updates(view)
            if view.result is not None and session:     # before it is sent: End's follow-up reads it (shown_end)
                with self._lock:
                    self._ended[session] = (job.id, view.status)
            yield updates
        if view.result is not None and getattr(view.result, "job_dir", None) is not None:
            self.jobs.keep_preview(view)
        if isinstance(view.result, Failed):         # the page keeps what the job made; the pop-up says Error
            raise gr.Error(messages.plain(view.result.message), title="The job failed", print_exception=False)

    def _updates(self, view: JobView) -> dict:
        ui = self.ui
        names = {"preview": ui.preview, "video": ui.video, "progress": ui.progress, "log": ui.log,
                 "status": ui.status}
        changes = view.take_changes()
        if changes.get("video") is not None:
            changes["video"] = published(changes["video"])          # a servable copy (ui/media.py)
        updates = {names[k]: v for k, v in changes.items() if k in names}
        if "memory" in changes:
            report = changes["memory"]
            updates[ui.memory_plot] = plots.memory_timeline_image(report.timeline, report.records, report.device)
            updates[ui.timings] = plots.timings_markdown(report.records, getattr(view.result, "timings", None))
            updates[ui.report] = gr.update(open=True)           # the report opens after a job
        if view.result is not None:         # the job is over: Start works again right away
            updates.update({ui.start: gr.update(interactive=True), ui.end: gr.update(interactive=False)})
        return updates or {ui.status: gr.skip()}

    def finish(self, job_id, selected_job, request: gr.Request):
        current = self.sessions.current(request.session_hash)
        gallery, job_ids = self.jobs.refresh(request)
        details = self.jobs.select_id(selected_job, request)    # the selected job as it is now (after Resume)
        if job_id is None or current is not None and current.id != job_id and not current.finished:
            return gr.skip(), gr.skip(), gallery, job_ids, *details    # not started, or a newer job is under way
        return gr.update(interactive=True), gr.update(interactive=False), gallery, job_ids, *details

    # ---- the job any tab shows ---------------------------------------------------------------------------------
    def watch(self, request: gr.Request):
        """The page is a view of the runner: a tab that has not started a job itself (a reloaded one, a second one,
        another browser of the same user) shows the job running here, whatever door started it (page, queue, command
        line, API): its progress, preview, section videos and End; then its end. Called every WATCH_S."""
        session, ui = request.session_hash, self.ui
        own = self.sessions.current(session)
        if own is not None:        # this tab's own job streams through run(); once it ended, its result stays shown
            with self._lock:
                self._watching.pop(session, None)
            return {ui.status: gr.skip()}
        user = self.ctx.access.user(request)
        running = [j for j in self.runner.running() if self.ctx.access.sees(user, j.owner)]
        with self._lock:
            watch = self._watching.get(session)
            if not running:
                self._watching.pop(session, None)
        if not running:
            return self._watched_end(watch) if watch is not None else self._elsewhere(user)
        job = running[0]
        updates = {}
        if watch is None or watch.job_id != job.id:
            request_ = job.request
            watch = Watch(job.id, JobView(fps=getattr(request_, "fps", 30), mode=getattr(request_, "mode", ""),
                                          seed=getattr(request_, "seed", None)), {})
            with self._lock:
                self._watching[session] = watch
            updates[ui.end] = gr.update(interactive=True)
        fresh = [e for kind, e in list(job.latest.items()) if watch.seen.get(kind) is not e]
        for event in sorted(fresh, key=lambda e: ("Progress", "Preview", "SectionVideo").index(type(e).__name__)):
            watch.view.apply(event)
            watch.seen[type(event).__name__] = event
        if not any(isinstance(event, Progress) for event in fresh):
            watch.view.tick()
        updates.update(self._updates(watch.view))
        status = (f"▶ Job {job.id}, started {STARTED_FROM.get(job.origin, 'elsewhere')}: its progress, preview and "
                  f"video show here; **End** stops it. {watch.view.status}")
        if status != watch.shown:
            updates[ui.status] = watch.shown = status
        return updates

    def _watched_end(self, watch: Watch) -> dict:
        """The job this tab showed has ended: its result (Done, Stopped, Failed), Start on, End off."""
        ui = self.ui
        job = self.runner.get(watch.job_id)
        if job is not None and job.result is not None:
            watch.view.apply(job.result)
        updates = self._updates(watch.view)
        updates.update({ui.start: gr.update(interactive=True), ui.end: gr.update(interactive=False)})
        return updates

    def _elsewhere(self, user) -> dict:
        """No job runs here: one that another process runs (a command line holding the queue) is named, with its
        progress as that process writes it."""
        ui = self.ui
        if self.runner.runs_the_queue:
            return {ui.status: gr.skip()}
        entries = [e for e in self.runner.store.entries(["running"]) if self.ctx.access.sees(user, e.owner)]
        if not entries:
            return {ui.status: gr.skip()}
        e = entries[0]
        return {ui.progress: progress_html(None, idle_text=e.message or "running…"),
                ui.status: (f"▶ Job {e.id} runs in another process (a command line on this outputs folder); it "
                            "is stopped there (Ctrl-C), or with `python -m cli queue remove` once it is "
                            "interrupted.")}

    # ---- End ----------------------------------------------------------------------------------------------------
    def stop(self, request: gr.Request):
        with self._lock:
            watch = self._watching.get(request.session_hash)
        own = self.sessions.current(request.session_hash)
        if (own is None or own.finished) and watch is not None:          # End on the job this tab shows
            job = self.runner.get(watch.job_id)
            if job is not None and self.ctx.access.sees(self.ctx.access.user(request), job.owner):
                return f"■ {self.sessions.stop(job.id)}", gr.skip(), gr.skip()
        message = self.sessions.cancel(request.session_hash)
        job = self.sessions.current(request.session_hash)
        if job is not None and job.finished:
            return f"■ {message}", gr.update(interactive=True), gr.update(interactive=False)
        return f"■ {message}", gr.skip(), gr.skip()

    @staticmethod
    def stop_busy():
        return "■ The server is busy; press End again.", gr.skip(), gr.skip()

    def shown_end(self, request: gr.Request):
        """After End's answer is on the page: the job's end again, if its stream already sent it. End's answer and
        the stream reach the page by two roads, so "Stopping…" (End sets the job's cancel flag, then answers) could
        land after the stream's "Stopped" and stay there (a busy CI machine: 180 s). The page asks this only once it
        has shown End's answer, and run() notes the end before sending it, so the end the page shows last is the
        job's: either noted here already (shown again), or sent by the stream after this answer."""
        job = self.sessions.current(request.session_hash)
        with self._lock:
            ended = self._ended.get(request.session_hash)
        if job is None or ended is None or ended[0] != job.id:
            return gr.skip()
        return ended[1]

    def tab_closed(self, request: gr.Request):
        self.sessions.drop_waiting(request.session_hash)
        with self._lock:
            self._confirmed.pop(request.session_hash, None)
            self._watching.pop(request.session_hash, None)
            self._ended.pop(request.session_hash, None)

    # ---- wiring -----------------------------------------------------------------------------------------------------
    def wire(self, app: gr.Blocks, job_state: gr.State) -> None:
        ui = self.ui
        run_outputs = [ui.preview, ui.video, ui.progress, ui.log, ui.status, ui.memory_plot, ui.timings, ui.report,
                       ui.start, ui.end]
        finish_outputs = [ui.start, ui.end, ui.gallery, ui.jobs_state, *self.jobs.detail_outputs]

        def queue_job(submitted, api_name=None):
            """After a job is queued: it waits its turn in the queue and streams to the page."""
            submitted.failure(self.show_submit_error, None, [ui.status, ui.progress], queue=False,
                              show_progress="hidden")
            submitted.success(self.run, job_state, run_outputs, concurrency_limit=JOBS_MAX, concurrency_id="gpu",
                              show_progress="full", show_progress_on=[ui.progress], api_name=api_name) \
                .then(self.finish, [job_state, ui.selected_job], finish_outputs,
                      show_progress="hidden")      # queued: it reads the job folders

        started_outputs = [job_state, ui.start, ui.end, ui.status, ui.progress]
        checks = dict(show_progress="hidden", concurrency_limit=SUBMITS_MAX, concurrency_id="submit")
        queue_job(ui.start.click(self.submit, ui.controls(), started_outputs, preprocess=False,
                                 trigger_mode="multiple", **checks), api_name="generate")
        ui.start.click(None, None, None, js=SHOW_PREVIEW_JS, show_progress="hidden")
        queue_job(ui.resume.click(self.submit_resume, ui.selected_job, started_outputs, **checks))
        # End reaches this tab's job whether it runs or waits; never waits behind the GPU queue
        ui.end.click(HandlerGuard(STOP_CALLS_MAX).wrap(self.stop, self.stop_busy), None, [ui.status, ui.start, ui.end],
                     queue=False, show_progress="hidden", api_name="stop") \
            .then(self.ctx.quick.wrap(self.shown_end, gr.skip), None, ui.status, queue=False, show_progress="hidden")
        app.unload(self.tab_closed)
        watch_outputs = [ui.preview, ui.video, ui.progress, ui.status, ui.start, ui.end, ui.log]
        gr.Timer(WATCH_S).tick(self.watch, None, watch_outputs, show_progress="hidden",
                               concurrency_limit=WATCH_CALLS_MAX, concurrency_id="watch")
