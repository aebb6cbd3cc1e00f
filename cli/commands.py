"""Command line: `python -m cli generate|batch|resume ...` (see --help).

Every job goes through the outputs folder's one queue (jobs/store.py) and its one runner (jobs/runner.py), as the
app's do: `generate`, `batch` and `resume` add their jobs to the queue (checked whole by the runner's pre-flight
first), then run the queue in this process until their jobs have ended, with a progress bar. When the app (or
another command line) already runs that queue, its runner runs them: this command then follows them in the queue
and says how they ended. A command line killed while its jobs run leaves them in the queue, where the next runner
(the app at its start, or the next command line) continues them in their job folders.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import time
from pathlib import Path
from typing import Any

from cli import log as cli_log
from common.environment import read_environment
from common.errors import InputError
from common.portable import handle_signal
from configs.controls import CONTROLS, Control, control
from configs.options import OneLineParser, add_process_options, config_from, outputs_problem
from configs.presets import get_preset
from configs.runtime import Config
from jobfolder.folder import finished_video, load_job, result_of
from jobs import jsonl
from jobs import store as qs
from jobs.doors import LOCAL, admitted
from jobs.line import Waiting
from jobs.preflight import preflight_for
from post.steps import EXPORTS, PostRequest, is_post
from post.steps import request_from as post_request_from

log = logging.getLogger("cli.commands")

EXIT_OK, EXIT_FAILED, EXIT_INPUT, EXIT_STOPPED = 0, 1, 2, 130
STOP_SIGNALS = ("SIGINT", "SIGTERM")      # Ctrl-C, and what a service manager or `kill` sends: a job stops at its step
FOLLOW_S = 1.0              # how often a job run by another process is looked at in the queue

# The option (and the batch file's key) that sets each field a request check can name (configs/controls.py).
# A check may name a field by its label ("LoRAs", pipeline/lora.py); a repeated option by the spelling given once per
# value (--lora a.safetensors --lora b.safetensors).
OPTION_OF_FIELD = {**{name: (c.cli_aliases[0] if c.repeat and c.cli_aliases else c.option)
                      for c in CONTROLS if c.option for name in (c.label, c.field_name) if name},
                   "host RAM": "--host-ram-gb"}
KEY_OF_FIELD = {name: c.name for c in CONTROLS for name in (c.label, c.field_name) if name}


def cli_message(error, names: dict[str, str]) -> str:
    """An InputError as the command line says it: the option (or batch key) and full file paths."""
    return error.cli_text(names.get(error.field, error.field))


def add_common(p: argparse.ArgumentParser, *, preset_default: str | None = None) -> None:
    add_process_options(p, preset_default=preset_default)
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


def add_new_seed(p: argparse.ArgumentParser) -> None:
    """`batch` and `queue add`: the `new_seed` control for every line of the file (a line's own key otherwise)."""
    c = control("new_seed")
    p.add_argument(str(c.option), dest="new_seed", choices=c.choices, default=None,
                   help=c.help + " (for every line; else each line's own \"new_seed\")")


def build_parser(controls: tuple[Control, ...] = CONTROLS) -> argparse.ArgumentParser:
    prog = "steadyframe-cli" if Path(sys.argv[0]).name == "steadyframe-cli" else "python -m cli"
    parser = OneLineParser(prog=prog, description="FramePack image-to-video, headless.")
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="make one video")
    add_settings(g, controls)
    g.add_argument("--settings", dest="saved_settings", metavar="NAME",
                   help="start from the settings saved under NAME (the page's Saved settings, in the outputs "
                        "folder's .settings/); the options given here win")
    add_common(g)                 # --preset not given: an extended job folder gives its own (as resume)
    b = sub.add_parser("batch", help="run the jobs of a JSON-lines file, one job per line")
    b.add_argument("jobs", type=Path, help="each line: a JSON object with generate's settings, e.g. "
                                           '{"image": "a.png", "prompt": "...", "seconds": 3}')
    add_new_seed(b)
    add_common(b)
    r = sub.add_parser("resume", help="continue an interrupted job from its folder")
    r.add_argument("job_dir", type=Path, help="the job's folder under outputs/")
    add_common(r)
    s = sub.add_parser("post", help="after the video: interpolate, upscale, trim, speed, loop, reverse, join and "
                                     "export a video (a post-processing job of the queue)")
    s.add_argument("source", nargs="+", help="the video: a file, a finished job's folder or its job id in --outputs "
                                             "(several: joined in this order)")
    s.add_argument("--steps", nargs="*", default=[], metavar="STEP",
                   help="in order: trim=A:B (seconds), speed=S, reverse, pingpong, loop=N, interpolate=2|4|fps:F[:FILE] "
                        "(RIFE), faces[=S][:FILE] (GFPGAN face restoration, strength S 0.05-1; file in --upscaler-dir; "
                        "default GFPGAN v1.4), upscale=2|4[:FILE] (ESRGAN-family file in --upscaler-dir; default "
                        "Real-ESRGAN)")
    s.add_argument("--export", choices=sorted(EXPORTS), default="mp4",
                   help="what to write besides the H.264 final.mp4: h265, webm (VP9), gif (with its own palette), "
                        "zip (PNG frames), frame (one frame as PNG, see --frame)")
    s.add_argument("--frame", type=int, default=-1, help="with --export frame: which frame (0 = first; -1 = the last)")
    s.add_argument("--crf", type=int, default=16, help="H.264 quality of final.mp4 (0-51, lower is better)")
    add_common(s)
    sub.add_parser("queue", add_help=False, help="the app's job queue on disk: add, list, export, move, remove, "
                                                 "run (python -m cli queue -h)")     # cli/queue.py
    sub.add_parser("studio", add_help=False, help="a FramePack-Studio job's settings (.json or .png) as one batch "
                                                  "line (python -m cli studio -h)")     # cli/studio.py
    return parser


def request_from_args(a: argparse.Namespace, saved=None, given: set[str] | None = None):
    """The Request of generate's options; with `saved` (pipeline.saved_settings.Loaded), its values and images
    for every control whose option is not in `given` (the controls named on the command line)."""
    from pipeline.request import Request

    values = {c.name: getattr(a, c.name) for c in Request.CONTROLS if c.option}
    values.update({c.name: ", ".join(values[c.name] or [c.default]) for c in Request.CONTROLS
                   if c.repeat})                                      # a repeated option: its values joined
    if saved is not None:
        for name, value in {**saved.settings, **saved.images}.items():
            if name not in (given or set()):
                values[name] = value
    return Request.from_mapping(admitted(values, LOCAL))             # the one door check (jobs/doors.py)


def given_controls(argv: list[str]) -> set[str]:
    """The controls whose option (or an older spelling) is on the command line."""
    out = set()
    for c in CONTROLS:
        names = [o for o in (c.option, *c.cli_aliases) if o]
        if any(tok == o or tok.startswith(o + "=") for tok in argv for o in names):
            out.add(c.name)
    return out


def say_rounding(request, quiet: bool) -> None:
    """The length is whole sections: say what --seconds becomes when it is not one."""
    from pipeline.sections import make_plan

    plan = make_plan(request.mode, request.seconds, request.latent_window, request.fps)
    actual = plan.total_frames / request.fps
    if not quiet and abs(actual - request.seconds) >= 0.05:
        print(f"--seconds {request.seconds:g} is rounded to whole sections: {plan.count} section(s), "
              f"{plan.total_frames} frames = {actual:.1f} s", file=sys.stderr)


class Command:
    """One command line's jobs: queued in the outputs folder's queue, then run here (or followed, when another
    process runs that queue)."""

    def __init__(self, config: Config, *, quiet: bool, verbose: bool, preset_given: bool = True):
        self.config, self.quiet, self.verbose = config, quiet, verbose
        self.preset_given = preset_given            # resume: else the job's own preset
        self.runner: Any = None                   # jobs.runner.Runner, once opened
        self.line: Any = None                     # jobs.follow.QueueLine: its jobs followed, their waits
        self.aborted = False          # a second Ctrl-C: the job was not waited for
        self.signal: int | None = None            # the stop signal that came (SIGINT, SIGTERM), once one did
        self.outputs_label = "--out"             # what names the outputs folder to the user (resume: its job folder)
        self._preflight = None

    @property
    def preflight(self):
        """The one pre-flight (jobs/preflight.py): the jobs are checked with it before anything is written."""
        if self._preflight is None or self._preflight.config is not self.config:

            try:
                self._preflight = preflight_for(self.config, self.device)
            except RuntimeError as e:           # --fp8-compute on a device that cannot (the message says why)
                print(f"error: {e}", file=sys.stderr)
                raise SystemExit(EXIT_INPUT) from None
        return self._preflight

    @property
    def device(self):
        """--device, checked (memory/device.py): raises InputError naming what is there; else the default."""
        if self.config.device:
            from memory.device import chosen_device  # torch only: answered before the models' imports

            return chosen_device(self.config.device)
        from memory.manager import default_device

        return default_device()

    def open(self):
        """The queue's runner (not started): its jobs run on the farm of --ray/--gpus/--cpu-workers, or here."""
        from farm.executor import queue_executor
        from jobs.follow import QueueLine
        from jobs.runner import open_runner

        problem = outputs_problem(self.config.outputs, create=True)      # read-only, a file: said before anything
        if problem:
            print(f"error: {self.outputs_label}: {problem}", file=sys.stderr)
            raise SystemExit(EXIT_INPUT)
        preflight, device = self.preflight, self.device
        from jobs.split import SplitUnavailable

        try:
            executor = queue_executor(self.config, preflight.models, device)
        except SplitUnavailable as e:                                 # --gpus-per-job N where it cannot run
            print(f"error: {e}", file=sys.stderr)
            raise SystemExit(EXIT_INPUT) from None
        except (RuntimeError, ConnectionError, ValueError) as e:      # no Ray, no cluster there, no GPUs
            print(f"error: the job farm could not start: {e}", file=sys.stderr)
            raise SystemExit(EXIT_FAILED) from None
        self.runner, warning = open_runner(self.config, executor, device_type=device.type, preflight=preflight)
        self.line = QueueLine(self.runner)
        self.line.learn_from(self.config.outputs)        # the waits said before this process has timed a job
        if warning:
            print(f"warning: {warning}", file=sys.stderr)
        return self.runner

    @property
    def stopped_code(self) -> int:
        """The exit code of a command a signal stopped: 128 + the signal's number (130 Ctrl-C, 143 SIGTERM)."""
        return 128 + self.signal if self.signal else EXIT_STOPPED

    def close(self) -> None:
        if self.runner is not None:
            self.runner.close(timeout=1 if self.aborted else 30)     # aborted: the step is not waited for
            close = getattr(self.runner.executor, "close", None)
            if close is not None:
                close()

    def exit_code(self, code: int) -> int:
        """`code`, once the runner is closed (a job thread an abort left inside a step: the process ends at once)."""
        from jobs.runner import exit_code_after

        self.close()
        return code if self.runner is None else exit_code_after(self.runner, code, "aborted (a second stop signal)")

    def _on_stop_signals(self, entry_id: str | None):
        """Ctrl-C and SIGTERM stop the job `entry_id` after its step (None: every job this process runs); a second
        one aborts. Returns what puts the previous handlers back."""
        restores = [handle_signal(name, lambda signum, _frame: self._interrupt(entry_id, signum))
                    for name in STOP_SIGNALS]                # main thread only

        def restore() -> None:
            for undo in restores:
                undo()

        return restore

    # ---- running ------------------------------------------------------------------------------------------------
    def run(self, jobs: list) -> list[tuple[int, object]]:
        """Run the queued jobs to their ends: [(exit code, the last event or entry)] in their order. This process's
        runner runs the queue when no other process does (and takes it over when that process dies); else the jobs
        are followed in the queue. Ctrl-C stops a job run here after its current step (a second Ctrl-C aborts)."""
        runner = self.runner
        runner.only = {job.entry for job in jobs}      # its own jobs: what others queued (or left) waits for them
        if runner.store.runner_alive():
            print("the queue of this outputs folder is run by another process (the app?): following the job(s) "
                  "there", file=sys.stderr)
        runner.start()
        results = []
        for job in jobs:
            if self.signal is not None:            # a stop signal stopped the command: the jobs after it do not run
                self.runner.stop(job.entry)
            results.append(self._watch(job))
        return results

    def drain(self) -> int:
        """`queue run`: run (or follow) the queue until no job waits or runs; say how each ended."""

        runner = self.open().start()
        store = runner.store
        said: dict = {}
        seen: list = []
        restore = self._on_stop_signals(None)
        try:
            while True:
                entries = store.entries([qs.WAITING, qs.RUNNING])
                if not runner.busy and (not entries or self.signal is not None):
                    break
                self._say_messages(entries, said, seen)
                time.sleep(FOLLOW_S)
        except _Aborted:
            return self._aborted(None)[0]
        finally:
            restore()
        ended = [store.get(i) for i in seen]
        for e in ended:
            where = f"  {self.config.outputs / e.job_dir}" if e is not None and e.job_dir else ""
            print(f"{e.id}: {e.status:<8}{where}" if e is not None else "a job left the queue")
        done = sum(1 for e in ended if e is not None and e.status == qs.DONE)
        print(f"{done}/{len(ended)} jobs done")
        if self.signal is not None:
            return self.stopped_code
        return EXIT_OK if done == len(ended) else EXIT_FAILED

    def _say_messages(self, entries, said: dict, seen: list) -> None:
        """`queue run`: each entry's new message, once."""
        for e in entries:
            if e.id not in said:
                seen.append(e.id)
                said[e.id] = ""
            if e.message and e.message != said[e.id] and not self.quiet:
                print(f"{e.id}: {e.message}", file=sys.stderr)
                said[e.id] = e.message

    def _watch(self, job) -> tuple[int, object]:
        """A queued job to its end: its events on a progress bar when it runs here, its entry's messages when
        another process runs it."""
        from jobs.text import waiting_text
        from pipeline.events import LogLine, Progress, SectionVideo, WorkerLine

        restore = self._on_stop_signals(job.entry)
        bar = None if self.quiet else _progress_bar()
        last, said = None, ""
        try:
            batches = ([] if ev is None else [ev] for ev in self.line.follow(job, tick_s=FOLLOW_S))
            for batch in batches:
                if not batch and not job.started:          # waiting, or run by another process
                    entry = self.runner.store.get(job.entry)
                    if entry is None or entry.status in qs.FINISHED:
                        last = entry
                        break
                    if bar is not None and entry.message and entry.message != said:
                        bar.set_description(entry.message[:80])
                        said = entry.message
                for ev in batch:
                    last = ev
                    if bar is None:
                        continue
                    if isinstance(ev, Waiting):
                        bar.set_description(waiting_text(ev))
                    elif isinstance(ev, Progress):
                        if ev.sections and bar.total != ev.sections * ev.steps:
                            bar.reset(total=ev.sections * ev.steps)
                        bar.n = max(0, ev.section - 1) * ev.steps + ev.step if ev.section else 0
                        where = f"section {ev.section}/{ev.sections}" if ev.section else ""
                        loading = ev.stage == "loading models" and ev.message
                        bar.set_description(ev.message if loading else f"{ev.stage} {where}".strip())
                        bar.refresh()
                    elif isinstance(ev, SectionVideo):
                        bar.write(f"section {ev.section}/{ev.sections}: {ev.frames} frames -> {ev.path}")
                    elif isinstance(ev, LogLine) and ev.level == "warning":     # an error: the end says it
                        bar.write(f"{ev.level}: {ev.message}")
                    elif isinstance(ev, WorkerLine):          # which farm worker runs it (farm/dispatch.py)
                        bar.write(ev.message, file=sys.stderr)
        except _Aborted:
            restore()                                    # a third Ctrl-C ends the process as Python does
            if bar is not None:
                bar.close()
                bar = None
            return self._aborted(job.entry)
        finally:
            restore()
            if bar is not None:
                bar.close()
        return self._ended(last)

    def _ended(self, last) -> tuple[int, object]:
        """What the command line says of a job's end (its last event here, or its entry when run elsewhere)."""
        from pipeline.events import Cancelled, Done, Failed

        if isinstance(last, qs.Entry):
            last = _as_event(last, self.config.outputs)
        if isinstance(last, Done):
            if last.stopped and last.video is None:
                print(f"stopped before its first section; `python -m cli resume {last.job_dir}` continues it",
                      file=sys.stderr)
            else:
                what = "stopped; kept" if last.stopped else "done:"
                print(f"{what} {last.video} ({last.frames} frames) in {last.job_dir}")
            return (self.stopped_code if last.stopped else EXIT_OK), last
        if isinstance(last, Cancelled):
            print("stopped before it started", file=sys.stderr)
            return self.stopped_code, last
        message = getattr(last, "message", "the job left the queue before it ended")
        if isinstance(last, Failed) and last.detail:
            # always in the log file (the record keeps the cause); on the terminal only with -v
            log.error("the job failed: %s\n%s", message, last.detail, extra={"terminal": self.verbose})
        where = "" if self.verbose or not getattr(last, "detail", "") else \
            f" (-v shows the traceback{cli_log.log_file_note()})"
        print(f"error: {message}{where}", file=sys.stderr)
        return EXIT_FAILED, last

    def _interrupt(self, entry_id: str | None, signum: int) -> None:
        """(The signal handler.) The first stop signal stops the job (`entry_id`; None: all of this process's)
        after its current step; a second aborts."""
        if self.signal is not None:
            raise _Aborted(entry_id)
        self.signal = signum
        print("\nstopping after this step (Ctrl-C again to abort)...", file=sys.stderr)
        self.runner.stop_all()                     # no other job starts here; the running ones stop
        if entry_id is not None:
            self.runner.stop(entry_id)             # (a waiting one leaves the queue)

    def _aborted(self, entry_id: str | None) -> tuple[int, object]:
        """A second stop signal: no waiting for the step; the job folders say "stopped" (what is written is kept,
        and `resume` continues them), the queue entries too, and one line says so (no traceback)."""
        from pipeline.events import Cancelled

        self.aborted = True
        folders = self.runner.abandon("aborted (a second stop signal)")
        for folder in folders:
            print(f"aborted; the sections made so far are in {folder}: `python -m cli resume {folder}` continues "
                  f"the job", file=sys.stderr)
        if not folders:
            print("aborted before the job started", file=sys.stderr)
        return self.stopped_code, Cancelled()


class _Aborted(KeyboardInterrupt):
    """The second Ctrl-C of a job run here (raised from the SIGINT handler)."""


def _as_event(entry, outputs: Path):
    """A finished entry (run by another process) as the event that ended it."""
    from pipeline.events import Done, Failed

    if entry.status == qs.FAILED:
        return Failed(entry.message)
    folder = outputs / entry.job_dir if entry.job_dir else None
    video, frames = result_of(folder) if folder is not None else (None, 0)       # what its job.json says it made
    return Done(folder, video, frames, entry.status == qs.STOPPED)  # type: ignore[arg-type]  # no folder: None


def _progress_bar():
    from tqdm import tqdm

    return tqdm(total=None, unit="step", dynamic_ncols=True, desc="starting")


def read_batch(path: Path, prepare) -> tuple[list[tuple[int, object]], list[tuple[int, str, str]]]:
    """Every job of a JSON-lines file (read by the one reader, jobs/jsonl.py `job_lines`), checked before any of
    them runs; a bad line is reported and skipped, the others run (README, "Command line"): ([(line number,
    PreparedRequest or PostRequest)], [(line number, "invalid", reason)]). `prepare`: a Request -> PreparedRequest
    that raises InputError (`check_request`, or a Preflight's prepare)."""
    from pipeline.request import Request

    jobs: list[tuple[int, object]] = []
    invalid: list[tuple[int, str, str]] = []
    for number, obj in jsonl.job_lines(path.read_text("utf-8"), door=LOCAL):
        if isinstance(obj, InputError):
            invalid.append((number, "invalid", obj.message))
            continue
        try:
            if is_post(obj):            # a post job: {"kind": "post", "source": "a.mp4", "steps": [...], ...}
                jobs.append((number, post_request_from(obj, base=path.parent)))
                continue
            jobs.append((number, prepare(Request.from_mapping(obj, base=path.parent))))
        except InputError as e:
            invalid.append((number, "invalid", cli_message(e, KEY_OF_FIELD)))
        except (ValueError, TypeError) as e:    # a value no control's check foresaw: the line, not the batch
            invalid.append((number, "invalid", f"{type(e).__name__}: {str(e)[:200]}"))
    return jobs, invalid


def check_request(request, config: Config):
    """A request's own fields and images (pipeline/request.py `prepare`: PIL, not torch), checked before anything
    loads the models' libraries: a typo in a path or a value is said in a fraction of a second. The pre-flight's
    checks against the models and memory follow (Preflight.prepare takes the PreparedRequest as it is)."""
    from pipeline.request import prepare

    return prepare(request, get_preset(config.preset).default_resolution)


def run_batch(command: Command, path: Path, new_seed: str | None = None) -> int:
    try:                         # the file and each line's own fields and images first: nothing of torch loaded yet
        checked, invalid = read_batch(path, lambda request: check_request(request, command.config))
    except (OSError, UnicodeDecodeError) as e:
        print(f"error: jobs: cannot read {path}: {e}", file=sys.stderr)
        return EXIT_INPUT
    jobs = []
    if any(not isinstance(p, PostRequest) for _, p in checked):         # generation jobs need the main models
        problem = _weights_problem(command.config, "original") or _weights_problem(command.config, "f1")
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return EXIT_INPUT
    if checked:
        for number, prepared in checked:             # then what the models and the memory limits decide
            try:
                jobs.append((number, command.preflight.prepare(prepared)))
            except InputError as e:
                invalid.append((number, "invalid", cli_message(e, KEY_OF_FIELD)))
        invalid.sort()
    for number, _, reason in invalid:
        print(f"line {number}: invalid: {reason}", file=sys.stderr)
    if invalid and jobs:
        print(f"{len(invalid)} invalid line(s) skipped; running the other {len(jobs)} job(s)", file=sys.stderr)
    if new_seed is not None:
        from jobs.runner import with_new_seed_switch

        jobs = [(number, p if is_post(p.request.settings()) else with_new_seed_switch(p, new_seed))
                for number, p in jobs]
    from jobs.text import waiting_text

    queued = command.open().submit_many([p for _, p in jobs], origin="batch", checked=True) if jobs else []
    for (number, prepared), job in zip(jobs, queued):
        request = prepared.request
        what = (" ".join(s.text() for s in request.steps) if isinstance(request, PostRequest) else request.prompt)
        place = command.line.waiting(job)                # as the page says it (jobs/follow.py, jobs/line.py)
        print(f"line {number}: {what[:60]!r} (queued as {job.entry})"
              + (f": {waiting_text(place)}" if place is not None else ""))
    results = list(invalid)
    for (number, _), (code, last) in zip(jobs, command.run(queued) if queued else []):
        status = {EXIT_OK: "done", EXIT_STOPPED: "stopped"}.get(code, "failed")
        where = str(getattr(last, "video", None) or getattr(last, "message", ""))
        results.append((number, status, where))
    results.sort()
    print("\nbatch summary")
    for number, status, where in results:
        print(f"  line {number:>3}: {status:<8} {where}")
    done = sum(1 for r in results if r[1] == "done")
    print(f"{done}/{len(results)} jobs done")
    if invalid and not jobs:            # nothing could run: the file is the problem, as for one bad `generate`
        return EXIT_INPUT
    return EXIT_OK if results and done == len(results) else EXIT_FAILED


def _job_preset(folder) -> str | None:
    """The preset a job folder was made with (its job.json), or None when it is not a job folder."""
    if not folder or not (Path(folder) / "job.json").is_file():
        return None
    try:
        models = load_job(Path(folder)).get("models")
    except (OSError, ValueError):
        return None
    return models.get("preset") if isinstance(models, dict) and isinstance(models.get("preset"), str) else None


def _weights_problem(config: Config, mode: str) -> str | None:
    """The real weights missing where they cannot be downloaded (--model-dir given, or HF_HUB_OFFLINE): said before
    anything else is checked, since nothing else can help then. Online, they are downloaded at the job's start."""
    from pipeline.availability import missing_weights_message  # (torch, through the loaders)

    message = missing_weights_message(get_preset(config.preset), mode, config.model_dir)
    if message and (config.model_dir or read_environment().offline):
        return message
    return None


def run_generate(command: Command, request) -> int:
    extended = _job_preset(request.input_video) if not command.preset_given else None
    if extended is not None and extended != command.config.preset:     # as resume: the job's own models
        command.config = _replace(command.config, preset=extended)
    try:
        prepared = check_request(request, command.config)     # its own fields and images: nothing of torch loaded
    except InputError as e:
        print(f"error: {cli_message(e, OPTION_OF_FIELD)}", file=sys.stderr)
        return EXIT_INPUT
    problem = _weights_problem(command.config, request.mode)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return EXIT_INPUT
    try:
        prepared = command.preflight.prepare(prepared)         # the one pre-flight: nothing written, nothing loaded
    except InputError as e:
        print(f"error: {cli_message(e, OPTION_OF_FIELD)}", file=sys.stderr)
        return EXIT_INPUT
    say_rounding(prepared.request, command.quiet)
    job = command.open().submit(prepared, origin="cli", checked=True)
    return command.run([job])[0][0]


def _settings_of(job_dir: Path) -> dict:
    try:
        settings = load_job(job_dir).get("settings")
    except (OSError, ValueError):
        return {}
    return settings if isinstance(settings, dict) else {}


def run_resume(command: Command, job_dir: Path) -> int:
    done = finished_video(job_dir)       # a finished job: said at once, nothing loaded
    if done is not None:
        print(f"job {Path(job_dir).name} is already complete; its video is {done.resolve()}")
        return EXIT_OK
    from pipeline.resume import prepare_resume

    if is_post(_settings_of(job_dir)):           # a post job continues at its next chunk
        command.config = _replace(command.config, outputs=Path(job_dir).resolve().parent)
        try:
            queued = command.open().submit_resume(job_dir, origin="cli")
        except InputError as e:
            print(f"error: {cli_message(e, OPTION_OF_FIELD)}", file=sys.stderr)
            return EXIT_INPUT
        return command.run([queued])[0][0]
    try:
        job = prepare_resume(job_dir)             # job.json and settings checked, images decoded: once
    except InputError as e:
        print(f"error: {cli_message(e, OPTION_OF_FIELD)}", file=sys.stderr)
        return EXIT_INPUT
    from jobs.runner import Busy  # (torch, through the runner's imports)

    command.outputs_label = "job folder"
    command.config = _replace(command.config, preset=command.config.preset if command.preset_given else job.preset,
                              outputs=Path(job_dir).resolve().parent)
    problem = command.preflight.host_problem(job.prepared)
    if problem:
        print(f"error: --host-ram-gb: {problem}", file=sys.stderr)
        return EXIT_INPUT
    try:
        queued = command.open().submit(job, origin="cli")
    except InputError as e:
        print(f"error: {cli_message(e, OPTION_OF_FIELD)}", file=sys.stderr)
        return EXIT_INPUT
    except Busy as e:                            # its runner (this queue's, in another process) has it
        print(f"error: job folder: {e}; wait for it to end, or stop it where it runs", file=sys.stderr)
        return EXIT_INPUT
    return command.run([queued])[0][0]


def post_source(text: str, outputs: Path) -> Path:
    """A post job's source on the command line: a video file, a finished job's folder, or a job id in `outputs`
    (their final.mp4). InputError naming "video"."""
    path = Path(text)
    if not path.exists() and Path(text).name == text and not text.startswith(".") and (Path(outputs) / text).is_dir():
        path = Path(outputs) / text
    if path.is_dir():
        video = finished_video(path)
        if video is None:
            raise InputError("video", f"{text} is not a finished job's folder (no done final.mp4); give a video file "
                                      f"or a finished job")
        return video
    return path


def run_post(command: Command, args) -> int:
    """`post`: checked whole by the one pre-flight (the videos read, the steps planned, every model file read and
    recognised) before anything is queued; then run (or followed) like any job."""
    try:
        sources = [post_source(s, command.config.outputs) for s in args.source]
        request = post_request_from({"sources": [str(s) for s in sources], "steps": args.steps,
                                     "export": args.export, "frame": args.frame, "crf": args.crf})
        checked = command.preflight.prepare(request)
    except InputError as e:
        print(f"error: {cli_message(e, {'video': 'source', 'steps': '--steps', 'export': '--export', 'crf': '--crf'})}",
              file=sys.stderr)
        return EXIT_INPUT
    plan = checked.plan
    if not command.quiet:
        print(f"{plan.out_frames} frames at {float(plan.out_fps):g} fps, {plan.out_width}x{plan.out_height}",
              file=sys.stderr)
    job = command.open().submit(checked, origin="cli", checked=True)
    return command.run([job])[0][0]


def _replace(config: Config, **changes) -> Config:
    return dataclasses.replace(config, **changes)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    config = config_from(parser, args)
    cli_log.setup_logging(args.quiet, args.verbose)
    command = Command(config, quiet=args.quiet, verbose=args.verbose, preset_given=args.preset is not None)
    if config.device and args.command in ("generate", "resume", "batch"):
        try:
            command.device          # --device checked before anything else loads: exit 2, one line
        except InputError as e:
            print(f"error: {cli_message(e, OPTION_OF_FIELD)}", file=sys.stderr)
            return EXIT_INPUT
    try:
        if args.command == "generate":

            try:
                saved = None
                if args.saved_settings:             # --settings NAME: the page's saved settings
                    from pipeline.saved_settings import in_outputs

                    saved = in_outputs(config.outputs).load(args.saved_settings)
                    for line in saved.left_out:
                        print(f"warning: --settings {saved.name}: left out {line}", file=sys.stderr)
                request = request_from_args(args, saved, given_controls(sys.argv[1:] if argv is None else argv))
            except InputError as e:                 # a start image or a video is required (configs/controls.py)
                if e.field == "settings name":
                    print(f"error: --settings: {e.message}", file=sys.stderr)
                    command.close()
                    return EXIT_INPUT
                parser.error(cli_message(e, OPTION_OF_FIELD))
            code = run_generate(command, request)
        elif args.command == "post":
            code = run_post(command, args)
        elif args.command == "resume":
            code = run_resume(command, args.job_dir)
        else:
            code = run_batch(command, args.jobs, args.new_seed)
    except qs.QueueLocked as e:                       # another program kept the queue's database locked too long
        print(f"error: {e}", file=sys.stderr)
        code = EXIT_FAILED
    except BaseException:
        command.close()
        raise
    return command.exit_code(code)
