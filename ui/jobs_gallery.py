"""Past jobs from outputs/: one entry per job folder with a job.json, newest first, for the gallery, the detail
view, "reuse settings" and "resume"."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

GALLERY_LIMIT = 60
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
    def settings(self) -> dict:
        s = self.info.get("settings")
        return s if isinstance(s, dict) else {}

    @property
    def thumbnail(self) -> Path | None:
        p = self.dir / "input.png"
        return p if p.is_file() else None

    @property
    def end_image(self) -> Path | None:
        p = self.dir / "end.png"
        return p if p.is_file() else None

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
        from pipeline.checkpoint import CHECKPOINT

        return self.status != "done" and (self.dir / CHECKPOINT).is_file()

    def caption(self) -> str:
        s = self.settings
        prompt = str(s.get("prompt") or "(no prompt)")
        prompt = prompt if len(prompt) <= 40 else prompt[:39] + "…"
        seconds = s.get("seconds")
        length = f"{float(seconds):g} s · " if isinstance(seconds, (int, float)) else ""
        return f"{STATUS_MARK.get(self.status, '?')} {length}seed {s.get('seed', '?')} · {prompt}"

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
    from pipeline.jobs import load_job

    try:
        info = load_job(job_dir)
    except (OSError, ValueError) as e:
        log.debug("skipping %s: %s", job_dir, e)
        return None
    return JobEntry(Path(job_dir), info)


def list_jobs(outputs: Path, limit: int = GALLERY_LIMIT) -> list[JobEntry]:
    """Job folders under `outputs` that have a readable job.json, newest first (job ids start with the time)."""
    outputs = Path(outputs)
    if not outputs.is_dir():
        return []
    entries = []
    for d in sorted((p for p in outputs.iterdir() if p.is_dir() and not p.name.startswith(".")),
                    key=lambda p: p.name, reverse=True):
        entry = read_job(d)
        if entry is not None:
            entries.append(entry)
            if len(entries) >= limit:
                break
    return entries


def gallery_items(entries: list[JobEntry]) -> list[tuple[str, str]]:
    """(thumbnail path, caption) for gr.Gallery; jobs without an input image are left out."""
    return [(str(e.thumbnail), e.caption()) for e in entries if e.thumbnail is not None]


def shown_entries(entries: list[JobEntry]) -> list[JobEntry]:
    """The entries in gallery order (the gallery's select index points into this list)."""
    return [e for e in entries if e.thumbnail is not None]
