"""The dispatcher: starts (or joins) Ray, makes one worker actor per GPU, hands each job to a free worker and
streams its events back; a worker lost mid-job is replaced by another one that continues the job from its last
section checkpoint.

    farm = Farm.start(FarmOptions(gpus=(0, 1)), WorkerConfig(config))     # config: the process's Config
    for event in farm.run(key, prepared, cancel):     # pipeline events (Progress, Preview, SectionVideo, Done ...)
        ...

Nothing here polls files: the worker's `run` is a Ray actor generator, each event arrives when it is made. Ray
restarts a dead worker (max_restarts); the dispatcher only decides where the interrupted job goes next.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from configs.runtime import FarmOptions
from farm.workers import JobWorker, Placed, WorkerConfig
from jobfolder.folder import CHECKPOINT
from pipeline.events import Done, Failed, LogLine, Started, WorkerLine

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent       # the repository: the workers import the app's packages from it
WORKER_RESTARTS = -1            # Ray restarts a dead worker as often as it dies (its job moves elsewhere meanwhile)
STOP_POLL_S = 0.25              # how soon End reaches a worker (the token is local; the worker is not)
RETRIES = 3                     # a job survives this many lost workers


@dataclass
class Slot:
    name: str
    actor: Any                     # the worker's Ray actor handle
    busy: bool = False
    reviving: bool = False         # it died; busy until Ray has restarted it
    lost: int = 0                  # times this worker died under a job


class Farm:
    def __init__(self, slots: list[Slot], owns_ray: bool):
        self.slots = slots
        self.owns_ray = owns_ray
        self._free = threading.Condition()
        self.assignments: dict[str, str] = {}      # job key -> worker name, while it runs

    # ---- starting -------------------------------------------------------------------------------------------------
    @classmethod
    def start(cls, options: FarmOptions, config: WorkerConfig, *, num_cpus: int | None = None) -> "Farm":
        """Join the cluster of --ray, or start a local Ray for --gpus/--cpu-workers; one worker per GPU (per
        --gpus-per-job GPUs: each job of a worker split over its GPUs, jobs/split.py)."""
        try:
            import ray
        except ImportError:
            raise RuntimeError("--ray/--gpus/--cpu-workers need Ray: pip install -e \".[ray]\" (or "
                               "pip install \"ray[default]==2.60.*\")") from None

        env = {"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                                          if p)}}
        per = config.config.gpus_per_job           # --gpus-per-job: a worker owns that many GPUs (jobs/split.py)
        if options.gpus and len(options.gpus) % per:
            raise RuntimeError(f"--gpus {','.join(map(str, options.gpus))} --gpus-per-job {per}: {len(options.gpus)} "
                               f"GPUs do not make workers of {per}; list a multiple of {per} GPUs")
        if options.address:
            ray.init(address=options.address, runtime_env=env, log_to_driver=True)
            count = int(ray.cluster_resources().get("GPU", 0)) // per
            if count < 1:
                raise RuntimeError(f"--ray {options.address}: the cluster has no GPUs (or fewer than --gpus-per-job "
                                   f"{per}); start its nodes with GPUs (ray start --num-gpus N) or run without --ray")
            gpu = True
        elif options.gpus:
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, options.gpus))   # Ray hands these out
            count, gpu = len(options.gpus) // per, True
            ray.init(num_gpus=len(options.gpus), num_cpus=num_cpus, runtime_env=env, include_dashboard=False)
        else:
            count, gpu = options.cpu_workers, False
            ray.init(num_cpus=num_cpus or count, num_gpus=0, runtime_env=env, include_dashboard=False)
        config = dataclasses.replace(config, use_gpu=gpu, share=config.share or (None if options.address else count))
        actor = ray.remote(JobWorker).options(num_gpus=per if gpu else 0, num_cpus=1, max_concurrency=2,
                                              max_restarts=WORKER_RESTARTS, max_task_retries=0)
        slots = [Slot(f"worker-{i + 1}", actor.remote(f"worker-{i + 1}", config)) for i in range(count)]
        farm = cls(slots, owns_ray=not options.address)
        for info in farm.workers():
            log.info("farm: %s on %s (%s)", info["name"], info["node"], info["device"])
        return farm

    def workers(self) -> list[dict]:
        """Each worker's name, node, process and device (waits for them to be up, a restarting one too)."""
        import ray

        return ray.get([_when_up(s.actor) for s in self.slots])

    @property
    def reviving(self) -> int:
        """Workers that died and are being restarted by Ray (no job goes to them until they answer)."""
        return sum(1 for s in self.slots if s.reviving)

    @property
    def size(self) -> int:
        return len(self.slots)

    def shutdown(self) -> None:
        import ray

        for s in self.slots:
            ray.kill(s.actor, no_restart=True)
        if self.owns_ray:
            ray.shutdown()

    # ---- placing --------------------------------------------------------------------------------------------------
    def _acquire(self, avoid: str | None = None) -> Slot:
        """A free worker, waiting for one; a worker that just died is taken only when no other is free."""
        with self._free:
            while True:
                free = [s for s in self.slots if not s.busy]
                if free:
                    slot = next((s for s in free if s.name != avoid), free[0])
                    slot.busy = True
                    return slot
                self._free.wait()

    def _release(self, slot: Slot) -> None:
        with self._free:
            slot.busy = False
            self._free.notify_all()

    # ---- running --------------------------------------------------------------------------------------------------
    def run(self, key: str, job, cancel, owner: str | None = None) -> Iterator:
        """Run `job` (a PreparedRequest, or a job folder to continue) on a free worker and yield its pipeline events
        as they come, ending with Done or Failed. LogLines say which worker and node run it, and what happened when
        a worker was lost: the job then goes on from its last finished section on another worker."""
        import ray

        avoid, job_dir, lost = None, None, 0
        while True:
            slot = self._acquire(avoid)
            if cancel.cancelled and job_dir is None:      # stopped while it waited for a worker: it never starts
                self._release(slot)
                yield Failed("stopped before it started", "")
                return
            self.assignments[key] = slot.name
            stopper = _Stopper(slot, key, cancel)
            ended = slot.reviving = False
            try:
                for ref in slot.actor.run.remote(key, job, owner):
                    event = ray.get(ref)
                    if isinstance(event, Placed):
                        job_dir = event.job_dir or job_dir
                        yield WorkerLine("info", f"{slot.name} on {event.node} runs this job", slot.name, event.node)
                        continue
                    if isinstance(event, Started):
                        job_dir = event.job_dir
                    ended = isinstance(event, (Done, Failed))
                    yield event
                return
            except ray.exceptions.RayActorError as e:
                if ended:
                    return
                lost += 1
                slot.lost += 1
                slot.reviving = True
                log.warning("farm: %s was lost during job %s: %s", slot.name, key, str(e).splitlines()[0][:200])
                if cancel.cancelled or lost > RETRIES:
                    why = "while stopping" if cancel.cancelled else f"(the {lost}th worker this job lost)"
                    yield Failed(f"{slot.name} was lost {why}; the job was not finished", "", job_dir)
                    return
                job, message = self._next_attempt(job, job_dir, slot.name)
                if job is None:
                    yield Failed(message, "", job_dir)
                    return
                if not isinstance(job, Path):
                    job_dir = None                          # started again: a new folder
                yield LogLine("warning", message)
                avoid = slot.name
            finally:
                stopper.close()
                self.assignments.pop(key, None)
                if slot.reviving:
                    threading.Thread(target=self._revive, args=(slot,), daemon=True,
                                     name=f"revive-{slot.name}").start()
                else:
                    self._release(slot)

    def _revive(self, slot: Slot) -> None:
        """Wait until Ray has restarted the dead worker (a call to a restarting actor is retried until it is up),
        then let jobs go to it again."""
        import ray

        try:
            info = ray.get(_when_up(slot.actor))
            log.info("farm: %s restarted (process %d on %s)", slot.name, info["pid"], info["node"])
        except ray.exceptions.RayError as e:       # it could not be restarted: it stays out of the farm
            log.error("farm: %s could not be restarted: %s", slot.name, str(e).splitlines()[0][:200])
            return
        except SystemExit:                          # Ray shut down (the app stopping) while it waited
            return
        slot.reviving = False
        self._release(slot)

    def run_all(self, jobs: dict, cancel, on_event=None) -> dict:
        """Run every job of {key: job} (as many at once as there are workers); {key: its last event}. `on_event(key,
        event)` hears every event, from the jobs' threads."""
        last = {}

        def one(key, job):
            for event in self.run(key, job, cancel):
                last[key] = event
                if on_event is not None:
                    on_event(key, event)

        threads = [threading.Thread(target=one, args=item, daemon=True, name=f"farm-{item[0]}")
                   for item in jobs.items()]
        for t in threads:
            t.start()
        try:
            for t in threads:
                while t.is_alive():
                    t.join(0.5)         # (short joins: Ctrl-C reaches the main thread)
        except KeyboardInterrupt:
            cancel.cancel()             # every job stops after its current step and keeps its video
            for t in threads:
                t.join()
        return last

    def _next_attempt(self, job, job_dir: Path | None, worker: str):
        """After a lost worker: (what to run next, what to tell the user). A job that has its folder continues
        there (pipeline/resume.py): from its last section checkpoint, or from the start when it had not finished
        a section; one lost before its folder existed starts again as it was asked."""
        from jobfolder.checkpoint import load_checkpoint

        if job_dir is None and isinstance(job, (str, Path)):
            job_dir = Path(job)
        if job_dir is not None and (Path(job_dir) / "job.json").is_file():
            if (job_dir / CHECKPOINT).is_file():
                done = int(load_checkpoint(job_dir)[1]["sections_done"])
                where = f"from its last finished section ({done})"
            else:
                where = "from the start, in its folder (it had not finished a section)"
            return Path(job_dir), (f"{worker} was lost (its process ended); the job continues on another worker "
                                   f"{where}; the dead worker is being restarted")
        return job, (f"{worker} was lost before the job had its folder; it starts again on another worker; "
                     f"the dead worker is being restarted")


def _when_up(actor):
    """The worker's info() call, retried by Ray while the worker is restarting."""
    return actor.info.options(max_task_retries=-1).remote()


class _Stopper:
    """Carries End to the worker running the job: the cancel token is this process's, the job is not."""

    def __init__(self, slot: Slot, key: str, cancel):
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(slot, key, cancel), daemon=True,
                                        name=f"stop-{str(key)[:8]}")
        self._thread.start()

    def _watch(self, slot: Slot, key: str, cancel) -> None:
        while not self._done.wait(STOP_POLL_S):
            if cancel.cancelled:
                slot.actor.stop.remote(key)
                return

    def close(self) -> None:
        self._done.set()
