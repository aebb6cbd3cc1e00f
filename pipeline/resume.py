"""Resume an interrupted job (killed process, stop, power loss) from its folder.

The folder holds the settings (job.json), the prepared images and, after every finished section, the latent
history with the random generator's state (latents.safetensors). Resuming re-encodes the prompt and the image
(deterministic), decodes the finished sections again so the cross-fades match (writing the video of a finished
section whose file the stopped process had not written yet), and samples the remaining sections with the saved
generator state: the final video, and every section's, equals that of an uninterrupted run with the same seed.
A job stopped before its first section was finished starts again in its folder from its saved request.

Like a new job, a resume is checked once, before any model loads: `prepare_resume(job_dir)` reads job.json,
checks its settings and decodes the images (a `ResumeRequest`); `resume(...)` takes that and runs it.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generator

from common.errors import InputError
from configs import PRESETS
from jobfolder.folder import CHECKPOINT, Job, damaged_sections, incomplete, load_job
from pipeline import keyframes
from pipeline.cancel import CancelToken
from pipeline.events import Failed
from pipeline.request import PreparedRequest, Request, prepare, setting_problems

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class ResumeRequest:
    """A job folder checked for resuming: its request with the images decoded, and the preset it was made with."""
    job_dir: Path
    prepared: PreparedRequest
    preset: str

    @property
    def request(self) -> Request:
        return self.prepared.request


class AlreadyComplete(InputError):
    """The job folder's job is done (job.json says so): there is nothing to resume. A queue entry that names it is
    over (jobs/runner.py); a page or command line says so."""

    def __init__(self, job_dir: Path, final):
        super().__init__("job folder", f"{Path(job_dir).name} is already complete ({final})")
        self.job_dir = Path(job_dir)


def _damaged(job_dir: Path, why: str) -> InputError:
    return InputError("job folder", f"{job_dir.name}/job.json is damaged or incomplete; it cannot be resumed "
                                    f"({why}): start the job again")


def resume_request(job_dir: Path) -> tuple[Request, dict]:
    """The request a job folder was started with, and its job.json. Raises InputError when it cannot resume.
    Only a file that is not a job's record is called damaged; any other error is a bug and keeps its traceback."""
    job_dir = Path(job_dir)
    if not (job_dir / "job.json").is_file():
        raise InputError("job folder", f"{job_dir} has no job.json; pick a folder under outputs/")
    try:
        info = load_job(job_dir)
    except (OSError, ValueError) as e:          # unreadable, not JSON, not an object, too large or deep
        raise _damaged(job_dir, str(e).splitlines()[0][:200]) from None
    settings, models = info.get("settings"), info.get("models")
    if not isinstance(settings, dict):
        raise _damaged(job_dir, "no settings")
    if not isinstance(models, dict) or not isinstance(models.get("preset"), str):
        raise _damaged(job_dir, "no model preset")
    if info.get("status") == "done" and not incomplete(job_dir, info):
        raise AlreadyComplete(job_dir, info.get("final"))
    end = job_dir / "end.png"
    given: dict[str, Any] = {}
    if isinstance(info.get("keyframes"), list) and settings.get("keyframes"):     # the folder's copies
        try:
            given["keyframes"] = keyframes.with_images(keyframes.parse(settings["keyframes"]),
                                                       [job_dir / str(k.get("file")) for k in info["keyframes"]])
        except (InputError, AttributeError):
            raise _damaged(job_dir, "its keyframes") from None
    request = Request.from_mapping(settings, unknown="ignore", image=job_dir / "input.png",
                                   end_image=end if end.exists() else None, **given)
    problems = setting_problems(request.settings())
    if problems:       # a hand-edited job.json: refused here, before any model loads
        raise InputError("job folder", f"{job_dir.name}/job.json: {next(iter(problems.values()))}; fix that value "
                                       f"or start the job again")
    # Then the folder's files, after job.json's own checks: a hand-edited value is named first (its fix may be all
    # the folder needs), then a missing start image or the checkpoint to delete.
    if not (job_dir / "input.png").is_file():    # the job's own start image (not the user's --image): its file named
        uploads = sorted(p.name for p in job_dir.glob("upload.*"))
        raise InputError("job folder", f"{job_dir / 'input.png'} is missing (the job's prepared start image); put it "
                                       f"back, or start a new job" + (f" from {job_dir / uploads[0]}" if uploads else ""))
    checkpoint_problem(job_dir)
    return request, info


def checkpoint_problem(job_dir: Path) -> None:
    """A checkpoint that cannot be read is said before any model loads, with the file to delete (the job then
    starts again in its folder from its saved settings: the same video, since the seed is kept)."""
    path = Path(job_dir) / CHECKPOINT
    if not path.is_file():
        return
    from safetensors import SafetensorError, safe_open  # (reads the header only)

    try:
        with safe_open(str(path), "pt") as f:
            keys, meta = set(f.keys()), dict(f.metadata() or {})
        int(meta["sections_done"])
        if not {"history", "real", "start_latent", "rng_state"} <= keys:
            raise ValueError(f"it lacks {sorted({'history', 'real', 'start_latent', 'rng_state'} - keys)}")
    except (SafetensorError, OSError, KeyError, ValueError) as e:
        raise InputError("job folder", f"{path} is damaged ({str(e).splitlines()[0][:120] or type(e).__name__}); "
                                       f"delete that file and resume again: the job starts again in its folder "
                                       f"from its settings and seed (the same video)") from None


def prepare_resume(job_dir: str | Path) -> ResumeRequest:
    """Check a job folder for resuming and decode its images (once). Raises InputError naming what is wrong."""

    job_dir = Path(job_dir)
    request, info = resume_request(job_dir)
    preset = info["models"]["preset"]
    default_resolution = PRESETS[preset].default_resolution if preset in PRESETS else 640
    prepared = prepare(request, default_resolution, images_prepared=True)
    if info.get("source") is not None:     # an extension's plan starts with its input (pipeline/extend_resume.py)
        from pipeline.extend_resume import restore_source

        whole = not (job_dir / CHECKPOINT).is_file()            # starting again: all of the input's state
        prepared = dataclasses.replace(prepared, source=restore_source(job_dir, info["source"], prepared.request,
                                                                       whole=whole))
    return ResumeRequest(job_dir, prepared, preset)


def resume(job: ResumeRequest, components, memory=None, *, cancel=None, lora_dir=None, compile: str = "auto",
           on_open=None, split=None) -> Generator:
    """Continue the checked job folder `job` (from prepare_resume); yields the same events as generate().
    `compile`, `on_open`, `split`: as generate()'s."""
    from jobfolder.checkpoint import saved_sections
    from memory.manager import MemoryManager
    from pipeline.orchestrator import JobRun
    from pipeline.strategy import Resumed, first_strategy

    if not isinstance(job, ResumeRequest):
        raise TypeError(f"resume() takes a ResumeRequest (from pipeline.prepare_resume), not {type(job).__name__}")
    job_dir = job.job_dir
    if job.request.mode != components.mode or job.preset != components.preset.name:
        yield Failed(f"job folder: {job_dir.name} was made with the {job.preset} preset in {job.request.mode} "
                     f"mode; load those models to resume it")
        return
    try:
        info = load_job(job_dir)         # again: the record as it is now (its settings were checked when prepared)
    except (OSError, ValueError) as e:
        yield Failed(str(_damaged(job_dir, str(e).splitlines()[0][:200])))
        return
    if info.get("status") == "done" and not incomplete(job_dir, info):
        yield Failed(str(AlreadyComplete(job_dir, info.get("final"))))
        return
    rewrite = damaged_sections(job_dir, info)
    broken = incomplete(job_dir, info) if info.get("status") == "done" else list(rewrite.values())
    if broken:
        log.warning("job %s: %s: written again from the checkpoint", job_dir.name, "; ".join(broken))
    for stale in job_dir.glob(".*"):          # temp files of writes the crash cut short
        if stale.is_file() and (stale.name.endswith(".tmp") or ".partial." in stale.name):
            stale.unlink()
    # the same run as a new job's, resumed: from the checkpoint, else started again as it first started
    strategy = Resumed(Job(job_dir, info), saved_sections(job_dir), first_strategy(job.prepared), frozenset(rewrite))
    run = JobRun(job.prepared, components, memory or MemoryManager(), cancel or CancelToken(), job_dir.parent,
                 strategy, lora_dir=lora_dir, compile=compile, on_open=on_open, split=split)
    yield from run.events()
