"""What the page may show of the outputs folder: a job's videos, its thumbnail, its images. The outputs folder itself
is never served (ui/launch.py blocks it: the queue's database, job.json files); a file the page shows is first copied
into Gradio's upload folder, named by its content's hash as Gradio names its own copies, and that copy is served.
The copies are Gradio's temporary files, deleted by ui/tempfiles.py after --temp-max-age."""
from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)


def published(path) -> str | None:
    """A servable copy of the outputs file `path` (None for no file, or one that is gone)."""
    if path is None:
        return None
    from gradio.processing_utils import save_file_to_cache
    from gradio.utils import get_upload_folder

    try:
        return save_file_to_cache(Path(path), get_upload_folder())
    except OSError as e:                    # deleted meanwhile (a job folder removed by its user)
        log.info("cannot show %s: %s", path, e)
        return None
