"""Past jobs from outputs/: one entry per job folder with a job.json, newest first, for the gallery, the detail
view, "reuse settings" and "resume".

A job's picture in the gallery is a frame from the middle of its video (kept as thumbnail.jpg in its folder, made
again when the video is newer), else the last latent preview of a job stopped before its first video
(preview.png, saved by the app), else its start image; the caption says its status, length and when it ran.
"""
from __future__ import annotations

import io
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from jobfolder.folder import atomic_write_bytes, load_job
from post.steps import CHUNKS_DIR, is_post

log = logging.getLogger(__name__)

GALLERY_LIMIT = 60
CAPTION_PROMPT = 40          # characters of the prompt on a tile
FILTER_WORDS = 8            # words of the Past jobs filter looked at
FILTER_CHARS = 200          # characters of it kept
STATUS_MARK = {"done": "✓", "stopped": "■", "failed": "✗", "running": "…"}


@dataclass(frozen=True)
class JobEntry:
    dir: Path
    info: dict

    @property
    def id(self) -> str:
        return self.dir.name

    @property
    def status(self) -> str:
        return str(self.info.get("status", "?"))

    @property
    def owner(self) -> str | None:
        owner = self.info.get("owner")
        return owner if isinstance(owner, str) else None

    @property
    def settings(self) -> dict:
        s = self.info.get("settings")
        return s if isinstance(s, dict) else {}

    @property
    def input_image(self) -> Path | None:
        p = self.dir / "input.png"
        return p if p.is_file() else None

    @property
    def end_image(self) -> Path | None:
        p = self.dir / "end.png"
        return p if p.is_file() else None

    def _upload(self, name: str) -> Path | None:
        uploads = self.info.get("uploads")
        file = uploads.get(name) if isinstance(uploads, dict) else None
        if isinstance(file, str) and file and "/" not in file and "\\" not in file and not file.startswith("."):
            p = self.dir / file
            return p if p.is_file() else None
        return None

    @property
    def original_image(self) -> Path | None:
        """The start image as the user uploaded it (jobs since the job folder keeps it), else None."""
        return self._upload("upload")

    @property
    def original_end_image(self) -> Path | None:
        return self._upload("upload_end")

    @property
    def thumbnail(self) -> Path | None:
        """The gallery picture: a frame of the video, else the last preview, else the start image."""
        video = self.video
        if video is not None:
            thumb = video_thumbnail(video, self.dir / THUMBNAIL)
            if thumb is not None:
                return thumb
        preview = self.dir / PREVIEW
        return preview if preview.is_file() else self.input_image

    @property
    def video(self) -> Path | None:
        """final.mp4, else the newest section video (a job that is still running or failed)."""
        names = [self.info.get("final")] + list(reversed(self.info.get("videos") or []))
        for name in names:
            if isinstance(name, str) and "/" not in name and "\\" not in name:
                p = self.dir / name
                if p.is_file():
                    return p
        return None

    @property
    def resumable(self) -> bool:
        """Not finished and has a checkpoint to continue from (a stopped, failed or interrupted job)."""
        from jobfolder.checkpoint import CHECKPOINT

        if is_post(self.settings):                      # a post job continues at its next chunk
            return self.status != "done" and (self.dir / CHUNKS_DIR).is_dir()
        return self.status != "done" and (self.dir / CHECKPOINT).is_file()

    def length_s(self) -> float | None:
        """Seconds of video made (the last recorded section), else None."""
        sections = self.info.get("sections")
        fps = self.settings.get("fps", 30)
        if isinstance(sections, list) and sections and isinstance(sections[-1], dict):
            frames = sections[-1].get("frames")
            if isinstance(frames, int) and isinstance(fps, (int, float)) and fps > 0:
                return frames / fps
        return None

    def when(self) -> str:
        """When the job was created, short: '21 Nov 20:42'."""
        created = self.info.get("created")
        try:
            return time.strftime("%d %b %H:%M", time.strptime(str(created)[:19], "%Y-%m-%dT%H:%M:%S"))
        except ValueError:
            return "?"

    def caption(self) -> str:
        """'✓ done · 2.4 s · 21 Nov 20:42' and, on a second line, the prompt's start and the seed (short enough for a
        gallery tile; the whole prompt is in the details)."""
        length = self.length_s()
        made = f"{length:.1f} s" if length is not None else "no video"
        head = f"{STATUS_MARK.get(self.status, '?')} {self.status} · {made} · {self.when()}"
        prompt = " ".join(str(self.settings.get("prompt") or "").split())
        if is_post(self.settings):                      # a post-processing job: its steps and export instead
            prompt = "after the video: " + " ".join([*map(str, self.settings.get("steps") or []),
                                                     f"→ {self.settings.get('export', 'mp4')}"])
        seed = self.settings.get("seed")
        parts = [f"“{prompt[:CAPTION_PROMPT]}{'…' if len(prompt) > CAPTION_PROMPT else ''}”" if prompt else "",
                 f"seed {seed}" if isinstance(seed, int) else ""]
        tail = " · ".join(t for t in parts if t)
        return f"{head}\n{tail}" if tail else head

    def matches(self, words: str) -> bool:
        """Past jobs' filter: every word (case-insensitive) in the job's id, status, prompt or seed."""
        text = " ".join([self.dir.name, self.status, str(self.settings.get("prompt") or ""),
                         str(self.settings.get("seed", ""))]).lower()
        return all(w in text for w in str(words or "").lower().split()[:FILTER_WORDS])

    def details(self) -> dict:
        """What the detail panel shows: the job's record without the bulky parts."""
        keep = ("id", "status", "created", "finished", "error", "settings", "timings", "final", "videos", "models")
        out = {k: self.info[k] for k in keep if k in self.info}
        mem = self.info.get("memory") or {}
        if mem:
            out["memory"] = {k: mem[k] for k in ("device", "cap_gb", "preserved_gb", "peak_allocated",
                                                  "peak_reserved") if k in mem}
        return out


def read_job(job_dir: Path) -> JobEntry | None:
    try:
        info = load_job(job_dir)
    except (OSError, ValueError) as e:
        log.debug("skipping %s: %s", job_dir, e)
        return None
    return JobEntry(Path(job_dir), info)


def list_jobs(outputs: Path, limit: int = GALLERY_LIMIT, sees=None, words: str = "") -> list[JobEntry]:
    """Job folders under `outputs` that have a readable job.json, newest first (job ids start with the time).
    `sees(owner)`: only the jobs whose job.json "owner" it accepts (ui/access.py); `words`: only those matching
    the Past jobs filter (`JobEntry.matches`)."""
    outputs = Path(outputs)
    if not outputs.is_dir():
        return []
    entries = []
    for d in sorted((p for p in outputs.iterdir() if p.is_dir() and not p.name.startswith(".")),
                    key=lambda p: p.name, reverse=True):
        entry = read_job(d)
        if entry is not None and (sees is None or sees(entry.owner)) and (not words or entry.matches(words)):
            entries.append(entry)
            if len(entries) >= limit:
                break
    return entries


def gallery_items(entries: list[JobEntry], publish=str) -> list[tuple[str, str]]:
    """(picture, caption) for gr.Gallery; entries without a picture are left out (as in shown_entries). `publish`:
    the picture's path → what the gallery is given (the app: a servable copy, ui/media.py)."""
    pictures = ((e.thumbnail, e) for e in entries)
    return [(publish(picture), e.caption()) for picture, e in pictures if picture is not None]


def shown_entries(entries: list[JobEntry]) -> list[JobEntry]:
    """The entries in gallery order (the gallery's select index points into this list): those with a picture."""
    return [e for e in entries if e.thumbnail is not None]


THUMBNAIL = "thumbnail.jpg"
PREVIEW = "preview.png"
THUMBNAIL_WIDTH = 320


def video_thumbnail(video: Path, target: Path) -> Path | None:
    """A frame from the middle of `video` as a JPEG at `target` (kept while it is newer than the video); None when
    the video cannot be read."""
    try:
        if target.is_file() and target.stat().st_mtime >= video.stat().st_mtime:
            return target
        frame = _middle_frame(video)
    except Exception as e:  # a damaged or foreign file: the gallery shows another picture
        log.info("no thumbnail from %s: %s", video, e)
        return None
    if frame is None:
        return None
    if frame.width > THUMBNAIL_WIDTH:
        frame = frame.resize((THUMBNAIL_WIDTH, max(1, round(frame.height * THUMBNAIL_WIDTH / frame.width))))


    buf = io.BytesIO()
    frame.convert("RGB").save(buf, format="JPEG", quality=85)
    atomic_write_bytes(target, buf.getvalue())
    return target


def _middle_frame(video: Path):
    import av

    with av.open(str(video)) as container:
        stream = container.streams.video[0]
        middle = max((stream.frames or 0) // 2, 0)
        last = None
        for i, frame in enumerate(container.decode(stream)):
            last = frame
            if i >= middle:
                break
        return last.to_image() if last is not None else None
