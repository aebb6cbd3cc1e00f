"""The UI's job runner on a farm: the same line, tickets, End button and event streams as ui.runner.JobRunner, but
as many jobs run at once as the farm has workers, each on the worker farm/dispatch.py hands it to.

A job's status line names its worker (every progress message starts with "[worker-N]") and its log says the node
and, after a lost worker, where the job went on; `placements()` lists which worker runs which job.
"""
from __future__ import annotations

import dataclasses
import logging
import queue
import time
from pathlib import Path

from pipeline.events import Done, Failed, Progress, Started
from ui.runner import JobRunner, Ticket, Waiting

log = logging.getLogger(__name__)


class FarmRunner(JobRunner):
    def __init__(self, farm, models, outputs: Path, vram_cap_gb: float, **kwargs):
        super().__init__(models, outputs, vram_cap_gb, **kwargs)
        self.farm = farm
        self._active: list[Ticket] = []         # the tickets on a worker now

    @property
    def busy(self) -> bool:
        with self._lock:
            return bool(self._active)

    def placements(self) -> dict[str, str]:
        """Job ticket id -> the worker running it."""
        return dict(self.farm.assignments)

    def _waiting(self, ticket: Ticket, now: float) -> Waiting | None:
        """(Lock held.) Jobs ahead: those running and those before it in line; no time estimate on a farm."""
        if ticket not in self._line or ticket.started:
            return None
        unstarted = [t for t in self._line if not t.started]
        before = unstarted.index(ticket)
        if before == 0 and len(self._active) < self.farm.size - self.farm.reviving:
            return None
        return Waiting(before + len(self._active), None)

    def _wait_turn(self, ticket: Ticket, out: queue.Queue) -> bool:
        last = None
        with self._turn:
            while True:
                if ticket.cancel.cancelled or ticket.finished:
                    return False
                if self._waiting(ticket, time.monotonic()) is None and ticket in self._line:
                    self._active.append(ticket)
                    ticket.started = True
                    return True
                place = self._waiting(ticket, time.monotonic())
                if place is not None and place != last:
                    out.put(place)
                    last = place
                self._turn.wait(1.0)

    def release(self, ticket: Ticket) -> None:
        with self._lock:
            if ticket in self._active:
                self._active.remove(ticket)
        super().release(ticket)

    def _run_job(self, ticket: Ticket, request, out: queue.Queue, t0: float) -> None:
        job = ticket.resume if ticket.resuming is not None else ticket.prepared
        for event in self.farm.run(ticket.id, job, ticket.cancel, ticket.owner):
            if isinstance(event, Progress):
                worker = self.farm.assignments.get(ticket.id)
                if worker:
                    event = dataclasses.replace(event, message=f"[{worker}] {event.message or event.stage}")
            if isinstance(event, Started):
                ticket.job_dir = event.job_dir
            elif isinstance(event, (Done, Failed)):
                if isinstance(event, Done):
                    self._learn(ticket, event)
                ticket.job_dir = event.job_dir or ticket.job_dir
            out.put(event)


def start_farm_runner(args, models, outputs: Path, weight_storage: str, *, num_cpus: int | None = None):
    """Start the farm of the command line's --ray/--gpus/--cpu-workers and a FarmRunner over it."""
    from farm.dispatch import Farm
    from farm.options import farm_options
    from farm.workers import WorkerConfig

    config = WorkerConfig(args.preset, args.model_dir, Path(outputs), args.vram_cap_gb,
                          getattr(args, "host_ram_gb", None), weight_storage)
    farm = Farm.start(farm_options(args), config, num_cpus=num_cpus)
    return FarmRunner(farm, models, outputs, args.vram_cap_gb, host_ram_gb=getattr(args, "host_ram_gb", None),
                      weight_storage=weight_storage)
