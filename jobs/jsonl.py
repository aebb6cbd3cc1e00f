"""JSON-lines job files (one job's settings a line, as `python -m cli batch`, the queue's import and its export
write them), read line by line and checked whole (the one pre-flight) before any job is queued; and the names of a
job's files in the queue."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator, Mapping

from common.errors import InputError
from common.files import file_sha256
from jobs.doors import Door, admitted
from post.steps import is_post
from post.steps import request_from as post_request

# (control, the name of its copy in the queue): the job's files, copied into the queue's folder when it is added
IMAGE_FIELDS = (("image", "start"), ("end_image", "end"), ("input_video", "video"))
FILE_NAMES = tuple(name for name, _ in IMAGE_FIELDS)
VIDEO_SHA256 = "input_video_sha256"      # the queue's copy of a video to extend, by hash (checked when it runs)


def _is_file(path) -> bool:
    try:
        return isinstance(path, (str, Path)) and Path(path).is_file()
    except (OSError, ValueError):               # a name too long, a NUL byte
        return False


def copy_problem(images: Mapping[str, Any]) -> str | None:
    """Why a queued job's copy of its video cannot be used (missing, or not the file that was queued), or None
    (the message of an InputError for the "video" field)."""
    path, sha = images.get("input_video"), images.get(VIDEO_SHA256)
    if not path or not sha:
        return None

    if not _is_file(path):
        return f"the queue's copy {Path(path).name} is missing; add the job again"
    if file_sha256(path) != sha:
        return f"the queue's copy {Path(path).name} changed since the job was queued (sha256); add it again"
    return None


def job_lines(text: str, *, door: Door) -> Iterator[tuple[int, dict | InputError]]:
    """The one reader of job files: each job line of a JSON-lines text, (its number, its values), or (its number, the
    InputError naming the line and saying why it is not a job); blank lines and # comments are skipped. `door`: what
    a line may name (jobs/doors.py: the app takes only the queue's own copies of the user's entries and LoRA names;
    the command line any path); each line passes `admitted` (aliases turned into names first) before anything reads
    a file. The caller decides what a bad line does: the queue's import refuses the file (`read_lines`), a batch
    skips it and says so (cli/commands.py)."""
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError) as e:
            yield number, InputError(f"line {number}", f"not JSON ({str(e)[:120]}); each line must be one job's "
                                                       "JSON object")
            continue
        if not isinstance(obj, dict):
            yield number, InputError(f"line {number}", "each line must be a JSON object with a job's settings")
            continue
        try:
            yield number, admitted(obj, door)
        except InputError as e:
            yield number, InputError(f"line {number}", f"{e.field}: {e.message}")


def read_lines(text: str, *, door: Door) -> list[tuple[int, dict]]:
    """Every job of a JSON-lines text, [(line number, its values)], the whole file or nothing: raises InputError
    naming the first bad line (`job_lines`), or the file when it holds no job."""
    jobs = []
    for number, values in job_lines(text, door=door):
        if isinstance(values, InputError):
            raise values
        jobs.append((number, values))
    if not jobs:
        raise InputError("jobs file", "no job in it; each line must be a JSON object, e.g. "
                                      '{"image": "a.png", "prompt": "...", "seconds": 3}')
    return jobs


def prepare_lines(lines: list[tuple[int, dict]], preflight, base: Path | None = None) -> list:
    """Each line's job checked by the one pre-flight (jobs/preflight.py), all of them before any is queued:
    [PreparedRequest, or a post job's CheckedPost]. `base`: relative file paths are relative to it (a jobs file's folder). Raises InputError
    naming the first bad line and its field."""
    from pipeline.request import Request

    prepared = []
    for number, values in lines:
        try:
            request = post_request(values, base) if is_post(values) else Request.from_mapping(values, base=base)
            prepared.append(preflight.prepare(request))
        except InputError as e:
            raise InputError(f"line {number}", f"{e.field}: {e.message}") from None
    return prepared
