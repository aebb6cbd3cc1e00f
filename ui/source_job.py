"""A finished job of the outputs folder as the input of an extension, named by its job id (the "Job to extend"
control: the page's text box, filled by the Past jobs panel's *Extend* button; `source_job` in /video and the
queue's API). The app looks the id up among its job folders by name (the text never becomes a path) and the job
extends that folder as `input_video` does (pipeline/extend.py: its saved latents are reused, no VAE encode)."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping

from pipeline.errors import InputError
from pipeline.request import shown

FIELD = "job to extend"


def job_folder(outputs: Path, job_id) -> Path:
    """The folder of the job `job_id` in `outputs`, found by comparing names. Raises InputError naming the field."""
    outputs = Path(outputs)
    if isinstance(job_id, str) and job_id and not job_id.startswith(".") and outputs.is_dir():
        for d in outputs.iterdir():
            if d.name == job_id and d.is_dir():
                return d
    raise InputError(FIELD, f"there is no job {shown(job_id)} in the outputs folder; use a job_id from the Past "
                            f"jobs panel or a /video summary")


def resolved_values(values: Mapping[str, Any], outputs: Path) -> dict:
    """`values` (by control name) with a job to extend turned into its folder as the video to extend."""
    values = dict(values)
    job_id = values.get("source_job")
    if not job_id:
        return values
    if values.get("input_video") or values.get("image"):
        raise InputError(FIELD, "give one of a job to extend, a video to extend or a start image; remove the others")
    return {**values, "input_video": str(job_folder(outputs, job_id)), "source_job": ""}


def resolved(request, outputs: Path):
    """A Request with its job to extend (if any) turned into its folder as the video to extend."""
    if not getattr(request, "source_job", ""):         # (a table without the control: nothing to look up)
        return request
    values = resolved_values({"source_job": request.source_job, "input_video": request.input_video,
                              "image": request.image}, outputs)
    return dataclasses.replace(request, input_video=Path(values["input_video"]), source_job="")
