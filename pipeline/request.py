"""A generation request and its validation: every user-caused problem is found here, before a model loads."""
from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, cast

from PIL import Image

from common.errors import InputError
from configs.controls import CONTROLS, Control, control
from configs.generation import LIMITS
from pipeline import keyframes, magcache, text_to_video, timeline
from pipeline.images import load_image, resize_center_crop
from pipeline.resolution import job_size

log = logging.getLogger(__name__)


_T2V_HINT = ("; for text-to-video without one choose start from noise, black, white or green "
             "(--start-from noise)")


def _with(request: RequestBase, settings: Mapping[str, Any]) -> RequestBase:
    """`request` with these settings: dataclasses.replace for a Request, a dataclass made at run time
    (`request_class`: mypy cannot see that it is one)."""
    return dataclasses.replace(cast(Any, request), **settings)


class RequestBase:
    """What every Request does; its fields come from configs/controls.py (one per control, see `request_class`)."""

    CONTROLS: tuple[Control, ...] = CONTROLS

    if TYPE_CHECKING:           # for the type checker: the fields are made at run time, one per control
        def __init__(self, *args: Any, **fields: Any) -> None: ...

        def __getattr__(self, name: str) -> Any: ...

    def settings(self) -> dict:
        """Everything but the images, for job.json and reuse."""
        return {c.name: getattr(self, c.name) for c in self.CONTROLS if not c.is_file}

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], *, base: Path | None = None, unknown: str = "refuse",
                     **given):
        """A Request from control values by name (job.json's "settings", a batch line, the CLI's options, the
        page's values); old option spellings are accepted ("window" for latent_window). Nothing is checked here
        but the names: `prepare` checks the values.

        `base`: image paths that are relative are relative to it (a batch file's folder). `unknown`: "refuse"
        raises InputError naming an unknown key, "ignore" leaves it out (a job.json of another version).
        `given`: fields set here, over `values` (e.g. a job folder's images)."""
        if not isinstance(values, Mapping):
            raise InputError("job", "the settings must be a mapping of names to values (a JSON object)")
        fields = canonical(values, cls.CONTROLS)
        unknown_keys = [key for key in fields if key not in {c.name for c in cls.CONTROLS}]
        if unknown_keys and unknown == "refuse":
            known = ", ".join(c.name for c in cls.CONTROLS)
            raise InputError(str(unknown_keys[0]), f"unknown setting; known: {known}")
        fields = {key: value for key, value in fields.items() if key not in unknown_keys}
        fields.update(given)
        if isinstance(fields.get("keyframes"), str) and "keyframes" not in given:   # [0s] start … [5s] end
            fields.update(keyframes.split_ends(fields, control("seconds").default))
        for c in cls.CONTROLS:
            if c.name == "image" and text_to_video.is_text_to_video(fields.get("start_from")):
                continue                        # text-to-video: no start image (checked in `prepare`)
            if c.required and fields.get(c.name) is None and fields.get(c.required_unless) is None:
                other = f" (or the {control(c.required_unless).label.lower()}'s)" if c.required_unless else ""
                raise InputError(c.field_name, (f"missing; give the {c.label.lower()}'s path{other}"
                                                + (_T2V_HINT if c.name == "image" else ""))
                                 if c.is_file else "missing")
            if c.is_file and base is not None and isinstance(fields.get(c.name), (str, Path)):
                path = Path(fields[c.name]).expanduser()
                fields[c.name] = path if path.is_absolute() else Path(base) / path
        if base is not None and isinstance(fields.get("keyframes"), str) and "keyframes" not in given:
            fields["keyframes"] = keyframes.relative_to(fields["keyframes"], base)     # their images alike
        return cls(**fields)


def canonical(values: Mapping[str, Any], controls: tuple[Control, ...] = CONTROLS) -> dict:
    """`values` with every key that names a control under another spelling (the table's aliases: "video" and
    "extend" for input_video, "lora" for loras, "window" for latent_window ...) turned into the control's name; other
    keys are kept as they are. The first step of every way a job's values come in (Request.from_mapping, and
    jobs/doors.py `admitted` before any file rule is applied), so no rule can be passed by another spelling. Two
    keys for one control are refused (InputError naming the control), not resolved by their order."""
    if not isinstance(values, Mapping):
        raise InputError("job", "the settings must be a mapping of names to values (a JSON object)")
    names = {key: c for c in controls for key in c.keys}
    out: dict = {}
    given_as: dict = {}
    for key, value in values.items():
        c = names.get(key)
        name = c.name if c is not None else key
        if name in given_as:
            raise InputError(c.field_name if c is not None else str(key),
                             f"given twice, as {shown(given_as[name])} and {shown(key)}; give it once")
        given_as[name] = key
        out[name] = value
    return out


def request_class(controls: tuple[Control, ...] = CONTROLS, name: str = "Request") -> type[RequestBase]:
    """A frozen dataclass with one field per control (the required ones first), defaults from the table."""
    required: list[tuple] = [(c.name, Any) for c in controls if c.required and not c.required_unless]
    optional = [(c.name, Any, dataclasses.field(default=c.default)) for c in controls
                if not c.required or c.required_unless]
    cls = dataclasses.make_dataclass(name, required + optional, bases=(RequestBase,), frozen=True,
                                     namespace={"CONTROLS": controls})
    cls.__module__ = __name__
    return cls


# A generation request: the images (a path, bytes, a PIL image or an H×W×C array) and every setting.
if TYPE_CHECKING:
    Request = RequestBase
else:
    Request = request_class()


@dataclass(frozen=True)
class PreparedRequest:
    request: Request
    image: Image.Image                           # bucketed, RGB, height × width
    end_image: Image.Image | None
    height: int
    width: int
    prompt: str
    warnings: tuple[str, ...] = field(default_factory=tuple)
    source: Any = None                           # extending: the checked input (pipeline.extend.ExtendSource)
    keyframes: tuple = ()                        # ((Keyframe, its image bucketed like the start image), ...)


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
        bound = (lambda x: str(int(x))) if kind is int else (lambda x: f"{x:g}")    # whole numbers in full: 2**63-1
        raise InputError(name, f"{text} is out of range; use a value between {bound(lo)} and {bound(hi)}")
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


def check_value(c: Control, value, preset: Mapping[str, Any] | None = None) -> tuple[Any, list[str]]:
    """One control's value checked against its row of the table: (the value as the pipeline uses it, warnings).
    Raises InputError naming the field. Bounded work."""
    name = c.field_name
    if c.kind == "text":
        return _text(name, value)
    if c.kind == "choice":
        return _choice(name, value, c.choices), []
    if c.is_file:
        return value, []
    if value is None and c.preset_default:
        value = (preset or {}).get(c.name, value)
    if value is None and c.default is None and not c.preset_default:
        return None, []
    lo, hi = c.limits if c.limits else (-math.inf, math.inf)
    value = _number(name, value, int if c.kind == "int" else float, lo, hi)
    if c.multiple_of and value % c.multiple_of:
        raise InputError(name, f"{value} is not a multiple of {c.multiple_of}")
    return value, []


def check_settings(values: Mapping[str, Any], preset: Mapping[str, Any] | None = None,
                   controls: tuple[Control, ...] = CONTROLS) -> tuple[dict[str, Any], list[str]]:
    """Every control but the images, in the table's order: (the checked values by name, warnings). A control
    missing from `values` gets its default; `preset` gives the defaults that depend on the model preset
    (`{"resolution": 640}`). Raises InputError naming the first bad field."""
    checked, warnings = {}, []
    for c in controls:
        if not c.is_file:
            checked[c.name], more = check_value(c, values.get(c.name, c.default), preset)
            warnings += more
    if {"prompt", "mode", "seconds", "latent_window", "fps"} <= checked.keys():
        timeline.check_request(checked)         # a timed prompt must fit this video (pipeline/timeline.py)
        keyframes.check_request(checked)        # so must the keyframes (pipeline/keyframes.py)
    magcache.check_settings(checked)            # one cache at a time: MagCache or TeaCache
    return checked, warnings


def preset_values(default_resolution: int) -> dict[str, Any]:
    return {"resolution": default_resolution}


def setting_problems(settings: dict, default_resolution: int = 640) -> dict[str, str]:
    """Which of `settings` (Request field names, e.g. a job.json's "settings") cannot be used, each with the
    reason; unknown names are left out. For restoring saved settings value by value."""
    problems = {}
    for c in CONTROLS:
        if c.name in settings and not c.is_file:
            try:
                check_value(c, settings[c.name], preset_values(default_resolution))
            except InputError as e:
                problems[c.name] = str(e)
    return problems


def _prepare_extension(request, warnings: list[str]) -> PreparedRequest:
    """`prepare` for a request with a video (its settings already checked): the input read and checked once, the
    start image its last frame (a job folder: its own start image). Raises InputError naming the field."""
    from pipeline import extend  # torch and PyAV: imported when a request extends a video (this stays light)

    extend.check_request(request)
    source, image = extend.load_source(request, request.resolution)
    end = None                                      # the original mode extends toward an end image
    if request.end_image is not None:
        end = resize_center_crop(load_image(request.end_image, "end image"), image.height, image.width)
    for w in warnings:
        log.warning(w)
    return PreparedRequest(request, image, end, image.height, image.width, request.prompt, tuple(warnings),
                           source)


def prepare(request: Request, default_resolution: int = 640, *, images_prepared: bool = False) -> PreparedRequest:
    """Check every field and load the images. Raises InputError naming the first bad field.

    `images_prepared`: the images were prepared (bucketed) before, e.g. those a job folder keeps for resuming;
    they are used as they are."""
    r = request
    settings, warnings = check_settings(r.settings(), preset_values(default_resolution), r.CONTROLS)
    if settings.get("source_job"):                  # a job id: the app looks it up (ui/source_job.py)
        raise InputError("job to extend", f"{shown(settings['source_job'])} is a job id, which the app looks up in "
                                          f"its outputs folder; here give the job's folder as the video to extend "
                                          f"(input_video, --extend outputs/<job id>)")
    t2v = text_to_video.is_text_to_video(settings.get("start_from"))
    if t2v and r.input_video is not None:
        raise InputError("start from", f"{shown(settings['start_from'])} is text-to-video, which starts without an "
                                       f"image; extending a video starts from its last frame: choose start from "
                                       f"'image'")
    if settings.get("loop") == "on" and r.input_video is not None:
        raise InputError("loop", "a loop returns to the start image of a new video; extending a video does not "
                                 "loop: turn loop off, or remove the video to extend")
    if settings.get("loop") == "on" and r.end_image is not None and not images_prepared:
        raise InputError("loop", "a loop ends at its start image, which is its end frame; remove the end image, or "
                                 "turn loop off")
    if r.input_video is not None and settings.get("keyframes"):
        raise InputError("keyframes", "keyframes place images in a new video; extending a video has none: remove "
                                      "the keyframes, or the video to extend")
    if r.input_video is not None:                      # extending a video: its own checks and start image
        return _prepare_extension(_with(r, settings), warnings)
    if t2v and r.image is not None and not images_prepared:
        raise InputError("start from", f"{shown(settings['start_from'])} is text-to-video, which starts without an "
                                       f"image; remove the start image, or choose start from 'image' to use it")
    if t2v and r.image is None:              # text-to-video: the square bucket of the resolution, or the custom size
        size = job_size(settings["resolution"], settings["resolution"], settings["resolution"], settings["width"],
                        settings["height"])
        r = _with(r, settings)
        if r.end_image is not None:
            raise InputError("end image", "text-to-video has no start image to pair an end frame with; remove "
                                          "the end image, or give a start image (start from 'image')")
        for w in warnings:
            log.warning(w)
        image = text_to_video.stand_in_image(r.start_from, size.height, size.width)
        return PreparedRequest(r, image, None, size.height, size.width, r.prompt, tuple(warnings),
                               keyframes=_keyframe_images(r, size.height, size.width, images_prepared))
    if r.image is None:                      # Request(...) built directly, without from_mapping's check
        raise InputError("image", "no image given", advice="Upload a start image; for text-to-video without one "
                                                           "choose start from noise, black, white or green.")
    if r.end_image is not None and r.mode != "original":
        raise InputError("end image", "only the original mode supports an end frame; choose mode 'original' or "
                                      "remove the end image")
    start = load_image(r.image, "image", check_size=not images_prepared)
    if images_prepared:
        height, width = start.size[::-1]
    else:                                   # the bucket, or the custom size (pipeline/resolution.py)
        size = job_size(start.height, start.width, settings["resolution"], settings["width"], settings["height"])
        height, width = size.height, size.width
    image = resize_center_crop(start, height, width)
    end = None
    if r.end_image is not None:
        end = resize_center_crop(load_image(r.end_image, "end image", check_size=not images_prepared), height,
                                 width)
    r = _with(r, settings)
    for w in warnings:
        log.warning(w)
    return PreparedRequest(r, image, end, height, width, r.prompt, tuple(warnings),
                           keyframes=_keyframe_images(r, height, width, images_prepared))


def _keyframe_images(r, height: int, width: int, images_prepared: bool) -> tuple:
    """The request's keyframes (checked with its settings), each image loaded and cropped to the job's size as the
    end image is. Raises InputError naming "keyframes"."""
    out = []
    for k in keyframes.parse(r.keyframes):
        try:
            image = load_image(Path(k.image).expanduser(), keyframes.FIELD, check_size=not images_prepared)
        except InputError as e:
            raise InputError(keyframes.FIELD, f"the keyframe at {k.time:g}s: {e.template}", path=e.path,
                             advice=e.advice) from None
        out.append((k, resize_center_crop(image, height, width)))
    return tuple(out)
