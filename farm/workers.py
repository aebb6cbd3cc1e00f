"""A farm worker: one Ray actor per GPU (or per CPU "device"), running whole jobs the way the app does: the one
function that runs a job (jobs/execute.py `run_job`, with the process's `Config`: LoRA folder, outputs, compile,
cap, host-RAM budget, fp8), so a new job goes through `pipeline.orchestrator.generate()` and its checks.

Each worker is its own process: its own models (jobs.models.ComponentCache), its own MemoryManager per job (the VRAM
cap is set on the worker's GPU; the host-RAM budget is this worker's), nothing shared with the other workers by
accident. `run` is an actor generator: the dispatcher receives each event as it is made. `stop` runs beside it (a
threaded actor with room for both), so End reaches a job on any worker. The class is plain Python; farm/dispatch.py
makes it a Ray actor (this module imports neither Ray nor torch at import time).
"""
from __future__ import annotations

import importlib
import logging
import os
import socket
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import rocm
from common.units import GIB
from configs.runtime import Config
from jobs.local import Work
from jobs.models import models_for
from jobs.split import SplitPool, each_process, split_devices
from memory.hostbudget import default_host_budget
from pipeline.cancel import CancelToken
from pipeline.events import Failed
from post.job import CheckedPost

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerConfig:
    """What a worker runs with: the process's one `Config` (every job-scoped setting: preset, models, outputs, LoRA
    folder, cap, host-RAM budget, weight storage, switches, compile, fp8 compute; its paths absolute, the worker's
    working folder is not the app's) and what only a farm worker has."""
    config: Config
    use_gpu: bool = True                   # False: a CPU "device" (tests, --cpu-workers)
    share: int | None = None               # workers on one machine (the default host budget is split between them);
                                           # None: the GPUs of the worker's Ray node (one worker per GPU)
    loader: str | None = None              # "module:function" building the models (preset, mode, model_dir); None:
                                           # the preset's own loading (benchmarks/farm.py: full-size random weights)


@dataclass(frozen=True)
class Placed:
    """A worker took a job: its name, its node and the job's folder (None until the folder exists)."""
    worker: str
    node: str
    job_dir: Path | None


def node_name() -> str:
    """This machine as the farm names it: the host name, and the Ray node's IP address when there is one."""
    try:
        import ray

        return f"{socket.gethostname()} ({ray.util.get_node_ip_address()})"
    except Exception:        # outside Ray (plain tests): the host name alone
        return socket.gethostname()


def _loader(spec: str | None):
    if spec is None:
        return None

    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def host_share(config: WorkerConfig) -> tuple[float | None, str]:
    """This worker's host-RAM budget (GB) and why. --host-ram-gb applies to each worker as given; without it, the
    machine's default budget (memory.hostbudget) is split between the workers on the machine, so N workers that
    each hold their own models never plan on the same RAM."""
    given = config.config.host_ram_gb
    if given is not None:
        return given, f"host RAM budget {given:g} GB (--host-ram-gb, per worker)"

    share = config.share or _gpus_of_this_node() or 1
    budget, text = default_host_budget()
    return budget / share / GIB, f"{text}; split between {share} worker(s) on this machine: " \
                                 f"{budget / share / GIB:.1f} GB each"


def _gpus_of_this_node() -> int:
    import ray

    here = ray.get_runtime_context().get_node_id()
    return next((int(n["Resources"].get("GPU", 0)) for n in ray.nodes() if n["NodeID"] == here), 0)


def record_placement(job, worker: str, node: str) -> None:
    """job.json says which worker and node ran the job: the last one as `worker`/`node`, every one in `workers`."""
    history = list(job.info.get("workers", []))
    history.append({"worker": worker, "node": node})
    job.update(worker=worker, node=node, workers=history)


class JobWorker:
    def __init__(self, name: str, config: WorkerConfig):
        rocm.apply_env_profile()             # before torch loads in this process

        self.name, self.config = name, config
        self.node = node_name()
        self.host_ram_gb, budget_text = host_share(config)
        log.info("%s: %s", name, budget_text)
        # with --fp8-compute: this worker's GPU can multiply in fp8, or the worker refuses to start
        self.models = models_for(config.config, self._device(), _loader(config.loader))
        per = config.config.gpus_per_job            # each job split over this worker's GPUs (jobs/split.py)
        self.split_devices = split_devices(per, self._device()) if per > 1 else []
        self.split_config = each_process(config.config, per, self.host_ram_gb) if per > 1 else config.config
        self.split_pool = SplitPool(self.split_devices, self.split_config) if per > 1 else None   # kept between jobs
        self._cancels: dict[str, CancelToken] = {}
        self._lock = threading.Lock()
        log.info("farm worker %s on %s (pid %d)", name, self.node, os.getpid())

    def info(self) -> dict:
        return {"name": self.name, "node": self.node, "pid": os.getpid(), "device": str(self._device())}

    def _device(self):
        import torch

        from memory.device import chosen_device

        if self.config.use_gpu and torch.cuda.is_available():
            return chosen_device("cuda:0")           # Ray gives the actor one GPU: the first it can see (current)
        return torch.device("cpu")

    def load(self, mode: str) -> float:
        """Load (or build) the models of `mode` now; the seconds it took (0 when they were loaded)."""
        t = time.monotonic()
        self.models.get(mode)
        return time.monotonic() - t

    def stop(self, key: str) -> bool:
        """End the job `key` at its next step (it keeps the video made so far). False when it is not running here."""
        with self._lock:
            cancel = self._cancels.get(key)
        if cancel is not None:
            cancel.cancel()
        return cancel is not None

    def run(self, key: str, job, owner: str | None = None) -> Iterator:
        """Run `job` (a PreparedRequest: a new job; a Path: continue that job folder) and yield its events, first a
        Placed once its folder exists, a MemoryReport (the worker's memory timeline) before the end. Always ends
        with Done or Failed: an error before the job could start (weights missing, a damaged folder) is a Failed
        too, its traceback in this worker's log."""
        cancel = CancelToken()
        with self._lock:
            self._cancels[key] = cancel
        try:
            yield from self._run(job, cancel, owner)
        except Exception as e:  # the stream must end with a verdict the page can show
            log.error("%s: job %s could not run: %s", self.name, key, e, exc_info=True)
            yield Failed(f"{type(e).__name__}: {e}".splitlines()[0][:300], traceback.format_exc())
        finally:
            with self._lock:
                self._cancels.pop(key, None)

    def _run(self, job, cancel, owner: str | None = None) -> Iterator:
        from jobs.execute import job_memory, run_job
        from pipeline.resume import ResumeRequest, prepare_resume

        if isinstance(job, (str, Path)):
            job = prepare_resume(Path(job))            # job.json checked again, here
        post = isinstance(job, CheckedPost)              # a post job: its own small models, loaded by the job
        components: Any = None if post else self.models.get(job.request.mode)
        memory = job_memory(self.config.config, job.request, self._device(),
                            host_ram_gb=self.split_config.host_ram_gb if self.split_devices else self.host_ram_gb)
        opened = []

        def place(folder) -> None:          # the run's own job.json record, so its later writes keep it
            record_placement(folder, self.name, self.node)
            opened.append(folder.dir)

        def events(split=None) -> Iterator:
            if split is not None:
                split.attach(components.transformer)
            try:
                for event in run_job(job, components, memory, self.config.config, cancel, owner=owner,
                                     on_open=place, split=split):
                    if opened:
                        yield Placed(self.name, self.node, opened.pop())
                    yield event
            finally:
                if split is not None:
                    split.detach()

        if self.split_pool is not None and not post:    # --gpus-per-job: this job split over the worker's GPUs
            work = Work(str(getattr(job, "job_dir", "")), resuming=job) if isinstance(job, ResumeRequest) else \
                Work("", prepared=job)
            yield from self.split_pool.run(work, int(components.transformer.config.num_attention_heads), events)
        else:
            yield from events()
