"""The app's API for whole jobs, for scripts (`gradio_client`). The section below is the README's text.

## Python API

The app answers API calls next to its page, in the same queue as the Start button (one GPU job at a time;
calls wait their turn). With `pip install gradio_client`:

```python
from gradio_client import Client, handle_file

client = Client("http://127.0.0.1:7860/")              # with --auth: Client(url, auth=("user", "pass"))
video, summary = client.predict(
    image=handle_file("start.png"),                     # PNG, JPEG or WebP, up to 64 MB
    prompt="The girl dances gracefully, with clear movements, full of charm.",
    seconds=5, seed=31337,                              # every control left out keeps the UI's default
    api_name="/video")
print(summary["status"], summary["frames"], video)     # done 145 /tmp/gradio/…/final.mp4 (a local copy)
```

`/video` takes the page's controls by name: the rows of the table of controls above that are on the page, by
their "API / job.json key" (`client.view_api()` lists them with their defaults). It returns the video (None if the
job was stopped before its first section) and a summary:
`job_id` (its folder under outputs/), `status` ("done" or "stopped"), `frames`, `seconds`, `video`, `warnings`
(e.g. a prompt cut to its first 4000 characters), `timings` and a one-line `message`.

Bad input raises `gradio_client.exceptions.AppError` whose message names the field, e.g. `seconds: 121 is out of
range; use a value between 1 and 120` (a file over 64 MB is refused by the client with a ValueError before it is
sent); a job that fails raises it with the reason and what to change, e.g. `Out of GPU memory in
transformer … Try: more preserved memory …` (the job folder keeps what was made).

One `Client` has one job at a time (it is one session, as a tab is): a second `/video` or `/resume` of the same
`Client` while its first runs or waits is refused ("already has a job running or waiting"); for several jobs at
once use one `Client` each, or `/queue_add` (the limits per client above count calls, not jobs).

Long jobs: `job = client.submit(..., api_name="/video")`; `job.status()` has the progress
(`progress_data[0].desc`, e.g. "sampling · section 2/4 · step 7/25 · elapsed 3 min 10 s · ETA 6 min", or while it
waits "Waiting for the GPU: you are 2nd in line (1 job ahead of yours). …");
`client.predict(api_name="/stop")` from the same `Client` ends its running job at the next step, and
`job.result()` then returns the video made so far with status "stopped" (a call still waiting in the queue is
dropped with `job.cancel()`). A job that was stopped or interrupted (killed, power loss) continues from its
last finished section with `client.predict("20250101-120000-abc123", api_name="/resume")` (its job_id); the
result equals that of an uninterrupted run. A `/video` or `/resume` job is kept in the app's queue on disk while it
waits or runs (see *The queue*): if the app is restarted meanwhile, the job is run (or continued) by the queue, and
its result is then found with `/queue_list` (its `job_id`) instead of in this call.
"""
from __future__ import annotations

import inspect
import logging
from typing import Any

import gradio as gr

from common.errors import InputError
from configs.controls import CONTROLS as TABLE
from configs.controls import Control
from jobs.line import Waiting
from jobs.runner import Busy, QueuedJob
from jobs.text import progress_line, waiting_text
from pipeline.events import Cancelled, Done, Failed, LogLine, Progress
from ui import doors
from ui import settings as st
from ui.access import Access
from ui.media import published
from ui.sessions import Sessions
from ui.view import done_status

log = logging.getLogger(__name__)

PUBLIC_ENDPOINTS = ("video", "resume", "stop", "post")      # post: ui/panel_post.py


class JobApi:
    """The endpoints' functions; `register()` wires them into the Blocks being built."""

    def __init__(self, sessions: Sessions, access: Access = Access()):
        self.sessions = sessions            # the callers' jobs on the runner (ui/sessions.py)
        self.access = access

    @property
    def runner(self):
        return self.sessions.runner

    def register(self, controls: list, *, concurrency_id: str = "gpu", concurrency_limit: int = 1,
                 table: tuple[Control, ...] = TABLE) -> None:
        """Hidden components and the /video and /resume events (call inside the gr.Blocks being built).
        `controls`: the page's controls in the order of `table`'s rows that are on the page."""
        self.table = table
        with gr.Group(visible=False):
            trigger = gr.Button(visible=False)
            job_id = gr.Textbox(label="job_id", visible=False)
            video = gr.File(label="video", visible=False)
            summary = gr.JSON(label="summary", visible=False)
        queue = dict(preprocess=False, concurrency_limit=concurrency_limit, concurrency_id=concurrency_id,
                     show_progress="hidden")
        trigger.click(video_endpoint(self.video, table), controls, [video, summary], api_name="video", **queue)
        trigger.click(self.resume, job_id, [video, summary], api_name="resume", **queue)

    # ---- endpoints ------------------------------------------------------------------------------------------------
    def video(self, values: dict, request: gr.Request = None, progress=None):
        """/video (see `video_endpoint`): `values` by control name."""
        user = self.access.user(request)

        def submit(session):
            job = st.request_from_values(values, getattr(self, "table", TABLE),       # the one door check
                                         doors.client(self.access, user, self.runner.outputs,
                                                      doors.lora_folder(self.runner)))
            return self.sessions.submit(job, session=session, owner=user, origin="api",  # the one pre-flight
                                        client=self.access.client(request))

        return self._run(self._submit(request, submit), progress)

    def resume(self, job_id, request: gr.Request, progress=gr.Progress()):
        """Continue a stopped or interrupted job from its last finished section; returns the video and a summary.

        Args:
            job_id: the job's folder name under outputs/ (the summary's job_id), e.g. 20250101-120000-abc123
        """
        user = self.access.user(request)
        return self._run(self._submit(request, lambda session: self.sessions.submit_resume(
            self.access.job_folder(self.runner.outputs, job_id, user, "job_id"), session=session, owner=user,
            origin="api", client=self.access.client(request))), progress)

    # ---- helpers --------------------------------------------------------------------------------------------------
    def _submit(self, request: gr.Request, submit) -> QueuedJob:
        try:
            return submit(getattr(request, "session_hash", None))     # no request: a direct call (tests, scripts)
        except InputError as e:
            log.info("API input rejected: %s", e)
            raise gr.Error(str(e), title="Please check the input", print_exception=False) from None
        except Busy as e:
            raise gr.Error(str(e), print_exception=False) from None

    def _run(self, job: QueuedJob, progress) -> tuple[str | None, dict]:
        result, warnings = None, []
        for batch in self.sessions.stream(job):
            for event in batch:
                if isinstance(event, Progress):
                    progress(event.fraction, desc=progress_line(event))
                elif isinstance(event, Waiting):
                    progress(0.0, desc=waiting_text(event))
                elif isinstance(event, LogLine) and event.level == "warning":
                    warnings.append(event.message)
                elif isinstance(event, (Done, Failed, Cancelled)):
                    result = event
        return outcome(result, warnings, job.request.fps)


VIDEO_DOC = "Image to video: runs one job to its end (in the GPU queue) and returns the video and a summary."


def video_signature(table: tuple[Control, ...] = TABLE) -> inspect.Signature:
    """/video's parameters: one per control on the page, by its API name, in the table's order (Gradio passes
    every value; a control left out by the client gets the page's default; the None defaults only mark the
    optional ones in the API info), then Gradio's request and progress."""
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    needed = {c.name for c in table if c.required and not c.required_unless}
    params = [inspect.Parameter(c.api_name or c.name, kind,
                                default=inspect.Parameter.empty if c.name in needed else None)
              for c in st.page_controls(table)]
    params += [inspect.Parameter("request", kind, default=None, annotation=gr.Request),
               inspect.Parameter("progress", kind, default=gr.Progress())]
    return inspect.Signature(params)


def video_docstring(table: tuple[Control, ...] = TABLE) -> str:
    args = "\n".join(f"    {c.api_name}: {c.help}" for c in st.page_controls(table))
    return f"{VIDEO_DOC}\n\nArgs:\n{args}\n"


def video_endpoint(handler, table: tuple[Control, ...] = TABLE):
    """The /video function Gradio sees: the signature and docstring of `video_signature`/`video_docstring`; it
    calls `handler(values by control name, request, progress)`."""
    signature = video_signature(table)
    rows = st.page_controls(table)

    def video(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        given = bound.arguments
        return handler({c.name: given[c.api_name] for c in rows}, given["request"], given["progress"])

    marked: Any = video                                 # (attributes a function does not declare)
    marked.__signature__ = signature
    video.__annotations__ = {"request": gr.Request}
    video.__doc__ = video_docstring(table)
    return video


def outcome(result, warnings: list[str], fps: int) -> tuple[str | None, dict]:
    """(video path, summary) of a finished job, or gr.Error for one that failed or never ran."""
    if isinstance(result, Failed):
        where = ""
        if result.job_dir is not None:
            kept = "; the video made before the failure is kept" if result.partial_video else ""
            where = f" (job {result.job_dir.name}{kept})"
        raise gr.Error(result.message + where, title="The job failed", print_exception=False)
    if not isinstance(result, Done):
        raise gr.Error("The job was cancelled before it started.", print_exception=False)
    job_id = result.job_dir.name
    message = done_status(result, fps).replace("**", "").replace("`", "")
    summary = {"job_id": job_id, "status": "stopped" if result.stopped else "done", "frames": result.frames,
               "seconds": round(result.frames / fps, 3) if fps else None,
               "video": f"{job_id}/{result.video.name}" if result.video else None, "warnings": warnings,
               "timings": result.timings, "message": message}
    return published(result.video), summary


def hide_ui_endpoints(blocks: gr.Blocks, public=PUBLIC_ENDPOINTS) -> None:
    """Keep the page's own handlers out of the API docs (they stay callable: the page uses them)."""
    for fn in blocks.fns.values():
        if fn.api_name not in public and fn.api_visibility == "public":
            fn.api_visibility = "undocumented"
