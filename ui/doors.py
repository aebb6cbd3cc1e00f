"""The app's doors (jobs/doors.py `Door`): what a client of the page or the API may name in a job's values.

- `client`: the page, /video, /queue_add, /queue_add_images, a FramePack-Studio import: a file must be one the
  client uploaded (ui/settings.py `client_file`); a finished job is named by its id (the "Job to extend" control:
  the page's text box, filled by the Past jobs panel's *Extend* button; `source_job` in /video and the queue's API),
  looked up among the job folders the user may see (ui/access.py: by name, the text never becomes a path), and
  extended as `input_video` is (pipeline/extend.py: its saved latents reused, no VAE encode).
- `queue_copies`: a jobs file sent to the app (/queue_import): a file may only be the queue's copy of an image or
  video of one of the user's entries (what Export writes).
- `no_files`: a change to a queued job (/queue_edit): it keeps its files; a value naming one is refused.

All of them take LoRAs by their names in the LoRA folder only, and every key is resolved to its control's name
first (aliases too), by the one `admitted`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from common.errors import InputError
from configs.lora import LORA
from jobs.doors import Door
from ui.access import Access
from ui.settings import UPLOADS


def lora_folder(runner) -> Path:
    """The LoRA folder of the runner's pre-flight (--lora-dir; the default folder when none is set)."""
    config = getattr(getattr(runner, "preflight", None), "config", None)
    return Path(getattr(config, "lora_dir", None) or LORA.folder)


def client(access: Access, user: str | None, outputs: Path, lora_folder: Path | None = None) -> Door:
    """The page's and the API's door for `user`: uploads, the ids of the jobs the user may see, LoRAs of the
    `lora_folder`'s list."""
    return Door("page and API", UPLOADS.file, job=lambda job_id, field: access.job_folder(outputs, job_id, user, field),
                lora_folder=lora_folder)


def queue_copies(store, access: Access, user: str | None) -> Door:
    """A jobs file sent to the app: only the queue's copies of the user's own entries' files, by their names in
    the queue (<entry id>/<file>: what Export writes, ui/queue_api.py `exported`) or their paths; a job to extend
    by its id, among the jobs the user may see. Refused with one message whatever the path is."""

    def file(c, value: Any) -> str:
        if c.name == "keyframes":                   # (not copied into the queue: the client's uploads)
            return UPLOADS.file(c, value)
        refused = InputError(c.name, "a jobs file sent to the app may name no file but the queue's copies of your "
                                     "queued jobs' images (what Export writes); add other images with 'Add one "
                                     "job per image' or the /queue_add API")
        if not isinstance(value, str):
            raise refused
        root = store.images_root.resolve()
        try:
            real = (root / value).resolve()                 # a name in the queue (an absolute path: itself)
            inside = real.is_relative_to(root) and len(real.relative_to(root).parts) == 2
        except (OSError, ValueError, RuntimeError):
            inside = False
        entry = store.get(real.relative_to(root).parts[0]) if inside else None
        if entry is None or not access.sees(user, entry.owner) or not real.is_file():
            raise refused
        return str(real)

    return Door("jobs file", file,
                job=lambda job_id, field: access.job_folder(store.outputs, job_id, user, field))


def no_files() -> Door:
    """A queued job's change: its files stay (a value naming one is refused); no job ids."""

    def file(c, value: Any):
        raise InputError(c.field_name, "a queued job keeps its files; remove the job and add it again with "
                                       "/queue_add to use another file")

    def job(job_id, field: str):
        raise InputError(field, "a queued job keeps what it extends; remove the job and add it again with "
                                "/queue_add to extend another")

    return Door("queue edit", file, job=job)
