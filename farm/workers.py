"""A farm worker: one Ray actor per GPU (or per CPU "device"), running whole jobs with the same orchestrator as the
app (pipeline.orchestrator.JobRun, pipeline.resume.resume).

Each worker is its own process: its own models (jobs.models.ComponentCache), its own MemoryManager per job (the VRAM
cap is set on the worker's GPU; the host-RAM budget is this worker's), nothing shared with the other workers by
accident. `run` is an actor generator: the dispatcher receives each event as it is made. `stop` runs beside it (a
threaded actor with room for both), so End reaches a job on any worker. The class is plain Python; farm/dispatch.py
makes it a Ray actor (this module imports neither Ray nor torch at import time).
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator
import importlib
from common.units import GIB
from memory.hostbudget import default_host_budget
import rocm
from jobs.models import models_for
import time
from pipeline.cancel import CancelToken
from pipeline.jobs import Job, load_job

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerConfig:
    preset: str
    model_dir: Path | None
    outputs: Path
    vram_cap_gb: float
    host_ram_gb: float | None = None
    weight_storage: str = "native"
    use_gpu: bool = True                   # False: a CPU "device" (tests, --cpu-workers)
    share: int | None = None               # workers on one machine (the default host budget is split between them);
                                           # None: the GPUs of the worker's Ray node (one worker per GPU)
    loader: str | None = None              # "module:function" building the models (preset, mode, model_dir); None:
                                           # the preset's own loading (benchmarks/farm.py: full-size random weights)
    switches: tuple[tuple[str, bool], ...] = ()    # the MemoryManager's switches (configs/runtime.py memory_options)
    compile: bool = True                   # --no-compile: False (pipeline/compiled.py)
    fp8_compute: bool = False              # --fp8-compute (checked on each worker's own GPU)


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
    if config.host_ram_gb is not None:
        return config.host_ram_gb, f"host RAM budget {config.host_ram_gb:g} GB (--host-ram-gb, per worker)"

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
        self.models = models_for(config, self._device(), _loader(config.loader))
        self._cancels: dict[str, object] = {}
        self._lock = threading.Lock()
        log.info("farm worker %s on %s (pid %d)", name, self.node, os.getpid())

    def info(self) -> dict:
        return {"name": self.name, "node": self.node, "pid": os.getpid(), "device": str(self._device())}

    def _device(self):
        import torch

        if self.config.use_gpu and torch.cuda.is_available():
            return torch.device("cuda", 0)           # Ray gives the actor one GPU: the first it can see
        return torch.device("cpu")

    @property
    def _compile(self) -> str:
        return "auto" if self.config.compile else "off"

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
        from pipeline.events import Failed

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
        from memory.manager import MemoryManager
        from pipeline.events import Done, Failed, MemoryReport
        from pipeline.orchestrator import JobRun
        from pipeline.resume import prepare_resume, resume

        resuming = isinstance(job, (str, Path))
        resume_request = prepare_resume(Path(job)) if resuming else None      # job.json checked again, here
        request = resume_request.request if resuming else job.request
        components = self.models.get(request.mode)
        memory = MemoryManager(device=self._device(), cap_gb=self.config.vram_cap_gb,
                               preserved_gb=request.preserved_gb, host_ram_gb=self.host_ram_gb,
                               weight_storage=self.config.weight_storage, **dict(self.config.switches))
        if resuming:
            record_placement(Job(Path(job), load_job(Path(job))), self.name, self.node)
            yield Placed(self.name, self.node, Path(job))
            run, events = None, resume(resume_request, components, memory, cancel=cancel, compile=self._compile)
        elif request.mode != components.mode:
            yield Failed(f"mode: the loaded models are for mode '{components.mode}', not '{request.mode}'")
            return
        else:
            run = JobRun(job, components, memory, cancel, self.config.outputs, owner=owner, compile=self._compile)
            events = run.events()
        for event in events:
            if run is not None and run.job is not None:
                record_placement(run.job, self.name, self.node)
                yield Placed(self.name, self.node, run.job.dir)
                run = None
            if isinstance(event, (Done, Failed)):
                yield MemoryReport(list(memory.timeline), list(memory.records), str(memory.device))
            yield event
