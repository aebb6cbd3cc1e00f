"""SteadyFrame's web app: `python app.py [--preset tiny] [--host] [--port] [--share] [--auth user:pass] ...`.

UI wiring only: the layout lives in ui/layout.py, the handlers in ui/panel_*.py (one module per part of the page),
the event -> component conversion in ui/view.py; every job goes through the one queue and runner (jobs/).
`build_app(config)` returns the Blocks (tests launch it on a free port).
"""
from __future__ import annotations

import signal
import sys

import rocm  # first: the ROCm environment profile must be applied before anything imports torch
from configs.options import requested_device_index

ROCM_ENV = rocm.apply_env_profile(device_index=requested_device_index(sys.argv[1:]))   # the jobs' GPU's profile

# Light imports only up here (argparse, the configs, the queue's files): `--help` and a bad option are answered
# before torch, diffusers and Gradio load (seconds on a busy machine); build_app and main import those.
import logging  # noqa: E402

from common.errors import InputError  # noqa: E402
from common.portable import STOP_SIGNALS, handle_signal, wait_for_stop  # noqa: E402
from configs import DEFAULTS, MEMORY, get_preset  # noqa: E402
from configs.options import outputs_problem  # noqa: E402
from configs.runtime import Config  # noqa: E402
from farm.executor import queue_executor  # noqa: E402
from jobs.preflight import preflight_for  # noqa: E402
from jobs.runner import QueueCaps, Runner, exit_code_after, open_runner  # noqa: E402
from ui.access import Access  # noqa: E402
from ui.examples import write_examples  # noqa: E402
from ui.guard import HeapKeeper, limit_queue_per_client  # noqa: E402
from ui.launch import (  # noqa: E402
    PUBLIC_NOTICE,
    host_budget_problem,
    launch_options,
    parse_args,
    port_problem,
    public_without_login,
    security_warnings,
    serve,
)
from ui.prompt_tokens import TokenCounter  # noqa: E402
from ui.sessions import Sessions  # noqa: E402
from ui.settings import use_own_upload_folder  # noqa: E402

log = logging.getLogger("steadyframe.app")
QUEUE_MAX = 64          # events waiting in Gradio's queue at most (one GPU job runs at a time)
QUEUED_PER_LOGIN = 16   # ... of one login, or one address (this computer's too; ui/guard.py client_key)
QUEUED_PER_ADDRESS = 16
QUEUE_POLL_S = 0.1     # how often Gradio's queue looks for new events when it has none (its own default: 1 ms)
PROGRESS_POLL_S = 0.25  # how often it sends pending progress (its own default: 10 ms)
STOP_WAIT_S = 120.0     # Ctrl-C or SIGTERM: how long the running job's step is waited for


def _device_text(device) -> str:
    if device.type != "cuda":
        return "CPU (no GPU found: slow with real models; the tiny preset is meant for this)"
    import torch

    name = torch.cuda.get_device_name(device)
    backend = "ROCm" if torch.version.hip else "CUDA"
    return f"{name} ({backend})"


def app_runner(config: Config, device) -> tuple[Runner, str | None]:
    """The one runner of the outputs folder's queue (and the store's warning): its jobs run on the farm of
    --ray/--gpus/--cpu-workers (Ray is imported only then) or in this process."""
    preflight = preflight_for(config, device)
    executor = queue_executor(config, preflight.models, device)
    return open_runner(config, executor, device_type=device.type, preflight=preflight)


def build_app(config: Config, runner: Runner | None = None, device=None):
    """The whole app as a gr.Blocks (queue configured, runner started, not launched). The panels in ui/ wire their
    own events: panel_controls (live hints, memory plan, token count, upload checks), panel_run (Start, Resume,
    End, the running job), panel_jobs (past jobs), panel_queue (the queue), api (the API for scripts)."""
    import gradio as gr

    from memory.device import chosen_device
    from pipeline.availability import missing_weights_message
    from ui import panel_controls, panel_keyframes, panel_lora, panel_saved
    from ui.api import PUBLIC_ENDPOINTS, JobApi, hide_ui_endpoints
    from ui.context import AppContext, preserved_max_gb, preserved_text
    from ui.layout import build_layout
    from ui.panel_jobs import JobsPanel
    from ui.panel_post import PostPanel, register_post_api
    from ui.panel_queue import wire_queue
    from ui.panel_run import JOBS_MAX, RunPanel
    from ui.queue_api import QUEUE_ENDPOINTS

    preset = get_preset(config.preset)
    device = device if device is not None else chosen_device(config.device)      # --device: the jobs' GPU too
    outputs = config.outputs.expanduser().resolve()
    warning = None
    if runner is None:
        runner, warning = app_runner(config, device)
    top = preserved_max_gb(config.vram_cap_gb, device)
    examples = write_examples(outputs / ".examples")       # never listed as a job (its name starts with a dot)
    public = PUBLIC_NOTICE if public_without_login(config) else ""
    notice = "\n\n".join(t for t in (missing_weights_message(preset, DEFAULTS.mode, config.model_dir), public) if t)

    with gr.Blocks(title="SteadyFrame", analytics_enabled=False) as app:
        ui = build_layout(preset, _device_text(device),
                          preserved_text(preset, config, device, min(MEMORY.preserved_gb, top), top),
                          notice=notice or None, preserved_max_gb=top, examples=examples, lora_dir=config.lora_dir)
        access = Access.of(config.web.auth, config.web.admins, forwarded=config.web.share)
        keeper = HeapKeeper()
        live, quick = AppContext.guards(keeper, forwarded=config.web.share)
        sessions = Sessions(runner)                    # the tabs' and API calls' jobs on it (ui/sessions.py)
        ctx = AppContext(config, preset, device, outputs, runner, sessions, ui, top, live, quick,
                         TokenCounter(preset, config.model_dir), access, public, keeper)
        panel_controls.wire(app, ctx)
        if ui.lora is not None:
            panel_lora.wire(ui.lora, ui.loras, ctx.quick, check=lambda spec, mode: runner.preflight.check_loras(
                mode, spec), mode=ui.mode)
        if ui.keyframe_rows is not None:
            panel_keyframes.wire(ui.keyframe_rows, ui.keyframes, ctx.quick)
        if ui.saved is not None:                       # Saved settings and the /settings_* API (ui/panel_saved.py)
            panel_saved.wire(app, ui.saved, panel_saved.SavedSettings(outputs, preset.default_resolution),
                             ui.controls())
        jobs = JobsPanel(ctx)
        RunPanel(ctx, jobs).wire(app, gr.State(None))
        jobs.wire(app)
        JobApi(sessions, access).register(ui.controls(), concurrency_id="gpu", concurrency_limit=JOBS_MAX)
        wire_queue(ctx, app, warning)                  # the queue panel and the /queue_* API (ui/panel_queue.py)
        PostPanel(ctx).build(app)                      # "After the video" and the /post API (ui/panel_post.py)
        register_post_api(sessions, access, concurrency_id="gpu", concurrency_limit=JOBS_MAX)

    hide_ui_endpoints(app, PUBLIC_ENDPOINTS + QUEUE_ENDPOINTS + panel_saved.ENDPOINTS)
    # api_open=False: queued events (jobs, gallery) cannot be called around the queue and its limits
    app.queue(max_size=QUEUE_MAX, default_concurrency_limit=4, api_open=False)
    limit_queue_per_client(app, QUEUED_PER_LOGIN, QUEUED_PER_ADDRESS, forwarded=config.web.share)
    idle_quietly(app)
    no_hidden_trackers(app)
    runner.caps = QueueCaps()                         # clients cannot fill the queue on disk (README: Limits)
    app.runner, app.sessions = runner.start(), sessions
    return app


def idle_quietly(app) -> None:
    """Gradio's queue polls for new events every 1 ms and for progress every 10 ms on Linux (gradio/queueing.py,
    `sleep_when_free`): about 5 % of a core with nothing to do. A job waits at most QUEUE_POLL_S longer to start
    and progress is sent every PROGRESS_POLL_S: invisible next to a job, and an idle app then idles."""
    queue = app._queue
    queue.sleep_when_free = QUEUE_POLL_S
    queue.progress_update_sleep_when_free = PROGRESS_POLL_S


def no_hidden_trackers(app) -> None:
    """Gradio's page runs each output's progress tracker through every event even where the event hides its
    progress (`show_progress="hidden"`): the hidden tracker still renders its timer text and counts it up on every
    animation frame until the answer comes, and one removed from the page while its event is pending keeps counting
    for the life of the tab (gradio 6.31: js/statustracker). The page's 1 s and 2 s timers alone (the watch, the
    queue list) kept an idle headless Chromium at ~0.4 of a core that way. An event whose progress is hidden shows
    it on no component (`show_progress_on=[]`), so its answer is all the page does."""
    for fn in app.fns.values():
        if fn.show_progress == "hidden" and fn.show_progress_on is None:
            fn.show_progress_on = []


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    config = parse_args(argv)

    asked: list[int] = []                    # the stop signals that came while starting

    def starting(signum, frame):
        asked.append(signum)
        raise _StoppedWhileStarting(signum)

    restore = [handle_signal(name, starting) for name in ("SIGINT", *STOP_SIGNALS)]
    made: list = []                          # the app once built (its runner runs): a stop then ends it cleanly
    try:
        code = _start(config, made, asked)
    except _StoppedWhileStarting as e:        # Ctrl-C or SIGTERM before the app served: one line, no traceback
        log.info("stopped while starting")
        if not made:
            return 128 + e.signum
        made[0].close()
        return stop_runner(made[0].runner, e.signum)
    finally:
        for undo in restore:
            undo()
    if code:
        return code
    signum = serve_until_stopped(made[0])
    return stop_runner(made[0].runner, signum)


class _StoppedWhileStarting(BaseException):
    """Ctrl-C or SIGTERM (Windows: Ctrl-Break) before the app served its page. A BaseException, as KeyboardInterrupt
    is: the handler raises it wherever the main thread is, often inside an import, and a library's `except
    Exception` there took an Exception for its own failure and went on (CI: SIGINT during start-up, and the app
    served anyway and never stopped)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = int(signum)


def _start(config: Config, made: list, asked: list[int]) -> int:
    """From the checked options to a served app (put in `made` as soon as it is built): 0, or the exit code after
    one line. `asked`: the stop signals that came meanwhile (their handler raises `_StoppedWhileStarting`; should
    code that catches everything have swallowed it, the stop still happens here, before the app serves)."""
    for line in ROCM_ENV.lines():
        log.info(line)
    log.info("%s", rocm.configure_host_heap())
    for warning in security_warnings(config):
        log.warning(warning)

    from memory.device import chosen_device  # torch only (the options are checked by now)

    try:
        device = chosen_device(config.device)                    # before any model: an unknown GPU stops here
    except InputError as e:
        log.error("%s", e)
        return 2
    from pipeline.availability import missing_weights_message

    missing = missing_weights_message(get_preset(config.preset), DEFAULTS.mode, config.model_dir)
    if missing:
        log.warning(missing)

    problem = host_budget_problem(config, device.type) or port_problem(config.web.host, config.web.port)
    if problem:
        log.error("%s", problem)
        return 2
    problem = outputs_problem(config.outputs, create=True)       # read-only, a file: one line, before anything
    if problem:
        log.error("--outputs: %s", problem)
        return 2
    use_own_upload_folder()
    try:
        made.append(build_app(config, device=device))
    except (RuntimeError, ConnectionError, ValueError) as e:      # the farm: no cluster there, no GPUs in it
        log.error("the app could not start: %s", e)
        return 2
    app = made[0]
    if asked:
        raise _StoppedWhileStarting(asked[0])
    serve(app, **launch_options(config).kwargs(), prevent_thread_lock=True)
    log.info("serving on %s (preset %s, outputs %s); Ctrl-C stops the app", app.local_url, config.preset,
             config.outputs.resolve())
    if app.share_url:
        log.info("public link: %s", app.share_url)
    return 0


class _StopNow(BaseException):           # (not an Exception: as _StoppedWhileStarting)
    """A second stop signal while the running job finishes its step."""


def serve_until_stopped(app) -> int:
    """Sleep in the main thread until Ctrl-C or SIGTERM (Windows: also Ctrl-Break), then close the server (its
    shutdown deletes the temporary files); returns the signal's number. The wait looks twice a second
    (common/portable.py says why not signal.pause); Gradio's own wait wakes ten times a second."""
    stopping = []

    def on_stop(signum, frame):
        stopping.append(signum)

    restore = [handle_signal(name, on_stop) for name in STOP_SIGNALS]
    try:
        wait_for_stop(lambda: bool(stopping))
    except KeyboardInterrupt:
        stopping.append(signal.SIGINT)
    finally:
        for undo in restore:
            undo()
        log.info("stopping the server")
        app.close()
    return int(stopping[0])


def stop_runner(runner, signum: int) -> int:
    """After the server: the running job stops at its next step (it ends "stopped" in its job.json and in the queue,
    and resumes from there), its threads are joined, the lease given back. A second Ctrl-C or SIGTERM (or a step
    longer than STOP_WAIT_S) does not wait: the job is marked stopped and the process ends at once. Returns the exit
    code: 128 + the signal's number when a job was stopped (130 Ctrl-C, 143 SIGTERM), 0 when the app was idle."""
    def again(signum, frame):
        raise _StopNow()

    restore = [handle_signal(name, again) for name in ("SIGINT", *STOP_SIGNALS)]
    stopped = False
    try:
        if runner.busy:
            log.info("the running job stops after its current step (Ctrl-C again to quit at once; it resumes from "
                     "its last section)")
        stopped = bool(runner.close(timeout=STOP_WAIT_S))
    except _StopNow:
        stopped = True
    finally:
        for undo in restore:
            undo()
    code = 128 + signum if stopped else 0
    return exit_code_after(runner, code, "the app was stopped during a step")


if __name__ == "__main__":
    sys.exit(main())
