"""The page's "After the video" panel and the /post API: a finished job (picked from the user's Past jobs) or an
uploaded video, the steps (interpolation, upscaling, trim, speed, loop, ping-pong, reverse) and an export, run as a
post-processing job of the one queue (post/): progress and a preview while it runs, the result to watch and to
download, and a frame as the start image of a new job.

The source is resolved the way every door resolves files: a job by its id among the folders the user may see
(ui/access.py `job_folder`), an upload only from Gradio's upload folder (ui/settings.py `client_file`)."""
from __future__ import annotations

import logging
from pathlib import Path

import gradio as gr

from common.errors import InputError
from configs.controls import control
from jobfolder.folder import finished_video, load_job
from jobs.line import Waiting
from jobs.runner import Busy
from jobs.text import progress_line, waiting_text
from pipeline.events import Cancelled, Done, Failed, Preview, Progress
from post.modelfiles import SUFFIXES
from post.steps import EXPORTS, PostRequest, request_from
from ui import doors
from ui import settings as st
from ui.access import Access
from ui.jobs_gallery import list_jobs
from ui.media import published
from ui.sessions import Sessions

log = logging.getLogger(__name__)

DEFAULT_UPSCALER = "default (Real-ESRGAN)"
DEFAULT_FACE = "default (GFPGAN v1.4)"
INTERPOLATION = ("off", "×2", "×4", "to fps")
UPSCALE = ("off", "×2", "×4")
JOBS_LISTED = 50
SESSION_SUFFIX = ":post"          # a tab's post job is its own, beside its generation job


def steps_of(interp: str, fps, upscale: str, upscaler: str | None, trim_start, trim_end, speed, loop,
             pingpong: bool, reverse: bool, faces=0, face_model: str | None = None) -> list[str]:
    """The panel's controls as step texts (post/steps.py), edits first (`faces`: the restoration's strength, 0 =
    off)."""
    steps = []
    start, end = float(trim_start or 0), float(trim_end or 0)
    if start > 0 or end > 0:
        steps.append(f"trim={start:g}:{end if end > 0 else 1e6:g}")
    if speed and abs(float(speed) - 1.0) > 1e-9:
        steps.append(f"speed={float(speed):g}")
    if reverse:
        steps.append("reverse")
    if pingpong:
        steps.append("pingpong")
    if loop and int(loop) > 1:
        steps.append(f"loop={int(loop)}")
    if interp in ("×2", "×4"):
        steps.append(f"interpolate={interp[1]}")
    elif interp == "to fps":
        steps.append(f"interpolate=fps:{float(fps or 0):g}")
    if faces and float(faces) > 0:
        model = "" if not face_model or face_model == DEFAULT_FACE else f":{face_model}"
        steps.append(f"faces={float(faces):g}{model}")
    if upscale in ("×2", "×4"):
        model = "" if not upscaler or upscaler == DEFAULT_UPSCALER else f":{upscaler}"
        steps.append(f"upscale={upscale[1]}{model}")
    return steps


def source_of(job_id, upload, outputs: Path, access: Access, user: str | None) -> tuple[Path, str]:
    """(the video, the job id it came from or ""): a finished job the user may see, or a file they uploaded (the
    client's door: ui/doors.py, the same rules as a generation job's)."""
    door = doors.client(access, user, outputs)
    if job_id and upload:
        raise InputError("video", "give a finished job or a video file, not both")
    if job_id:
        assert door.job is not None                     # the client's door names jobs (ui/doors.py client)
        folder = door.job(job_id, "job")
        video = finished_video(folder)
        if video is None:
            raise InputError("job", f"job {folder.name} has no finished video yet; pick a finished job")
        return video, folder.name
    path = door.file(control("input_video"), upload)
    if path is None:
        raise InputError("video", "pick a finished job or upload a video")
    return Path(path), ""


def post_request(values: dict, outputs: Path, access: Access, user: str | None) -> PostRequest:
    """The page's or the API's values as a PostRequest (its fields checked: InputError naming the field)."""
    video, job = source_of(values.get("job_id"), values.get("video"), outputs, access, user)
    return request_from({"sources": [str(video)], "steps": values.get("steps") or [], "export": values.get("export"),
                         "frame": values.get("frame", -1), "source_job": job})


class PostPanel:
    def __init__(self, ctx):
        self.ctx = ctx
        self.sessions, self.access = ctx.sessions, ctx.access

    def finished_jobs(self, user: str | None) -> list[str]:
        """The ids of the finished jobs the user may see (not post jobs' exports only: every done job), newest
        first."""
        return [e.id for e in list_jobs(self.ctx.outputs, JOBS_LISTED, sees=lambda o: self.access.sees(user, o))
                if e.status == "done"]

    def upscalers(self, default: str = DEFAULT_UPSCALER) -> list[str]:
        """The upscalers folder's model files (upscalers and face models), the default first."""
        folder = Path(self.ctx.config.upscaler_dir)
        files = sorted(p.name for p in folder.glob("*") if p.suffix.lower() in SUFFIXES) if folder.is_dir() else []
        return [default, *files]

    def build(self, app) -> None:
        with gr.Accordion("After the video: interpolate, upscale, restore faces, loop, export", open=False,
                          elem_id="post-panel") as self.accordion:
            gr.Markdown("Runs on a finished job's video or a video you upload, as a job of the queue (Stop keeps "
                        "what was made; Resume in Past jobs continues it). RIFE 4.25 makes the frames between, "
                        "ESRGAN-family files in the upscalers folder enlarge them, GFPGAN restores faces.")
            with gr.Row():
                self.job = gr.Dropdown(label="Finished job", choices=[], value=None, elem_id="post-job",
                                       allow_custom_value=False)
                self.refresh = gr.Button("↻ Jobs", size="sm", elem_id="post-refresh")
                self.upload = gr.File(label="…or a video file", file_types=[".mp4", ".webm", ".mov", ".mkv"],
                                      elem_id="post-video")
            with gr.Row():
                self.interp = gr.Radio(list(INTERPOLATION), value="off", label="Frame interpolation",
                                       elem_id="post-interp")
                self.fps = gr.Number(60, label="target fps (to fps)", elem_id="post-fps")
                self.upscale = gr.Radio(list(UPSCALE), value="off", label="Upscale", elem_id="post-upscale")
                self.upscaler = gr.Dropdown(self.upscalers(), value=DEFAULT_UPSCALER, label="Upscaler file",
                                            elem_id="post-upscaler")
            with gr.Row():
                self.faces = gr.Slider(0, 1, 0, step=0.05, label="Restore faces (GFPGAN strength; 0 = off)",
                                       info="each face found in each frame",
                                       elem_id="post-faces")
                self.face_model = gr.Dropdown(self.upscalers(DEFAULT_FACE), value=DEFAULT_FACE,
                                              label="Face model file", elem_id="post-face-model")
            with gr.Row():
                self.trim_start = gr.Number(0, label="Trim from (s)", elem_id="post-trim-start")
                self.trim_end = gr.Number(0, label="to (s; 0 = the end)", elem_id="post-trim-end")
                self.speed = gr.Slider(0.25, 4, 1, step=0.05, label="Speed", elem_id="post-speed")
                self.loop = gr.Number(1, precision=0, label="Loop (times)", elem_id="post-loop")
                self.pingpong = gr.Checkbox(False, label="Ping-pong", elem_id="post-pingpong")
                self.reverse = gr.Checkbox(False, label="Reverse", elem_id="post-reverse")
            with gr.Row():
                self.export = gr.Dropdown([(label, key) for key, label in EXPORTS.items()], value="mp4",
                                          label="Export", elem_id="post-export")
                self.frame = gr.Number(-1, precision=0, label="Frame (export one frame; -1 = the last)",
                                       elem_id="post-frame")
            with gr.Row():
                self.run_btn = gr.Button("Run", variant="primary", elem_id="post-run")
                self.stop_btn = gr.Button("Stop", elem_id="post-stop")
            self.status = gr.Markdown("", elem_id="post-status")
            with gr.Row():
                self.preview = gr.Image(label="Preview", interactive=False, elem_id="post-preview", height=240)
                self.video = gr.Video(label="Result", interactive=False, elem_id="post-result", height=240)
            self.download = gr.File(label="Download", interactive=False, elem_id="post-download")
            self.use_frame = gr.Button("Use the exported frame as the start image", elem_id="post-use-frame")
        self.wire(app)

    def wire(self, app) -> None:
        inputs = [self.job, self.upload, self.interp, self.fps, self.upscale, self.upscaler, self.trim_start,
                  self.trim_end, self.speed, self.loop, self.pingpong, self.reverse, self.export, self.frame,
                  self.faces, self.face_model]
        outputs = [self.status, self.preview, self.video, self.download]
        self.refresh.click(self.jobs_choices, None, self.job, queue=False)
        app.load(self.jobs_choices, None, self.job, queue=False)
        self.run_btn.click(self.run_post, inputs, outputs, concurrency_limit=None, show_progress="hidden")
        self.stop_btn.click(self.stop_post, None, self.status, queue=False)
        self.use_frame.click(self.frame_as_start, self.download, self.ctx.ui.image, queue=False)
        from_jobs = getattr(self.ctx.ui, "post_job", None)          # Past jobs' "After the video" button
        if from_jobs is not None:
            from ui.panel_jobs import scroll_to

            from_jobs.click(self.from_past_job, self.ctx.ui.selected_job,
                            [self.job, self.upload, self.accordion, self.status], queue=False) \
                .then(None, js=scroll_to("#post-panel"))

    # ---- handlers ---------------------------------------------------------------------------------------------------
    def jobs_choices(self, request: gr.Request = None):
        return gr.update(choices=self.finished_jobs(self.access.user(request)))

    def from_past_job(self, job_id, request: gr.Request = None):
        """Past jobs' "After the video": the selected job's final video becomes the panel's source (the job chosen,
        an upload cleared), the panel opened. Only a finished job the user may see (the same door as Run's)."""
        user = self.access.user(request)
        try:
            if not job_id:
                raise InputError("job", "select a finished job in Past jobs first")
            _, name = source_of(job_id, None, self.ctx.outputs, self.access, user)
        except InputError as e:
            raise gr.Error(str(e), title="After the video", print_exception=False) from None
        choices = self.finished_jobs(user)
        if name not in choices:                   # older than the list's newest jobs: still the one chosen
            choices.insert(0, name)
        return (gr.update(choices=choices, value=name), None, gr.update(open=True),
                f"Job **{name}**'s video is chosen: pick the steps and press Run.")

    def run_post(self, job_id, upload, interp, fps, upscale, upscaler, trim_start, trim_end, speed, loop, pingpong,
            reverse, export, frame, faces=0, face_model=None, request: gr.Request = None):
        user = self.access.user(request)
        session = (getattr(request, "session_hash", None) or "direct") + SESSION_SUFFIX
        try:
            steps = steps_of(interp, fps, upscale, upscaler, trim_start, trim_end, speed, loop, pingpong, reverse,
                             faces, face_model)
            post = post_request({"job_id": job_id, "video": upload, "steps": steps, "export": export,
                                 "frame": frame}, self.ctx.outputs, self.access, user)
            job = self.sessions.submit(post, session=session, owner=user, origin="page",    # the one pre-flight
                                       client=self.access.client(request))
        except InputError as e:
            yield f"⚠ {e}", None, None, None
            return
        except Busy as e:
            yield f"⚠ {e}", None, None, None
            return
        preview = None
        for batch in self.sessions.stream(job, tick_s=1.0):
            for event in batch:
                if isinstance(event, Waiting):
                    yield waiting_text(event), preview, None, None
                elif isinstance(event, Progress):
                    yield progress_line(event), preview, None, None
                elif isinstance(event, Preview):
                    preview = event.image
                    yield gr.update(), preview, None, None
                elif isinstance(event, Done):
                    yield self.finished(event, preview)
                elif isinstance(event, Failed):
                    yield f"⚠ Failed: {event.message}", preview, None, None
                elif isinstance(event, Cancelled):
                    yield "Cancelled before it started.", preview, None, None

    def finished(self, done: Done, preview):
        if done.stopped or done.video is None:
            return (f"■ Stopped (job {done.job_dir.name if done.job_dir else '?'}): Resume in Past jobs continues "
                    f"it", preview, None, None)
        export = (load_job(done.job_dir).get("post") or {}).get("export")
        download = done.job_dir / export if export else done.video
        return (f"✓ Done: {done.frames} frames, job {done.job_dir.name}", preview, published(done.video),
                published(download))

    def stop_post(self, request: gr.Request = None):
        session = (getattr(request, "session_hash", None) or "direct") + SESSION_SUFFIX
        return self.sessions.cancel(session)

    def frame_as_start(self, download):
        try:
            path = st.client_file(download, "image")
        except InputError:
            path = None
        if not path or not str(path).lower().endswith(".png"):
            gr.Warning("Export one frame (Export: one frame) first; then it can start a new job.")
            return gr.update()
        return path


def register_post_api(sessions: Sessions, access: Access, *, concurrency_id: str = "gpu",
                      concurrency_limit: int = 1) -> None:
    """/post for scripts: `client.predict(job_id=..., video=handle_file(...), steps="interpolate=2 upscale=2",
    export="gif", frame=-1, api_name="/post")` -> (the export or final.mp4, a summary). Checked by the one
    pre-flight; bad input raises an AppError naming the field."""
    with gr.Group(visible=False):
        trigger = gr.Button(visible=False)
        fields = [gr.Textbox(label="job_id", visible=False), gr.File(label="video", visible=False),
                  gr.Textbox(label="steps", visible=False), gr.Textbox(label="export", visible=False),
                  gr.Number(label="frame", visible=False)]
        result = gr.File(label="result", visible=False)
        summary = gr.JSON(label="summary", visible=False)

    def post(job_id=None, video=None, steps="", export="mp4", frame=-1, request: gr.Request = None,
             progress=gr.Progress()):
        """After the video: a post-processing job on a finished job's video (job_id) or an uploaded video.

        Args:
            job_id: a finished job's id (its folder under outputs/), or empty with a video
            video: an uploaded video (gradio_client.handle_file), or None with a job_id
            steps: space-separated steps, e.g. "trim=0:3 loop=2 interpolate=2 faces=0.7 upscale=2" (README: After
                the video)
            export: mp4, h265, webm, gif, zip or frame
            frame: with export "frame": which frame (-1: the last)
        """
        user = access.user(request)
        try:
            job = sessions.submit(post_request({"job_id": job_id, "video": video, "steps": steps or "",
                                              "export": export or "mp4", "frame": int(frame if frame is not None
                                                                                      else -1)},
                                             sessions.runner.outputs, access, user),
                                session=getattr(request, "session_hash", None), owner=user, origin="api",
                                client=access.client(request))
        except (InputError, Busy) as e:
            raise gr.Error(str(e), title="Please check the input", print_exception=False) from None
        result = None
        for batch in sessions.stream(job):
            for event in batch:
                if isinstance(event, Progress):
                    progress(event.fraction, desc=progress_line(event))
                elif isinstance(event, (Done, Failed, Cancelled)):
                    result = event
        if isinstance(result, Failed):
            raise gr.Error(result.message, title="The job failed", print_exception=False)
        if not isinstance(result, Done):
            raise gr.Error("The job was cancelled before it started.", print_exception=False)
        if result.video is None:
            return None, {"job_id": result.job_dir.name, "status": "stopped", "frames": 0}
        export_name = (load_job(result.job_dir).get("post") or {}).get("export")
        out = result.job_dir / export_name if export_name else result.video
        return published(out), {"job_id": result.job_dir.name, "status": "done", "frames": result.frames,
                                "file": f"{result.job_dir.name}/{out.name}"}

    trigger.click(post, fields, [result, summary], api_name="post", preprocess=False, show_progress="hidden",
                  concurrency_id=concurrency_id, concurrency_limit=concurrency_limit)
