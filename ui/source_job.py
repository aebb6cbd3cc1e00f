"""A finished job of the outputs folder as the input of an extension, named by its job id (the "Job to extend"
control: the page's text box, filled by the Past jobs panel's *Extend* button; `source_job` in /video and the
queue's API). The app looks the id up among the job folders the user may see (ui/access.py: by name, the text
never becomes a path) and the job extends that folder as `input_video` does (pipeline/extend.py: its saved latents
are reused, no VAE encode)."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping

from common.errors import InputError
from ui.access import Access

FIELD = "job to extend"


def resolved_values(values: Mapping[str, Any], outputs: Path, access: Access, user: str | None) -> dict:
    """`values` (by control name) with a job to extend turned into its folder as the video to extend."""
    values = dict(values)
    job_id = values.get("source_job")
    if not job_id:
        return values
    if values.get("input_video") or values.get("image"):
        raise InputError(FIELD, "give one of a job to extend, a video to extend or a start image; remove the others")
    return {**values, "input_video": str(access.job_folder(outputs, job_id, user, FIELD)), "source_job": ""}


def resolved(request, outputs: Path, access: Access, user: str | None):
    """A Request with its job to extend (if any) turned into its folder as the video to extend."""
    if not getattr(request, "source_job", ""):         # (a table without the control: nothing to look up)
        return request
    values = resolved_values({"source_job": request.source_job, "input_video": request.input_video,
                              "image": request.image}, outputs, access, user)
    return dataclasses.replace(request, input_video=Path(values["input_video"]), source_job="")
