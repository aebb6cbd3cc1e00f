"""The memory plan's size line on the page: which size the job will have (the bucket of the start image at the
resolution, or the custom width × height), what it costs under the VRAM cap, or why it cannot fit and the nearest
size that does (pipeline/resolution.py). Raw page values in, never raising: a live hint must not break the page."""
from __future__ import annotations

import logging

from common.errors import InputError
from pipeline.resolution import job_size, plan_text
from ui import hints, messages
from ui import settings as st

log = logging.getLogger(__name__)


def image_size(value) -> tuple[int, int] | None:
    """(height, width) of an uploaded start image from its header (EXIF rotation applied), None without one (or
    for a value that is not an upload)."""
    try:
        path = st.client_file(value, "image")
    except InputError:
        return None
    if path is None:
        return None
    from PIL import Image

    from pipeline.images import FORMATS

    try:
        with Image.open(path, formats=FORMATS) as img:          # (the header only; no other format's decoder)
            w, h = img.size
            if img.getexif().get(0x0112) in (5, 6, 7, 8):       # rotated by 90°: pipeline.images applies it
                w, h = h, w
            return h, w
    except (OSError, ValueError, SyntaxError):
        return None


def size_line(preset, cap_gb: float, resolution, width, height, window, image=None,
              weight_storage: str = "native", fp8_compute: bool = False) -> tuple[tuple[int, int] | None, str]:
    """((height, width) of the job or None, the line for the page); `weight_storage`, `fp8_compute`: the
    process's (Config), as the pre-flight checks the job."""

    r, w, h, n = (hints.number(v) for v in (resolution, width or 0, height or 0, window))
    if r is None or w is None or h is None or n is None or r < 16 or not 1 <= n <= 64:
        return None, ""
    if r % 16 or w % 16 or h % 16 or max(r, w, h) > 4096:
        return None, "⚠ Resolution, custom width and height must be multiples of 16 (see Advanced)."
    hw = image_size(image)
    try:
        size = job_size(*(hw or (1, 1)), int(r), int(w), int(h))
    except InputError as e:
        return None, f"⚠ {messages.input_error(e)}"
    try:
        return (size.height, size.width), plan_text(preset, cap_gb, int(r), int(w), int(h), int(n), hw,
                                                    weight_storage, fp8_compute)
    except Exception:
        log.warning("could not compute the size's memory plan", exc_info=True)
        return None, ""
