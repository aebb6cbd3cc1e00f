"""The generation controls and the pipeline Request: names, order, conversions both ways, all from the table of
controls (configs/controls.py).

The app passes the control values to its handlers in CONTROLS order (Gradio preprocessing off: uploads arrive as
file payloads, which `upload_path` turns into the uploaded file's path, so the pipeline's safe loader checks them).
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Mapping

from configs.controls import CONTROLS as TABLE, Control

# Request field names of the page's controls, in the order the handlers receive their values.
CONTROLS = tuple(c.name for c in TABLE if c.widget)
IMAGES = tuple(c.name for c in TABLE if c.widget and c.is_file)        # the image and video uploads
SETTINGS = tuple(name for name in CONTROLS if name not in IMAGES)
INTEGER_FIELDS = tuple(c.name for c in TABLE if c.widget and c.kind == "int")

EXAMPLE_PROMPTS = (
    "The girl dances gracefully, with clear movements, full of charm.",
    "A character doing some simple body movements.",
    "The man turns his head and smiles at the camera, soft daylight.",
    "Leaves sway in the wind as the camera slowly pushes in.",
)


def page_controls(table: tuple[Control, ...] = TABLE) -> tuple[Control, ...]:
    """The rows of the table that are on the page (and in the /video API), in the table's order."""
    return tuple(c for c in table if c.widget)


def random_seed() -> int:
    return random.randint(0, 2**31 - 1)


def upload_path(value: Any) -> str | None:
    """The file path of an upload as Gradio hands it over without preprocessing (a FileData dict or model), or a
    plain path; None when nothing was uploaded."""
    if value is None or value == "":
        return None
    if isinstance(value, (str, Path)):
        return str(value)
    if isinstance(value, Mapping):
        if isinstance(value.get("video"), Mapping):        # a gr.Video payload: {"video": FileData, ...}
            return upload_path(value["video"])
        return value.get("path") or None
    return getattr(value, "path", None)


def _whole(value):
    """Sliders and number boxes send floats; whole floats become ints, everything else is left for the
    pipeline's validation to explain."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def request_from_values(values: Mapping[str, Any], table: tuple[Control, ...] = TABLE):
    """A pipeline Request from the control values (by name). Nothing is validated here: the pipeline's `prepare`
    does that and names the field."""
    from pipeline.request import Request, request_class

    cls = Request if table is TABLE else request_class(table)
    kwargs = {}
    for c in page_controls(table):
        if c.name not in values:
            continue
        value = values[c.name]
        if c.is_file:
            value = upload_path(value)
        elif c.kind == "int":
            value = _whole(value)
        elif c.kind == "text":
            value = value or ""
        kwargs[c.name] = value
    kwargs.setdefault("image", None)
    return cls(**kwargs)


def values_from_settings(settings: Mapping[str, Any], default_resolution: int) -> dict[str, Any]:
    """Control values from a job.json "settings" dict ("reuse settings"): known fields only; missing ones and
    those the request checks refuse (a hand-edited job.json) fall back to the defaults."""
    from pipeline.request import setting_problems

    defaults = default_values(default_resolution)
    known = {name: settings[name] for name in SETTINGS if name in settings and settings[name] is not None}
    usable = {name: value for name, value in known.items()
              if name not in setting_problems(known, default_resolution)}
    return {name: usable.get(name, defaults[name]) for name in SETTINGS}


def default_values(default_resolution: int, table: tuple[Control, ...] = TABLE) -> dict[str, Any]:
    """The controls' defaults (the table's; those that depend on the preset from it)."""
    return {c.name: default_resolution if c.preset_default else c.default
            for c in page_controls(table) if not c.is_file}


def limits(table: tuple[Control, ...] = TABLE) -> dict[str, tuple]:
    """Slider and number-box ranges, from the table."""
    return {c.name: c.widget_range() for c in page_controls(table) if c.widget_range()}
