"""Command line: `python -m cli generate|batch|resume ...` (see --help)."""
from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import traceback
from pathlib import Path

from configs import MEMORY, PRESETS
from configs.controls import CONTROLS, Control
from configs.lora import LORA
from farm.options import add_arguments as add_farm_arguments, farm_options
from cli import log as cli_log

log = logging.getLogger("cli.commands")

EXIT_OK, EXIT_FAILED, EXIT_INPUT, EXIT_STOPPED = 0, 1, 2, 130

# The option (and the batch file's key) that sets each field a request check can name (configs/controls.py).
OPTION_OF_FIELD = {**{c.field_name: c.option for c in CONTROLS if c.option}, "job folder": "job_dir"}
KEY_OF_FIELD = {c.field_name: c.name for c in CONTROLS}


def cli_message(error, names: dict[str, str]) -> str:
    """An InputError as the command line says it: the option (or batch key) and full file paths."""
    return error.cli_text(names.get(error.field, error.field))


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="hunyuan", choices=list(PRESETS),
                   help="hunyuan = real weights (~42 GB, downloaded once); tiny = random tiny models, no download")
    p.add_argument("--model-dir", type=Path, help="folder laid out like the repos (<dir>/<owner>/<repo>/...); "
                                                  "nothing is downloaded when given")
    p.add_argument("--outputs", "--out", dest="outputs", type=Path, default=Path("outputs"),
                   help="folder for job folders (default: outputs)")
    p.add_argument("--vram-cap-gb", type=float, default=MEMORY.vram_cap_gb, help="hard VRAM cap (default 20)")
    p.add_argument("--no-pin", action="store_true", help="do not page-lock host copies (when host RAM is short)")
    p.add_argument("--host-ram-gb", type=float, default=MEMORY.host_ram_gb,
                   help="host RAM this program may use; weights that do not fit are read from the weight files when "
                        "needed (default: this machine's RAM minus a margin for the OS and a browser; logged)")
    p.add_argument("--fp8", action="store_true",
                   help="keep the transformer and the Llama text encoder in fp8 in host RAM (half the RAM and "
                        "half the bytes streamed per step; weights rounded to 3 mantissa bits, see README)")
    p.add_argument("--device", help="cuda, cuda:1 or cpu (default: the GPU if there is one)")
    p.add_argument("--lora-dir", type=Path, default=Path(LORA.folder),
                   help=f"folder where --lora names are looked up (default {LORA.folder}/)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar, warnings only")
    p.add_argument("-v", "--verbose", action="store_true", help="stage messages (memory status, timings)")


def _option_type(c: Control):
    return {"int": int, "float": float}.get(c.kind, str)


def add_settings(p: argparse.ArgumentParser, controls: tuple[Control, ...] = CONTROLS) -> None:
    """One option per control of the table (configs/controls.py), named like the app's API (--latent-window for
    latent_window), with its older spelling as an alias."""
    for c in controls:
        if c.option is None:
            continue
        notes = []
        if c.default_text:
            notes.append(f"default: {c.default_text}")
        elif not c.is_file and c.kind != "text" and c.default is not None:
            notes.append(f"default {c.default:g}" if c.is_number else f"default {c.default}")
        if c.is_number and c.limits and c.limits[1] < 10**6:
            notes.append(f"range {c.limits[0]:g}–{c.limits[1]:g}")
        text = c.help + (f" ({'; '.join(notes)})" if notes else "")
        p.add_argument(c.option, *c.cli_aliases, dest=c.name, type=_option_type(c),
                       default=None if c.repeat else c.default,
                       required=c.required and not c.required_unless, choices=c.choices if c.kind == "choice" else None,
                       help=text.replace("%", "%%"), **({"action": "append"} if c.repeat else {}))


def build_parser(controls: tuple[Control, ...] = CONTROLS) -> argparse.ArgumentParser:
    prog = "steadyframe-cli" if Path(sys.argv[0]).name == "steadyframe-cli" else "python -m cli"
    parser = argparse.ArgumentParser(prog=prog, description="FramePack image-to-video, headless.")
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="make one video")
    add_settings(g, controls)
    _add_common(g)
    b = sub.add_parser("batch", help="run the jobs of a JSON-lines file, one job per line")
    b.add_argument("jobs", type=Path, help="each line: a JSON object with generate's settings, e.g. "
                                           '{"image": "a.png", "prompt": "...", "seconds": 3}')
    _add_common(b)
    add_farm_arguments(b)           # --ray / --gpus / --cpu-workers: the jobs side by side on several GPUs (farm/)
    r = sub.add_parser("resume", help="continue an interrupted job from its folder")
    r.add_argument("job_dir", type=Path, help="the job's folder under outputs/")
    _add_common(r)
    r.set_defaults(preset=None)
    sub.add_parser("queue", add_help=False, help="the app's job queue on disk: add, list, export, move, remove "
                                                 "(python -m cli queue -h)")     # cli/queue.py
    return parser


def request_from_args(a: argparse.Namespace):
    from pipeline.request import Request

    values = {c.name: getattr(a, c.name) for c in Request.CONTROLS if c.option}
    values.update({c.name: ", ".join(values[c.name] or [c.default]) for c in Request.CONTROLS
                   if c.repeat})                                      # a repeated option: its values joined
    return Request.from_mapping(values)


def request_from_json(obj: dict, base: Path):
    """A batch line -> Request; relative image paths are relative to the jobs file."""
    from common.errors import InputError
    from pipeline.request import Request

    if not isinstance(obj, dict):
        raise InputError("job", "each line must be a JSON object")
    return Request.from_mapping(obj, base=base)


class Runner:
    """Loads components once per mode and runs jobs, printing progress."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self._components = {}

    def components(self, mode: str):
        from pipeline.components import load_components

        if mode not in self._components:
            self._components.clear()            # one set in host memory at a time
            self._components[mode] = load_components(self.args.preset, mode, self.args.model_dir)
        return self._components[mode]

    def memory(self, request):
        from memory import MemoryManager, default_device

        device = self.args.device or default_device()
        return MemoryManager(device=device, cap_gb=self.args.vram_cap_gb, preserved_gb=request.preserved_gb,
                             pin_host_memory=not self.args.no_pin, host_ram_gb=self.args.host_ram_gb,
                             weight_storage="fp8" if self.args.fp8 else "native")

    def host_problem(self, request) -> str | None:
        """Why the host-RAM budget cannot work for this request (checked before any model loads), or None."""
        from memory import default_device
        from memory.estimate import nominal_plan
        from memory.hostplan import HostBudgetError

        device = torch_device_type(self.args.device or default_device())
        try:
            nominal_plan(PRESETS[self.args.preset], request.mode, self.args.vram_cap_gb, request.preserved_gb,
                         device, self.args.host_ram_gb, "fp8" if self.args.fp8 else "native")
        except HostBudgetError as e:
            return f"--host-ram-gb: {e}"
        return None

    def run(self, request) -> tuple[int, object]:
        """Run one job: `request` is a Request (checked here, before any model loads) or a PreparedRequest (a
        batch line, checked when the file was read); either way its images are decoded once."""
        from common.errors import InputError
        from pipeline.events import Failed
        from pipeline.orchestrator import generate
        from pipeline.request import PreparedRequest, prepare
        from pipeline.resolution import check_fits

        prepared = request
        if not isinstance(prepared, PreparedRequest):
            try:
                prepared = prepare(request, PRESETS[self.args.preset].default_resolution)   # before models load
            except InputError as e:
                print(f"error: {cli_message(e, OPTION_OF_FIELD)}", file=sys.stderr)
                return EXIT_INPUT, Failed(str(e))
        request = prepared.request
        try:                                    # the size fits under the cap (pipeline/resolution.py)
            check_fits(prepared, PRESETS[self.args.preset], self.args.vram_cap_gb,
                       "fp8" if self.args.fp8 else "native")
        except InputError as e:
            print(f"error: {cli_message(e, OPTION_OF_FIELD)}", file=sys.stderr)
            return EXIT_INPUT, Failed(str(e))
        problem = self.host_problem(request)
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return EXIT_INPUT, Failed(problem)
        self._say_rounding(request)
        return self._drive(lambda cancel: generate(prepared, self.components(request.mode), self.memory(request),
                                                   cancel=cancel, outputs=self.args.outputs,
                                                   lora_dir=self.args.lora_dir), request.mode)

    def _say_rounding(self, request) -> None:
        """The length is whole sections: say what --seconds becomes when it is not one."""
        from pipeline.sections import make_plan

        plan = make_plan(request.mode, request.seconds, request.latent_window, request.fps)
        actual = plan.total_frames / request.fps
        if not self.args.quiet and abs(actual - request.seconds) >= 0.05:
            print(f"--seconds {request.seconds:g} is rounded to whole sections: {plan.count} section(s), "
                  f"{plan.total_frames} frames = {actual:.1f} s", file=sys.stderr)

    def resume(self, job_dir: Path) -> tuple[int, object]:
        from pipeline.jobs import finished_video

        done = finished_video(job_dir)       # a finished job: said at once, nothing loaded
        if done is not None:
            print(f"job {Path(job_dir).name} is already complete; its video is {done.resolve()}")
            return EXIT_OK, None
        from common.errors import InputError
        from pipeline.events import Failed
        from pipeline.resume import prepare_resume, resume

        try:
            job = prepare_resume(job_dir)             # job.json and settings checked, images decoded: once
        except InputError as e:
            print(f"error: {cli_message(e, OPTION_OF_FIELD)}", file=sys.stderr)
            return EXIT_INPUT, Failed(str(e))
        request = job.request
        self.args.preset = self.args.preset or job.preset
        problem = self.host_problem(request)
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return EXIT_INPUT, Failed(problem)
        return self._drive(lambda cancel: resume(job, self.components(request.mode), self.memory(request),
                                                 cancel=cancel, lora_dir=self.args.lora_dir), request.mode)

    def _drive(self, start, mode: str) -> tuple[int, object]:
        """Run a job's event stream with a progress bar; Ctrl-C stops after the current step. The bar says what is
        happening (loading the models, each stage) and counts the steps of all sections (TeaCache-skipped ones
        too: every step is reported)."""
        from pipeline.events import Done, Failed, LogLine, Progress, SectionVideo
        from pipeline.cancel import CancelToken

        cancel = CancelToken()
        previous = signal.signal(signal.SIGINT, lambda *_: self._interrupt(cancel))
        bar = None if self.args.quiet else _progress_bar()
        last = None
        try:
            if bar is not None and mode not in self._components:
                bar.set_description(f"loading the {self.args.preset} models")
            for ev in start(cancel):
                last = ev
                if bar is None:
                    continue
                if isinstance(ev, Progress):
                    if ev.sections and bar.total != ev.sections * ev.steps:
                        bar.reset(total=ev.sections * ev.steps)
                    bar.n = max(0, ev.section - 1) * ev.steps + ev.step if ev.section else 0
                    where = f"section {ev.section}/{ev.sections}" if ev.section else ""
                    bar.set_description(f"{ev.stage} {where}".strip())
                elif isinstance(ev, SectionVideo):
                    bar.write(f"section {ev.section}/{ev.sections}: {ev.frames} frames -> {ev.path}")
                elif isinstance(ev, LogLine) and ev.level != "info":
                    bar.write(f"{ev.level}: {ev.message}")
        except Exception as e:  # loading failed (e.g. weights missing): a clear line; the traceback is logged
            if bar is not None:
                bar.close()
                bar = None
            # Always in the log file (and the record keeps the cause); on the terminal only with -v.
            log.error("the job could not run: %s", e, exc_info=True, extra={"terminal": self.args.verbose})
            where = cli_log.log_file_note()
            print(f"error: {e}" + ("" if self.args.verbose else f" (-v shows the traceback{where})"),
                  file=sys.stderr)
            return EXIT_FAILED, Failed(str(e), traceback.format_exc())
        finally:
            signal.signal(signal.SIGINT, previous)
            if bar is not None:
                bar.close()
        if isinstance(last, Done):
            what = "stopped; kept" if last.stopped else "done:"
            print(f"{what} {last.video} ({last.frames} frames) in {last.job_dir}")
            return (EXIT_STOPPED if last.stopped else EXIT_OK), last
        print(f"error: {last.message}", file=sys.stderr)
        return (EXIT_INPUT if last.job_dir is None else EXIT_FAILED), last

    @staticmethod
    def _interrupt(cancel) -> None:
        if cancel.cancelled:
            raise KeyboardInterrupt
        print("\nstopping after this step (Ctrl-C again to abort)...", file=sys.stderr)
        cancel.cancel()


def torch_device_type(device) -> str:
    import torch

    return torch.device(device).type


def _progress_bar():
    from tqdm import tqdm

    return tqdm(total=None, unit="step", dynamic_ncols=True, desc="starting")


def read_batch(path: Path, default_resolution: int) -> tuple[list[tuple[int, object]], list[tuple[int, str, str]]]:
    """Every job of a JSON-lines file, checked before any of them runs (a bad line is refused at once, not after
    the jobs before it): ([(line number, PreparedRequest)], [(line number, "invalid", reason)])."""
    from common.errors import InputError
    from pipeline.request import prepare

    lines = path.read_text("utf-8").splitlines()
    jobs, invalid = [], []
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            prepared = prepare(request_from_json(json.loads(line), path.parent), default_resolution)
        except InputError as e:
            invalid.append((number, "invalid", cli_message(e, KEY_OF_FIELD)))
            continue
        except (ValueError, RecursionError, TypeError) as e:   # not JSON (JSONDecodeError is a ValueError)
            reason = f"not a JSON object ({type(e).__name__}: {str(e)[:200]})"
            invalid.append((number, "invalid", reason))
            continue
        jobs.append((number, prepared))
    return jobs, invalid


def run_batch(runner: Runner, path: Path) -> int:
    try:
        jobs, invalid = read_batch(path, PRESETS[runner.args.preset].default_resolution)
    except (OSError, UnicodeDecodeError) as e:
        print(f"error: jobs: cannot read {path}: {e}", file=sys.stderr)
        return EXIT_INPUT
    for number, _, reason in invalid:
        print(f"line {number}: invalid: {reason}", file=sys.stderr)
    if invalid and jobs:
        print(f"{len(invalid)} invalid line(s) skipped; running the other {len(jobs)} job(s)", file=sys.stderr)
    results = list(invalid)
    if farm_options(runner.args).enabled:
        from farm.batch import run_on_farm

        results += run_on_farm(runner.args, jobs)
        jobs = []
    for number, prepared in jobs:
        print(f"line {number}: {prepared.request.prompt[:60]!r}")
        code, last = runner.run(prepared)
        status = {EXIT_OK: "done", EXIT_STOPPED: "stopped"}.get(code, "failed")
        where = str(getattr(last, "video", None) or getattr(last, "message", ""))
        results.append((number, status, where))
    results.sort()
    print("\nbatch summary")
    for number, status, where in results:
        print(f"  line {number:>3}: {status:<8} {where}")
    done = sum(1 for r in results if r[1] == "done")
    print(f"{done}/{len(results)} jobs done")
    return EXIT_OK if results and done == len(results) else EXIT_FAILED


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["queue"]:
        from cli.queue import main as queue_main

        return queue_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.host_ram_gb is not None and not args.host_ram_gb > 0:
        parser.error("--host-ram-gb: must be more than 0 (GB of host RAM this program may use)")
    cli_log.setup_logging(args.quiet, args.verbose)
    runner = Runner(args)
    if args.command == "generate":
        from common.errors import InputError

        try:
            request = request_from_args(args)
        except InputError as e:                 # a start image or a video is required (configs/controls.py)
            parser.error(cli_message(e, OPTION_OF_FIELD))
        return runner.run(request)[0]
    if args.command == "resume":
        return runner.resume(args.job_dir)[0]
    return run_batch(runner, args.jobs)
