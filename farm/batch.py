"""`python -m cli batch jobs.jsonl --gpus 0,1` (or --ray ADDRESS): the batch's jobs on a farm, as many at once as
it has workers. Each job's worker and result are printed as they come; the caller prints the summary."""
from __future__ import annotations

import sys
from pathlib import Path


def run_on_farm(args, jobs: list) -> list[tuple[int, str, str]]:
    """Run the (line number, PreparedRequest) jobs on the farm of args' --ray/--gpus/--cpu-workers;
    [(line number, "done" | "stopped" | "failed", video or message)]. Ctrl-C stops every job after its step."""
    from farm.dispatch import Farm
    from farm.options import farm_options
    from farm.workers import WorkerConfig
    from pipeline.cancel import CancelToken
    from pipeline.events import Done, LogLine

    config = WorkerConfig(args.preset, args.model_dir, Path(args.outputs).resolve(), args.vram_cap_gb,
                          args.host_ram_gb, "fp8" if args.fp8 else "native")
    try:
        farm = Farm.start(farm_options(args), config)
    except (RuntimeError, ConnectionError, ValueError) as e:       # no Ray, no cluster there, no GPUs in it
        print(f"error: the job farm could not start: {e}", file=sys.stderr)
        return [(number, "failed", "the job farm could not start") for number, _ in jobs]

    def say(key, event):
        if isinstance(event, LogLine) and (event.level != "info" or "runs this job" in event.message):
            print(f"line {key}: {event.message}", file=sys.stderr, flush=True)

    try:
        last = farm.run_all({number: prepared for number, prepared in jobs}, CancelToken(), say)
    finally:
        farm.shutdown()
    results = []
    for number, _ in jobs:
        end = last.get(number)
        if isinstance(end, Done):
            results.append((number, "stopped" if end.stopped else "done", str(end.video)))
        else:
            results.append((number, "failed", getattr(end, "message", "no result")))
    return results
