"""The generation controls and the pipeline Request: names, order, conversions both ways.

The app passes the control values to its handlers in CONTROLS order (Gradio preprocessing off: uploads arrive as
file payloads, which `upload_path` turns into the uploaded file's path, so the pipeline's safe loader checks them).
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Mapping

from configs import DEFAULTS, LIMITS, MEMORY

# Request field names, in the order the handlers receive the control values.
CONTROLS = ("image", "end_image", "prompt", "negative_prompt", "seed", "seconds", "mode", "steps", "gs", "cfg",
            "rescale", "latent_window", "sampler", "resolution", "teacache", "preserved_gb", "crf")
IMAGES = ("image", "end_image")
SETTINGS = tuple(name for name in CONTROLS if name not in IMAGES)

INTEGER_FIELDS = ("seed", "steps", "latent_window", "resolution", "crf")

EXAMPLE_PROMPTS = (
    "The girl dances gracefully, with clear movements, full of charm.",
    "A character doing some simple body movements.",
    "The man turns his head and smiles at the camera, soft daylight.",
    "Leaves sway in the wind as the camera slowly pushes in.",
)


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
        return value.get("path") or None
    return getattr(value, "path", None)


def _whole(value):
    """Sliders and number boxes send floats; whole floats become ints, everything else is left for the
    pipeline's validation to explain."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def request_from_values(values: Mapping[str, Any]):
    """A pipeline Request from the control values (by CONTROLS name). Nothing is validated here: the pipeline's
    `prepare` does that and names the field."""
    from pipeline.request import Request

    kwargs = {name: values[name] for name in SETTINGS if name in values}
    for name in INTEGER_FIELDS:
        if name in kwargs:
            kwargs[name] = _whole(kwargs[name])
    for name in ("prompt", "negative_prompt"):
        kwargs[name] = kwargs.get(name) or ""
    return Request(image=upload_path(values.get("image")), end_image=upload_path(values.get("end_image")),
                   **kwargs)


def values_from_settings(settings: Mapping[str, Any], default_resolution: int) -> dict[str, Any]:
    """Control values from a job.json "settings" dict ("reuse settings"): known fields only; missing ones and
    those the request checks refuse (a hand-edited job.json) fall back to the defaults."""
    from pipeline.request import setting_problems

    defaults = default_values(default_resolution)
    known = {name: settings[name] for name in SETTINGS if name in settings and settings[name] is not None}
    usable = {name: value for name, value in known.items()
              if name not in setting_problems(known, default_resolution)}
    return {name: usable.get(name, defaults[name]) for name in SETTINGS}


def default_values(default_resolution: int) -> dict[str, Any]:
    """The controls' defaults, all from configs/."""
    d = DEFAULTS
    return {"prompt": d.prompt, "negative_prompt": d.negative_prompt, "seed": d.seed, "seconds": d.seconds,
            "mode": d.mode, "steps": d.steps, "gs": d.gs, "cfg": d.cfg, "rescale": d.rescale,
            "latent_window": d.latent_window, "sampler": d.sampler, "resolution": default_resolution,
            "teacache": d.teacache, "preserved_gb": MEMORY.preserved_gb, "crf": d.crf}


def limits() -> dict[str, tuple]:
    """Slider ranges, from configs/."""
    L = LIMITS
    return {"seconds": L.seconds, "steps": L.steps, "gs": L.gs, "cfg": L.cfg, "rescale": L.rescale,
            "latent_window": L.latent_window, "resolution": L.resolution, "crf": L.crf,
            "preserved_gb": (MEMORY.preserved_min_gb, MEMORY.preserved_max_gb), "seed": L.seed}
