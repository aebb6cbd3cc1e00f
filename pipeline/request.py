"""A generation request and its validation: every user-caused problem is found here, before a model loads."""
from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, field
from typing import Any

from PIL import Image

from configs.generation import DEFAULTS, LIMITS, MODES, SAMPLERS
from configs.memory import MEMORY
from pipeline.errors import InputError
from pipeline.images import load_image, nearest_bucket, resize_center_crop

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Request:
    image: Any                                  # path, bytes, PIL image or H×W×C array
    prompt: str = DEFAULTS.prompt
    end_image: Any = None                       # original mode only
    negative_prompt: str = DEFAULTS.negative_prompt
    seconds: float = DEFAULTS.seconds
    seed: int = DEFAULTS.seed
    steps: int = DEFAULTS.steps
    gs: float = DEFAULTS.gs
    cfg: float = DEFAULTS.cfg
    rescale: float = DEFAULTS.rescale
    latent_window: int = DEFAULTS.latent_window
    mode: str = DEFAULTS.mode
    sampler: str = DEFAULTS.sampler
    teacache: float = DEFAULTS.teacache
    resolution: int | None = None               # None: the preset's default (640 for the real models)
    crf: int = DEFAULTS.crf
    preserved_gb: float = MEMORY.preserved_gb
    # How much of the end image's SigLIP embedding is blended into the image conditioning (see orchestrator).
    end_embed_weight: float = 0.5
    fps: int = DEFAULTS.fps

    def settings(self) -> dict:
        """Everything but the images, for job.json and reuse."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("image",
                                                                                                   "end_image")}


@dataclass(frozen=True)
class PreparedRequest:
    request: Request
    image: Image.Image                           # bucketed, RGB, height × width
    end_image: Image.Image | None
    height: int
    width: int
    prompt: str
    warnings: tuple[str, ...] = field(default_factory=tuple)


def shown(value, limit: int = 60) -> str:
    """A user's value for a message, cut to `limit` characters: a message never echoes megabytes, and a container
    is named by its type (its contents are not turned into text)."""
    if isinstance(value, (str, bytes)):
        text = repr(value[: 2 * limit])
    elif value is None or isinstance(value, (bool, float)) or (isinstance(value, int) and abs(value) < 10 ** 60):
        text = repr(value)
    elif isinstance(value, int):
        text = "a number with more than 60 digits"
    else:
        text = f"a {type(value).__name__}"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _number(name: str, value, kind, lo, hi):
    if isinstance(value, bool) or value is None:
        raise InputError(name, f"a number is required, got {shown(value)}")
    try:
        v = float(value)
    except (TypeError, ValueError, OverflowError):
        raise InputError(name, f"{shown(value)} is not a number") from None
    text = str(value) if len(str(value)) <= 40 else str(value)[:39] + "…"      # a number: shown as given
    if not math.isfinite(v):
        raise InputError(name, f"{text} is not a finite number")
    if kind is int:
        if v != int(v):
            raise InputError(name, f"{text} must be a whole number")
        v = int(value) if isinstance(value, int) else int(v)
    if not lo <= v <= hi:
        raise InputError(name, f"{text} is out of range; use a value between {lo:g} and {hi:g}")
    return v


def _choice(name: str, value, choices) -> str:
    if value not in choices:
        raise InputError(name, f"{shown(value)} is not one of {', '.join(map(str, choices))}")
    return value


def _text(name: str, value) -> tuple[str, list[str]]:
    if value is None:
        value = ""
    if not isinstance(value, str):
        raise InputError(name, f"text is required, got {type(value).__name__}")
    warnings = []
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(name, "contains characters that are not valid text (lone UTF-16 surrogates); "
                               "retype or paste it again") from None
    value = value.replace("\x00", "")
    if len(value) > LIMITS.prompt_chars_max:
        warnings.append(f"{name}: {len(value)} characters; only the first {LIMITS.prompt_chars_max} are used")
        value = value[: LIMITS.prompt_chars_max]
    return value, warnings


def _check_settings(r: Request, default_resolution: int) -> tuple[int, str, str, list[str]]:
    """Every field but the images; returns (resolution, prompt, negative prompt, warnings). Bounded work."""
    _number("seconds", r.seconds, float, *LIMITS.seconds)
    _number("steps", r.steps, int, *LIMITS.steps)
    _number("crf", r.crf, int, *LIMITS.crf)
    _number("distilled CFG (gs)", r.gs, float, *LIMITS.gs)
    _number("CFG", r.cfg, float, *LIMITS.cfg)
    _number("CFG rescale", r.rescale, float, *LIMITS.rescale)
    _number("latent window", r.latent_window, int, *LIMITS.latent_window)
    _number("TeaCache threshold", r.teacache, float, *LIMITS.teacache)
    _number("seed", r.seed, int, *LIMITS.seed)
    _number("preserved memory (GB)", r.preserved_gb, float, 0.0, MEMORY.preserved_max_gb)
    _number("end-frame embedding weight", r.end_embed_weight, float, 0.0, 1.0)
    _number("fps", r.fps, int, *LIMITS.fps)
    _choice("mode", r.mode, MODES)
    _choice("sampler", r.sampler, SAMPLERS)
    resolution = default_resolution if r.resolution is None else _number("resolution", r.resolution, int,
                                                                          *LIMITS.resolution)
    if resolution % 16:
        raise InputError("resolution", f"{resolution} is not a multiple of 16")
    prompt, warnings = _text("prompt", r.prompt)
    negative, more = _text("negative prompt", r.negative_prompt)
    return resolution, prompt, negative, warnings + more


def setting_problems(settings: dict, default_resolution: int = 640) -> dict[str, str]:
    """Which of `settings` (Request field names, e.g. a job.json's "settings") cannot be used, each with the
    reason; unknown names are left out. For restoring saved settings value by value."""
    names = {f.name for f in dataclasses.fields(Request)} - {"image", "end_image"}
    problems = {}
    for name, value in settings.items():
        if name in names:
            try:
                _check_settings(Request(image=None, **{name: value}), default_resolution)
            except InputError as e:
                problems[name] = str(e)
    return problems


def prepare(request: Request, default_resolution: int = 640, *, images_prepared: bool = False) -> PreparedRequest:
    """Check every field and load the images. Raises InputError naming the first bad field.

    `images_prepared`: the images were prepared (bucketed) before, e.g. those a job folder keeps for resuming;
    they are used as they are."""
    r = request
    resolution, prompt, negative, warnings = _check_settings(r, default_resolution)
    if r.end_image is not None and r.mode != "original":
        raise InputError("end image", "only the original mode supports an end frame; choose mode 'original' or "
                                      "remove the end image")
    start = load_image(r.image, "image", check_size=not images_prepared)
    height, width = start.size[::-1] if images_prepared else nearest_bucket(start.height, start.width, resolution)
    image = resize_center_crop(start, height, width)
    end = None
    if r.end_image is not None:
        end = resize_center_crop(load_image(r.end_image, "end image", check_size=not images_prepared), height,
                                 width)
    r = dataclasses.replace(r, prompt=prompt, negative_prompt=negative, resolution=resolution,
                            seconds=float(r.seconds), steps=int(r.steps), crf=int(r.crf), seed=int(r.seed),
                            latent_window=int(r.latent_window))
    for w in warnings:
        log.warning(w)
    return PreparedRequest(r, image, end, height, width, prompt, tuple(warnings))
