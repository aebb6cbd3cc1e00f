"""A queued job's values checked as a job's, and JSON-lines job files read line by line (the queue's import;
jobs/store.py keeps the jobs, ui/queue_api.py and cli/queue.py read files with these)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from common.errors import InputError

# (control, the name of its copy in the queue): the job's files, copied into the queue's folder when it is added
IMAGE_FIELDS = (("image", "start"), ("end_image", "end"), ("input_video", "video"))
FILE_NAMES = tuple(name for name, _ in IMAGE_FIELDS)
VIDEO_SHA256 = "input_video_sha256"      # the queue's copy of a video to extend, by hash (checked when it runs)


def _is_file(path) -> bool:
    try:
        return isinstance(path, (str, Path)) and Path(path).is_file()
    except (OSError, ValueError):               # a name too long, a NUL byte
        return False


def checked_values(values: Mapping[str, Any], default_resolution: int, *, base: Path | None = None) -> dict:
    """Settings and image paths by control name, checked as a job's (pipeline.request.prepare: raises InputError
    naming the field); the images must be files. Returns the request's settings and image paths."""
    from pipeline.request import Request, prepare

    request = Request.from_mapping(values, base=base)
    for name, _ in IMAGE_FIELDS:
        path = getattr(request, name)
        if name == "input_video" and path is not None and _is_job_folder(path):
            continue                # a finished job to extend: used where it is (pipeline/extend.py)
        if path is not None and not _is_file(path):
            what = "a video file (mp4, webm, mov) or a finished job's folder" if name == "input_video" else \
                "a PNG, JPEG or WebP image"
            raise InputError(name, f"{str(path)[:200]!r} is not a file; give the path of {what}")
    prepare(request, default_resolution)
    out = dict(request.settings())
    for name, _ in IMAGE_FIELDS:
        path = getattr(request, name)
        out[name] = str(Path(path).resolve()) if path is not None else None
    return out


def _is_job_folder(path) -> bool:
    try:
        return isinstance(path, (str, Path)) and (Path(path) / "job.json").is_file()
    except (OSError, ValueError):
        return False


def copy_problem(images: Mapping[str, Any]) -> str | None:
    """Why a queued job's copy of its video cannot be used (missing, or not the file that was queued), or None
    (the message of an InputError for the "video" field)."""
    path, sha = images.get("input_video"), images.get(VIDEO_SHA256)
    if not path or not sha:
        return None
    from common.files import file_sha256

    if not _is_file(path):
        return f"the queue's copy {Path(path).name} is missing; add the job again"
    if file_sha256(path) != sha:
        return f"the queue's copy {Path(path).name} changed since the job was queued (sha256); add it again"
    return None


def read_jsonl(text: str, default_resolution: int, base: Path | None = None, *, files=None) -> list[dict]:
    """Every job of a JSON-lines text, checked before any is queued: InputError naming the first bad line.
    `files(name, value) -> path`: what a file named in a line may be (the app: only the queue's own copies); it
    sees each file's value before anything reads the file, and raises InputError to refuse it."""
    jobs = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise InputError(f"line {number}", f"not JSON ({str(e)[:120]}); each line must be one job's JSON "
                                               "object") from None
        if not isinstance(obj, dict):
            raise InputError(f"line {number}", "each line must be a JSON object with a job's settings")
        try:
            if files is not None:
                obj = {**obj, **{name: files(name, obj[name]) for name in FILE_NAMES if obj.get(name) not in (None, "")}}
            jobs.append(checked_values(obj, default_resolution, base=base))
        except InputError as e:
            raise InputError(f"line {number}", f"{e.field}: {e.message}") from None
    if not jobs:
        raise InputError("jobs file", "no job in it; each line must be a JSON object, e.g. "
                                      '{"image": "a.png", "prompt": "...", "seconds": 3}')
    return jobs
