"""SteadyFrame's web app: `python app.py [--preset tiny] [--host] [--port] [--share] [--auth user:pass] ...`.

UI wiring only: the layout lives in ui/layout.py, the job queue/cancel handling in ui/runner.py, the event ->
component conversion in ui/view.py. `build_app(args)` returns the Blocks (tests launch it on a free port).
"""
import rocm  # first: the ROCm environment profile must be applied before anything imports torch

ROCM_ENV = rocm.apply_env_profile()

import logging  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import gradio as gr  # noqa: E402

from configs import DEFAULTS, MEMORY, get_preset  # noqa: E402
from ui import hints, jobs_gallery, plots  # noqa: E402
from ui.api import JobApi, hide_ui_endpoints  # noqa: E402
from ui import settings as st  # noqa: E402
from ui.cli import host_budget_problem, launch_options, parse_args, security_warnings, weight_storage  # noqa: E402
from ui.layout import CSS, Layout, build_layout  # noqa: E402
from ui.models import ComponentCache  # noqa: E402
from ui.runner import JobRunner, SessionBusy  # noqa: E402
from ui.view import JobView, progress_html  # noqa: E402

log = logging.getLogger("steadyframe.app")
SCROLL_LOG_JS = "() => { const t = document.querySelector('#log textarea'); if (t) t.scrollTop = t.scrollHeight; }"
QUEUE_MAX = 32          # jobs waiting in Gradio's queue at most (one GPU job runs at a time)


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
    from pipeline.errors import InputError
    from pipeline.events import Failed
    from pipeline.request import prepare

    preset = get_preset(args.preset)
    device = default_device()
    outputs = Path(args.outputs).expanduser().resolve()
    if runner is None:
        runner = JobRunner(ComponentCache(preset.name, args.model_dir), outputs, args.vram_cap_gb, device,
                           host_ram_gb=getattr(args, "host_ram_gb", None), weight_storage=weight_storage(args))

    def preserved_text(preserved_gb):
        return "**Memory plan:** " + hints.preserved_hint(preset, args.vram_cap_gb, preserved_gb, device.type,
                                                          getattr(args, "host_ram_gb", None), weight_storage(args))

    with gr.Blocks(title="SteadyFrame", analytics_enabled=False) as app:
        ui: Layout = build_layout(preset, _device_text(device), preserved_text(MEMORY.preserved_gb))
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

        for component in hint_inputs:
            component.change(show_hints, hint_inputs, ui.hints, queue=False, preprocess=False,
                             show_progress="hidden")
        app.load(show_hints, hint_inputs, ui.hints, queue=False, preprocess=False, show_progress="hidden")
        ui.preserved_gb.change(preserved_text, ui.preserved_gb, ui.preserved_info, queue=False,
                               show_progress="hidden")
        ui.randomize.click(st.random_seed, None, ui.seed, queue=False, show_progress="hidden")
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
                yield {}            # dropped while waiting (End or tab closed): leave the page as it is
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
            if isinstance(view.result, Failed):
                gr.Warning(view.result.message, title="The job failed")

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
                .then(finish, ticket_state, [ui.start, ui.end, ui.gallery, ui.jobs_state, ui.resume], queue=False,
                      show_progress="hidden")

        started_outputs = [ticket_state, ui.start, ui.end, ui.status, ui.progress]
        queue_job(ui.start.click(submit, controls, started_outputs, preprocess=False, trigger_mode="multiple",
                                 show_progress="hidden", concurrency_limit=None), api_name="generate")
        queue_job(ui.resume.click(submit_resume, ui.selected_job, started_outputs, show_progress="hidden",
                                  concurrency_limit=None))

        # ---- End: reaches this tab's job whether it runs or waits; never waits behind the GPU queue ----------
        def stop(request: gr.Request):
            message = runner.cancel(request.session_hash)
            ticket = runner.current(request.session_hash)
            if ticket is not None and ticket.finished:
                return f"■ {message}", gr.update(interactive=True), gr.update(interactive=False)
            return f"■ {message}", gr.skip(), gr.skip()

        ui.end.click(stop, None, [ui.status, ui.start, ui.end], queue=False, show_progress="hidden",
                     api_name="stop")

        def tab_closed(request: gr.Request):
            runner.drop_waiting(request.session_hash)

        app.unload(tab_closed)

        # ---- past jobs ------------------------------------------------------------------------------------------
        def select_job(job_dirs, evt: gr.SelectData):
            off = gr.update(interactive=False)
            if not job_dirs or evt.index is None or not 0 <= evt.index < len(job_dirs):
                return None, None, None, off, off
            entry = jobs_gallery.read_job(Path(job_dirs[evt.index]))
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
    app.queue(max_size=QUEUE_MAX, default_concurrency_limit=4)
    return app


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    args = parse_args(argv)
    for line in ROCM_ENV.lines():
        log.info(line)
    log.info("%s", rocm.configure_host_heap())
    for warning in security_warnings(args):
        log.warning(warning)
    from memory import default_device

    problem = host_budget_problem(args, default_device().type)
    if problem:
        log.error("%s", problem)
        return 2
    app = build_app(args)
    options = launch_options(args)
    log.info("serving on http://%s:%s (preset %s, outputs %s)", options.server_name, options.server_port or "auto",
             args.preset, Path(args.outputs).resolve())
    app.launch(**options.kwargs(), css=CSS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
