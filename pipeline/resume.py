"""Resume an interrupted job (killed process, stop, power loss) from its folder.

The folder holds the settings (job.json), the prepared images and, after every finished section, the latent
history with the random generator's state (latents.safetensors). Resuming re-encodes the prompt and the image
(deterministic), decodes the finished sections again so the cross-fades match, and samples the remaining sections
with the saved generator state: the final video equals that of an uninterrupted run with the same seed.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Iterator

from memory import MemoryManager
from pipeline.checkpoint import CHECKPOINT, load_checkpoint
from pipeline.components import Components
from pipeline.errors import InputError
from pipeline.events import Event, Failed
from pipeline.jobs import Job, load_job
from pipeline.orchestrator import CancelToken, JobRun, ResumeState
from pipeline.request import Request, prepare, setting_problems


def resume_request(job_dir: Path) -> tuple[Request, dict]:
    """The request a job folder was started with, and its job.json. Raises InputError when it cannot resume."""
    job_dir = Path(job_dir)
    if not (job_dir / "job.json").is_file():
        raise InputError("job folder", f"{job_dir} has no job.json; pick a folder under outputs/")
    try:
        info = load_job(job_dir)
        settings, preset = dict(info["settings"]), str(info["models"]["preset"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise InputError("job folder", f"{job_dir.name}/job.json is damaged or incomplete; it cannot be "
                                       f"resumed: start the job again") from None
    info["models"]["preset"] = preset
    if info.get("status") == "done":
        raise InputError("job folder", f"{job_dir.name} is already complete ({info.get('final')})")
    if not (job_dir / CHECKPOINT).is_file():
        raise InputError("job folder", f"{job_dir.name} has no finished section to continue from; start it again")
    names = {f.name for f in dataclasses.fields(Request)}
    settings = {k: v for k, v in settings.items() if k in names}
    problems = setting_problems(settings)
    if problems:       # a hand-edited job.json: refused here, before any model loads
        raise InputError("job folder", f"{job_dir.name}/job.json: {next(iter(problems.values()))}; fix that value "
                                       f"or start the job again")
    end = job_dir / "end.png"
    return Request(image=job_dir / "input.png", end_image=end if end.exists() else None, **settings), info


def resume(job_dir: str | Path, components: Components, memory: MemoryManager | None = None, *,
           cancel: CancelToken | None = None) -> Iterator[Event]:
    """Continue the job in `job_dir`; yields the same events as generate()."""
    job_dir = Path(job_dir)
    try:
        request, info = resume_request(job_dir)
        prepared = prepare(request, components.preset.default_resolution, images_prepared=True)
    except InputError as e:
        yield Failed(str(e), "", None, None)
        return
    if request.mode != components.mode or info["models"]["preset"] != components.preset.name:
        yield Failed(f"job folder: {job_dir.name} was made with the {info['models']['preset']} preset in "
                     f"{request.mode} mode; load those models to resume it", "", None, None)
        return
    for stale in job_dir.glob(".*"):          # temp files of writes the crash cut short
        if stale.is_file() and (stale.name.endswith(".tmp") or ".partial." in stale.name):
            stale.unlink()
    tensors, meta = load_checkpoint(job_dir)
    state = ResumeState(Job(job_dir, info), tensors["history"], tensors["real"], tensors["start_latent"],
                        tensors.get("end_latent"), tensors["rng_state"], int(meta["sections_done"]))
    run = JobRun(prepared, components, memory or MemoryManager(), cancel or CancelToken(), job_dir.parent, state)
    yield from run.events()
