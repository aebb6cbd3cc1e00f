"""One folder per job under outputs/: input images, a video per section, final.mp4 and job.json.

Job ids are generated (time + random), never taken from user text. A job folder is there whole or not at all: it is
made under a hidden name, gets its images and then job.json, and only then takes its id (`Job.create`), so a folder
named by an id always holds what its job needs to run again. Every file is written atomically (common/files.py:
temp file + rename), so a crash never leaves a half-written file under a real name. job.json says what state the
job is in: running, done, stopped or failed.
"""
from __future__ import annotations

import io
import json
import platform
import secrets
import shutil
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Callable

from common.files import atomic_copy, atomic_write_bytes, atomic_write_json, file_sha256, rename_new

CHECKPOINT = "latents.safetensors"       # the latest section's latents and random state (jobfolder/checkpoint.py)
PACKAGES = ("torch", "diffusers", "transformers", "accelerate", "huggingface_hub", "safetensors", "av", "gradio",
            "pillow", "numpy")


def package_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    try:
        import torch

        out["torch_cuda"] = torch.version.cuda
        out["torch_hip"] = torch.version.hip
    except ImportError:
        pass
    return out


UPLOAD_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff")


def new_job_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


PARTIAL_SUFFIX = ".partial"             # a job folder being made: .<id>.partial, hidden from every listing
PARTIAL_STALE_S = 3600.0                # one this old was left by a process that died while making it


def sweep_partial(outputs: Path) -> None:
    """Remove the half-made job folders a killed process left behind (older than an hour: another process may be
    making one right now)."""
    for d in Path(outputs).glob("." + "*" + PARTIAL_SUFFIX):
        try:
            if d.is_dir() and time.time() - d.stat().st_mtime > PARTIAL_STALE_S:
                shutil.rmtree(d, ignore_errors=True)
        except OSError:
            pass


@dataclass
class Job:
    dir: Path
    info: dict = field(default_factory=dict)
    detached: bool = False          # another process runs this job now: this one writes nothing more (`detach`)
    owner: Callable[[], bool] | None = None     # asked before each write: does this process still run the job?

    def writable(self) -> bool:
        """May this process still write the job's record (not detached, and `owner` still says so)?"""
        if not self.detached and self.owner is not None and not self.owner():
            self.detached = True
        return not self.detached

    @property
    def id(self) -> str:
        return self.dir.name

    @classmethod
    def create(cls, outputs: Path, settings: dict, models: dict, fill=None) -> "Job":
        """A new job folder, there whole or not at all: made as a hidden `.<id>.partial`, filled by `fill(job)` (the
        files the job starts from: its images, an input video's copy; it may add to `job.info`), given job.json
        last, then renamed to its id. If `fill` fails the folder is removed; a process killed meanwhile leaves only
        the hidden folder (swept an hour later)."""
        outputs = Path(outputs)
        outputs.mkdir(parents=True, exist_ok=True)
        sweep_partial(outputs)
        for _ in range(10):
            job_id = new_job_id()
            partial = outputs / f".{job_id}{PARTIAL_SUFFIX}"
            if (outputs / job_id).exists():
                continue
            try:
                partial.mkdir()
                break
            except FileExistsError:
                continue
        else:
            raise RuntimeError(f"could not create a job folder in {outputs}")
        job = cls(partial, {"id": job_id, "status": "running", "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                            "settings": settings, "models": models, "versions": package_versions(),
                            "sections": [], "timings": {}, "memory": {}, "videos": [], "final": None,
                            "error": None})
        try:
            if fill is not None:
                fill(job)
            job.save()
            rename_new(partial, outputs / job_id)     # never over a folder; Windows: waits for a scanner
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        job.dir = outputs / job_id
        return job

    def path(self, name: str) -> Path:
        return self.dir / name

    def save(self) -> None:
        if self.writable():
            atomic_write_json(self.dir / "job.json", self.info)

    def detach(self) -> None:
        """This process lost the job to another (the queue's lease was taken): nothing is written from now on."""
        self.detached = True

    def update(self, **fields) -> None:
        self.info.update(fields)
        self.save()

    def save_image(self, name: str, image) -> Path:
        buf = io.BytesIO()
        image.save(buf, format="PNG")
        path = self.path(name)
        atomic_write_bytes(path, buf.getvalue())
        return path

    def keep_upload(self, name: str, source) -> Path | None:
        """Copy the file a user gave (an image path) into the job folder as `name` + its image suffix, untouched,
        and note it in the record's "uploads" (the app's "Reuse settings" puts it back; saved with job.json's next
        write). Other sources (bytes, arrays, PIL images) are not files of the user's: nothing is kept."""
        if not isinstance(source, (str, Path)) or not Path(source).is_file():
            return None
        suffix = Path(source).suffix.lower()
        path = self.path(name + (suffix if suffix in UPLOAD_SUFFIXES else ".img"))
        atomic_write_bytes(path, Path(source).read_bytes())
        self.info.setdefault("uploads", {})[name] = path.name
        return path

    def finish(self, status: str, final: Path | None, *, error: str | None = None, timings: dict | None = None,
               memory: dict | None = None, frames: int = 0) -> None:
        """The job's end in job.json: its status, its final video and how many frames it has (`frames`)."""
        if not self.writable():
            return
        if final is not None and final.name != "final.mp4":
            final = atomic_copy(final, self.path("final.mp4"))
        self.update(status=status, final=final.name if final else None, frames=frames, error=error,
                    final_sha256=file_sha256(final) if final else None,     # what "done" is checked against
                    finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"), timings=timings or self.info["timings"],
                    memory=memory or self.info["memory"])
        if status == "done" and final is not None and self.info.get("settings", {}).get("keep_final_only") == "on":
            self.drop_section_videos()

    def drop_section_videos(self) -> None:
        """Keep only the final video (the `keep_final_only` control): delete the section videos of a job that is
        done, and only once final.mp4 is there. A stopped or failed job keeps them (Resume decodes its sections
        again from the checkpoint, and a done job is never resumed; Extend uses final.mp4)."""
        if self.info.get("status") != "done" or not self.path("final.mp4").is_file():
            return
        for name in self.info.get("videos") or []:
            if isinstance(name, str) and "/" not in name and "\\" not in name and name != "final.mp4":
                try:
                    self.path(name).unlink(missing_ok=True)
                except OSError:             # held open (Windows): it stays, nothing else depends on it
                    pass
        self.update(videos=[], section_videos="deleted (keep only the final video)")


JOB_JSON_MAX_BYTES = 4 << 20          # a real job.json is a few kB; anything far larger was not written by a job


def load_job(job_dir: Path) -> dict:
    """A job's job.json. Raises OSError when it cannot be read, ValueError when it is not a JSON object of sane
    size and depth (a hand-edited or foreign file): bounded work whatever the file holds."""
    path = Path(job_dir) / "job.json"
    size = path.stat().st_size
    if size > JOB_JSON_MAX_BYTES:
        raise ValueError(f"{path.name} is {size} bytes, more than a job ever writes ({JOB_JSON_MAX_BYTES} at most)")
    try:
        info = json.loads(path.read_text("utf-8"))
    except RecursionError:
        raise ValueError(f"{path.name} is nested too deeply to be a job's record") from None
    if not isinstance(info, dict):
        raise ValueError(f"{path.name} does not hold a JSON object")
    return info


def mark_stopped(job_dir: Path, reason: str) -> bool:
    """A job whose process ends while it runs (no step could end it): its job.json says "stopped" with `reason`, so
    that it reads as resumable, not as running. False when job.json is missing, unreadable or not "running"."""
    try:
        info = load_job(job_dir)
    except (OSError, ValueError):
        return False
    if info.get("status") != "running":
        return False
    info.update(status="stopped", error=reason)
    atomic_write_json(Path(job_dir) / "job.json", info)
    return True


def result_of(job_dir: Path) -> tuple[Path | None, int]:
    """What a job's record says it made: (its final video, when job.json names one that is there; its frames). (None,
    0) when it made none or the record cannot be read. Light: reads job.json only."""
    try:
        info = load_job(job_dir)
    except (OSError, ValueError):
        return None, 0
    final, frames = info.get("final"), info.get("frames")
    frames = frames if isinstance(frames, int) and not isinstance(frames, bool) and frames >= 0 else 0
    if not isinstance(final, str) or "/" in final or "\\" in final or not (Path(job_dir) / final).is_file():
        return None, frames
    return Path(job_dir) / final, frames


def video_problem(job_dir: Path, name: str, sha256: str | None, frames: int | None) -> str | None:
    """Why the video `name` of a job folder is not the one its record says was written (None: it is): missing,
    other bytes than the SHA-256 recorded when it was written, or (a record without it) not decoding to the frame
    count recorded."""
    path = Path(job_dir) / name
    if not path.is_file():
        return f"{name} is missing"
    if sha256:
        return None if file_sha256(path) == sha256 else f"{name} is damaged (not the bytes that were written)"
    if not isinstance(frames, int):
        return None                             # nothing recorded to check it against
    from video.mp4 import decoded_frames  # (PyAV) an older record only

    try:
        got = decoded_frames(path)
    except (OSError, ValueError) as e:          # av's errors are OSErrors or ValueErrors
        return f"{name} is damaged (it cannot be decoded: {str(e).splitlines()[0][:120] if str(e) else type(e).__name__})"
    return None if got == frames else f"{name} is damaged ({got} frames decode, {frames} were written)"


def _section_records(info: dict) -> dict[int, dict]:
    return {s["section"]: s for s in info.get("sections") or [] if isinstance(s, dict) and isinstance(s.get("section"), int)}


def final_problem(job_dir: Path, info: dict) -> str | None:
    """Why a job whose record says "done" is not complete (None: it is): its final video missing, or not what was
    written (its recorded SHA-256, or the frame count of its last section when an older record has no hash)."""
    final = info.get("final")
    if not isinstance(final, str) or "/" in final or "\\" in final or not final:
        return "its record names no final video"
    sections = _section_records(info)
    frames = info.get("frames") or (sections[max(sections)] if sections else {}).get("frames")
    return video_problem(job_dir, final, info.get("final_sha256"), frames)


def damaged_sections(job_dir: Path, info: dict) -> dict[str, str]:
    """The section videos a job's record lists that are missing or not what was written: {name: why}."""
    sections = _section_records(info)
    out = {}
    for name in info.get("videos") or []:
        if not isinstance(name, str) or "/" in name or "\\" in name or not name.startswith("section_"):
            continue
        try:
            record = sections.get(int(name.removeprefix("section_").removesuffix(".mp4")), {})
        except ValueError:
            continue
        problem = video_problem(job_dir, name, record.get("video_sha256"), record.get("frames"))
        if problem:
            out[name] = problem
    return out


def incomplete(job_dir: Path, info: dict) -> list[str]:
    """What keeps a job folder from being complete, whatever its record says: its final video and each section
    video it lists that is missing or not what was written ([]: all are as written)."""
    final = final_problem(job_dir, info)
    return [*([final] if final else []), *damaged_sections(job_dir, info).values()]


def finished_video(job_dir: Path) -> Path | None:
    """The final video of a job that is complete: job.json says "done" and its final and section videos are the
    files that were written (`incomplete`), else None. Light (job.json and a hash of the file; PyAV only for an older record),
    so a command can say "already complete" before loading anything."""
    try:
        info = load_job(job_dir)
    except (OSError, ValueError):
        return None
    if info.get("status") != "done" or incomplete(job_dir, info):
        return None
    return Path(job_dir) / info["final"]
