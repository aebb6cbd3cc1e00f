"""Messages for the page: fields named by their on-screen labels, no exception class names.

The pipeline names a field by its code name ("image", "distilled CFG (gs)"); a person looking at the page knows it
as "Start image" or "Distilled CFG scale". Errors the code causes may carry a Python class name ("RuntimeError:
...") that means nothing to a user: the page shows the text after it (the log keeps the whole line).
"""
from __future__ import annotations

import re

from configs.controls import CONTROLS

# pipeline field names (configs/controls.py `field_name`, pipeline/images.py) -> the labels on the page
FIELD_LABELS = {**{c.field_name: c.label for c in CONTROLS}, **{c.name: c.label for c in CONTROLS},
                "job": "Past jobs", "job folder": "Past jobs"}
_CLASS_NAME = re.compile(r"\b(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Warning|NotFound|Busy)"
                         r"(?=:\s)[:]\s*")
_CLASS_IN_BRACKETS = re.compile(r"\s*\((?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Warning)\)")


def label(field: str) -> str:
    return FIELD_LABELS.get(field, field)


def input_error(error) -> str:
    """A common.errors.InputError for the page: 'Start image: the file … is not a readable image. …'."""
    field = getattr(error, "field", None)
    message = getattr(error, "message", None)
    if field is None or message is None:
        return plain(str(error))
    return f"{label(field)}: {plain(message)}"


def plain(text: str) -> str:
    """`text` without Python class names ('RuntimeError: disk full' -> 'disk full')."""
    text = _CLASS_IN_BRACKETS.sub("", _CLASS_NAME.sub("", str(text)))
    return text.strip() or "an unexpected error (see the log)"
