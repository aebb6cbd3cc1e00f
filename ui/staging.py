"""Staged images: a queued job's own copies of the files it will read, so that nothing (Gradio's temp-file
sweeper, the user deleting an upload) can take them away before it runs. One folder per ticket under
outputs/.staged (hidden from the gallery), deleted when the job ends; folders left by a killed app go at the
next start."""
from __future__ import annotations

import dataclasses
import shutil
import time
from pathlib import Path

STAGED = ".staged"              # under outputs/: the staged images of waiting and running jobs (never in the gallery)
STAGED_STALE_S = 86400          # staged folders left by an app that was killed are deleted at the next start


def stage_images(outputs: Path, ticket_id: str, request):
    """(the request with its image files replaced by copies in the ticket's folder, that folder or None when
    there was no file to copy)."""
    folder, changes = None, {}
    for name, stem in (("image", "start"), ("end_image", "end")):
        source = getattr(request, name, None)
        if isinstance(source, (str, Path)) and Path(source).is_file():
            if folder is None:
                folder = outputs / STAGED / ticket_id
                folder.mkdir(parents=True, exist_ok=True)
            target = folder / (stem + Path(source).suffix.lower()[:8])
            shutil.copyfile(source, target)
            changes[name] = str(target)
    return (dataclasses.replace(request, **changes) if changes else request), folder


def unstage(folder: Path | None) -> None:
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def sweep_stale(outputs: Path) -> None:
    folder = outputs / STAGED
    if not folder.is_dir():
        return
    for d in folder.iterdir():
        try:
            if time.time() - d.stat().st_mtime > STAGED_STALE_S:
                shutil.rmtree(d, ignore_errors=True)
        except OSError:
            pass
