"""Resuming an extension (pipeline/extend.py): what the input stood for is rebuilt from job.json's "source".

An extension's plan starts with the input's sections, so a resume needs that count, and, for an input video, its
frames (they start the output video as they are). The job folder keeps a copy of the input video
(`input_video.<ext>`, recorded as the source's "kept"), so a resume does not depend on the user's file (or an
upload's temporary file) still being there; the copy, or else the file at the recorded path, must have the
recorded sha256. Decoding the same file with the same settings gives the same frames (pipeline/video_input.py), so
the resumed video equals an uninterrupted one. A job folder as the input needs nothing more: the extension's own
checkpoint holds the whole history (the input job's latents included), and its sections are decoded again from it
as any resume's are. The original mode's directions (backward, toward an end frame) follow from the settings (the
mode, the job's end.png), as when it was started; an extension toward an end frame keeps the input's prefix latents
in its checkpointed history, so it needs only the frames.
"""
from __future__ import annotations

from pathlib import Path

from common.errors import InputError
from common.files import atomic_copy, file_sha256
from pipeline.extend import FORWARD, TO_END, ExtendSource, direction, job_source, min_frames
from pipeline.video_input import VIDEO_SUFFIXES, load_video

KEPT_STEM = "input_video"               # the job folder's copy of an input video: input_video.mp4, .webm …


def kept_record(job, source: ExtendSource) -> dict:
    """job.json's "source" for a new extension; an input video is copied into the job folder first."""
    record = source.record()
    if source.kind == "video":
        suffix = source.path.suffix.lower()
        name = KEPT_STEM + (suffix if suffix in VIDEO_SUFFIXES else ".video")
        atomic_copy(source.path, job.path(name))
        record["kept"] = name
    return record


def _damaged(job_dir: Path, why: str) -> InputError:
    return InputError("job folder", f"{job_dir.name}/job.json: its source ({why}) cannot be read; it cannot be "
                                    f"resumed: extend the input again")


def restore_source(job_dir: Path, record, request, *, whole: bool = False) -> ExtendSource:
    """The ExtendSource of a job folder's recorded "source", for resuming it with `request` (its checked settings).
    `whole`: the extension starts again (no section of its own was finished), so an input job's latents are read
    too, as when it was started. Raises InputError when the record is damaged or the input is gone or changed."""
    if not isinstance(record, dict) or record.get("kind") not in ("video", "job"):
        raise _damaged(job_dir, "kind")
    done, sha, way = record.get("sections_as_context"), record.get("sha256"), direction(request)
    least = 0 if way == TO_END else 1          # toward an end frame the input stands for no section of the plan
    if isinstance(done, bool) or not isinstance(done, int) or done < least or not isinstance(sha, str):
        raise _damaged(job_dir, "sections_as_context or sha256")
    if record.get("direction", FORWARD) != way:     # the mode and the end image say which way it extends
        raise _damaged(job_dir, f"direction {record.get('direction', FORWARD)!r}, but the settings extend {way}")
    path = Path(str(record.get("path", "")))
    if record["kind"] == "job":
        if not whole:
            return ExtendSource("job", path, sha, done, job_seed=record.get("seed"), preset=record.get("preset"))
        source, _ = job_source(path, request)
        if source.sha256 != sha or source.sections_done != done:
            raise InputError("job folder", f"{job_dir.name} extends the job {path.name}, which has changed since "
                                           f"(its video or latents differ): extend it again")
        return source
    kept = record.get("kept")
    candidates = [job_dir / kept] if isinstance(kept, str) and kept and Path(kept).name == kept else []
    candidates.append(path)
    found = next((p for p in candidates if p.is_file() and file_sha256(p) == sha), None)
    if found is None:
        raise InputError("job folder", f"{job_dir.name} extends the video {path.name}; neither the job folder's copy "
                                       f"nor {path} is that video any more (missing, or its sha256 differs): extend "
                                       f"the video again")
    video = load_video(found, request.resolution, request.fps, min_frames(request.latent_window))
    tail = record.get("encoded_frames")
    if len(video.frames) != record.get("frames") or not isinstance(tail, int) or not 0 < tail <= len(video.frames):
        raise _damaged(job_dir, f"{len(video.frames)} frames decoded, {record.get('frames')} recorded")
    return ExtendSource("video", found, sha, done, video=video, tail_frames=tail, direction=way)
