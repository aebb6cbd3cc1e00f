"""Gradio's temporary copies: every upload and every video the page or the API shows is copied into Gradio's temp
folder (a new file per job and section), which would grow for as long as the app runs. This deletes this app's
copies once they are older than a maximum age (and all of them when the app stops); outputs/ is never touched.

Gradio's own `gr.Blocks(delete_cache=...)` does the same, but in 6.31 it iterates the live sets of file names while
requests add to them: the first upload that lands during a sweep raises "Set changed size during iteration" and
ends the cleanup task for good (tests/test_server_soak.py showed it). Here every sweep works on snapshots and any
error is logged, never fatal.

A file that a waiting or running job will read is never swept: the events in Gradio's queue (waiting or being
processed) name their uploads, and those are skipped; once a job is queued it reads the queue's own copies of its
files under outputs/.queue/ (jobs/store.py), which no sweep touches.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from pathlib import Path

log = logging.getLogger(__name__)


class Sweeper:
    """Deletes the files a Blocks app put in Gradio's temp folder once they are older than `max_age_s` (by ctime,
    which Gradio refreshes when it hands a cached copy out again). The per-file hash folders this empties are
    removed a sweep later, once idle as long (Gradio may be putting the same file there again right now)."""

    def __init__(self, max_age_s: float):
        self.max_age_s = max_age_s
        self.emptied: set[Path] = set()

    def __call__(self, blocks, now: float | None = None, max_age_s: float | None = None) -> int:
        now = time.time() if now is None else now
        max_age = self.max_age_s if max_age_s is None else max_age_s
        cache = Path(blocks.GRADIO_CACHE).resolve()
        for folder in list(self.emptied):
            try:
                if now - folder.stat().st_mtime <= max_age:
                    continue                          # emptied lately: maybe in use again soon
                folder.rmdir()
            except OSError:
                pass                                  # gone already, or in use again (not empty)
            self.emptied.discard(folder)
        keep: set = set(files_of_queued_events(blocks))
        for block in list(blocks.blocks.values()):
            keep.update(getattr(block, "keep_in_cache", ()))
        removed = 0
        for names in list(blocks.temp_file_sets):
            for name in list(names):                  # a snapshot (list() of a set is atomic under the GIL)
                if name in keep:
                    continue
                try:
                    if now - os.lstat(name).st_ctime <= max_age:
                        continue
                    os.remove(name)
                    removed += 1
                except FileNotFoundError:
                    pass
                except OSError as e:
                    log.debug("could not delete %s: %s", name, e)
                    continue
                names.discard(name)
                parent = Path(name).resolve().parent
                if parent.parent == cache:
                    self.emptied.add(parent)
        return removed


def _paths(value, out: set, depth: int = 0) -> None:
    if depth > 6:
        return
    if isinstance(value, dict):
        path = value.get("path")
        if isinstance(path, str):
            out.add(path)
            with contextlib.suppress(OSError):
                out.add(str(Path(path).resolve()))
        for v in value.values():
            if isinstance(v, (dict, list, tuple)):
                _paths(v, out, depth + 1)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _paths(v, out, depth + 1)


def files_of_queued_events(blocks) -> set[str]:
    """The file paths named by the events in Gradio's queue (waiting, or being processed). Gradio has no public
    view of its queue: this reads `blocks._queue.event_ids_to_events` (Gradio 6.31) and returns nothing, with a
    log line, if that changes."""
    queue = getattr(blocks, "_queue", None)
    events = getattr(queue, "event_ids_to_events", None)
    if not isinstance(events, dict):
        if queue is not None:
            log.warning("temporary files: Gradio's queue has no event_ids_to_events; queued uploads are not pinned")
        return set()
    out: set = set()
    for event in list(events.values()):
        body = getattr(event, "data", None)
        _paths(getattr(body, "data", None), out)
    return out


def cleanup_lifespan(max_age_s: float, every_s: float | None = None):
    """A FastAPI lifespan (launch(app_kwargs={"lifespan": ...})) that sweeps every `every_s` seconds while the app
    runs and deletes all of this app's copies when it stops."""
    every_s = every_s or max(1.0, min(3600.0, max_age_s / 4))
    sweep = Sweeper(max_age_s)

    async def loop(app):
        while True:
            await asyncio.sleep(every_s)
            try:
                removed = await asyncio.to_thread(sweep, app.get_blocks())
                if removed:
                    log.info("deleted %d temporary file(s) older than %g s", removed, max_age_s)
            except Exception as e:  # never fatal: the next sweep tries again
                log.warning("temporary files: sweep failed: %s", e, exc_info=True)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        task = asyncio.create_task(loop(app))
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            try:
                blocks = app.get_blocks()
                sweep(blocks, max_age_s=-1.0)
                sweep(blocks, max_age_s=-1.0)         # and the folders that emptied
            except Exception as e:
                log.warning("temporary files: final sweep failed: %s", e, exc_info=True)

    return lifespan
