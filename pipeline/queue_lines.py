"""A queued job's values checked as a job's, and JSON-lines job files read line by line (the queue's import;
pipeline/queue_store.py keeps the jobs, ui/queue_api.py and pipeline/queue_cli.py read files with these)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from pipeline.errors import InputError

IMAGE_FIELDS = (("image", "start"), ("end_image", "end"))     # (control, the name of its copy in the queue)


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
        if path is not None and not _is_file(path):
            raise InputError(name, f"{str(path)[:200]!r} is not a file; give the path of a PNG, JPEG or WebP image")
    prepare(request, default_resolution)
    out = dict(request.settings())
    for name, _ in IMAGE_FIELDS:
        path = getattr(request, name)
        out[name] = str(Path(path).resolve()) if path is not None else None
    return out


def outside(values: Mapping[str, Any], root: Path) -> str | None:
    """The first image of `values` that is not a path inside `root` (anything else but a path counts), or None."""
    for name, _ in IMAGE_FIELDS:
        path = values.get(name)
        if path is None or path == "":
            continue
        try:
            if not isinstance(path, (str, Path)) or not Path(path).resolve().is_relative_to(Path(root).resolve()):
                return name
        except (OSError, ValueError):           # a NUL byte, a loop of links
            return name
    return None


def read_jsonl(text: str, default_resolution: int, base: Path | None = None, *, images_under: Path | None = None
               ) -> list[dict]:
    """Every job of a JSON-lines text, checked before any is queued: InputError naming the first bad line.
    `images_under`: the images must be files in that folder (a file uploaded to the server names no other)."""
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
            values = checked_values(obj, default_resolution, base=base)
            name = outside(values, images_under) if images_under is not None else None
            if name is not None:
                raise InputError(name, f"{values[name]} is outside the outputs folder: a jobs file sent to the app "
                                       "may name only images in it (an exported queue's); add other images with "
                                       "'Add one job per image' or `python -m pipeline queue add`")
            jobs.append(values)
        except InputError as e:
            raise InputError(f"line {number}", f"{e.field}: {e.message}") from None
    if not jobs:
        raise InputError("jobs file", "no job in it; each line must be a JSON object, e.g. "
                                      '{"image": "a.png", "prompt": "...", "seconds": 3}')
    return jobs
