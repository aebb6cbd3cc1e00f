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

`/video` takes the UI's controls by name: `image`, `end_image` (original mode only), `prompt`, `negative_prompt`,
`seed`, `seconds`, `mode` ("original" or "f1"), `steps`, `gs`, `cfg`, `rescale`, `latent_window`, `sampler`
("unipc", "unipc_bh2" or "euler"), `resolution`, `teacache`, `preserved_gb`, `crf` (`client.view_api()` lists them with
their defaults). It returns the video (None if the job was stopped before its first section) and a summary:
`job_id` (its folder under outputs/), `status` ("done" or "stopped"), `frames`, `seconds`, `video`, `warnings`
(e.g. a prompt cut to its first 4000 characters), `timings` and a one-line `message`.

Bad input raises `gradio_client.exceptions.AppError` whose message names the field, e.g. `seconds: 121 is out of
range; use a value between 1 and 120` (a file over 64 MB is refused by the client with a ValueError before it is
sent); a job that fails raises it with the reason and what to change, e.g. `Out of GPU memory in
transformer … Try: more preserved memory …` (the job folder keeps what was made).

Long jobs: `job = client.submit(..., api_name="/video")`; `job.status()` has the progress
(`progress_data[0].desc`, e.g. "sampling · section 2/4 · step 7/25 · elapsed 3 min 10 s · ETA 6 min", or while it
waits "Waiting for the GPU: you are 2nd in line (1 job ahead of yours). …");
`client.predict(api_name="/stop")` from the same `Client` ends its running job at the next step, and
`job.result()` then returns the video made so far with status "stopped" (a call still waiting in the queue is
dropped with `job.cancel()`). A job that was stopped or interrupted (killed, power loss) continues from its
last finished section with `client.predict("20250101-120000-abc123", api_name="/resume")` (its job_id); the
result equals that of an uninterrupted run.
"""
from __future__ import annotations

import logging
from pathlib import Path

import gradio as gr

from pipeline.errors import InputError
from pipeline.events import Done, Failed, LogLine, Progress
from ui import settings as st
from ui.runner import JobRunner, SessionBusy, Ticket, Waiting
from ui.view import done_status, progress_line, waiting_text

log = logging.getLogger(__name__)

PUBLIC_ENDPOINTS = ("video", "resume", "stop")


class JobApi:
    """The endpoints' functions; `register()` wires them into the Blocks being built."""

    def __init__(self, runner: JobRunner, default_resolution: int):
        self.runner = runner
        self.default_resolution = default_resolution

    def register(self, controls: list, *, concurrency_id: str = "gpu", concurrency_limit: int = 1) -> None:
        """Hidden components and the /video and /resume events (call inside the gr.Blocks being built)."""
        with gr.Group(visible=False):
            trigger = gr.Button(visible=False)
            job_id = gr.Textbox(label="job_id", visible=False)
            video = gr.File(label="video", visible=False)
            summary = gr.JSON(label="summary", visible=False)
        queue = dict(preprocess=False, concurrency_limit=concurrency_limit, concurrency_id=concurrency_id,
                     show_progress="hidden")
        trigger.click(self.video, controls, [video, summary], api_name="video", **queue)
        trigger.click(self.resume, job_id, [video, summary], api_name="resume", **queue)

    # ---- endpoints ------------------------------------------------------------------------------------------------
    # Gradio passes every value (a control left out by the client gets the UI's default); the None defaults only
    # mark end_image as optional in the API info (the others' defaults come from their components).
    def video(self, image, end_image=None, prompt=None, negative_prompt=None, seed=None, seconds=None, mode=None,
              steps=None, gs=None, cfg=None, rescale=None, latent_window=None, sampler=None, resolution=None,
              teacache=None, preserved_gb=None, crf=None, request: gr.Request = None, progress=gr.Progress()):
        """Image to video: runs one job to its end (in the GPU queue) and returns the video and a summary.

        Args:
            image: the start image (gradio_client.handle_file(path)); PNG, JPEG or WebP
            end_image: optional end frame (original mode only)
            prompt: what should happen; longer than 4000 characters is cut (a warning says so)
            negative_prompt: used only when cfg > 1
            seed: the random seed (same seed and settings = same video)
            seconds: length of the video
            mode: "original" (inverted anti-drifting; supports an end frame) or "f1" (forward)
            steps: sampling steps per section
            gs: distilled CFG scale
            cfg: real CFG scale (1 = off)
            rescale: CFG rescale
            latent_window: latent frames per section
            sampler: "unipc" (FramePack's), "unipc_bh2" or "euler" (diffusers')
            resolution: bucket base resolution (a multiple of 16)
            teacache: TeaCache threshold (0 = off)
            preserved_gb: GPU memory kept free of resident transformer weights (GB)
            crf: MP4 compression (0 = lossless, 51 = smallest)
        """
        values = {"image": image, "end_image": end_image, "prompt": prompt, "negative_prompt": negative_prompt,
                  "seed": seed, "seconds": seconds, "mode": mode, "steps": steps, "gs": gs, "cfg": cfg,
                  "rescale": rescale, "latent_window": latent_window, "sampler": sampler, "resolution": resolution,
                  "teacache": teacache, "preserved_gb": preserved_gb, "crf": crf}
        from pipeline.request import prepare

        job = st.request_from_values(values)
        try:
            prepared = prepare(job, self.default_resolution)       # checked and decoded once, here
        except InputError as e:
            log.info("API input rejected: %s", e)
            raise gr.Error(str(e), title="Please check the input", print_exception=False) from None
        return self._run(self._reserve(request, lambda session: self.runner.reserve(session, prepared)), progress)

    def resume(self, job_id, request: gr.Request, progress=gr.Progress()):
        """Continue a stopped or interrupted job from its last finished section; returns the video and a summary.

        Args:
            job_id: the job's folder name under outputs/ (the summary's job_id), e.g. 20250101-120000-abc123
        """
        job_dir = self._job_folder(job_id)
        return self._run(self._reserve(request, lambda session: self.runner.reserve_resume(session, job_dir)),
                         progress)

    # ---- helpers --------------------------------------------------------------------------------------------------
    def _reserve(self, request: gr.Request, reserve) -> Ticket:
        try:
            return reserve(request.session_hash)
        except InputError as e:
            raise gr.Error(str(e), title="Please check the input", print_exception=False) from None
        except SessionBusy as e:
            raise gr.Error(str(e), print_exception=False) from None

    def _job_folder(self, job_id) -> Path:
        """The folder of an existing job, found by comparing names (the text never becomes a path)."""
        outputs = self.runner.outputs
        if isinstance(job_id, str) and job_id and not job_id.startswith(".") and outputs.is_dir():
            for d in outputs.iterdir():
                if d.name == job_id and d.is_dir():
                    return d
        shown = repr(job_id) if len(repr(job_id)) <= 80 else repr(job_id)[:77] + "…"
        raise gr.Error(f"job_id: there is no job {shown} in the outputs folder; use the job_id of a /video "
                       "summary or a folder name from the Past jobs panel", title="Please check the input",
                       print_exception=False)

    def _run(self, ticket: Ticket, progress) -> tuple[str | None, dict]:
        result, warnings = None, []
        try:
            for batch in self.runner.run(ticket):
                for event in batch:
                    if isinstance(event, Progress):
                        progress(event.fraction, desc=progress_line(event))
                    elif isinstance(event, Waiting):
                        progress(0.0, desc=waiting_text(event))
                    elif isinstance(event, LogLine) and event.level == "warning":
                        warnings.append(event.message)
                    elif isinstance(event, (Done, Failed)):
                        result = event
        finally:
            self.runner.forget(ticket)
        return outcome(result, warnings, ticket.request.fps)


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
    return (str(result.video) if result.video else None), summary


def hide_ui_endpoints(blocks: gr.Blocks, public=PUBLIC_ENDPOINTS) -> None:
    """Keep the page's own handlers out of the API docs (they stay callable: the page uses them)."""
    for fn in blocks.fns.values():
        if fn.api_name not in public and fn.api_visibility == "public":
            fn.api_visibility = "undocumented"
