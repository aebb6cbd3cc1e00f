"""The queue's actions (add, add one job per image, import/export JSON lines, list, move, edit, remove), shared by
the page's queue panel (ui/panel_queue.py) and the API endpoints registered here (/queue_add, /queue_add_images,
/queue_import, /queue_export, /queue_list, /queue_move, /queue_edit, /queue_remove). The README's section "The
queue" shows them in use; tests/test_queue_api.py runs its example against the app."""
from __future__ import annotations

import json
import logging
import math
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping

import gradio as gr

from common.errors import InputError
from common.files import unlink_if_possible
from configs.controls import CONTROLS as TABLE
from configs.generation import LIMITS
from jobs import jsonl
from jobs import store as qs
from jobs.doors import Door
from jobs.doors import admitted as admit
from jobs.runner import Runner, client_of
from pipeline import keyframes
from pipeline.images import header_pixels
from pipeline.request import Request, canonical
from ui import doors
from ui import settings as st
from ui.access import Access
from ui.api import VIDEO_DOC, video_endpoint
from ui.sessions import stop_in_words

log = logging.getLogger(__name__)

EXPORT_KEEP_S = 3600            # exported files are deleted after this
IMAGES_MAX = 32                 # images (jobs) one "one job per image" request may add
IMPORT_BYTES_MAX = 1 << 20      # a jobs file sent to the app: its size and lines at most (read before parsing)
IMPORT_LINES_MAX = 500
LIST_PAGE = 100                 # entries one /queue_list answer holds at most (offset: the next ones)
# the images one adding call may check, in pixels (their headers summed before any is decoded): two of the largest
# one job may have (a start and an end image of 8192×8192). Decoding and checking is ~25 Mpixels/s on one loaded
# core, so no call holds a slot of the adding group (2 at once) for more than a few seconds
REQUEST_PIXELS_MAX = 2 * LIMITS.image_pixels_max
QUEUE_ENDPOINTS = ("queue_add", "queue_add_images", "queue_list", "queue_move", "queue_edit", "queue_remove",
                   "queue_import", "queue_export")


class QueueActions:
    """What the page and the API do to the queue, for a user (ui/access.py: with several users each sees and
    changes only their own entries). Jobs are added through the one runner (jobs/runner.py), checked whole by its
    pre-flight when they are added. Each raises InputError naming the field when refused."""

    def __init__(self, runner: Runner, access: Access = Access()):
        self.runner, self.store = runner, runner.store
        self.access = access

    def door(self, user: str | None) -> Door:
        """The page's and the API's door for `user` (ui/doors.py: uploads, the user's jobs by id, LoRA names)."""
        return doors.client(self.access, user, self.store.outputs, doors.lora_folder(self.runner))


    def _own(self, entry_id, user: str | None, *, waiting: bool = False) -> qs.Entry:
        """The entry, if the user may see it (another user's is "not there", like a missing one)."""
        entry = self.store.get(entry_id) if isinstance(entry_id, str) else None
        if entry is None or not self.access.sees(user, entry.owner):
            raise qs.missing(entry_id)
        return self.store.require(entry.id, waiting=waiting)

    def visible(self, user: str | None, statuses=None) -> list[qs.Entry]:
        return [e for e in self.store.entries(statuses) if self.access.sees(user, e.owner)]

    def _room(self, user: str | None, client: str | None, adding: int) -> None:
        """Refuse (InputError "queue") before any work when `adding` jobs of the client would pass the queue's caps
        (`client`: who adds them, ui/access.py Access.client; else the user's login)."""
        caps = getattr(self.runner, "caps", None)
        if caps is not None:
            caps.check(self.store, client_of(user, client), adding)

    def _queued(self, jobs) -> list[qs.Entry]:
        """The entries of jobs just queued (one another client removed meanwhile is left out)."""
        return [e for e in (self.store.get(job.entry) for job in jobs) if e is not None]

    def page_values(self, values: Mapping[str, Any], user: str | None = None) -> dict:
        """Settings and uploaded files by name from a client's control values (by name; aliases too), admitted by
        the client's door (ui/doors.py: aliases resolved, files uploads only, a job to extend looked up by its id,
        LoRAs by name). Every handler of the queue that takes a client's job values calls it, once."""
        request = st.request_from_values(values, door=self.door(user))
        return {**request.settings(), "image": request.image, "end_image": request.end_image,
                "input_video": request.input_video}

    def add(self, values: Mapping[str, Any], user: str | None = None, client: str | None = None) -> qs.Entry:
        """Add a job: a client's `values` by control name (settings and uploads). `client` (here and below): who
        adds it (ui/access.py Access.client), recorded in the entry and counted by the queue's caps."""
        request = Request.from_mapping(self.page_values(values, user))
        (entry,) = self._queued(self.runner.submit_many([request], owner=user, client=client))
        return entry

    def add_images(self, images: list, values: Mapping[str, Any], user: str | None = None,
                   client: str | None = None) -> list[qs.Entry]:
        if not isinstance(values, Mapping):
            raise InputError("settings", "give the jobs' settings as a JSON object, e.g. {\"prompt\": \"waves\"}")
        if not isinstance(images, (list, tuple)):
            images = [images] if images else []
        if len(images) > IMAGES_MAX:
            raise InputError("images", f"{len(images)} images; at most {IMAGES_MAX} at once (one job each)")
        self._room(user, client, len(images))
        paths = [st.client_file(i, "images") for i in images]
        if not paths or not all(paths):
            raise InputError("images", "upload one or more images: one job is added per image")
        values = canonical(values)
        if values.get("image") not in (None, ""):
            raise InputError("image", "one job is added per image of 'images'; leave the start image out of the "
                                      "settings")
        page = {k: v for k, v in self.page_values(values, user).items() if k != "image"}
        within_budget("images", paths + images_of(page) * len(paths))
        requests = [Request.from_mapping({**page, "image": p}) for p in paths]
        return self._queued(self.runner.submit_many(requests, owner=user, client=client))

    def import_jsonl(self, upload, user: str | None = None, client: str | None = None) -> list[qs.Entry]:
        path = st.client_file(upload, "jobs file")
        if path is None:
            raise InputError("jobs file", "upload a .jsonl file: one job's settings (a JSON object) a line")
        size = Path(path).stat().st_size
        if size > IMPORT_BYTES_MAX:
            raise InputError("jobs file", f"{size / 2**20:.1f} MB; a jobs file sent to the app may have at most "
                                          f"{IMPORT_BYTES_MAX >> 20} MB (use `python -m cli queue add` for more)")
        try:
            text = Path(path).read_text("utf-8")
        except (OSError, ValueError):                         # unreadable, not UTF-8
            raise InputError("jobs file", "cannot read it as text; save it as UTF-8 text") from None
        lines = len(text.splitlines())                      # (a last line's newline ends it, starts none)
        if lines > IMPORT_LINES_MAX:
            raise InputError("jobs file", f"{lines} lines; a jobs file sent to the app may have at most "
                                          f"{IMPORT_LINES_MAX} (use `python -m cli queue add` for more)")
        jobs = jsonl.read_lines(text, door=doors.queue_copies(self.store, self.access, user))
        self._room(user, client, len(jobs))                 # (before any line's images are read)
        within_budget("jobs file", [p for _, v in jobs for p in [v.get("image"), *images_of(v)]])
        prepared = jsonl.prepare_lines(jobs, self.runner.preflight)
        return self._queued(self.runner.submit_many(prepared, owner=user, checked=True, client=client))

    def export_path(self, user: str | None = None) -> str:
        """The user's waiting jobs as a JSON-lines file in a temporary folder (Gradio sends a copy; files older than
        EXPORT_KEEP_S are deleted at the next export)."""
        folder = Path(tempfile.gettempdir()) / "steadyframe-queue-exports"
        folder.mkdir(exist_ok=True)
        for old in folder.glob("queue-*.jsonl"):
            try:
                stale = time.time() - old.stat().st_mtime > EXPORT_KEEP_S
            except OSError:                      # deleted meanwhile by another app's export
                continue
            if stale:
                unlink_if_possible(old)          # Windows: one still being sent stays until the next export
        lines = [json.dumps(exported(e, self.store.images_root), ensure_ascii=False) + "\n"
                 for e in self.visible(user, (qs.WAITING, qs.RUNNING))]
        with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=folder, prefix="queue-", suffix=".jsonl",
                                         delete=False) as f:
            f.write("".join(lines))
        return f.name

    def edit(self, entry_id, values: Mapping[str, Any], user: str | None = None, from_page: bool = False) \
            -> qs.Entry:
        """Change a waiting job: `values` are merged over its settings (so {"seconds": 4} changes only that); the
        whole job is checked again by the pre-flight. The values pass the door of a change (ui/doors.py `no_files`:
        /queue_edit names no file), or, `from_page` (the page's Save: all the controls' values), the client's door
        (`page_values`: the video to extend may be replaced by an upload; the job keeps its images)."""
        if not isinstance(values, Mapping):
            raise InputError("settings", "give the settings to change as a JSON object, e.g. {\"seconds\": 4}")
        if from_page:
            values = {k: v for k, v in self.page_values(values, user).items() if k not in ("image", "end_image")}
        else:
            values = admit(values, doors.no_files())
        entry = self._own(entry_id, user, waiting=True)
        merged = {**entry.values(), **{k: v for k, v in values.items() if v is not None or k == "end_image"}}
        return self.runner.edit(entry.id, Request.from_mapping(merged))

    def move(self, entry_id, index, user: str | None = None) -> list[qs.Entry]:
        if isinstance(index, bool) or not isinstance(index, (int, float)) or not math.isfinite(index) \
                or index != int(index):
            raise InputError("position", "give a whole number: 0 is first among the waiting jobs")
        self.store.move(self._own(entry_id, user, waiting=True).id, int(index))
        return self.visible(user)

    def step(self, entry_id, by: int, user: str | None = None) -> list[qs.Entry]:
        """Move a waiting job up (-1) or down (+1) among the waiting jobs."""
        entry = self._own(entry_id, user, waiting=True)
        waiting = [e.id for e in self.store.entries([qs.WAITING])]
        self.store.move(entry.id, max(waiting.index(entry.id) + by, 0))
        return self.visible(user)

    def remove(self, entry_id, user: str | None = None) -> str:
        return stop_in_words(self.runner, self._own(entry_id, user).id)

    def listing(self, user: str | None = None, offset=0, limit=LIST_PAGE) -> list[dict]:
        """The user's entries in line order, `limit` (at most LIST_PAGE) from `offset`."""
        offset = int(offset) if isinstance(offset, (int, float)) and math.isfinite(offset) and offset > 0 else 0
        limit = int(limit) if isinstance(limit, (int, float)) and math.isfinite(limit) and limit > 0 else LIST_PAGE
        return [shown(e) for e in self.visible(user)[offset:offset + min(limit, LIST_PAGE)]]

    def clear_finished(self, user: str | None = None) -> int:
        """Take the finished, stopped and failed jobs the user may see out of the list (their job folders stay in
        Past jobs); returns how many."""
        return self.store.clear_finished(lambda owner: self.access.sees(user, owner))


def images_of(values: Mapping[str, Any]) -> list:
    """The images a job's values name besides its start image: the end image and the keyframes' images (each is
    decoded when the job is checked)."""
    text = values.get("keyframes")
    try:
        frames = keyframes.parse(text) if isinstance(text, str) and text.strip() else ()
    except InputError:                                      # (the job's own check says why)
        frames = ()
    return [values.get("end_image"), *(k.image for k in frames)]


def within_budget(field: str, paths) -> None:
    """Refuse (InputError `field`) before any is decoded when the images one call would check have more than
    REQUEST_PIXELS_MAX pixels in all (their headers: pipeline/images.py header_pixels)."""
    given = [str(p) for p in paths if isinstance(p, (str, Path)) and str(p)]
    pixels = {p: header_pixels(p) for p in set(given)}     # (each header read once; each use is checked)
    total = sum(pixels[p] for p in given)
    if total > REQUEST_PIXELS_MAX:
        raise InputError(field, f"{total / 1e6:.0f} megapixels of images in one call; one call may check at most "
                                f"{REQUEST_PIXELS_MAX / 1e6:.0f} (e.g. 32 images of 4 megapixels); add the others "
                                f"in another call")


def exported(entry: qs.Entry, images_root: Path) -> dict:
    """An entry as a line of a client's export (/queue_export, the panel's Export), what /queue_import takes back
    (ui/doors.py queue_copies), never a server path: the queue's copies of its files by their names in the queue
    (<entry id>/start.png), a job it extends by its id (source_job), a post job's videos by their file names;
    keyframes as the client gave them (its uploads). The command line's `queue export` writes paths instead: its
    user is on this computer."""
    out: dict[str, Any] = {}
    extends = None
    root = Path(images_root)
    for name, value in entry.values().items():
        if value is None:
            continue
        if name in jsonl.FILE_NAMES and isinstance(value, str) and value:
            path = Path(value)
            if path.is_relative_to(root):
                out[name] = path.relative_to(root).as_posix()
            elif name == "input_video" and path.parent == root.parent.parent:    # a job folder of the outputs
                extends = path.name
            else:
                out[name] = path.name
        elif name == "sources" and isinstance(value, list):
            out[name] = [Path(str(s)).name for s in value]
        else:
            out[name] = value
    if extends is not None:
        out["source_job"] = extends
    return out


def shown(entry: qs.Entry) -> dict:
    """An entry as the API answers a client: its files by name (a job extended: the job's id), never the server's
    paths (the queue's folder, the outputs folder, the upload folder)."""
    out = entry.summary()
    for name in jsonl.FILE_NAMES:
        if isinstance(out.get(name), str) and out[name]:
            out[name] = Path(out[name]).name
    if isinstance(out.get("sources"), list):                # a post job's videos (post/steps.py)
        out["sources"] = [Path(str(s)).name for s in out["sources"]]
    text = out.get("keyframes")
    if isinstance(text, str) and text.strip():
        try:
            items = keyframes.parse(text)
        except InputError:
            items = ()
        out["keyframes"] = keyframes.with_images(items, [Path(k.image).name for k in items]) if items else text
    return out


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
        # adding checks the jobs' images and files (seconds for large ones): a group of its own, so that it never
        # holds the list, moves, edits and removes of everyone else
        adding = dict(show_progress="hidden", concurrency_limit=2, concurrency_id="queue-add")
        offset = gr.Number(0, label="offset", precision=0, visible=False)
        limit = gr.Number(LIST_PAGE, label="limit", precision=0, visible=False)
        add = video_endpoint(self.add, table)            # /video's parameters
        add.__name__ = add.__qualname__ = "queue_add"
        add.__doc__ = add.__doc__.replace(VIDEO_DOC, "Add a job to the queue on disk (it runs when the GPU is free); "
                                                     "returns the queued job.")
        trigger.click(add, controls, result, api_name="queue_add", preprocess=False, **adding)
        trigger.click(self.add_images, [images, settings], result, api_name="queue_add_images", preprocess=False,
                      **adding)
        trigger.click(self.listing, [offset, limit], result, api_name="queue_list", **quick)
        trigger.click(self.move, [job, position], result, api_name="queue_move", **quick)
        trigger.click(self.edit, [job, settings], result, api_name="queue_edit", **adding)   # (its checks)
        trigger.click(self.remove, job, result, api_name="queue_remove", **quick)
        trigger.click(self.import_jsonl, jobs_file, result, api_name="queue_import", preprocess=False, **adding)
        trigger.click(self.export_path, None, export, api_name="queue_export", **quick)

    def _user(self, request) -> str | None:
        return self.actions.access.user(request)

    def _client(self, request) -> str | None:
        return self.actions.access.client(request)

    def add(self, values: dict, request: gr.Request = None, progress=None) -> dict:
        """Add a job (the /video parameters) to the queue on disk; returns the queued job."""
        user, client = self._user(request), self._client(request)
        return shown(self._call(lambda: self.actions.add(values, user, client)))

    def add_images(self, images, settings, request: gr.Request) -> list[dict]:
        """Add one job per image (at most 32), each with `settings` (a JSON object of /video parameters)."""
        if settings is not None and not isinstance(settings, dict):
            raise gr.Error("settings: give a JSON object of /video parameters, e.g. {\"prompt\": \"waves\"}",
                           title="Please check the input", print_exception=False)
        user, client = self._user(request), self._client(request)

        def add():
            return self.actions.add_images(images, settings or {}, user, client)

        return [shown(e) for e in self._call(add)]

    def listing(self, offset, limit, request: gr.Request) -> list[dict]:
        """The queue: your jobs (every job without logins), in line order, at most 100 a call.

        Args:
            offset: how many to skip (0: from the first; 100: the next page)
            limit: how many at most (up to 100)
        """
        return self.actions.listing(self._user(request), offset, limit)

    def move(self, job, position, request: gr.Request) -> list[dict]:
        """Put a waiting job at `position` among the waiting jobs (0: first); returns the queue."""
        return [shown(e) for e in self._call(self.actions.move, job, position, self._user(request))]

    def edit(self, job, settings, request: gr.Request) -> dict:
        """Change a waiting job's settings (a JSON object of the settings to change; its images stay: to use other
        images, remove the job and add it again)."""
        return shown(self._call(self.actions.edit, job, settings, self._user(request)))

    def remove(self, job, request: gr.Request) -> dict:
        """End for a queued job: a waiting one is removed at once, a running one stops at its next step."""
        return {"message": self._call(self.actions.remove, job, self._user(request))}

    def import_jsonl(self, jobs_file, request: gr.Request) -> list[dict]:
        """Add the jobs of a JSON-lines file (one job's settings a line; at most 500 lines and 1 MB), all checked
        before any is added."""
        return [shown(e) for e in self._call(self.actions.import_jsonl, jobs_file, self._user(request),
                                             self._client(request))]

    def export_path(self, request: gr.Request) -> str:
        """Your waiting jobs as a JSON-lines file (what /queue_import reads)."""
        return self.actions.export_path(self._user(request))
