"""Keyframes: images at chosen times in the video, `[2.5s] middle.png [4s, 0.8] other.png` (original mode).

The start image is the video's frame at 0 s and the end image (original mode) its last frame; a keyframe is an image
in between. Each section is conditioned on the keyframe that governs it, as FramePack-eichi's section keyframes
are (its `endframe_ichi.py`: per section, the clean latent at RoPE index 0, FramePack's `clean_latents_pre`, which
is otherwise the start image's latent, is the latent of the section's keyframe): here the keyframe in effect at the
section's MIDDLE frame governs it, the same rule as a timed prompt's (pipeline/timeline.py), so a keyframe governs
the sections from its time until the next keyframe; the sections before the first keyframe keep the start latent.
A keyframe's strength s (0 to 1, default 1) blends: the section's start slot is (1 − s)·start + s·keyframe latent.
The SigLIP image conditioning stays the start image's (and the end image's blend), as in eichi.

The original mode only: F1 conditions every section on its own history (its start slot is the anchor the whole
video drifts from), so keyframes there are refused with a message.

Forms (the setting `keyframes`, in job.json, batch lines and the API; the page builds it from its rows):
- `[TIME] FILE` or `[TIME, STRENGTH] FILE`, one after another: `[2.5s] middle.png [4s, 0.8] other.png`;
- `TIME=FILE` or `TIME:STRENGTH=FILE`, comma-separated (the command line's repeated `--keyframe 2.5=middle.png`).
A time is seconds in the final video (`2.5`, `2.5s`). A keyframe at 0 s is the start image and one at or after the
requested length its end image, when those are not given otherwise (`split_ends`: `[0s] start.png [2.5s] middle.png
[5s] end.png` is a whole request's images); given both ways, the keyframe is refused saying so.

Pure bookkeeping (no torch): the parse, the checks against the section plan, and which keyframe governs each section.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from common.errors import InputError
from pipeline import timeline

FIELD = "keyframes"
MAX_KEYFRAMES = 8
STRENGTH_RANGE = (0.0, 1.0)
_BRACKET = re.compile(r"\[([^\[\]]*)\]\s*([^\[\]]*)")
_TIME = re.compile(r"(\d+(?:\.\d+)?|\.\d+)\s*s?", re.IGNORECASE)


@dataclass(frozen=True)
class Keyframe:
    time: float                 # seconds from the video's start
    image: str                  # the file (a path; a job folder's copy once the job runs)
    strength: float = 1.0

    def spec(self) -> str:
        strength = "" if self.strength == 1.0 else f", {self.strength:g}"
        return f"[{self.time:g}s{strength}] {self.image}"


def _error(message: str) -> InputError:
    return InputError(FIELD, message)


def _time(raw: str, item: str) -> float:
    m = _TIME.fullmatch(raw.strip())
    if m is None:
        raise _error(f"{item!r}: {raw.strip()[:20]!r} is not a time; write seconds, like [2.5s] middle.png")
    return float(m.group(1))


def _strength(raw: str, item: str) -> float:
    try:
        value = float(raw.strip())
    except ValueError:
        value = math.nan
    lo, hi = STRENGTH_RANGE
    if not math.isfinite(value) or not lo <= value <= hi:
        raise _error(f"{item!r}: the strength {raw.strip()[:20]!r} is not a number from {lo:g} to {hi:g}")
    return value


def parse(spec) -> tuple[Keyframe, ...]:
    """The keyframes of a setting, sorted by time. Raises InputError (field "keyframes") for a malformed one, a
    repeated time, or more than MAX_KEYFRAMES. Bounded: one pass over the text."""
    if spec is None:
        return ()
    if not isinstance(spec, str):
        raise _error("must be text, like [2.5s] middle.png [4s, 0.8] other.png")
    text = spec.strip()
    if not text:
        return ()
    items: list[Keyframe] = []
    if text.startswith("["):
        pos = 0
        for m in _BRACKET.finditer(text):
            if text[pos:m.start()].strip():
                break
            pos = m.end()
            head, _, strength = m.group(1).partition(",")
            item = m.group(0).strip()[:60]
            image = m.group(2).strip()
            if not image:
                raise _error(f"{item!r} names no image; write [time] file")
            items.append(Keyframe(_time(head, item), image, _strength(strength, item) if strength.strip() else 1.0))
        if text[pos:].strip():
            raise _error(f"{text[pos:pos + 40]!r}: write each keyframe as [time] file, like [2.5s] middle.png")
    else:
        for part in text.split(","):
            item = part.strip()
            if not item:
                continue
            head, eq, image = item.partition("=")
            if not eq or not image.strip():
                raise _error(f"{item[:60]!r}: write TIME=FILE, like 2.5=middle.png (or 2.5:0.8=middle.png with a "
                             f"strength)")
            when, _, strength = head.partition(":")
            items.append(Keyframe(_time(when, item[:60]), image.strip(),
                                  _strength(strength, item[:60]) if strength.strip() else 1.0))
    if len(items) > MAX_KEYFRAMES:
        raise _error(f"{len(items)} keyframes; at most {MAX_KEYFRAMES}")
    items.sort(key=lambda k: k.time)
    for a, b in zip(items, items[1:]):
        if a.time == b.time:
            raise _error(f"two keyframes at {a.time:g}s; give each time once")
    return tuple(items)


def spec(keyframes) -> str:
    """The setting's text for keyframes (the inverse of `parse`)."""
    return " ".join(k.spec() for k in keyframes)


def with_images(keyframes, images) -> str:
    """The setting with each keyframe's image replaced (the job folder's copies), times and strengths kept."""
    return spec(Keyframe(k.time, str(i), k.strength) for k, i in zip(keyframes, images))


def check(spec_text, mode: str, window: int, count: int, fps: int) -> tuple[Keyframe, ...]:
    """The keyframes of a request, checked against its section plan. Raises InputError naming "keyframes": F1
    mode; a time at 0 s (the start image) or at or after the video's end (the end image); a keyframe that governs
    no section (two keyframes closer than a section: the later one wins every section between them)."""
    keyframes = parse(spec_text)
    if not keyframes:
        return keyframes
    if mode != "original":
        raise _error("the F1 mode has no keyframes (each of its sections follows its own history); choose mode "
                     "'original', or remove the keyframes")
    end = timeline.video_seconds(window, count, fps)
    for k in keyframes:
        if k.time == 0:
            raise _error(f"{k.spec()}: a keyframe at 0s is the start image, and a start image is given too; "
                         f"remove one of them")
        if k.time >= end:
            raise _error(f"{k.spec()}: at or after the video's end ({end:.2f} s) it is the end frame, and an end "
                         f"image is given too; remove one of them, or give the keyframe an earlier time")
    governing = governing_keyframes([k.time for k in keyframes], "original", window, count, fps)
    section_s = 4 * window / fps
    for i, k in enumerate(keyframes):
        if i not in governing:
            raise _error(f"{k.spec()} governs no section: each section ({section_s:.2f} s) takes the keyframe in "
                         f"effect at its middle; space the keyframes at least {section_s:.2f} s apart, or move it "
                         f"before the last section's middle")
    return keyframes


def governing_keyframes(times, mode: str, window: int, count: int, fps: int) -> list[int | None]:
    """For each section in GENERATION order (the plan's index): the index of the keyframe that governs it (the
    last whose time is at or before the section's middle in the final video), or None (the start latent)."""
    out = []
    for index in range(count):
        middle = timeline.section_middle(window, timeline.video_position(mode, count, index), fps)
        found = None
        for k, t in enumerate(times):
            if t <= middle:
                found = k
        out.append(found)
    return out


def check_request(settings: dict) -> tuple[Keyframe, ...]:
    """The request checks' hook (pipeline/request.py): the keyframes checked against this request's plan."""
    if not (settings.get("keyframes") or "").strip():
        return ()
    from pipeline.sections import make_plan  # (torch), as timeline.check_request

    plan = make_plan(settings["mode"], settings["seconds"], settings["latent_window"], settings["fps"])
    return check(settings["keyframes"], plan.mode, plan.window, plan.count, settings["fps"])


def relative_to(spec_text, base) -> str:
    """The setting with relative image paths made relative to `base` (a batch file's folder), as the image
    controls' are; a setting that does not parse is left for the request's check to explain."""
    try:
        items = parse(spec_text)
    except InputError:
        return spec_text
    paths = [Path(k.image).expanduser() for k in items]
    return with_images(items, [p if p.is_absolute() else Path(base) / p for p in paths])


def split_ends(fields: dict, default_seconds: float) -> dict:
    """`[0s] start.png [2.5s] middle.png [5s] end.png` as a request's fields: a keyframe at 0 s is the start image
    and one at or after the requested length (`seconds`) the end image, when those are not given otherwise; the
    others stay keyframes. Returns the fields to change (none when the setting does not parse: its check says
    why)."""
    try:
        items = list(parse(fields.get("keyframes")))
        seconds = float(fields.get("seconds", default_seconds))
    except (InputError, TypeError, ValueError):
        return {}
    out = {}
    if items and items[0].time == 0 and fields.get("image") in (None, ""):
        out["image"] = items.pop(0).image
    if items and math.isfinite(seconds) and items[-1].time >= seconds and fields.get("end_image") in (None, ""):
        out["end_image"] = items.pop().image
    if out:
        out["keyframes"] = spec(items)
    return out
