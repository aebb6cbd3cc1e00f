"""Running one job, the same way for every executor: the local one (jobs/local.py), the farm's workers
(farm/workers.py), a new job or a job folder to continue.

`run_job(job, components, memory, config, cancel)` takes a checked job (a PreparedRequest: a new job; a ResumeRequest:
continue its folder), the loaded models, the job's memory manager (`job_memory`) and the process's one `Config`, and
yields the job's events. Heavy (torch): the executors import it when a job runs. Every job-scoped setting comes
from that Config: where the LoRAs are (--lora-dir), the outputs folder, the compile choice (--no-compile), the
memory manager's cap, host-RAM budget, weight storage and switches; fp8 compute is the models' (jobs/models.py,
from the same Config). A new job goes through
`pipeline.orchestrator.generate()` (its mode and extension checks) and a folder through `pipeline.resume.resume()`.
"""
from __future__ import annotations

from collections.abc import Generator
from typing import Callable, Iterator

from configs.runtime import Config
from jobfolder.folder import Job
from memory.manager import MemoryManager
from pipeline.cancel import CancelToken
from pipeline.events import Done, Failed, MemoryReport
from pipeline.orchestrator import generate
from pipeline.resume import ResumeRequest, resume
from post.job import CheckedPost, folders_of, run_post


def compile_choice(config: Config) -> str:
    """The pipeline's compile choice from the process's: "auto" (compiled where the device can), "off"."""
    return "auto" if config.compile else "off"


def job_memory(config: Config, request, device, host_ram_gb: float | None = None) -> MemoryManager:
    """The memory manager of one job on `device`: the Config's cap, host-RAM budget (`host_ram_gb` instead: a farm
    worker's share), weight storage and switches, and the request's preserved memory."""
    options = config.memory_options()
    if host_ram_gb is not None:
        options["host_ram_gb"] = host_ram_gb
    return MemoryManager(device=device, preserved_gb=request.preserved_gb, **options)


def run_job(job, components, memory: MemoryManager, config: Config, cancel: CancelToken, *,
            owner: str | None = None, on_open: Callable[[Job], None] | None = None, split=None) -> Iterator:
    """The events of `job` (pipeline.request.PreparedRequest: a new job; pipeline.resume.ResumeRequest: continue its
    folder; post.job.CheckedPost: a post-processing job, new or continued, `components` unused), a MemoryReport
    (the memory timeline) just before the end; always ends with one Done or Failed.
    `owner`: the user who started a new job. `on_open(job)`: called with the run's own job folder (jobfolder/folder.py)
    as soon as it is open, so what it records is kept by the run's later writes (a farm worker notes itself).
    `split`: this process's part of a job split over several GPUs (jobs/split.py, pipeline/split.py), else None."""
    events: Iterator
    if isinstance(job, CheckedPost):
        events = run_post(job, memory, cancel=cancel, outputs=config.outputs, folders=folders_of(config), owner=owner)
    elif isinstance(job, ResumeRequest):
        events = resume(job, components, memory, cancel=cancel, lora_dir=config.lora_dir,
                        compile=compile_choice(config), on_open=on_open, split=split)
    else:
        events = generate(job, components, memory, cancel=cancel, outputs=config.outputs, lora_dir=config.lora_dir,
                          owner=owner, compile=compile_choice(config), on_open=on_open, split=split)
    try:
        for event in events:
            if isinstance(event, (Done, Failed)):
                yield MemoryReport(list(memory.timeline), list(memory.records), str(memory.device))
            yield event
    finally:
        if isinstance(events, Generator):       # a run stopped early still ends its stages (their `finally`)
            events.close()
