"""SteadyFrame's web app: `python app.py [--preset tiny] [--host] [--port] [--share] [--auth user:pass] ...`.

UI wiring only: the layout lives in ui/layout.py, the job queue/cancel handling in ui/runner.py, the event ->
component conversion in ui/view.py. `build_app(args)` returns the Blocks (tests launch it on a free port).
"""
import rocm  # first: the ROCm environment profile must be applied before anything imports torch

ROCM_ENV = rocm.apply_env_profile()

import logging  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import gradio as gr  # noqa: E402

from configs import DEFAULTS, MEMORY, get_preset  # noqa: E402
from ui import hints, jobs_gallery, plots  # noqa: E402
from ui.api import JobApi, hide_ui_endpoints  # noqa: E402
from ui import settings as st  # noqa: E402
from ui.cli import host_budget_problem, launch_options, parse_args, security_warnings, weight_storage  # noqa: E402
from ui.guard import HandlerGuard  # noqa: E402
from ui.layout import CSS, Layout, build_layout  # noqa: E402
from ui.models import ComponentCache  # noqa: E402
from ui.runner import JobRunner, SessionBusy  # noqa: E402
from ui.view import JobView, progress_html  # noqa: E402

log = logging.getLogger("steadyframe.app")
SCROLL_LOG_JS = "() => { const t = document.querySelector('#log textarea'); if (t) t.scrollTop = t.scrollHeight; }"
QUEUE_MAX = 32          # jobs waiting in Gradio's queue at most (one GPU job runs at a time)
LIVE_CALLS_MAX = 2      # un-queued live handlers (hints, memory plan, random seed) running at once; more return at once
STOP_CALLS_MAX = 8      # End presses handled at once (each is a lock and a flag)
SUBMITS_MAX = 2         # Start/Resume checks (image decoding) at once; more wait in the queue
QUEUE_POLL_S = 0.1     # how often Gradio's queue looks for new events when it has none (its own default: 1 ms)
PROGRESS_POLL_S = 0.25  # how often it sends pending progress (its own default: 10 ms)


def _device_text(device) -> str:
    if device.type != "cuda":
        return "CPU (no GPU found: slow with real models; the tiny preset is meant for this)"
    import torch

    name = torch.cuda.get_device_name(device)
    backend = "ROCm" if torch.version.hip else "CUDA"
    return f"{name} ({backend})"


def build_app(args, runner: JobRunner | None = None) -> gr.Blocks:
    """The whole app as a gr.Blocks (queue configured, not launched)."""
    from memory import default_device
    from pipeline.availability import missing_weights_message
    from pipeline.errors import InputError
    from pipeline.events import Failed
    from pipeline.request import prepare

    preset = get_preset(args.preset)
    device = default_device()
    outputs = Path(args.outputs).expanduser().resolve()
    if runner is None:
        runner = JobRunner(ComponentCache(preset.name, args.model_dir), outputs, args.vram_cap_gb, device,
                           host_ram_gb=getattr(args, "host_ram_gb", None), weight_storage=weight_storage(args))

    live = HandlerGuard(LIVE_CALLS_MAX)          # un-queued handlers: bounded work, bounded concurrency

    def preserved_text(preserved_gb):
        return "**Memory plan:** " + hints.preserved_hint(preset, args.vram_cap_gb, preserved_gb, device.type,
                                                          getattr(args, "host_ram_gb", None), weight_storage(args))

    with gr.Blocks(title="SteadyFrame", analytics_enabled=False) as app:
        ui: Layout = build_layout(preset, _device_text(device), preserved_text(MEMORY.preserved_gb),
                                  notice=missing_weights_message(preset, DEFAULTS.mode, args.model_dir))
        ticket_state = gr.State(None)
        controls = ui.controls()

        # ---- live explanations next to the controls ----------------------------------------------------------
        hint_inputs = [ui.mode, ui.end_image, ui.seconds, ui.latent_window, ui.cfg, ui.rescale, ui.negative_prompt,
                       ui.crf, ui.teacache]

        def show_hints(mode, end_image, seconds, window, cfg, rescale, negative, crf, teacache):
            problems = hints.combination_problems(
                mode=mode, has_end_image=st.upload_path(end_image) is not None, cfg=cfg, rescale=rescale,
                negative_prompt=negative, crf=crf, teacache=teacache)
            return hints.hints_markdown(hints.plan_hint(seconds, window, mode, DEFAULTS.fps), problems)

        live_hints = live.wrap(show_hints, gr.skip)
        for component in hint_inputs:
            component.change(live_hints, hint_inputs, ui.hints, queue=False, preprocess=False,
                             show_progress="hidden")
        app.load(live_hints, hint_inputs, ui.hints, queue=False, preprocess=False, show_progress="hidden")
        ui.preserved_gb.change(live.wrap(preserved_text, gr.skip), ui.preserved_gb, ui.preserved_info, queue=False,
                               preprocess=False, show_progress="hidden")
        ui.randomize.click(live.wrap(st.random_seed, gr.skip), None, ui.seed, queue=False, show_progress="hidden")
        ui.log.change(None, None, None, js=SCROLL_LOG_JS, show_progress="hidden")   # newest line in view

        def refresh_gallery():
            entries = jobs_gallery.shown_entries(jobs_gallery.list_jobs(outputs))
            return jobs_gallery.gallery_items(entries), [str(e.dir) for e in entries]

        # ---- Start / Resume: validate (instant), then wait in the GPU queue, then stream ---------------------
        def refuse(session, error: Exception):
            runner.remember_error(session, str(error))
            log.info("job refused: %s", error)
            title = "Please check the input" if isinstance(error, InputError) else None
            raise gr.Error(str(error), title=title, print_exception=False) from None

        def started(ticket):
            waiting = "Waiting for the GPU: another job is running…" if runner.busy else "Starting…"
            return (ticket.id, gr.update(interactive=False), gr.update(interactive=True), waiting,
                    progress_html(None, idle_text=waiting))

        def submit(request: gr.Request, *values):
            job = st.request_from_values(dict(zip(st.CONTROLS, values)))
            try:
                prepare(job, preset.default_resolution)
                return started(runner.reserve(request.session_hash, job))
            except (InputError, SessionBusy) as e:
                refuse(request.session_hash, e)

        def submit_resume(job_dir, request: gr.Request):
            try:
                if not job_dir:
                    raise InputError("job", "select a job in the gallery first")
                return started(runner.reserve_resume(request.session_hash, Path(job_dir)))
            except (InputError, SessionBusy) as e:
                refuse(request.session_hash, e)

        def show_submit_error(request: gr.Request):
            message = runner.last_error(request.session_hash)
            return f"⚠ {message}" if message else gr.skip()

        out_names = {"preview": ui.preview, "video": ui.video, "progress": ui.progress, "log": ui.log,
                     "status": ui.status}
        run_outputs = [*out_names.values(), ui.memory_plot, ui.timings, ui.start, ui.end]

        def run(ticket_id):
            ticket = runner.get(ticket_id)
            if ticket is None or ticket.cancel.cancelled and not ticket.started:
                yield {ui.status: gr.skip()}    # dropped while waiting (End or tab closed): leave the page as it is
                return
            view = JobView(fps=ticket.request.fps)
            yield {ui.preview: None, ui.video: None, ui.log: "", ui.memory_plot: None,
                   ui.timings: "_Shown after the job._", ui.status: "Running…"}
            for batch in runner.run(ticket):
                for event in batch:
                    view.apply(event)
                changes = view.take_changes()
                updates = {out_names[k]: v for k, v in changes.items() if k in out_names}
                if "memory" in changes:
                    report = changes["memory"]
                    updates[ui.memory_plot] = plots.memory_timeline_image(report.timeline, report.records,
                                                                          report.device)
                    updates[ui.timings] = plots.timings_markdown(report.records, getattr(view.result, "timings",
                                                                                          None))
                if view.result is not None:         # the job is over: Start works again right away
                    updates.update({ui.start: gr.update(interactive=True), ui.end: gr.update(interactive=False)})
                yield updates
            if isinstance(view.result, Failed):         # the page keeps what the job made; the pop-up says Error
                raise gr.Error(view.result.message, title="The job failed", print_exception=False)

        def finish(ticket_id, request: gr.Request):
            current = runner.current(request.session_hash)
            if current is not None and current.id != ticket_id and not current.finished:
                return gr.skip(), gr.skip(), *refresh_gallery(), gr.skip()  # a newer job of this tab is under way
            # the gallery is refreshed (its selection cleared): Resume waits for a new selection
            return gr.update(interactive=True), gr.update(interactive=False), *refresh_gallery(), \
                gr.update(interactive=False)

        def queue_job(submitted, api_name=None):
            """After a ticket is reserved: the job waits its turn in the GPU queue and streams to the page."""
            submitted.failure(show_submit_error, None, ui.status, queue=False, show_progress="hidden")
            submitted.success(run, ticket_state, run_outputs, concurrency_limit=1, concurrency_id="gpu",
                              show_progress="full", show_progress_on=[ui.progress], api_name=api_name) \
                .then(finish, ticket_state, [ui.start, ui.end, ui.gallery, ui.jobs_state, ui.resume],
                      show_progress="hidden")      # queued: it reads the job folders

        started_outputs = [ticket_state, ui.start, ui.end, ui.status, ui.progress]
        checks = dict(show_progress="hidden", concurrency_limit=SUBMITS_MAX, concurrency_id="submit")
        queue_job(ui.start.click(submit, controls, started_outputs, preprocess=False, trigger_mode="multiple",
                                 **checks), api_name="generate")
        queue_job(ui.resume.click(submit_resume, ui.selected_job, started_outputs, **checks))

        # ---- End: reaches this tab's job whether it runs or waits; never waits behind the GPU queue ----------
        def stop(request: gr.Request):
            message = runner.cancel(request.session_hash)
            ticket = runner.current(request.session_hash)
            if ticket is not None and ticket.finished:
                return f"■ {message}", gr.update(interactive=True), gr.update(interactive=False)
            return f"■ {message}", gr.skip(), gr.skip()

        def stop_busy():
            return "■ The server is busy; press End again.", gr.skip(), gr.skip()

        ui.end.click(HandlerGuard(STOP_CALLS_MAX).wrap(stop, stop_busy), None, [ui.status, ui.start, ui.end],
                     queue=False, show_progress="hidden", api_name="stop")

        def tab_closed(request: gr.Request):
            runner.drop_waiting(request.session_hash)

        app.unload(tab_closed)

        # ---- past jobs ------------------------------------------------------------------------------------------
        def select_job(job_dirs, evt: gr.SelectData):
            off = gr.update(interactive=False)
            index = evt.index
            if not job_dirs or not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(job_dirs):
                return None, None, None, off, off
            entry = jobs_gallery.read_job(Path(job_dirs[index]))
            if entry is None:
                return None, None, {"error": "job.json could not be read"}, off, off
            video = str(entry.video) if entry.video else None
            return (str(entry.dir), video, entry.details(), gr.update(interactive=True),
                    gr.update(interactive=entry.resumable))

        def reuse_settings(job_dir):
            entry = jobs_gallery.read_job(Path(job_dir)) if job_dir else None
            if entry is None:
                raise gr.Error("Select a job in the gallery first.")
            values = st.values_from_settings(entry.settings, preset.default_resolution)
            values["image"] = str(entry.thumbnail) if entry.thumbnail else None
            values["end_image"] = str(entry.end_image) if entry.end_image else None
            gr.Info(f"Settings of job {entry.id} loaded; the start image is the job's cropped input.")
            return [values[name] for name in st.CONTROLS]

        app.load(refresh_gallery, None, [ui.gallery, ui.jobs_state], show_progress="hidden")
        ui.refresh.click(refresh_gallery, None, [ui.gallery, ui.jobs_state], show_progress="hidden")
        ui.gallery.select(select_job, ui.jobs_state,
                          [ui.selected_job, ui.job_video, ui.job_details, ui.reuse, ui.resume], show_progress="hidden")
        ui.reuse.click(reuse_settings, ui.selected_job, controls, show_progress="hidden")

        # ---- the API for scripts (gradio_client): /video, /resume, /stop; see ui/api.py -----------------------
        JobApi(runner, preset.default_resolution).register(controls, concurrency_id="gpu")

    hide_ui_endpoints(app)
    # api_open=False: queued events (jobs, gallery) cannot be called around the queue and its limits
    app.queue(max_size=QUEUE_MAX, default_concurrency_limit=4, api_open=False)
    idle_quietly(app)
    return app


def idle_quietly(app: gr.Blocks) -> None:
    """Gradio's queue polls for new events every 1 ms and for progress every 10 ms on Linux (gradio/queueing.py,
    `sleep_when_free`): about 5 % of a core with nothing to do. A job waits at most QUEUE_POLL_S longer to start
    and progress is sent every PROGRESS_POLL_S: invisible next to a job, and an idle app then idles."""
    queue = app._queue
    queue.sleep_when_free = QUEUE_POLL_S
    queue.progress_update_sleep_when_free = PROGRESS_POLL_S


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    args = parse_args(argv)
    for line in ROCM_ENV.lines():
        log.info(line)
    log.info("%s", rocm.configure_host_heap())
    for warning in security_warnings(args):
        log.warning(warning)
    from pipeline.availability import missing_weights_message

    missing = missing_weights_message(get_preset(args.preset), DEFAULTS.mode, args.model_dir)
    if missing:
        log.warning(missing)
    from memory import default_device

    problem = host_budget_problem(args, default_device().type)
    if problem:
        log.error("%s", problem)
        return 2
    app = build_app(args)
    options = launch_options(args)
    app.launch(**options.kwargs(), css=CSS, prevent_thread_lock=True)
    log.info("serving on %s (preset %s, outputs %s); Ctrl-C stops the app", app.local_url, args.preset,
             Path(args.outputs).resolve())
    if app.share_url:
        log.info("public link: %s", app.share_url)
    serve_until_stopped(app)
    return 0


def serve_until_stopped(app: gr.Blocks) -> None:
    """Sleep in the main thread until Ctrl-C or SIGTERM, then close the server (its shutdown deletes the temporary
    files). Waiting in signal.pause() costs no CPU; Gradio's own wait wakes up ten times a second."""
    stopping = []

    def on_term(signum, frame):
        stopping.append(signum)

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        while not stopping:
            signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        log.info("stopping the server")
        app.close()


if __name__ == "__main__":
    sys.exit(main())
