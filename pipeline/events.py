"""The typed events a generation yields, one type per kind of news. A UI or the CLI turns them into updates."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


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
    message: str                # short, for the user: what went wrong and what to change
    detail: str                 # the traceback, for the log
    job_dir: Path | None
    partial_video: Path | None  # the video made before the failure, if any


Event = Progress | Preview | LogLine | SectionVideo | Done | Failed
