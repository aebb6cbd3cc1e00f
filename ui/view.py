"""What the UI shows while a job runs: pipeline events in, component values out.

`JobView.apply(event)` folds one event into the view; `take_changes()` returns only the values that changed
since the last call (by component name), so each streamed update carries as little as possible. `tick()` moves the
elapsed time and the ETA on between events (a long VAE decode sends none), so the bar never looks frozen.
"""
from __future__ import annotations

import dataclasses
import html
import logging
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from jobs.line import Waiting
from jobs.text import format_seconds, progress_parts, waiting_text
from pipeline.events import Cancelled, Done, Failed, LogLine, MemoryReport, Preview, Progress, SectionVideo
from ui.messages import plain

log = logging.getLogger(__name__)

LOG_LINES = 500
PREVIEW_MIN_HEIGHT = 192
PREVIEW_MAX_WIDTH = 1536


def enlarge(image: np.ndarray, min_height: int = PREVIEW_MIN_HEIGHT, max_width: int = PREVIEW_MAX_WIDTH
            ) -> np.ndarray:
    """Nearest-neighbour upscale of a small latent preview so it is visible (a whole factor, width bounded)."""
    h, w = image.shape[:2]
    factor = max(1, min(-(-min_height // max(h, 1)), max_width // max(w, 1)))
    return image.repeat(factor, axis=0).repeat(factor, axis=1) if factor > 1 else image


ORIGINAL_NOTE = ("Original mode makes the end of the video first: section 1 is the last part of the video, and the "
                 "video grows towards the start image.")


QUEUED_TEXT = "Queued: the progress shows here once it starts."    # (the status says where it waits)

def progress_html(p: Progress | None, *, idle_text: str = "Idle: upload an image, write a prompt, press Start.",
                  note: str = "") -> str:
    """A progress bar with the stage, section i/n, step j/m, elapsed and ETA (plain HTML, no script); `note` is a
    line under it (e.g. what the original mode does)."""
    if p is None:
        return f'<div class="sf-progress sf-idle"><div class="sf-progress-text">{html.escape(idle_text)}</div></div>'
    pct = round(100 * p.fraction, 1)
    parts = progress_parts(p)
    text = " · ".join([f"<b>{html.escape(parts[0])}</b>", *parts[1:]])
    detail = html.escape(p.message) if p.message and p.message != p.stage else ""
    return (f'<div class="sf-progress" data-stage="{html.escape(p.stage)}" data-section="{p.section}" '
            f'data-step="{p.step}"><div class="sf-progress-text">{text}</div>'
            f'<div class="sf-progress-track"><div class="sf-progress-fill" style="width:{pct}%"></div></div>'
            f'<div class="sf-progress-detail">{detail}</div>'
            + (f'<div class="sf-progress-note">{html.escape(note)}</div>' if note else "") + '</div>')


def done_status(done: Done, fps: int, seed: int | None = None) -> str:
    """The status of an ended job (with the seed it used, which "New seed for each job" chose)."""
    seconds = done.frames / fps if fps else 0.0
    # the job's id and the file's name, never the server's path (the page and the API answer clients)
    where = (f"`{done.job_dir.name}/{done.video.name}`" if done.job_dir is not None else f"`{done.video.name}`") \
        if done.video else "no video"
    total = done.timings.get("total")
    took = f" in {format_seconds(total)}" if total is not None else ""
    if done.stopped:
        if done.video is None:
            return f"■ **Stopped** before the first section was finished{took}: no video was made."
        return f"■ **Stopped**: kept the video made so far, {done.frames} frames ({seconds:.1f} s){took} → {where}"
    used = f", seed {seed}" if isinstance(seed, int) and not isinstance(seed, bool) else ""
    return f"✓ **Done**: {done.frames} frames ({seconds:.1f} s){took}{used} → {where}"


@dataclass
class JobView:
    fps: int = 30
    mode: str = ""
    seed: int | None = None                      # the seed the job uses (said in Done)
    preview: np.ndarray | None = None
    video: str | None = None
    progress: Progress | None = None
    status: str = ""
    result: Done | Failed | Cancelled | None = None
    memory: MemoryReport | None = None
    log_lines: deque = field(default_factory=lambda: deque(maxlen=LOG_LINES))
    videos_seen: int = 0
    waiting: Waiting | None = None
    progress_at: float = 0.0                     # when the shown progress came (tick() counts from there)
    _shown: Progress | None = None               # the progress as shown: moved on by tick()
    _changed: set = field(default_factory=set)

    def _log(self, level: str, message: str) -> None:
        prefix = "" if level == "info" else f"{level.upper()}: "
        for line in message.splitlines() or [""]:
            self.log_lines.append(f"{time.strftime('%H:%M:%S')} {prefix}{line}")
        self._changed.add("log")

    def apply(self, event) -> None:
        if isinstance(event, Progress):
            self.progress = self._shown = event
            self.progress_at = time.monotonic()
            if self.waiting is not None or not self.status:
                self.waiting = None
                self.status = "Running…"
                self._changed.add("status")
            self._changed.add("progress")
        elif isinstance(event, Waiting):
            self.waiting = event
            self.status = waiting_text(event)
            self._changed.update({"status", "progress"})
        elif isinstance(event, Preview):
            self.preview = enlarge(event.image)
            self._changed.add("preview")
        elif isinstance(event, LogLine):
            self._log(event.level, event.message)
        elif isinstance(event, SectionVideo):
            self.video = str(event.path)
            self.videos_seen += 1
            self.status = (f"Section {event.section}/{event.sections} ready: {event.frames} frames "
                           f"({event.seconds:.1f} s) so far…")
            self._changed.update({"video", "status"})
        elif isinstance(event, Done):
            self.result = event
            if event.video is not None:
                self.video = str(event.video)
                self._changed.add("video")
            self.status = done_status(event, self.fps, self.seed)
            self._log("info", self.status.replace("**", "").replace("`", ""))
            self._finish_progress("stopped" if event.stopped else "done", event.timings.get("total"))
            self._changed.add("status")
        elif isinstance(event, Failed):
            self.result = event
            self.status = f"✗ **Failed**: {plain(event.message)}"
            if event.partial_video is not None:
                self.video = str(event.partial_video)
                self.status += " (the video made before the failure is kept)"
                self._changed.add("video")
            self._log("error", event.message)
            if event.detail:
                self._log("error", event.detail.rstrip())
            self._finish_progress("failed")
            self._changed.add("status")
        elif isinstance(event, Cancelled):
            self.result = event
            self.status = f"■ {event.message}"
            self._finish_progress("cancelled")
            self._changed.add("status")
        elif isinstance(event, MemoryReport):
            self.memory = event
            self._changed.add("memory")
        else:
            log.debug("ignored event %r", event)

    def tick(self, now: float | None = None) -> None:
        """Between events: the shown elapsed time grows and the ETA shrinks by the time since the last progress.
        While the job waits in line its place is said again: a look at the runner's job that this tab asked for just
        before its Start (panel_run.watch) may answer after the Start's own status and cover it."""
        p = self.progress
        if self.waiting is not None and p is None and self.result is None:
            self._changed.add("status")
        if p is None or self.result is not None:
            return
        dt = max((time.monotonic() if now is None else now) - self.progress_at, 0.0)
        self._shown = dataclasses.replace(p, elapsed_s=p.elapsed_s + dt,
                                          eta_s=None if p.eta_s is None else p.eta_s - dt)
        self._changed.add("progress")

    def _progress_html(self) -> str:
        if self.waiting is not None and self.progress is None:      # the status says where it stands in line
            return progress_html(None, idle_text=QUEUED_TEXT)
        note = ORIGINAL_NOTE if self.mode == "original" and self.result is None and self.progress is not None \
            and self.progress.sections > 1 else ""
        return progress_html(self._shown, note=note)

    def _finish_progress(self, stage: str, total_s: float | None = None) -> None:
        """The progress line of an ended job; `total_s`: the job's whole time (Done.timings' "total", the clock of
        every Progress.elapsed_s), which the line then says as the status does (the last progress event came
        before the last decode and the video's end)."""
        p = self.progress
        if p is None:
            self.progress = Progress(stage, 0, 0, 0, 0, 0.0 if total_s is None else float(total_s), None, stage)
            self.waiting = None
        else:
            done = stage == "done"
            elapsed = p.elapsed_s if total_s is None else float(total_s)
            self.progress = Progress(stage, p.sections if done else p.section, p.sections,
                                     p.steps if done else p.step, p.steps, elapsed, None, stage)
        self._shown = self.progress
        self._changed.add("progress")

    @property
    def log_text(self) -> str:
        return "\n".join(self.log_lines)

    def take_changes(self) -> dict:
        """Values of the components that changed since the last call: names preview, video, progress, log,
        status, memory (the MemoryReport itself)."""
        values = {"preview": self.preview, "video": self.video,
                  "progress": self._progress_html(), "log": self.log_text, "status": self.status,
                  "memory": self.memory}
        out = {name: values[name] for name in self._changed}
        self._changed = set()
        return out
