"""Uploads checked the moment they arrive: a file that is not a usable image is refused there (the image box is
emptied and the message names the box), not shown as a broken picture until Start."""
from __future__ import annotations

import logging

from common.errors import InputError
from ui import messages
from ui.settings import client_file

log = logging.getLogger(__name__)

FIELDS = {"image": "image", "end_image": "end image"}        # control name -> the pipeline's field name


def check_upload(value, control: str) -> tuple[object, str | None]:
    """(the value to keep in the box, a message or None): the upload if the pipeline's loader accepts it (the same
    checks as at Start: readable, a supported format, a usable size), else (None, why)."""
    from pipeline.images import load_image

    field = FIELDS[control]
    try:
        path = client_file(value, field)
        if path is None:
            return value, None
        load_image(path, field)
    except InputError as e:
        log.info("upload refused: %s", e)
        return None, messages.input_error(e)
    return value, None
