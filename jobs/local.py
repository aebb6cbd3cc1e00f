"""Running a job in this process (the runner's executor when there is no farm): one job at a time, on this machine's
GPU (or CPU). The models are loaded once per mode and kept (jobs/models.py); every job gets its own memory manager
(the VRAM cap, its request's preserved memory, the host-RAM budget). farm/executor.py is the other executor: jobs on
Ray workers, several at once."""
from __future__ import annotations

import logging
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from common.errors import WeightsNotFound
from configs.runtime import Config
from pipeline.events import Failed, LogLine, Progress
from pipeline.logcapture import capture_logs
from post.job import CheckedPost

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Work:
    """What a queue entry runs: a new job (a checked PreparedRequest) or a job folder to continue (a checked
    ResumeRequest), and whose it is."""
    entry: str
    prepared: Any = None                 # pipeline.request.PreparedRequest
    resuming: Any = None                 # pipeline.resume.ResumeRequest
    owner: str | None = None

    @property
    def post(self) -> CheckedPost | None:
        """A post-processing job (post/job.py), new or continued, or None."""
        return self.prepared if isinstance(self.prepared, CheckedPost) else None

    @property
    def request(self):
        return self.resuming.request if self.resuming is not None else self.prepared.request

    @property
    def folder(self) -> Path | None:
        """The job folder it continues (None: a new job)."""
        return self.resuming.job_dir if self.resuming is not None else None


class LocalExecutor:
    slots = 1

    def __init__(self, config: Config, models, device=None):
        self.config = config
        self.models = models                    # jobs.models.ComponentCache
        self.device = device                    # None: memory.default_device()

    def placements(self) -> dict[str, str]:
        return {}

    def _device(self):
        """The device this executor's jobs run on: the one it was given, else the Config's --device (checked) or
        the GPU if there is one (memory/device.py)."""
        from memory.device import chosen_device  # torch: only when a job runs

        return self.device or chosen_device(self.config.device)

    def run(self, work: Work, cancel, split=None) -> Iterator:
        """The job's events (pipeline/events.py), a MemoryReport before its end; always ends with Done or Failed.
        `split`: this process's part of a job split over several GPUs (jobs/split.py), else None."""
        request = work.request
        if work.post is not None:               # post-processing: its own small models, loaded by the job
            from jobs.execute import job_memory, run_job

            memory = job_memory(self.config, request, self._device())
            yield from run_job(work.post, None, memory, self.config, cancel, owner=work.owner)
            return
        if not self.models.is_loaded(request.mode):
            preset = self.models.preset
            what = "loading the tiny models (built in code)" if preset.tiny else \
                f"loading the models (first job; downloads up to {preset.download_gb(request.mode):g} GB once)"
            yield Progress("loading models", 0, 0, 0, request.steps, 0.0, None, what)
            yield LogLine("info", what)
        t0 = time.monotonic()
        with capture_logs() as lines:
            try:
                components, failure = self.models.get(request.mode), None
            except WeightsNotFound as e:
                components = None
                log.info("job %s cannot run: %s", work.entry, e)        # the Failed event carries it on
                failure = Failed(str(e), traceback.format_exc())
        yield from lines
        if components is None:
            yield failure
            return
        log.debug("models ready in %.1f s", time.monotonic() - t0)
        from jobs.execute import job_memory, run_job

        job = work.resuming if work.resuming is not None else work.prepared
        device = split.device if split is not None else self._device()
        memory = job_memory(self.config, request, device)
        if split is not None:
            split.attach(components.transformer)
        try:
            yield from run_job(job, components, memory, self.config, cancel, owner=work.owner, split=split)
        finally:
            if split is not None:
                split.detach()

