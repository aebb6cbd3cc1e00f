"""The queue's actions (add, add one job per image, import/export JSON lines, list, move, edit, remove), shared by
the page's queue panel (ui/panel_queue.py) and the API endpoints registered here. The section below is the
README's text.

## The queue

Jobs added to the queue wait on disk (`outputs/.queue/queue.db`, SQLite, with copies of their images in
`outputs/.queue/images/`) and run one after another whenever the GPU is free: a restart of the app (or a crash, or a
power cut) shows them again and continues them, the interrupted one from its last finished section.

Jobs started with *Start*, *Resume*, `/video` or `/resume` are in this queue too while they wait or run (status
"in line", then "running"): they run in click order, stream into their page as always (previews, End) and leave the
queue when they end. If the app stops first, the next start shows them as waiting jobs and runs them from the queue,
the running one continued from its last finished section (its video then lands in the Past jobs gallery; the page
that started it is gone). End on such a job while it waits (the page's End, `/stop`, or *Remove / End* here) takes it
out at once: it never runs. A job with a video to extend keeps its own copy of the video in the queue (checked by its
sha256 before it runs); a finished job to extend is named by its id (`source_job`) and read where it is.

In the page: the **Queue** panel lists the jobs with their status and progress. *Add to queue* adds the settings
above as a job; *Add one job per image* adds one job for each uploaded image with the prompt and settings above;
*Import JSON lines* adds the jobs of a `.jsonl` file (one job's settings a line, as `python -m pipeline batch`
reads; a file sent to the app may name only images in the outputs folder, as an exported queue does); *Export*
saves the waiting jobs as such a file. Click a job's row to pick it, then move it up or down, remove it (End on a
waiting job: it goes at once; on the running one: it stops at its next step, keeping its video), load its
settings into the controls, or save the settings above into it (its images stay).

From a script (`gradio_client`):

```python
from gradio_client import Client, handle_file

client = Client("http://127.0.0.1:7860/")
entry = client.predict(image=handle_file("start.png"), prompt="a cat walks", seconds=3,
                       api_name="/queue_add")           # the /video parameters; returns the queued job
client.predict([handle_file("a.png"), handle_file("b.png")], {"prompt": "waves", "seconds": 2},
               api_name="/queue_add_images")           # one job per image
jobs = client.predict(api_name="/queue_list")          # [{"id", "status", "progress", "message", "job_id", …}]
client.predict(jobs[-1]["id"], 0, api_name="/queue_move")      # first among the waiting jobs
client.predict(jobs[0]["id"], {"seconds": 4}, api_name="/queue_edit")
client.predict(jobs[0]["id"], api_name="/queue_remove")        # a waiting job goes at once; a running one stops
client.predict(input_video=handle_file("clip.mp4"), mode="f1", prompt="the sea", seconds=2,
               api_name="/queue_add")                  # an extension, queued with its own copy of clip.mp4
client.predict(handle_file("jobs.jsonl"), api_name="/queue_import")
path = client.predict(api_name="/queue_export")                # a .jsonl file of the waiting jobs
```

From the command line, with or without the app running (it picks the jobs up within a second):
`python -m pipeline queue add jobs.jsonl --outputs outputs`, `python -m pipeline queue list --outputs outputs`,
`python -m pipeline queue export waiting.jsonl`, `python -m pipeline queue remove <id>`,
`python -m pipeline queue move <id> 0`.
"""
from __future__ import annotations

import logging
import math
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping

import gradio as gr

from configs.controls import CONTROLS as TABLE
from pipeline import queue_store as qs
from pipeline.errors import InputError
from ui import settings as st

log = logging.getLogger(__name__)

EXPORT_KEEP_S = 3600            # exported files are deleted after this
QUEUE_ENDPOINTS = ("queue_add", "queue_add_images", "queue_list", "queue_move", "queue_edit", "queue_remove",
                   "queue_import", "queue_export")


class QueueActions:
    """What the page and the API do to the queue. Each raises InputError naming the field when refused."""

    def __init__(self, store: qs.QueueStore, worker, default_resolution: int):
        self.store, self.worker = store, worker
        self.default_resolution = default_resolution

    def _checked(self, values: Mapping[str, Any], base: Path | None = None) -> dict:
        from ui.source_job import resolved_values

        return qs.checked_values(resolved_values(values, self.store.outputs), self.default_resolution, base=base)

    def _added(self, entries):
        self.worker.wake()
        return entries

    @staticmethod
    def page_values(values: Mapping[str, Any]) -> dict:
        """Settings and image paths by name from the page's control values (uploads as Gradio hands them over)."""
        request = st.request_from_values(values)
        return {**request.settings(), "image": request.image, "end_image": request.end_image,
                "input_video": request.input_video}

    def add(self, values: Mapping[str, Any]) -> qs.Entry:
        """Add a job: `values` by control name (settings and image paths)."""
        return self._added(self.store.add(self._checked(values)))

    def add_images(self, images: list, values: Mapping[str, Any]) -> list[qs.Entry]:
        if not isinstance(values, Mapping):
            raise InputError("settings", "give the jobs' settings as a JSON object, e.g. {\"prompt\": \"waves\"}")
        if not isinstance(images, (list, tuple)):
            images = [images] if images else []
        paths = [st.upload_path(i) for i in images]
        if not paths or not all(isinstance(p, str) and p for p in paths):
            raise InputError("images", "upload one or more images: one job is added per image")
        checked = [self._checked({**values, "image": p}) for p in paths]
        return self._added(self.store.add_many(checked))

    def import_jsonl(self, path) -> list[qs.Entry]:
        path = st.upload_path(path)
        if not path or not isinstance(path, str):
            raise InputError("jobs file", "upload a .jsonl file: one job's settings (a JSON object) a line")
        try:
            text = Path(path).read_text("utf-8")
        except (OSError, ValueError) as e:                    # unreadable, not UTF-8, a NUL in the name
            raise InputError("jobs file", f"cannot read it ({type(e).__name__}); save it as UTF-8 text") from None
        jobs = qs.read_jsonl(text, self.default_resolution, Path(path).parent, images_under=self.store.outputs)
        return self._added(self.store.add_many(jobs))

    def export_path(self) -> str:
        """The waiting jobs as a JSON-lines file in a temporary folder (Gradio sends a copy; files older than
        EXPORT_KEEP_S are deleted at the next export)."""
        folder = Path(tempfile.gettempdir()) / "steadyframe-queue-exports"
        folder.mkdir(exist_ok=True)
        for old in folder.glob("queue-*.jsonl"):
            if time.time() - old.stat().st_mtime > EXPORT_KEEP_S:
                old.unlink(missing_ok=True)
        with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=folder, prefix="queue-", suffix=".jsonl",
                                         delete=False) as f:
            f.write(self.store.export_jsonl())
        return f.name

    def edit(self, entry_id, values: Mapping[str, Any]) -> qs.Entry:
        """Change a waiting job: `values` are merged over its settings (so {"seconds": 4} changes only that)."""
        entry = self.store.require(entry_id, waiting=True)
        if not isinstance(values, Mapping):
            raise InputError("settings", "give the settings to change as a JSON object, e.g. {\"seconds\": 4}")
        merged = {**entry.values(), **{k: v for k, v in values.items() if v is not None or k == "end_image"}}
        return self.store.edit(entry.id, self._checked(merged))

    def move(self, entry_id, index) -> list[qs.Entry]:
        if isinstance(index, bool) or not isinstance(index, (int, float)) or not math.isfinite(index) \
                or index != int(index):
            raise InputError("position", "give a whole number: 0 is first among the waiting jobs")
        return self.store.move(entry_id, int(index))

    def step(self, entry_id, by: int) -> list[qs.Entry]:
        """Move a waiting job up (-1) or down (+1) among the waiting jobs."""
        entry = self.store.require(entry_id, waiting=True)
        waiting = [e.id for e in self.store.entries([qs.WAITING])]
        return self.store.move(entry.id, max(waiting.index(entry.id) + by, 0))

    def remove(self, entry_id) -> str:
        return self.worker.stop(entry_id)

    def listing(self) -> list[dict]:
        return [e.summary() for e in self.store.entries()]


class QueueApi:
    """The /queue_* endpoints (call `register` inside the gr.Blocks being built)."""

    def __init__(self, actions: QueueActions):
        self.actions = actions

    @staticmethod
    def _call(fn, *args):
        try:
            return fn(*args)
        except InputError as e:
            raise gr.Error(str(e), title="Please check the input", print_exception=False) from None

    def register(self, controls: list, table=TABLE) -> None:
        from ui.api import VIDEO_DOC, video_endpoint

        with gr.Group(visible=False):
            trigger = gr.Button(visible=False)
            job = gr.Textbox(label="job", visible=False)
            position = gr.Number(label="position", precision=0, visible=False)
            settings = gr.JSON(label="settings", visible=False)
            images = gr.File(label="images", file_count="multiple", visible=False)
            jobs_file = gr.File(label="jobs_file", visible=False)
            result = gr.JSON(label="result", visible=False)
            export = gr.File(label="queue", visible=False)
        quick = dict(show_progress="hidden", concurrency_limit=2, concurrency_id="queue")
        a = self.actions
        add = video_endpoint(self.add, table)            # /video's parameters
        add.__name__ = add.__qualname__ = "queue_add"
        add.__doc__ = add.__doc__.replace(VIDEO_DOC, "Add a job to the queue on disk (it runs when the GPU is free); "
                                                     "returns the queued job.")
        trigger.click(add, controls, result, api_name="queue_add", preprocess=False, **quick)
        trigger.click(self.add_images, [images, settings], result, api_name="queue_add_images", preprocess=False,
                      **quick)
        trigger.click(a.listing, None, result, api_name="queue_list", **quick)
        trigger.click(self.move, [job, position], result, api_name="queue_move", **quick)
        trigger.click(self.edit, [job, settings], result, api_name="queue_edit", **quick)
        trigger.click(self.remove, job, result, api_name="queue_remove", **quick)
        trigger.click(self.import_jsonl, jobs_file, result, api_name="queue_import", preprocess=False, **quick)
        trigger.click(a.export_path, None, export, api_name="queue_export", **quick)

    def add(self, values: dict, request=None, progress=None) -> dict:
        """Add a job (the /video parameters) to the queue on disk; returns the queued job."""
        return self._call(self.actions.add, self.actions.page_values(values)).summary()

    def add_images(self, images, settings) -> list[dict]:
        """Add one job per image, each with `settings` (a JSON object of /video parameters)."""
        if settings is not None and not isinstance(settings, dict):
            raise gr.Error("settings: give a JSON object of /video parameters, e.g. {\"prompt\": \"waves\"}",
                           title="Please check the input", print_exception=False)
        return [e.summary() for e in self._call(self.actions.add_images, images, settings or {})]

    def move(self, job, position) -> list[dict]:
        """Put a waiting job at `position` among the waiting jobs (0: first); returns the queue."""
        return [e.summary() for e in self._call(self.actions.move, job, position)]

    def edit(self, job, settings) -> dict:
        """Change a waiting job's settings (a JSON object of the settings to change; images: paths under the
        outputs folder only)."""
        name = qs.outside(settings, self.actions.store.outputs) if isinstance(settings, dict) else None
        if name is not None:
            raise gr.Error(f"{name}: only an image in the outputs folder can be named here; add a job with "
                           "/queue_add to use another image", title="Please check the input", print_exception=False)
        return self._call(self.actions.edit, job, settings).summary()

    def remove(self, job) -> dict:
        """End for a queued job: a waiting one is removed at once, a running one stops at its next step."""
        return {"message": self._call(self.actions.remove, job)}

    def import_jsonl(self, jobs_file) -> list[dict]:
        """Add the jobs of a JSON-lines file (one job's settings a line), all checked before any is added."""
        return [e.summary() for e in self._call(self.actions.import_jsonl, jobs_file)]
