"""The farm as the runner's executor (jobs/runner.py): the queue's jobs run on the farm's workers, as many at once
as it has; a job's progress names its worker ("[worker-1] sampling ..."), and `placements()` says which worker runs
which queue entry."""
from __future__ import annotations

import dataclasses
from typing import Iterator

from configs.runtime import Config, WebOptions
from farm.dispatch import Farm
from farm.workers import WorkerConfig
from jobs.split import executor_for
from pipeline.events import Progress


class FarmExecutor:
    def __init__(self, farm, models=None):
        self.farm = farm
        self.models = models                    # jobs.models.ComponentCache of this process (LoRA checks)

    @property
    def slots(self) -> int:
        return self.farm.size

    def placements(self) -> dict[str, str]:
        return dict(self.farm.assignments)

    def run(self, work, cancel) -> Iterator:
        job = work.folder if work.resuming is not None else work.prepared
        for event in self.farm.run(work.entry, job, cancel, work.owner):
            if isinstance(event, Progress):
                worker = self.farm.assignments.get(work.entry)
                if worker:
                    event = dataclasses.replace(event, message=f"[{worker}] {event.message or event.stage}")
            yield event

    def close(self) -> None:
        self.farm.shutdown()


def start_farm(config: Config, models=None, *, num_cpus: int | None = None) -> FarmExecutor:
    """Start the farm of the configuration's --ray/--gpus/--cpu-workers (Ray is imported only now). The workers run
    with this process's Config, its folders made absolute (a worker's working folder is not this process's), without
    the web server's options (its --auth passwords never travel to a worker)."""
    absolute = dataclasses.replace(config, outputs=config.outputs.resolve(), lora_dir=config.lora_dir.resolve(),
                                   upscaler_dir=config.upscaler_dir.resolve(),
                                   interpolator_dir=config.interpolator_dir.resolve(),
                                   model_dir=config.model_dir.resolve() if config.model_dir else None,
                                   web=WebOptions())        # the server's logins stay in this process
    return FarmExecutor(Farm.start(config.farm, WorkerConfig(absolute), num_cpus=num_cpus), models)


def queue_executor(config: Config, models, device):
    """What runs the queue's jobs, for the app and the CLI alike: the farm of --ray/--gpus/--cpu-workers (Ray is
    imported only then), else this process on `device` (each job split over --gpus-per-job GPUs: jobs/split.py;
    raises jobs.split.SplitUnavailable where it cannot run)."""
    if config.farm.enabled:          # --gpus-per-job N: workers of N GPUs each (farm/dispatch.py)
        return start_farm(config, models)
    return executor_for(config, models, device, config.gpus_per_job)
