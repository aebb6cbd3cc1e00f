"""The one check of what a job's values may name, for every way a job comes in.

A job's values name files (the start and end images, a video to extend), a finished job (`source_job`, by its id)
and LoRA files. Whoever sends them — the page's Start, the /video API, /queue_add, /queue_add_images, a line of
/queue_import, /queue_edit, a FramePack-Studio import, a batch line or the command line — they pass through
`admitted` first, with the `Door` of where they came in:

1. every key is turned into its control's name (pipeline/request.py `canonical`: "video" and "extend" are
   input_video, "lora" is loras ...), so no rule below can be passed by another spelling;
2. each file (a keyframe's image too) is given to the door's `file` rule (the app: only a client's own uploads, or, in a jobs file sent to
   the app, only the queue's copies of the user's own entries; the command line: any path its user can read);
3. a job id is looked up by the door's `job` rule (the app: among the job folders the user may see; ui/access.py)
   and becomes the video to extend;
4. LoRAs are names of files in the LoRA folder, unless the door takes paths (the command line only).

A post-processing job's line (`"kind": "post"`, post/steps.py) names its videos as "sources" (or "source"): each one
is given to the door's `file` rule the same way.

A door refuses with an InputError naming the field, before anything reads the file.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from common.errors import InputError
from configs.controls import CONTROLS, Control
from pipeline import keyframes
from post.steps import is_post, source_values

JOB_FIELD = "job to extend"


@dataclass(frozen=True)
class Door:
    """The rules of one way in. `file(control, value)`: what the job uses for a file control's value (None: no
    file), raising InputError to refuse it; `job(job_id, field)`: a job id's folder, raising InputError (None: this
    door takes no job ids; the request's own check refuses one); `lora_paths`: LoRAs may be paths."""
    name: str
    file: Callable[[Control, Any], Any]
    job: Callable[[Any, str], Path] | None = None
    lora_paths: bool = False
    lora_folder: Path | None = None        # LoRAs must be in this folder's list (the app: the client never sees
                                           # the folder's path in a "no such file" answer)


def _as_given(control: Control, value: Any) -> Any:
    return value


# The command line (generate, batch, queue add): its user names files of their own machine.
LOCAL = Door("command line", _as_given, job=None, lora_paths=True)


def _given(value: Any) -> bool:
    return value is not None and value != ""


def _keyframes(c: Control, text: str, door: Door) -> str:
    """The keyframes setting with each keyframe's image given to the door's file rule; a setting that does not
    parse is left for the request's check to explain (it reads no file then)."""
    try:
        items = keyframes.parse(text)
    except InputError:
        return text
    return keyframes.with_images(items, [door.file(c, k.image) for k in items])


def admitted(values: Mapping[str, Any], door: Door, table: tuple[Control, ...] = CONTROLS) -> dict:
    """`values` by control name (aliases turned into names), each file, job id and LoRA checked by `door`'s rules;
    a job id becomes the video to extend (its folder). Keys that are no control are kept (Request.from_mapping
    refuses or ignores them). Raises InputError naming the field."""
    from pipeline.request import canonical, shown  # (PIL and the request's checks: not at import, for the CLI)

    out = canonical(values, table)
    names = {c.name for c in table}
    for c in table:
        if c.is_file and _given(out.get(c.name)):
            out[c.name] = door.file(c, out[c.name])
        elif c.name == "keyframes" and isinstance(out.get(c.name), str) and out[c.name].strip():
            out[c.name] = _keyframes(c, out[c.name], door)
    if "source_job" in names and _given(out.get("source_job")):
        if door.job is None:
            raise InputError(JOB_FIELD, f"{shown(out['source_job'])} is a job id, which the page, /video and "
                                        f"/queue_add look up (the {door.name} does not); the command line takes "
                                        f"the job's folder as the video to extend (--extend outputs/<job id>)")
        if _given(out.get("input_video")) or _given(out.get("image")):
            raise InputError(JOB_FIELD, "give one of a job to extend, a video to extend or a start image; "
                                        "remove the others")
        out["input_video"] = str(door.job(out["source_job"], JOB_FIELD))
        out["source_job"] = ""
    if is_post(out):                            # a post job's videos (post/steps.py): files like any other
        video = next(c for c in table if c.name == "input_video")
        out["sources"] = [door.file(video, s) for s in source_values(out)]
        out.pop("source", None)
    if "loras" in names and _given(out.get("loras")) and not door.lora_paths:
        from pipeline.lora import listed_only, names_only  # (torch: only where a door checks LoRA names)
        names_only(out["loras"])                # LoRA files by their names in the LoRA folder, never a path
        if door.lora_folder is not None:
            listed_only(out["loras"], door.lora_folder)
    return out
