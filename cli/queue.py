"""`python -m cli queue ...`: the app's job queue on disk (jobs/store.py) from the command line,
whether the app is running or not (a running app picks new jobs up within a second; a stopped one at its start).

    python -m cli queue add jobs.jsonl [--outputs outputs]     one job a line, all checked before any is added
    python -m cli queue add queue_export.zip                   FramePack-Studio's queue export (zip or queue.json)
    python -m cli queue list [--json]
    python -m cli queue export waiting.jsonl
    python -m cli queue move <id> <position>                   0: first among the waiting jobs
    python -m cli queue remove <id>                            a waiting or finished job
    python -m cli queue run [--preset tiny ...]                run the waiting jobs here until none is left
                                                               (or follow them, when the app runs the queue)
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from cli import log as cli_log
from cli.commands import Command, add_common, add_new_seed
from common.errors import InputError
from configs import PRESETS
from configs.options import OneLineParser, config_from
from jobs import jsonl, studio
from jobs import store as qs
from jobs.doors import LOCAL
from jobs.runner import enqueue, with_new_seed_switch
from pipeline.request import Request
from post.steps import is_post

EXIT_OK, EXIT_FAILED, EXIT_INPUT = 0, 1, 2


def build_parser() -> argparse.ArgumentParser:
    common = OneLineParser(add_help=False)
    common.add_argument("--outputs", "--out", dest="outputs", type=Path, default=Path("outputs"),
                        help="the app's outputs folder (default: outputs)")
    common.add_argument("--preset", default="hunyuan", choices=sorted(PRESETS),
                        help="the model preset the app runs (its default resolution checks the jobs; default hunyuan)")
    p = OneLineParser(prog="python -m cli queue",
                                description="The app's job queue (outputs/.queue/queue.db): add, list, export, move, "
                                            "remove. The app runs the waiting jobs one after another.")
    sub = p.add_subparsers(dest="action", required=True)
    a = sub.add_parser("add", help="add the jobs of a JSON-lines file (as `python -m cli batch` reads), checked by "
                                   "the app's pre-flight: give the options the app runs with (--preset, "
                                   "--vram-cap-gb, --lora-dir, ...)")
    add_common(a)
    a.add_argument("jobs", type=Path)
    add_new_seed(a)
    ls = sub.add_parser("list", parents=[common], help="the queue in its order, with each job's status")
    ls.add_argument("--json", action="store_true", help="one JSON object a line")
    e = sub.add_parser("export", parents=[common], help="write the waiting (and running) jobs as JSON lines")
    e.add_argument("file", type=Path)
    m = sub.add_parser("move", parents=[common], help="put a waiting job at a position among the waiting jobs "
                                                      "(0: first)")
    m.add_argument("id")
    m.add_argument("position", type=int)
    r = sub.add_parser("remove", parents=[common], help="take a waiting or finished job out of the queue")
    r.add_argument("id")
    run = sub.add_parser("run", help="run the queue's jobs in this process until none waits (the jobs a killed "
                                     "app or command line left continue in their folders)")
    add_common(run)
    return p


def _line(e: qs.Entry) -> str:
    prompt = str(e.settings.get("prompt", ""))[:50]
    return f"{e.id}  {e.status:<8} {e.progress * 100:3.0f} %  {prompt!r}  {e.job_dir or ''}  {e.message[:60]}"


def _add_studio_queue(args, store: qs.QueueStore, preflight) -> int:
    """`queue add` of a FramePack-Studio queue export (its queue.json, or the zip with its images:
    jobs/studio.py `read_queue`): each job Studio would run, checked by the one pre-flight; a job that cannot
    be used is left out with the reason, the others are added, and the report says what was mapped or changed."""
    with tempfile.TemporaryDirectory(prefix="studio-queue-") as folder:
        imported = studio.read_queue(args.jobs, folder, preflight.default_resolution)
        report, prepared = imported.report(), []
        for job in imported.jobs:
            try:
                p = preflight.prepare(Request.from_mapping(job.values()))
            except InputError as e:
                report.append(f"{job.id}: left out: {e.field}: {e.message}")
                continue
            prepared.append(with_new_seed_switch(p, args.new_seed) if args.new_seed is not None else p)
        for line in report:
            print(f"studio: {line}", file=sys.stderr)
        if not prepared:
            print(f"error: {studio.FIELD}: no job of {args.jobs.name} can be added (see above)", file=sys.stderr)
            return EXIT_INPUT
        for entry, _ in enqueue(store, preflight, prepared, origin="queue", checked=True):
            print(f"added {entry.id}: {str(entry.settings.get('prompt', ''))[:60]!r}")
    return EXIT_OK


def _read(args) -> int:
    """`list` and `export`: the queue as it can be read; a damaged database is left as it is (a writer repairs it)."""
    entries, warning = qs.QueueStore.read(args.outputs)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    if args.action == "list":
        for e in entries:
            print(json.dumps(e.summary(), ensure_ascii=False) if args.json else _line(e))
        return EXIT_OK
    unfinished = [e for e in entries if e.status in (qs.WAITING, qs.RUNNING, qs.SHOWN_INTERRUPTED)]
    args.file.write_text(qs.export_lines(unfinished), "utf-8")
    print(f"wrote {len(unfinished)} job(s) to {args.file}")
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.action == "run":
        cli_log.setup_logging(args.quiet, args.verbose)
        command = Command(config_from(parser, args), quiet=args.quiet, verbose=args.verbose)
        try:
            code = command.drain()
        except BaseException:
            command.close()
            raise
        return command.exit_code(code)
    cli_log.setup_logging(quiet=True, verbose=False)         # the store's warnings: one line each, on the terminal
    if args.action in ("list", "export"):                     # readers: they change nothing, not even a damaged file
        return _read(args)
    try:
        store, _ = qs.QueueStore.open(args.outputs)          # (a recovery is said by the store's log)
    except qs.QueueLocked as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAILED
    try:
        # the one pre-flight, built as the app and the command line build it (jobs/preflight.py preflight_for)
        preflight = Command(config_from(parser, args), quiet=True, verbose=False).preflight \
            if args.action == "add" else None
        if args.action == "add" and studio.is_queue_export(args.jobs):
            return _add_studio_queue(args, store, preflight)
        if args.action == "add":
            try:
                text = args.jobs.read_text("utf-8")
            except (OSError, UnicodeDecodeError) as e:
                print(f"error: jobs: cannot read {args.jobs}: {e}", file=sys.stderr)
                return EXIT_INPUT
            prepared = jsonl.prepare_lines(jsonl.read_lines(text, door=LOCAL), preflight, args.jobs.resolve().parent)
            if args.new_seed is not None:
                prepared = [p if is_post(p.request.settings()) else with_new_seed_switch(p, args.new_seed)
                            for p in prepared]
            for entry, _ in enqueue(store, preflight, prepared, origin="queue", checked=True):
                what = entry.settings.get("prompt") or " ".join(map(str, entry.settings.get("steps") or []))
                print(f"added {entry.id}: {str(what)[:60]!r}")
        elif args.action == "move":
            for entry in store.move(args.id, args.position):
                print(_line(entry))
        else:
            print(f"removed {store.remove(args.id).id}")
    except InputError as e:
        print(f"error: {e.cli_text()}", file=sys.stderr)
        return EXIT_INPUT
    except qs.QueueLocked as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        store.close()
    return EXIT_OK
