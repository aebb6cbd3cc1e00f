"""One job on several GPUs of this machine (`--gpus-per-job N`): the executor that splits a job's transformer steps.

For each job this process (the queue's, on the first GPU) starts N-1 helper processes, one per further GPU, and the
N join one `torch.distributed` group (NCCL for the tensors on GPUs with a gloo side for small messages; gloo alone on
the CPU, for trying it and for the tests). Every process runs the same job from the same request and seed with the
same code (jobs/local.py); in the transformer steps each computes its share of the tokens (pipeline/split.py), so a
step takes about 1/N of the time. The other stages (encoders, VAE) run on every GPU at once, each on its own (no
slower than on one GPU); only this process writes the job folder, the others write theirs into a temporary folder
that is deleted. Each GPU has its own VRAM cap.

The helpers and the group outlive a job (`SplitPool`): started at the first split job, they keep their models loaded
and wait for the next job, as the queue's process keeps its own. Starting a helper and reading its weights took
about 65 s of every job on 2 H200s (section 1: 26.5 s against 16.0 s for the others; BENCHMARKS.md), paid now once.
A job that does not end politely (failed, a helper lost) ends the pool; the next job starts a new one.

A job ends the same way on every process: done or stopped, the first process says so and the others finish
(pipeline/split.py `finish`) and all leave the group together (NCCL's destroy is collective); when a helper dies or fails mid-job, the job fails with a message naming its GPU, the
other helpers are ended and the group is dropped; the job folder keeps its finished sections and resumes like any
other (on the GPUs there are then: a split again, or one GPU).

Why own code around torch.distributed rather than a launcher (torchrun, Ray): a job's group lives for that job only
inside a process that is already running (the app, the command line, a farm worker), which torchrun cannot start;
`torch.multiprocessing`'s spawn starts the helpers and `init_process_group` joins them.
"""
from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Iterator

from common.units import GIB
from configs.runtime import Config
from jobs.local import LocalExecutor, Work
from jobs.models import models_for
from memory.hostbudget import default_host_budget
from pipeline.cancel import CancelToken
from pipeline.events import Done, Failed, LogLine

log = logging.getLogger(__name__)

GROUP_TIMEOUT = timedelta(minutes=30)     # a collective that waits longer fails (a helper stuck, not dead)
_FAILED_EXIT = 3                          # a helper whose job failed on its own GPU


class SplitUnavailable(RuntimeError):
    """--gpus-per-job N cannot run here (the message says why and what to do)."""


def split_devices(n: int, device) -> list:
    """The N devices of a split job whose first process runs on `device`: that GPU and the N-1 after it, or N times
    the CPU. Raises SplitUnavailable: too few GPUs, mixed cards, no NCCL/RCCL in this PyTorch."""
    import torch
    import torch.distributed as dist

    device = torch.device(device)
    if n < 2:
        raise SplitUnavailable(f"--gpus-per-job {n}: a split job needs at least 2 GPUs (1 is the default: no split)")
    if not dist.is_available():
        raise SplitUnavailable(f"--gpus-per-job {n}: this PyTorch has no torch.distributed; use --gpus-per-job 1")
    if device.type == "cpu":
        return [device] * n
    if device.type != "cuda":
        raise SplitUnavailable(f"--gpus-per-job {n}: a split job runs on CUDA or ROCm GPUs, not {device.type}")
    first = device.index or 0
    count = torch.cuda.device_count()
    if first + n > count:
        raise SplitUnavailable(f"--gpus-per-job {n}: needs {n} GPUs from cuda:{first}, this machine has {count} "
                               f"(CUDA_VISIBLE_DEVICES or --device choose them); use --gpus-per-job {max(1, count - first)}")
    names = [torch.cuda.get_device_name(i) for i in range(first, first + n)]
    if len(set(names)) > 1:
        raise SplitUnavailable(f"--gpus-per-job {n}: the GPUs differ ({', '.join(names)}); a split job waits for its "
                               f"slowest card at every step, so it takes {n} of the same kind (CUDA_VISIBLE_DEVICES "
                               f"picks them)")
    if not dist.is_nccl_available():
        raise SplitUnavailable(f"--gpus-per-job {n}: this PyTorch has no NCCL ({'RCCL' if torch.version.hip else 'NCCL'}"
                               f" exchanges the tokens between the GPUs); use --gpus-per-job 1")
    return [torch.device("cuda", first + r) for r in range(n)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _join_group(rank: int, size: int, port: int, device, heads: int = 24):
    """Join the pool's group as `rank`; this process's SequenceSplit (`heads`: the transformer's attention heads, set
    again for each job: `SequenceSplit.for_job`)."""
    import torch
    import torch.distributed as dist

    from pipeline.split import SequenceSplit

    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size,
                            timeout=GROUP_TIMEOUT)
    return SequenceSplit(device, heads)


def _heads(models, work: Work) -> int:
    """The attention heads of the job's transformer (from its config: nothing is loaded for this)."""
    transformer = models.transformer_for_checks(work.request.mode)
    return int(transformer.config.num_attention_heads) if transformer is not None else 24


def _leave_group(abort: bool = False) -> None:
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    if abort:                # a peer is gone: an orderly destroy could wait for it
        dist.distributed_c10d._abort_process_group()
    else:
        dist.destroy_process_group()


def terminal_level() -> int:
    """The level this process's terminal shows (the lowest of the root logger's handlers that write to stderr or
    stdout; WARNING where none does): what a helper process shows on the same terminal."""
    root = logging.getLogger()
    levels = [max(h.level, root.level) for h in root.handlers
              if type(h) is logging.StreamHandler and h.stream in (sys.stderr, sys.stdout)]
    return min(levels, default=logging.WARNING)


def _helper_logging(level: int, device) -> None:
    """A helper's log lines on the terminal of the process that started it, each naming its device (a spawned
    process starts with no logging set up: its stage lines, "transformer: … resident" and the models' loading time
    would be lost)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(level)           # on the handler: a job raises its own loggers to INFO (pipeline/logcapture.py)
    handler.setFormatter(logging.Formatter(helper_log_format(device), datefmt="%H:%M:%S"))
    logging.basicConfig(level=level, handlers=[handler])


def helper_log_format(device) -> str:
    """A helper's log line: the command line's (cli/log.py), its device after the level."""
    return f"%(asctime)s %(levelname)s [{device}] %(name)s: %(message)s"


def helper_main(rank: int, size: int, port: int, device, config: Config, inbox,
                log_level: int = logging.WARNING) -> None:
    """A helper process: load the models, join the group, then run each job `inbox` brings ((work, heads); None:
    leave) into a temporary folder. A job that fails here ends the process (the pool is then ended and a new one
    started for the next job)."""
    _helper_logging(log_level, device)
    models = models_for(config, device)
    split = _join_group(rank, size, port, device)
    while (job := inbox.get()) is not None:
        work, heads = job
        split.for_job(heads)
        if not _helper_job(rank, config, models, device, split, work):
            _leave_group(abort=True)
            os._exit(_FAILED_EXIT)
    _leave_group()
    os._exit(0)      # (no interpreter teardown: the group's threads and the models go with the process)


def _helper_job(rank: int, config: Config, models, device, split, work: Work) -> bool:
    """One job of a helper, into a temporary folder; False when it failed on this process's GPU."""
    with tempfile.TemporaryDirectory(prefix="steadyframe-split-") as tmp:
        if work.resuming is not None:        # a copy of the job folder: only the first process writes the real one
            copy = Path(tmp) / work.resuming.job_dir.name
            shutil.copytree(work.resuming.job_dir, copy)
            work = dataclasses.replace(work, resuming=dataclasses.replace(work.resuming, job_dir=copy))
        executor = LocalExecutor(dataclasses.replace(config, outputs=Path(tmp)), models, device)
        ok = True
        for event in executor.run(work, CancelToken(), split=split):
            if isinstance(event, Failed):
                log.error("split job, GPU %d: %s", rank, event.message)
                ok = False
        if ok:
            split.finish()
        return ok


class _Helpers:
    """The helper processes of a pool, watched during a job: `lost` says which ended before the job did."""

    def __init__(self, procs: list, devices: list, abort_on_loss: bool):
        self.procs, self.devices = procs, devices
        self.lost: tuple[int, int | None] | None = None         # (rank, exit code)
        self._abort = abort_on_loss
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self.watch()

    def watch(self) -> None:
        """Watch them (during a job)."""
        self._done.clear()
        self._thread = threading.Thread(target=self._watch, name="split-watch", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._done.wait(0.2):
            for rank, p in enumerate(self.procs, start=1):
                if p.exitcode is not None and p.exitcode != 0:
                    self.lost = (rank, p.exitcode)
                    log.error("split job: the process on %s ended (exit code %s)", self.devices[rank], p.exitcode)
                    if self._abort:      # NCCL would wait for it until the timeout: end the group's waits now
                        _leave_group(abort=True)
                    return

    def stop_watching(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def end(self, wait_s: float) -> None:
        """Wait up to `wait_s` for the helpers to exit, then end the rest."""
        deadline = time.monotonic() + wait_s
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in self.procs:
            if p.is_alive():
                p.kill()
                p.join()


class SplitPool:
    """The helper processes of split jobs over `devices` (the first is this process's), started at the first job and
    kept between jobs with their models loaded, in one group. `config`: what the helpers run with (their host-RAM
    budget is each process's share)."""

    def __init__(self, devices: list, config: Config):
        self.devices, self.config = devices, config
        self.helpers: _Helpers | None = None
        self._inboxes: list = []
        self._split = None
        self._lock = threading.Lock()          # one job at a time (the executors run one: slots = 1)
        atexit.register(self.close)

    @property
    def running(self) -> bool:
        return self.helpers is not None and all(p.exitcode is None for p in self.helpers.procs)

    def _start(self, heads: int) -> Iterator:
        import torch.multiprocessing as mp

        size, port = len(self.devices), _free_port()
        ctx = mp.get_context("spawn")
        self._inboxes = [ctx.SimpleQueue() for _ in range(1, size)]
        procs = [ctx.Process(target=helper_main, args=(r, size, port, self.devices[r], self.config,
                                                       self._inboxes[r - 1], terminal_level()),
                             name=f"split-{r}", daemon=True) for r in range(1, size)]
        for p in procs:
            p.start()
        yield LogLine("info", f"job split over {size} devices: {', '.join(str(d) for d in self.devices)}; helpers "
                              "started (they stay, with their models, for the next jobs)")
        self.helpers = _Helpers(procs, self.devices, abort_on_loss=self.devices[0].type == "cuda")
        self._split = _join_group(0, size, port, self.devices[0], heads)

    def run(self, work: Work, heads: int, leader) -> Iterator:
        """Run `work` split over the devices: each helper runs its copy, this process `leader(split)` (the events of
        its job run with that SequenceSplit). Ends with the job's Done or Failed, a helper's loss said in it."""
        with self._lock:
            ended = False
            try:
                for event in self._run(work, heads, leader):
                    ended = isinstance(event, (Done, Failed))
                    yield event
            finally:
                if not ended:       # the job's events were dropped mid-job: its helpers cannot be told where it ended
                    self._end(polite=False)

    def _run(self, work: Work, heads: int, leader) -> Iterator:
        size = len(self.devices)
        if self.helpers is not None and not self.running:      # a helper ended between jobs: start again
            self._end(polite=False)
        ending = None
        try:
            if self.helpers is None:
                yield from self._start(heads)
            else:
                yield LogLine("info", f"job split over {size} devices: {', '.join(str(d) for d in self.devices)} "
                                      "(helpers already running)")
                self.helpers.watch()
            assert self._split is not None
            if self.devices[0].type == "cuda":          # this job's thread may not be the one that joined
                import torch
                torch.cuda.set_device(self.devices[0])
            for inbox in self._inboxes:
                inbox.put((work, heads))
            self._split.for_job(heads)
            for event in leader(self._split):
                if isinstance(event, (Done, Failed)):
                    ending = event
                    break
                yield event
        except Exception as e:       # the group could not form (a helper died at its start)
            log.error("split job: %s", e, exc_info=True)
            ending = Failed(f"the split job could not start on {size} devices: {str(e).splitlines()[0][:200]}")
        helpers = self.helpers
        polite = isinstance(ending, Done) and helpers is not None and helpers.lost is None
        if polite and self._split is not None:
            self._split.finish()      # stopped or done: the helpers end their copy of the job and wait for the next
        if helpers is not None:
            helpers.stop_watching()
        if helpers is not None and helpers.lost is not None and not isinstance(ending, Done):
            rank, code = helpers.lost
            ending = Failed(f"the process on {self.devices[rank]} ended mid-job (exit code {code}); the job folder "
                            f"keeps its finished sections: resume it (on the GPUs there are now)",
                            ending.detail if isinstance(ending, Failed) else "",
                            getattr(ending, "job_dir", None), getattr(ending, "partial_video", None))
        if not (polite and helpers is not None and helpers.lost is None):
            self._end(polite=False)
        yield ending

    def _end(self, polite: bool) -> None:
        """End the helpers and leave the group: `polite`, they are told to leave with this process (NCCL's destroy
        is collective: each process's returns when all have called it, so this one leaves before it waits for
        their exit); otherwise the group is aborted and they are ended."""
        helpers, self.helpers = self.helpers, None
        if helpers is None:
            return
        helpers.stop_watching()
        if polite:
            for inbox in self._inboxes:
                inbox.put(None)
        _leave_group(abort=not polite)
        helpers.end(wait_s=60.0 if polite else 0.0)
        self._inboxes, self._split = [], None

    def close(self) -> None:
        """Let the helpers go (the executor's end, or this process's exit). While a job still runs (this process
        exits under it) they are ended without a word."""
        if self._lock.acquire(timeout=2.0):
            try:
                self._end(polite=self.running)
            finally:
                self._lock.release()
        elif (helpers := self.helpers) is not None:
            for p in helpers.procs:
                p.kill()


def each_process(config: Config, processes: int, host_ram_gb: float | None = None) -> Config:
    """The Config each process of a split job runs with: its share of the host-RAM budget (`host_ram_gb`, else
    --host-ram-gb, else the machine's default budget), since every process holds its own copy of the models."""
    if host_ram_gb is None:
        host_ram_gb = config.host_ram_gb
    if host_ram_gb is None:
        host_ram_gb = default_host_budget()[0] / GIB
    return dataclasses.replace(config, host_ram_gb=host_ram_gb / processes)


class SplitExecutor(LocalExecutor):
    """The local executor with every job split over `gpus_per_job` GPUs (or CPU processes), its helpers kept between
    jobs (SplitPool)."""
    slots = 1

    def __init__(self, config: Config, models, device, gpus_per_job: int):
        self.devices = split_devices(gpus_per_job, device)
        super().__init__(each_process(config, len(self.devices)), models, device)
        log.info("each job split over %d %s: %s; host RAM budget %.1f GB per process", len(self.devices),
                 "CPU processes (no faster: for trying it)" if self.devices[0].type == "cpu" else "GPUs",
                 ", ".join(str(d) for d in self.devices), self.config.host_ram_gb)
        self.pool = SplitPool(self.devices, self.config)

    @property
    def helpers(self) -> _Helpers | None:
        return self.pool.helpers

    def run(self, work: Work, cancel, split=None) -> Iterator:
        if work.post is not None:        # post-processing (its own small models): on the first GPU alone
            yield from super().run(work, cancel)
            return
        yield from self.pool.run(work, _heads(self.models, work),
                                 lambda group: LocalExecutor.run(self, work, cancel, split=group))

    def close(self) -> None:
        self.pool.close()


def executor_for(config: Config, models, device, gpus_per_job: int):
    """The local executor for `--gpus-per-job` (1: jobs/local.py's)."""
    if gpus_per_job <= 1:
        return LocalExecutor(config, models, device)
    return SplitExecutor(config, models, device, gpus_per_job)
