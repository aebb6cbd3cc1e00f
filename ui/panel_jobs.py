"""Past jobs: the gallery of job folders (a frame of each video, status, length, time), the selected job's video
and details, "Reuse settings" (the settings and the images as the user uploaded them) and the Resume button's
state. The page holds job ids, never paths: each is looked up among the jobs the user may see (ui/access.py), and
what is shown of a job folder is a servable copy (ui/media.py)."""
from __future__ import annotations

import io
import logging
import re
import shutil
import threading
from collections import OrderedDict
from pathlib import Path

import gradio as gr
from PIL import Image

from common.errors import InputError
from jobfolder.folder import PARTIAL_SUFFIX, atomic_write_bytes
from jobs import studio
from jobs.doors import admitted
from pipeline import keyframes
from ui import jobs_gallery, messages
from ui import settings as st
from ui.context import AppContext
from ui.media import published

log = logging.getLogger(__name__)

# Controls an imported FramePack-Studio job leaves as they are: this machine's, not the job's.
STUDIO_KEEPS = ("preserved_gb", "compile", "crf")


def _markdown_text(text: str) -> str:
    """`text` shown as it is in Markdown (an imported file's keys and prompt: no links, images or markup)."""
    return re.sub(r"([\\`*_{}\[\]()<>#+!|~])", r"\\\1", text)


FILTERS_KEPT = 256          # sessions whose Past jobs filter is remembered (the oldest is forgotten first)


def reused_keyframes(entry, text: str) -> str:
    """A job's keyframes for Reuse settings: the times and strengths of its setting, the images the job folder kept
    (servable copies: the uploads they were may be gone). Empty when the folder has none."""
    kept = entry.info.get("keyframes")
    if not isinstance(kept, list) or not kept or not text:
        return text if not kept else ""
    try:
        items = keyframes.parse(text)
    except InputError:
        return ""
    files = [published(entry.dir / str(k.get("file", ""))) if isinstance(k, dict) else None for k in kept]
    if len(files) != len(items) or not all(files):
        return ""
    return keyframes.with_images(items, files)


def scroll_to(selector: str) -> str:
    """Browser code that brings `selector` into view (the page's own script, no handler)."""
    return f"() => {{ document.querySelector({selector!r})?.scrollIntoView({{behavior: 'smooth', block: 'center'}}); }}"


def reasoned_buttons(entry) -> tuple:
    """Resume and Extend for a selected job: on, or greyed out with the reason on the button (issue 44 item 6: a
    finished original-mode job's Extend was greyed out with no word of why)."""
    if entry.resumable:
        resume = gr.update(interactive=True, value="Resume")
    elif entry.status == "done":
        resume = gr.update(interactive=False, value="Resume: it is done")
    else:
        resume = gr.update(interactive=False, value="Resume: no finished section to go on from")
    if entry.settings.get("mode") == "f1":
        extend = gr.update(interactive=True, value="Extend")
    else:
        extend = gr.update(interactive=False, value="Extend: F1-mode jobs only (Reuse, switch to F1)")
    return resume, extend


def post_button(entry) -> dict:
    """"After the video" for a selected job: on for a finished job with its video, else greyed out saying why."""
    if entry is not None and entry.status == "done" and entry.video is not None:
        return gr.update(interactive=True, value="After the video")
    return gr.update(interactive=False, value="After the video: finished jobs only")


class JobsPanel:
    def __init__(self, ctx: AppContext):
        self.ctx, self.ui = ctx, ctx.ui
        self._words: OrderedDict[str, str] = OrderedDict()       # session -> its Past jobs filter
        self._lock = threading.Lock()

    @property
    def detail_outputs(self) -> list:
        ui = self.ui
        extra = [ui.post_job] if getattr(ui, "post_job", None) is not None else []
        return [ui.selected_job, ui.job_video, ui.job_details, ui.reuse, ui.resume, ui.extend, *extra]

    def refresh(self, request: gr.Request = None):
        """The gallery (the session's filter applied, whoever refreshes it: a finished job, Delete, Refresh)."""
        user = self.ctx.access.user(request)
        with self._lock:
            words = self._words.get(getattr(request, "session_hash", None) or "", "")
        entries = jobs_gallery.shown_entries(jobs_gallery.list_jobs(
            self.ctx.outputs, sees=lambda owner: self.ctx.access.sees(user, owner), words=words))
        return jobs_gallery.gallery_items(entries, published), [e.id for e in entries]

    def filtered(self, words, request: gr.Request = None):
        """The Past jobs filter changed: remembered for the session, the gallery shown through it."""
        words = words[:jobs_gallery.FILTER_CHARS] if isinstance(words, str) else ""
        session = getattr(request, "session_hash", None) or ""
        with self._lock:
            self._words.pop(session, None)
            if words.strip():
                self._words[session] = words
                while len(self._words) > FILTERS_KEPT:
                    self._words.popitem(last=False)
        return self.refresh(request)

    refresh_gallery = refresh

    def _entry(self, job_id, request) -> jobs_gallery.JobEntry | None:
        """The job `job_id` if the user may see it (else None)."""
        try:
            folder = self.ctx.access.job_folder(self.ctx.outputs, job_id, self.ctx.access.user(request), "job")
        except InputError:
            return None
        return jobs_gallery.read_job(folder)

    def select_id(self, job_id, request: gr.Request = None) -> tuple:
        """(selected job, its video, its details, Reuse, Resume, Extend) for the job `job_id` as it is now."""
        off = gr.update(interactive=False)
        entry = self._entry(job_id, request) if job_id else None
        post = (post_button(entry),) if getattr(self.ui, "post_job", None) is not None else ()
        if not job_id:
            return None, None, None, off, off, off, *post
        if entry is None:
            return (None, None, {"error": "this job is no longer there (or its job.json cannot be read)"}, off, off,
                    off, *post)
        return (entry.id, published(entry.video), entry.details(), gr.update(interactive=True),
                *reasoned_buttons(entry), *post)

    def select_job(self, job_ids, evt: gr.SelectData, request: gr.Request):
        index = evt.index
        if not job_ids or not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(job_ids):
            return self.select_id(None)
        return self.select_id(job_ids[index], request)

    def reuse_settings(self, job_id, request: gr.Request):
        entry = self._entry(job_id, request) if job_id else None
        if entry is None:
            raise gr.Error("Select a job in the gallery first.")
        values = st.values_from_settings(entry.settings, self.ctx.default_resolution)
        values["keyframes"] = reused_keyframes(entry, values.get("keyframes", ""))
        values["image"] = published(entry.original_image or entry.input_image)
        values["end_image"] = published(entry.original_end_image or entry.end_image)
        for name in st.IMAGES:          # the other uploads (the video to extend) are not reused: chosen afresh
            values.setdefault(name, None)
        which = "the start image you uploaded" if entry.original_image else \
            "the job's cropped start image (this job is older than keeping uploads)"
        gr.Info(f"Settings of job {entry.id} loaded, with {which}.")
        return [values[name] for name in st.CONTROLS]

    def import_studio(self, upload, request: gr.Request = None):
        """A FramePack-Studio job's settings (its metadata JSON, or its PNG's text chunks: jobs/studio.py) into
        the controls, as Reuse settings fills them: what Studio gives, the defaults for the rest of the job's
        settings; the machine's own (preserved memory, compile, CRF) and the images stay, except that Studio's PNG,
        its job's start image, becomes the start image. Returns the controls' values and the report."""
        try:
            path = st.client_file(upload, studio.FIELD)
            if path is None:
                raise InputError(studio.FIELD, "no file; upload FramePack-Studio's .json or .png of a job")
            imported = studio.import_file(path, self.ctx.default_resolution)
            settings = admitted(imported.settings, st.UPLOADS)      # the one door check (jobs/doors.py)
        except InputError as e:
            raise gr.Error(messages.input_error(e), title="Cannot import these settings", print_exception=False) \
                from None
        values: dict = st.values_from_settings(settings, self.ctx.default_resolution)
        for name in STUDIO_KEEPS:
            values[name] = gr.update()
        if imported.text_to_video:                    # no start image in Studio's job: its PNG is a placeholder
            values["image"] = None
        else:
            values["image"] = path if imported.kind == "png" else gr.update()
        values["end_image"] = gr.update()
        values["input_video"] = None                  # a video or job to extend is chosen afresh, as with Reuse
        report = imported.report()
        gr.Info(f"FramePack-Studio settings loaded: {len(imported.settings)} controls"
                + (f"; {len(report)} notes below" if report else "")
                + ("" if imported.kind == "png" or imported.text_to_video else "; upload the start image"))
        lines = "\n".join(f"- {_markdown_text(messages.plain(line))}" for line in report)
        text = (f"**Imported from FramePack-Studio** ({len(imported.settings)} controls set).\n\n"
                + (f"Not mapped or changed:\n{lines}" if lines else "Everything in the file was mapped."))
        return [values[name] for name in st.CONTROLS] + [text]

    # ---- Delete (Past jobs): asked, then confirmed ---------------------------------------------------------------
    def _deletable(self, job_id, request) -> jobs_gallery.JobEntry:
        """The job `job_id` if this user may delete it now; raises gr.Error saying why not. Found by its name among
        the outputs folder's job folders (ui/access.py), never a path made of the text; with several users only the
        job's owner may delete it; a running job is refused."""
        access = self.ctx.access
        user = access.user(request)
        entry = self._entry(job_id, request) if job_id else None
        if entry is None:
            raise gr.Error("Select a job in the gallery first (this one is not there).", print_exception=False)
        if len(access.users) > 1 and entry.owner != user:
            raise gr.Error("Only the user who made this job can delete it.", print_exception=False)
        if entry.status == "running":
            raise gr.Error(f"Job {entry.id} is running: press End (or remove it from the queue) first.",
                           print_exception=False)
        store = getattr(getattr(self.ctx, "runner", None), "store", None)
        if store is not None and any(e.job_dir and Path(e.job_dir).name == entry.id
                                     for e in store.entries(("waiting", "running"))):
            raise gr.Error(f"Job {entry.id} is in the queue (running or waiting to resume): remove it from the "
                           f"queue first.", print_exception=False)
        outputs = Path(self.ctx.outputs).resolve()
        if entry.dir.is_symlink() or entry.dir.resolve().parent != outputs:
            raise gr.Error("This job's folder is not in the outputs folder.", print_exception=False)
        return entry

    def ask_delete(self, job_id, request: gr.Request = None):
        """Delete pressed: (the confirmation text, the Confirm button shown, the job it asks about: Confirm deletes
        that one, whatever is selected since). A resumable job warns that it can no longer be resumed."""
        entry = self._deletable(job_id, request)
        warning = (" **It is not finished: once deleted it can no longer be resumed.**" if entry.resumable else "")
        return (f"Delete job **{entry.id}** ({entry.status}) and every file in its folder?{warning}",
                gr.update(visible=True), entry.id)

    def delete_job(self, job_id, request: gr.Request = None):
        """Confirm pressed: the job asked about (`job_id`) has its folder removed (first renamed to a hidden name,
        which listings skip and a later start sweeps if removing it fails half way). Returns the gallery, its ids,
        the note, the Confirm button hidden, no job asked about, then the selected job's outputs cleared."""
        entry = self._deletable(job_id, request)
        hidden = entry.dir.with_name(f".{entry.id}.deleted{PARTIAL_SUFFIX}")
        try:
            entry.dir.rename(hidden)
        except OSError as e:
            raise gr.Error(f"Could not delete job {entry.id}: {e}", print_exception=False) from None
        shutil.rmtree(hidden, ignore_errors=True)
        log.info("job %s deleted", entry.id)
        gallery, ids = self.refresh(request)
        return (gallery, ids, f"Job {entry.id} deleted.", gr.update(visible=False), None) + self.select_id(None)

    def keep_preview(self, view) -> None:
        """A job that ended before its first video: its last latent preview becomes its gallery picture."""
        job_dir = getattr(view.result, "job_dir", None)
        if view.video is not None or view.preview is None or job_dir is None or not Path(job_dir).is_dir():
            return


        buf = io.BytesIO()
        Image.fromarray(view.preview).save(buf, format="PNG")
        try:
            atomic_write_bytes(Path(job_dir) / jobs_gallery.PREVIEW, buf.getvalue())
        except OSError as e:
            log.info("could not keep the last preview of %s: %s", job_dir, e)

    def wire(self, app: gr.Blocks) -> None:
        ui = self.ui
        app.load(self.refresh_gallery, None, [ui.gallery, ui.jobs_state], show_progress="hidden")
        jobs_filter = getattr(ui, "jobs_filter", None)
        if jobs_filter is not None:
            # Refresh and the filter are one event, each call after the last one's answer, the last with the filter
            # the page holds then (`always_last`): as two events, Refresh's answer (every job) could come back after
            # the filter's typed next and stay shown under it (the browser test waited 120 s for its one job)
            gr.on([ui.refresh.click, jobs_filter.change], self.filtered, jobs_filter, [ui.gallery, ui.jobs_state],
                  show_progress="hidden", trigger_mode="always_last")
        else:
            ui.refresh.click(self.refresh_gallery, None, [ui.gallery, ui.jobs_state], show_progress="hidden")
        ui.gallery.select(self.select_job, ui.jobs_state, self.detail_outputs, show_progress="hidden")
        # each button's result is shown where it lands (issue 44 item 6: it happened at the top, out of view)
        ui.reuse.click(self.reuse_settings, ui.selected_job, ui.controls(), show_progress="hidden") \
            .then(None, js=scroll_to("#prompt"))
        opened = [ui.extend_group] if ui.extend_group is not None else []      # the group it fills, opened
        assert ui.extend is not None                                            # (every layout has it)
        ui.extend.click(self.extend_opened if opened else self.extend, ui.selected_job,
                        [ui.source_job, ui.mode, ui.image, ui.input_video, *opened],
                        show_progress="hidden").then(None, js=scroll_to("#extend-group"))
        ui.resume.click(None, js=scroll_to("#actions"))           # the resumed job's progress, by Start
        if ui.delete is not None and ui.delete_confirm is not None:
            ui.delete.click(self.ask_delete, ui.selected_job, [ui.delete_note, ui.delete_confirm, ui.delete_pending],
                            show_progress="hidden")
            ui.delete_confirm.click(self.delete_job, ui.delete_pending,
                                    [ui.gallery, ui.jobs_state, ui.delete_note, ui.delete_confirm, ui.delete_pending]
                                    + self.detail_outputs, show_progress="hidden")
        if ui.studio_import is not None:
            ui.studio_import.upload(self.import_studio, ui.studio_import, ui.controls() + [ui.studio_report],
                                    show_progress="hidden")

    def extend_opened(self, job_id, request: gr.Request):
        """`extend`, and the page's "Extend a video" group opened to show what it filled."""
        return (*self.extend(job_id, request), gr.update(open=True))

    def extend(self, job_id, request: gr.Request):
        """The selected job as the job to extend (F1 mode; no start image or video with it)."""
        entry = self._entry(job_id, request) if job_id else None
        if entry is None:
            raise gr.Error("Select a job in the gallery first.")
        gr.Info(f"Job {entry.id} will be extended: set the length to add and press Start.")
        return entry.id, "f1", None, None
