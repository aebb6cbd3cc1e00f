"""A FramePack-Studio job's settings as SteadyFrame's controls: its metadata JSON or the text chunks of its PNG.

Studio writes, for every job (modules/pipelines/metadata_utils.py, `create_metadata` and `save_job_start_image`):
- `<metadata_dir>/<job_id>.json`: a JSON object (the keys below; "loras" is {name: weight});
- `<output_dir>/<job_id>.png`: the job's start image, with one PNG text chunk per key whose value is a string,
  number, bool or None, written as text (`str(value)`: "True", "None", "0.15"); so no "loras" there.
Its own "load metadata" (modules/interface.py, `load_metadata_from_json`) reads the same keys back, and takes the
cache type from "cache_type" or, in older files, from "use_magcache" / "use_teacache".

`read_file` reads either (bounded: a JSON of at most STUDIO_JSON_MAX_BYTES, a PNG's chunks up to its image data);
`from_metadata` maps the keys onto the controls of configs/controls.py: the values SteadyFrame's checks accept
(pipeline.request.setting_problems), and for every key that could not be mapped a (key, reason). Keys that are pure
bookkeeping (the version, the time, file paths) are left out silently. Light: no torch.

Its doors: the page's "Import Studio settings" (ui/panel_jobs.py), `python -m cli studio` (one batch line:
cli/studio.py) and `python -m cli queue add` of a Studio queue export (`read_queue`, cli/queue.py).
"""
from __future__ import annotations

import json
import math
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any, Mapping

from PIL import Image, UnidentifiedImageError

from common.errors import InputError
from configs.controls import MAGCACHE_CHOICES, TEACACHE_CHOICES, control
from configs.lora import LORA
from pipeline import timeline
from pipeline.buckets import nearest_bucket
from pipeline.request import setting_problems

FIELD = "Studio settings"              # the name messages give the imported file
STUDIO_JSON_MAX_BYTES = 1 << 20        # Studio's JSON is about 2 kB
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
STUDIO_BUCKET_TARGETS = (128, 256, 384, 512, 640, 768)    # the resolutions of Studio's bucket table

# Studio key -> SteadyFrame control, where the meaning is the same (Studio's worker.py passes them to the same
# FramePack sampling arguments: cfg, gs (distilled), rs (rescale); blend_sections counts sections as prompt_blend does).
DIRECT = {
    "prompt": "prompt",
    "negative_prompt": "negative_prompt",
    "seed": "seed",
    "steps": "steps",
    "cfg": "cfg",
    "gs": "gs",
    "rs": "rescale",
    "total_second_length": "seconds",
    "latent_window_size": "latent_window",
    "blend_sections": "prompt_blend",
}

# Studio's model types (modules/interface.py's model_type choices, metadata_utils.py's colours) -> mode, and a note.
MODES = {
    "Original": ("original", ""),
    "Original with Endframe": ("original", "upload the end image (it is not in the metadata)"),
    "F1": ("f1", ""),
    "F1 with Endframe": ("f1", "SteadyFrame's F1 mode has no end frame; the job runs without one"),
    "Video F1": ("f1", "choose the video to extend (it is not in the metadata)"),
    "Video": ("original", "choose the video to extend (it is not in the metadata): the new part goes before it"),
    "Video with Endframe": ("original", "choose the video to extend and the end image (neither is in the metadata): "
                                        "the new part goes after the video, toward the end image"),
}
NOT_MODES = {
    "XY Plot": "an XY plot (a grid of jobs); SteadyFrame has none: import one of its jobs instead",
}

# Keys that describe the file, not the job: never reported.
BOOKKEEPING = {"app_version", "timestamp", "job_id", "has_input_image", "input_image_path", "end_frame_image_path",
               "end_frame_used", "generation_type", "video_path", "input_video"}
# What Studio's queue export adds to each job's metadata (modules/video_queue.py, save_queue_to_json): the queue's
# bookkeeping and its copies of the images (read by `read_queue`, not settings).
QUEUE_BOOKKEEPING = {"id", "status", "created_at", "started_at", "completed_at", "error", "result", "queue_position",
                     "saved_input_image_path", "saved_end_frame_image_path", "thumbnail", "progress_data"}

# Keys with no SteadyFrame setting: the reason, reported when the key holds a value.
NO_SETTING = {
    "resolutionH": "Studio buckets a start image by its width target (resolutionW) alone; that is the resolution",
    "end_frame_strength": "Studio scales the end frame's latent by it; SteadyFrame has no such setting",
    "latent_type": "not one of Studio's starting latents (Black, White, Noise, Green Screen)",
    "combine_with_source": "Studio's video extension joins the source video; SteadyFrame's extension always does",
    "num_cleaned_frames": "not a whole number of context frames from 1 to 19",
    "x_param": "an XY plot's axis; SteadyFrame has no XY plots",
    "y_param": "an XY plot's axis; SteadyFrame has no XY plots",
    "x_values": "an XY plot's axis; SteadyFrame has no XY plots",
    "y_values": "an XY plot's axis; SteadyFrame has no XY plots",
}
CACHE_KEYS = {"cache_type", "use_teacache", "teacache_rel_l1_thresh", "teacache_num_steps", "use_magcache",
              "magcache_threshold", "magcache_max_consecutive_skips", "magcache_retention_ratio"}
# What identifies Studio's metadata (every file it writes has these).
STUDIO_KEYS = {"prompt", "seed", "model_type"}


@dataclass
class StudioImport:
    """The controls an imported Studio job sets (Request field names, values checked), what could not be mapped
    ((Studio key, reason)), and notes on what was mapped (rounded, or needs a file the metadata cannot hold)."""
    settings: dict[str, Any] = field(default_factory=dict)
    unmapped: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    kind: str = "json"                      # "json" or "png"

    @property
    def text_to_video(self) -> bool:
        """Studio's job had no start image: it starts from a latent (SteadyFrame's `start_from`), and a PNG Studio
        saved with it is a placeholder, not a start image."""
        return self.settings.get("start_from", "image") != "image"

    def report(self) -> list[str]:
        """The lines to show: 'key: reason' for each key not mapped, then the notes."""
        return [f"{key}: {reason}" for key, reason in self.unmapped] + self.notes


# ---- reading -------------------------------------------------------------------------------------------------------

def read_file(path) -> tuple[dict, str]:
    """(Studio's metadata, "json" or "png") from a file Studio wrote. Raises InputError naming FIELD."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            head = f.read(len(PNG_SIGNATURE))
    except OSError as e:
        raise InputError(FIELD, f"cannot read {{file}}: {e.strerror or e}", path=path) from None
    if head == PNG_SIGNATURE:
        return _read_png(path), "png"
    return _read_json(path), "json"


def _read_json(path: Path) -> dict:
    if path.stat().st_size > STUDIO_JSON_MAX_BYTES:
        raise InputError(FIELD, f"{{file}} is larger than {STUDIO_JSON_MAX_BYTES // 1024} kB: not a FramePack-Studio "
                                f"metadata file (those are a few kB)", path=path)
    try:
        data = json.loads(path.read_bytes().decode("utf-8-sig"))
    except (ValueError, RecursionError):
        raise InputError(FIELD, "{file} is neither JSON nor a PNG; give the .json file FramePack-Studio writes "
                                "beside its outputs (its metadata folder), or the PNG start image it saves with the "
                                "video", path=path) from None
    if not isinstance(data, dict):
        raise InputError(FIELD, "{file} does not hold a JSON object of a job's settings", path=path)
    _studio_or_refuse(data, path, "its keys")
    return data


def _read_png(path: Path) -> dict:
    try:
        with Image.open(path, formats=("PNG",)) as im:    # the chunks before the image data; the pixels are not decoded
            text = {k: v for k, v in im.info.items() if isinstance(k, str) and isinstance(v, str)}
    except (OSError, UnidentifiedImageError, ValueError, SyntaxError) as e:
        raise InputError(FIELD, f"{{file}} is not a readable PNG ({str(e)[:120]})", path=path) from None
    _studio_or_refuse(text, path, "its text chunks")
    return text


def _studio_or_refuse(data: Mapping, path: Path, where: str) -> None:
    if STUDIO_KEYS & set(data):
        return
    hint = " (this looks like a SteadyFrame job.json: pick the job in Past jobs and press Reuse settings)" \
        if "settings" in data else ""
    raise InputError(FIELD, f"{{file}} holds no FramePack-Studio settings in {where} (no prompt, seed or model_type)"
                            f"{hint}", path=path)


# ---- values --------------------------------------------------------------------------------------------------------

def _none(value) -> bool:
    """No value: None, Studio's text "None" (a PNG chunk), an empty text, list or mapping."""
    return value is None or (isinstance(value, str) and value.strip() in ("", "None")) or value in ({}, [])


def _number(value, kind: str):
    """A number from JSON or a PNG chunk's text; None when it is none. Whole floats become ints for int controls."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    if kind == "int":
        return int(value) if float(value).is_integer() else None
    return float(value)


def _flag(value) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return bool(value) and not _none(value)


def _nearest(value: float, choices: tuple) -> float:
    """The non-zero choice nearest `value` (the page offers only these)."""
    return min((c for c in choices if c > 0), key=lambda c: (abs(c - value), c))


# ---- mapping -------------------------------------------------------------------------------------------------------

def from_metadata(meta: Mapping[str, Any], default_resolution: int = 640, kind: str = "json") -> StudioImport:
    """Studio's metadata (JSON values, or a PNG's text values) as SteadyFrame settings; see the module's doc."""
    out = StudioImport(kind=kind)
    wanted: dict[str, Any] = {}                       # control -> value, before SteadyFrame's checks
    source: dict[str, str] = {}                       # control -> the Studio key it came from

    def want(name: str, value, key: str) -> None:
        wanted[name], source[name] = value, key

    def source_of(key: str) -> str | None:
        return next((name for name, k in source.items() if k == key), None)

    for key, name in DIRECT.items():
        raw, c = meta.get(key), control(name)
        if c.kind == "text":
            if isinstance(raw, str) and not (kind == "png" and raw == "None"):
                want(name, raw, key)
            elif raw is not None:
                out.unmapped.append((key, f"not text ({type(raw).__name__})"))
            continue
        if _none(raw):
            continue
        value = _number(raw, c.kind)
        if value is None:
            what = "a whole number" if c.kind == "int" else "a number"
            out.unmapped.append((key, f"{str(raw)[:40]!r} is not {what}"))
            continue
        want(name, value, key)

    _mode(meta, out, want)
    _video_and_start(meta, want)
    _resolution(meta, out, want)
    _caches(meta, out, want, wanted)
    _loras(meta, out, want)

    for key, value in meta.items():
        if key in DIRECT or key in CACHE_KEYS or key in BOOKKEEPING or key in QUEUE_BOOKKEEPING \
                or key in ("model_type", "resolutionW", "loras"):
            continue
        if key in NO_SETTING:
            if source_of(key) is not None:
                continue                               # mapped (_video_and_start, _resolution)
            if not _none(value) and not (key == "latent_type" and _flag(meta.get("has_input_image", True))) \
                    and not (key in ("combine_with_source", "num_cleaned_frames")
                             and not str(meta.get("model_type", "")).startswith("Video")):
                out.unmapped.append((key, NO_SETTING[key]))
            continue
        out.unmapped.append((str(key)[:60], "not a FramePack-Studio setting SteadyFrame knows"))

    problems = setting_problems(wanted, default_resolution)
    for name, value in wanted.items():
        if name in problems:
            out.unmapped.append((source[name], f"SteadyFrame refuses {str(value)[:40]!r}: {problems[name]}"))
        else:
            out.settings[name] = value
    _check_prompt(out)
    return out


def _mode(meta, out: StudioImport, want) -> None:
    model = meta.get("model_type")
    if _none(model):
        return
    model = str(model)
    if model in MODES:
        mode, note = MODES[model]
        want("mode", mode, "model_type")
        if note:
            out.notes.append(f"model_type {model!r} → mode {mode}: {note}")
    else:
        out.unmapped.append(("model_type", NOT_MODES.get(model, f"{model[:40]!r} is not a model type SteadyFrame "
                                                                f"knows (Original, F1 …)")))


# Studio's "latent_type" (the latent it starts from without a start image) -> SteadyFrame's "start from"
LATENT_TYPES = {"black": "black", "white": "white", "noise": "noise", "green screen": "green"}


def _video_and_start(meta, want) -> None:
    """A video model's context frames (Studio's num_cleaned_frames: the input video's latent frames the new sections
    see, as SteadyFrame's context frames) and, without a start image, the latent it starts from (text-to-video)."""
    if str(meta.get("model_type", "")).startswith("Video"):
        frames = _number(meta.get("num_cleaned_frames"), "int")
        if frames is not None and 1 <= frames <= (control("context_frames").limits or (0, 0))[1]:
            want("context_frames", int(frames), "num_cleaned_frames")
    if not _flag(meta.get("has_input_image", True)):
        latent = meta.get("latent_type")
        start = LATENT_TYPES.get("black" if _none(latent) else str(latent).strip().lower())   # Studio's default
        if start is not None:
            want("start_from", start, "latent_type")


def _studio_target(value: float) -> int:
    """The nearest target of Studio's bucket table (the smaller on a tie: its table's order)."""
    return min(STUDIO_BUCKET_TARGETS, key=lambda t: abs(t - value))


def _resolution(meta, out: StudioImport, want) -> None:
    """Studio buckets a start image with `find_nearest_bucket(H, W, resolution=resolutionW)` (its original and F1
    pipelines), which first moves the target to the nearest size its bucket table has (diffusers_helper/
    bucket_tools.py: STUDIO_BUCKET_TARGETS): that target is SteadyFrame's resolution. Without a start image Studio
    buckets resolutionH × resolutionW itself, at the target nearest their mean (`find_nearest_bucket(resolutionH,
    resolutionW, (resolutionW + resolutionH) / 2)`): the same rule here gives that bucket (SteadyFrame's table of
    that target, pipeline/buckets.py) as the custom width × height, so the aspect ratio is kept."""
    if _none(meta.get("resolutionW")):
        return
    width = _number(meta["resolutionW"], "float")
    if width is None:
        out.unmapped.append(("resolutionW", f"{str(meta['resolutionW'])[:40]!r} is not a number"))
        return
    height = _number(meta.get("resolutionH"), "float")
    if not _flag(meta.get("has_input_image", True)) and height is not None and width > 0 and height > 0:
        target = _studio_target((width + height) / 2)
        h, w = nearest_bucket(int(height), int(width), target)
        out.notes.append(f"resolutionW {width:g} × resolutionH {height:g} (no start image) → {w}×{h}: Studio "
                         f"buckets a job without a start image by both sides, at the target nearest their mean "
                         f"({target})")
        want("resolution", target, "resolutionW")
        want("width", w, "resolutionH")
        want("height", h, "resolutionH")
        return
    target = _studio_target(width)
    if target != width:
        out.notes.append(f"resolutionW {width:g} → resolution {target} (Studio buckets at the nearest of "
                         f"{', '.join(map(str, STUDIO_BUCKET_TARGETS))})")
    want("resolution", target, "resolutionW")


def _threshold(meta, out: StudioImport, want, control: str, key: str, default: float, choices, name: str) -> None:
    """A cache's threshold: Studio's value (or its default), as the nearest one the page offers (noted if moved)."""
    given = _number(meta.get(key), "float")
    value = _nearest(given if given is not None else default, choices)
    if given is not None and value != given:
        out.notes.append(f"{key} {given:g} → {name} threshold {value:g} (the nearest the page offers)")
    want(control, value, key)


def _caches(meta, out: StudioImport, want, wanted) -> None:
    """Studio's cache choice (its loader's rule: "cache_type", else use_magcache, else use_teacache) as the two
    thresholds; the value nearest Studio's among those the page offers."""
    if not CACHE_KEYS & set(meta):
        return
    kind = meta.get("cache_type")                     # "MagCache", "TeaCache" or "None" (the text: no cache)
    if kind is None or kind == "":
        kind = "MagCache" if _flag(meta.get("use_magcache")) else "TeaCache" if _flag(meta.get("use_teacache")) \
            else "None"
    kind = str(kind)
    if kind == "TeaCache":
        _threshold(meta, out, want, "teacache", "teacache_rel_l1_thresh", 0.15, TEACACHE_CHOICES, "TeaCache")
        want("magcache", 0.0, "use_magcache")
        steps = _number(meta.get("teacache_num_steps"), "int")
        if steps is not None and steps != wanted.get("steps"):
            out.unmapped.append(("teacache_num_steps", "SteadyFrame's TeaCache counts the job's own steps (the first "
                                                       "and last of each section always compute)"))
    elif kind == "MagCache":
        _threshold(meta, out, want, "magcache", "magcache_threshold", 0.1, MAGCACHE_CHOICES, "MagCache")
        want("teacache", 0.0, "use_teacache")
        for key in ("magcache_max_consecutive_skips", "magcache_retention_ratio"):
            if not _none(meta.get(key)):
                out.unmapped.append((key, "SteadyFrame's MagCache uses its authors' fixed values (3 skips in a row, "
                                          "the first 20 % of the steps computed: pipeline/magcache.py)"))
    elif kind == "None":
        want("teacache", 0.0, "use_teacache")
        want("magcache", 0.0, "use_magcache")
    else:
        out.unmapped.append(("cache_type", f"{kind[:40]!r} is not MagCache, TeaCache or None"))


def _loras(meta, out: StudioImport, want) -> None:
    """Studio's {name: weight}: a name is the file's path in its LoRA folder without the suffix
    (studio.py's LoRA list); SteadyFrame names the .safetensors file in its own LoRA folder."""
    loras = meta.get("loras")
    if _none(loras):
        if out.kind == "png":
            out.notes.append("loras: Studio writes the LoRAs into its JSON file only, not into the PNG; import the "
                             "JSON to get them")
        return
    if not isinstance(loras, Mapping):
        out.unmapped.append(("loras", "not a mapping of LoRA names to weights"))
        return
    items: list[str] = []
    for name, weight in loras.items():
        name = str(name).strip()
        if not name:                                  # Studio's placeholder LoRA " "
            continue
        strength = _number(weight, "float")
        file = Path(name.replace("\\", "/")).name + ".safetensors"
        if strength is None or not LORA.strength_min <= strength <= LORA.strength_max:
            out.unmapped.append((f"loras.{name[:60]}", f"weight {str(weight)[:20]!r} is not a strength from "
                                                       f"{LORA.strength_min:g} to {LORA.strength_max:g}"))
        elif "," in file or "\n" in file:
            out.unmapped.append((f"loras.{name[:60]}", "a name with ',' cannot be written in the LoRAs field"))
        elif len(items) == LORA.max_count:
            out.unmapped.append((f"loras.{name[:60]}", f"more than {LORA.max_count} LoRAs; SteadyFrame takes at most "
                                                       f"{LORA.max_count}"))
        else:
            if "/" in name.replace("\\", "/"):
                out.notes.append(f"loras: {name[:60]!r} is in a subfolder of Studio's LoRA folder; SteadyFrame looks "
                                 f"for {file} in its LoRA folder")
            items.append(f"{file}:{strength:g}")
    if items:
        want("loras", ", ".join(items), "loras")


def _check_prompt(out: StudioImport) -> None:
    """A timed prompt as Studio reads it: what Studio accepts and SteadyFrame's page refuses is rewritten
    (`timeline.relax`: sorted, a late first block from 0 s, a block no section uses dropped, each said in a note);
    a note when SteadyFrame still refuses it for this video (the prompt is filled in anyway)."""
    prompt = out.settings.get("prompt")
    if not isinstance(prompt, str) or not timeline.is_timeline(prompt):
        return
    settings = {"prompt": prompt}
    for name in ("mode", "seconds", "latent_window", "fps", "prompt_blend"):
        settings[name] = out.settings.get(name, control(name).default)
    try:
        relaxed = timeline.relax_request(settings)
    except ValueError:
        return                                        # the length or window: their own checks say it
    if relaxed.prompt != prompt:
        out.settings["prompt"] = settings["prompt"] = relaxed.prompt
        out.notes.append(f"prompt: rewritten as Studio reads it: {relaxed.prompt[:200]!r}")
    out.notes.extend(f"prompt: {note}" for note in relaxed.notes)
    try:
        timeline.check_request(settings)
    except InputError as e:
        out.notes.append(f"prompt: imported, but SteadyFrame refuses it as it stands: {e.message}")
    except ValueError:
        pass                                          # the length or window: their own checks say it


def import_file(path, default_resolution: int = 640) -> StudioImport:
    """`read_file` then `from_metadata`. Raises InputError naming FIELD for a file that is not Studio's."""
    meta, kind = read_file(path)
    return from_metadata(meta, default_resolution, kind)


def job_values(imported: StudioImport, files: Mapping[str, Any]) -> dict:
    """An imported job as a batch line's values: its settings, then its files' paths ("image", "end_image",
    "input_video"; None: not given). A start image given to a text-to-video import makes it an image job (its
    `start_from` and Studio's no-image size are left out)."""
    values = dict(imported.settings)
    if files.get("image") is not None and imported.text_to_video:
        for name in ("start_from", "width", "height"):
            values.pop(name, None)
    return {**values, **{name: str(path) for name, path in files.items() if path is not None}}


# ---- Studio's queue export ---------------------------------------------------------------------------------------

QUEUE_JSON_MAX_BYTES = 16 << 20        # queue.json: a few kB a job
QUEUE_MAX_JOBS = 1000
IMAGE_MAX_BYTES = 64 << 20             # one image of the zip's queue_images/
VIDEO_MAX_BYTES = 4 << 30              # one video of the zip's input_files/
SKIPPED_STATUSES = ("completed", "failed", "cancelled")     # Studio's own import skips them (load_queue_from_json)
ZIP_SIGNATURE = b"PK\x03\x04"


@dataclass
class QueuedJob:
    """One job of a Studio queue export: its settings imported, the files it names (paths on this machine)."""
    id: str
    imported: StudioImport
    files: dict[str, Path] = field(default_factory=dict)      # "image", "end_image", "input_video"

    def values(self) -> dict:
        """The job as a batch line's values (settings and files)."""
        return job_values(self.imported, self.files)


@dataclass
class StudioQueue:
    """A Studio queue export read: its jobs to import, in Studio's queue order, and the ones left out, with why."""
    jobs: list[QueuedJob] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)

    def report(self) -> list[str]:
        """One line per job left out, then each imported job's notes, prefixed by its id."""
        return [f"{job_id}: left out: {why}" for job_id, why in self.skipped] + \
            [f"{job.id}: {line}" for job in self.jobs for line in job.imported.report()]


def is_queue_export(path) -> bool:
    """Whether `path` is a Studio queue export: a zip, or a JSON object of jobs (id → Studio's metadata)."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            head = f.read(len(ZIP_SIGNATURE))
        if head == ZIP_SIGNATURE:
            return True
        if path.stat().st_size > QUEUE_JSON_MAX_BYTES:
            return False
        data = json.loads(path.read_bytes().decode("utf-8-sig"))
    except (OSError, ValueError, RecursionError):
        return False
    return _is_queue(data)


def _is_queue(data) -> bool:
    return isinstance(data, dict) and bool(data) and all(isinstance(v, dict) for v in data.values()) \
        and any(STUDIO_KEYS & set(v) for v in data.values())


def read_queue(path, folder, default_resolution: int = 640) -> StudioQueue:
    """The jobs of a Studio queue export (modules/video_queue.py: `save_queue_to_json` writes queue.json, {job id:
    its metadata + the queue's fields}; `export_queue_to_zip` zips it with queue_images/<id>_input.png,
    <id>_end_frame.png and input_files/<video>). A zip's files are copied into `folder` (only the names a job
    refers to, each within its size bound; never extracted whole); a JSON's are looked up beside it, as Studio's
    working folder holds them. Jobs Studio's own import skips (completed, failed, cancelled) are left out and
    reported, as are jobs that need a file the export does not hold. Raises InputError naming FIELD for a file
    that is not a Studio queue export."""
    path, folder = Path(path), Path(folder)
    out = StudioQueue()
    try:
        archive = zipfile.ZipFile(path) if zipfile.is_zipfile(path) else None
    except (OSError, zipfile.BadZipFile) as e:
        raise InputError(FIELD, f"{{file}} is not a readable zip ({str(e)[:120]})", path=path) from None
    try:
        data = _queue_json(path, archive)
        for job_id, meta in list(data.items())[:QUEUE_MAX_JOBS]:
            job_id = str(job_id)[:60]
            status = str(meta.get("status", "pending"))
            if status in SKIPPED_STATUSES:
                out.skipped.append((job_id, f"{status} in Studio (its own import skips such jobs)"))
                continue
            imported = from_metadata(meta, default_resolution)
            job = QueuedJob(job_id, imported)
            missing = _queue_files(meta, job, path, archive, folder)
            if missing:
                out.skipped.append((job_id, missing))
                continue
            out.jobs.append(job)
        if len(data) > QUEUE_MAX_JOBS:
            out.skipped.append(("…", f"{len(data) - QUEUE_MAX_JOBS} more jobs than {QUEUE_MAX_JOBS}: left out"))
    finally:
        if archive is not None:
            archive.close()
    return out


def _queue_json(path: Path, archive) -> dict:
    if archive is None:
        if path.stat().st_size > QUEUE_JSON_MAX_BYTES:
            raise InputError(FIELD, f"{{file}} is larger than {QUEUE_JSON_MAX_BYTES >> 20} MB: not a Studio queue",
                             path=path)
        raw = path.read_bytes()
    else:
        try:
            info = archive.getinfo("queue.json")
        except KeyError:
            raise InputError(FIELD, "{file} holds no queue.json: not a FramePack-Studio queue export", path=path) \
                from None
        if info.file_size > QUEUE_JSON_MAX_BYTES:
            raise InputError(FIELD, f"{{file}}'s queue.json is larger than {QUEUE_JSON_MAX_BYTES >> 20} MB",
                             path=path)
        with archive.open(info) as f:
            raw = f.read(QUEUE_JSON_MAX_BYTES + 1)
    try:
        data = json.loads(raw.decode("utf-8-sig"))
    except (ValueError, RecursionError):
        raise InputError(FIELD, "{file}: its queue.json is not JSON", path=path) from None
    if not _is_queue(data):
        raise InputError(FIELD, "{file} is not a FramePack-Studio queue (a JSON object of jobs by id, each with its "
                                "prompt, seed and model_type)", path=path)
    return data


def _queue_files(meta, job: QueuedJob, path: Path, archive, folder: Path) -> str | None:
    """The job's start image, end image and video into `job.files`; why the job cannot be imported, or None."""
    wanted = []
    if not job.imported.text_to_video:
        wanted.append(("image", meta.get("saved_input_image_path"), f"queue_images/{job.id}_input.png",
                       IMAGE_MAX_BYTES))
    if str(meta.get("model_type", "")).endswith("with Endframe"):
        wanted.append(("end_image", meta.get("saved_end_frame_image_path"), f"queue_images/{job.id}_end_frame.png",
                       IMAGE_MAX_BYTES))
    if str(meta.get("model_type", "")).startswith("Video") and isinstance(meta.get("input_video"), str):
        name = PurePath(meta["input_video"].replace("\\", "/")).name
        wanted.append(("input_video", meta["input_video"], f"input_files/{name}", VIDEO_MAX_BYTES))
    for name, given, member, limit in wanted:
        found = _zip_member(archive, member, folder, limit) if archive is not None else \
            _beside(path, given, member)
        if found is None:
            if name == "image" or name == "input_video":
                return (f"its {'start image' if name == 'image' else 'video'} ({member}) is not in the export; "
                        f"add the job by hand")
            job.imported.notes.append(f"{member}: not in the export; the job runs without an end image")
            continue
        job.files[name] = found
    return None


def _zip_member(archive: zipfile.ZipFile, member: str, folder: Path, limit: int) -> Path | None:
    """A copy of the zip's `member` in `folder` (under a name of ours), or None when it is absent or too large."""
    try:
        info = archive.getinfo(member)
    except KeyError:
        return None
    if info.is_dir() or info.file_size > limit:
        return None
    target = folder / f"{len(list(folder.iterdir()))}{PurePath(member).suffix[:8]}"
    with archive.open(info) as src, target.open("wb") as dst:
        copied = 0
        while chunk := src.read(1 << 20):
            copied += len(chunk)
            if copied > limit:
                dst.close()
                target.unlink()
                return None
            dst.write(chunk)
    return target


def _beside(path: Path, given, member: str) -> Path | None:
    """A queue.json's file as Studio's working folder (the JSON's folder) holds it: its saved path, relative there,
    or the export's own name for it."""
    for candidate in (given, member):
        if isinstance(candidate, str) and candidate.strip():
            found = path.parent / candidate.replace("\\", "/")
            if found.is_file():
                return found.resolve()
    return None
