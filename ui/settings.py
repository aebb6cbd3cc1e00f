"""The generation controls and the pipeline Request: names, order, conversions both ways, all from the table of
controls (configs/controls.py).

The app passes the control values to its handlers in CONTROLS order (Gradio preprocessing off: uploads arrive as
file payloads, which `upload_path` turns into the uploaded file's path, so the pipeline's safe loader checks them).
"""
from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any, Mapping

from common.errors import InputError
from configs.controls import CONTROLS as TABLE
from configs.controls import Control
from jobs.doors import Door, admitted

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
    """The file path a client's value names, as Gradio hands it over without preprocessing (a FileData dict or
    model, a gr.Video payload, a plain path); None when it names none. Not checked: `client_file` is what
    handlers call."""
    if value is None or value == "":
        return None
    if isinstance(value, (str, Path)):
        return str(value)
    if isinstance(value, Mapping):
        if isinstance(value.get("video"), Mapping):        # a gr.Video payload: {"video": FileData, ...}
            return upload_path(value["video"])
        path = value.get("path")
        return path if isinstance(path, str) and path else None
    path = getattr(value, "path", None)
    return path if isinstance(path, str) and path else None


def upload_folder() -> Path:
    """Gradio's upload folder: where every file a client sent (and every copy Gradio serves) lives."""
    from gradio.utils import get_upload_folder

    return Path(get_upload_folder()).resolve()


def use_own_upload_folder() -> Path:
    """Give this process's app an upload folder of its own, `steadyframe-<pid>` inside Gradio's (GRADIO_TEMP_DIR,
    else <tmp>/gradio), before the app is built. Gradio names a copy by its content, so without this two apps on
    one machine (one per GPU, say) hold the same file for the same image, and the one that stops deletes it under
    the other (the sweeper deletes an app's copies when it stops: ui/tempfiles.py). Called again in the same
    process, it keeps the folder it chose."""
    base = upload_folder()
    own = f"steadyframe-{os.getpid()}"
    if base.name != own:
        base = base / own
        os.environ["GRADIO_TEMP_DIR"] = str(base)
    base.mkdir(parents=True, exist_ok=True)
    return base


def _names_no_file(value: Any) -> bool:
    """Nothing uploaded: no value, an empty text, or an empty upload payload."""
    if value is None or value == "":
        return True
    if isinstance(value, Mapping):
        video = value.get("video")
        inner = video if isinstance(video, Mapping) else value
        return inner.get("path") is None or inner.get("path") == ""
    return False


def client_file(value: Any, field: str) -> str | None:
    """The path of a file a client uploaded (the only way a file comes in from the page or the API), or None when
    the value names none. A path that is not a file in Gradio's upload folder, after links are followed, is refused
    with one message whatever is there: a client learns nothing about the server's files. Raises InputError naming
    the field."""

    path = upload_path(value)
    if path is None and _names_no_file(value):
        return None
    try:
        real = Path(path).resolve() if path and "\x00" not in path else None
        inside = real is not None and real.is_relative_to(upload_folder()) and real.is_file()
    except (OSError, ValueError, RuntimeError):
        inside = False
    if not inside:
        raise InputError(field, "only a file uploaded to this app can be used here, not a path on the server; "
                                "upload the file (scripts: gradio_client.handle_file)")
    return str(real)


def _whole(value):
    """Sliders and number boxes send floats; whole floats become ints, everything else is left for the
    pipeline's validation to explain."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _upload(c: Control, value: Any) -> str | None:
    return client_file(value, c.field_name)


# The client's door (jobs/doors.py) without job ids: files are the client's uploads, LoRAs names in the LoRA folder.
UPLOADS = Door("uploads", _upload)


def request_from_values(values: Mapping[str, Any], table: tuple[Control, ...] = TABLE, door: Door = UPLOADS):
    """A pipeline Request from a client's control values (by name), admitted by `door` (jobs/doors.py: aliases
    resolved, the files uploads only, a job id looked up where the door takes them, LoRAs by name; raises
    InputError naming the field); the rest is validated by the pipeline's `prepare`, which names the field.
    Keys that are no control of the page are left out."""
    from pipeline.request import Request, request_class

    cls = Request if table is TABLE else request_class(table)
    values = admitted(values, door, table)
    kwargs = {}
    for c in page_controls(table):
        if c.name not in values:
            continue
        value = values[c.name]
        if c.kind == "int":
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
    return {c.name: r for c in page_controls(table) if (r := c.widget_range())}
