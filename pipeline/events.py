"""The typed events of a job, one type per kind of news: what a generation yields (Progress ... Done / Failed) and
what the UI's job runner adds around it (MemoryReport after a job, Cancelled for a job that never started). A UI or
the CLI turns them into updates. Light: no torch, no diffusers (numpy only)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class Started:
    """The job has its folder (job.json and its images written, jobfolder/folder.py): from here on, whatever happens
    to the process, `resume` continues it there. A queue notes the folder at this event."""
    job_dir: Path
    resumed: bool = False       # continuing a folder that was made before


@dataclass(frozen=True)
class Progress:
    stage: str                  # "text encoders", "VAE encode", "image encoder", "sampling", "VAE decode", ...
    section: int                # 1-based; 0 before sampling starts
    sections: int
    step: int                   # 1-based within the section; 0 outside sampling
    steps: int
    elapsed_s: float
    eta_s: float | None         # None until an estimate exists
    message: str = ""
    eta_note: str = ""          # why the estimate went up, while that holds (pipeline/eta.py), else ""

    @property
    def fraction(self) -> float:
        """Overall completion in [0, 1], counting sampling steps."""
        if self.sections <= 0 or self.steps <= 0:
            return 0.0
        done = max(self.section - 1, 0) * self.steps + self.step
        return min(done / (self.sections * self.steps), 1.0)


@dataclass(frozen=True)
class Preview:
    image: np.ndarray           # H×W×3 uint8: the latent window mapped to RGB, frames side by side
    section: int
    step: int


@dataclass(frozen=True)
class LogLine:
    level: str                  # "info" | "warning" | "error"
    message: str                # stage messages: memory status, fallback statistics, VAE-decode log


@dataclass(frozen=True)
class WorkerLine(LogLine):
    """A LogLine saying which farm worker, on which machine, runs the job (farm/dispatch.py): shown like any info
    line, and the command line prints it even when quiet about info lines."""
    worker: str = ""
    node: str = ""


@dataclass(frozen=True)
class SectionVideo:
    path: Path                  # a new file per section (browsers reload it)
    frames: int
    seconds: float
    section: int
    sections: int


@dataclass(frozen=True)
class Done:
    job_dir: Path
    video: Path | None
    frames: int
    stopped: bool               # True when the user stopped the job: the video made so far
    timings: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Failed:
    message: str                        # short, for the user: what went wrong and what to change
    detail: str = ""                    # the traceback, for the log
    job_dir: Path | None = None         # None: refused before a job folder existed
    partial_video: Path | None = None   # the video made before the failure, if any


@dataclass(frozen=True)
class MemoryReport:
    """Sent after a job (UI runner): the memory timeline and stage records of its MemoryManager."""
    timeline: list
    records: list
    device: str


@dataclass(frozen=True)
class Cancelled:
    """The session pressed End while its job was still waiting: nothing ran."""
    message: str = "Cancelled before it started."


Event = Started | Progress | Preview | LogLine | SectionVideo | Done | Failed
RunnerEvent = Event | MemoryReport | Cancelled
