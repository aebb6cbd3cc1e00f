"""A post job's request and its steps, checked, and the plan they make: pure functions over frame indices (no
torch, no video decoding), so the pre-flight, the command line and the tests answer before anything loads.

Steps are written as short texts (the command line, batch lines, the API and job.json use the same):
    trim=A:B      keep seconds A to B          speed=S      S times as fast (frames dropped or repeated)
    reverse       backwards                    pingpong     forward then back (a seamless loop)
    loop=N        N times over                 interpolate=2|4|fps:F   RIFE frames between (×2, ×4, or F frames/s)
    upscale=2|4[:FILE]  ESRGAN-family ×2/×4 (FILE in the upscalers folder; default Real-ESRGAN)
    faces[=S][:FILE]    face restoration, GFPGAN (S: strength 0.05-1, default 1; FILE in the upscalers folder;
                        default GFPGAN v1.4)
The edits (trim, speed, reverse, pingpong, loop) are applied in the order given and make an index map over the
source frames (several sources are joined first, in order); then interpolation, face restoration, then upscaling
(each at most once),
whatever their place in the list: interpolating the edited sequence makes a loop's seam as smooth as the rest.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from common.errors import InputError

FIELD = "steps"
EDITS = ("trim", "speed", "reverse", "pingpong", "loop")
MODEL_STEPS = ("interpolate", "faces", "upscale")          # in the order they run, each at most once
KINDS = EDITS + MODEL_STEPS
EXPORTS = {"mp4": "MP4 (H.264)", "h265": "MP4 (H.265)", "webm": "WebM (VP9)", "gif": "GIF (palette)",
           "zip": "PNG frames (zip)", "frame": "one frame (PNG)"}
FPS_MAX = 240
LOOPS_MAX = 20
SPEED_RANGE = (0.1, 10.0)
FACE_STRENGTH = (0.05, 1.0)          # how much of the restored face replaces the original
OUT_FRAMES_MAX = 20_000


@dataclass(frozen=True)
class Step:
    kind: str
    value: Any = None           # trim: (a, b) s; speed: float; loop: int; interpolate: int factor or Fraction fps;
                                # faces: the strength (float)
    model: str = ""             # upscale/interpolate/faces: the model file's name ("" = the default)

    def text(self) -> str:
        if self.kind == "trim":
            return f"trim={self.value[0]:g}:{self.value[1]:g}"
        if self.kind in ("reverse", "pingpong"):
            return self.kind
        if self.kind == "interpolate":
            v = f"fps:{self.value}" if isinstance(self.value, Fraction) else str(self.value)
            return f"interpolate={v}" + (f":{self.model}" if self.model else "")
        if self.kind in ("upscale", "faces"):
            return f"{self.kind}={self.value:g}" + (f":{self.model}" if self.model else "")
        return f"{self.kind}={self.value:g}" if isinstance(self.value, float) else f"{self.kind}={self.value}"


def _number(text: str, what: str, kind=float):
    try:
        value = kind(text)
    except (TypeError, ValueError):
        raise InputError(FIELD, f"{what}: {text!r} is not a number") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(FIELD, f"{what}: {text!r} is not a finite number")
    return value


def parse_step(text: str) -> Step:
    """One step from its text (InputError naming "steps" and saying what is allowed)."""
    raw = str(text).strip()
    kind, _, arg = raw.partition("=")
    kind = kind.strip().lower()
    if kind not in KINDS:
        raise InputError(FIELD, f"{raw[:40]!r} is not a step; use one of {', '.join(KINDS)} (e.g. interpolate=2)")
    if kind == "faces" and not arg:
        return Step(kind, 1.0)
    if kind in ("reverse", "pingpong"):
        if arg:
            raise InputError(FIELD, f"{kind} takes no value")
        return Step(kind)
    if not arg:
        raise InputError(FIELD, f"{kind} needs a value (e.g. {dict(trim='trim=0.5:3', speed='speed=1.5', loop='loop=3', interpolate='interpolate=2', upscale='upscale=2')[kind]})")
    if kind == "trim":
        a, sep, b = arg.partition(":")
        start, end = _number(a, "trim start"), _number(b, "trim end") if sep else None
        if start < 0 or end is None or end <= start:
            raise InputError(FIELD, f"trim={arg}: give START:END in seconds with 0 ≤ START < END")
        return Step(kind, (start, end))
    if kind == "speed":
        s = _number(arg, "speed")
        if not SPEED_RANGE[0] <= s <= SPEED_RANGE[1]:
            raise InputError(FIELD, f"speed={arg}: choose from {SPEED_RANGE[0]:g} to {SPEED_RANGE[1]:g}")
        return Step(kind, float(s))
    if kind == "loop":
        n = _number(arg, "loop", int)
        if not 1 <= n <= LOOPS_MAX:
            raise InputError(FIELD, f"loop={arg}: choose 1 to {LOOPS_MAX} times")
        return Step(kind, n)
    value, _, model = arg.partition(":")
    if kind == "interpolate":
        if value == "fps":
            fps_text, _, model = model.partition(":")
            fps = _number(fps_text, "interpolate fps")
            if not 1 <= fps <= FPS_MAX:
                raise InputError(FIELD, f"interpolate=fps:{fps_text}: choose 1 to {FPS_MAX} frames per second")
            return Step(kind, Fraction(fps_text).limit_denominator(1001), model)
        factor = _number(value, "interpolate", int)
        if factor not in (2, 4):
            raise InputError(FIELD, f"interpolate={value}: choose 2, 4 or fps:F (a frame rate)")
        return Step(kind, factor, model)
    if kind == "faces":
        strength = _number(value, "faces strength")
        if not FACE_STRENGTH[0] <= strength <= FACE_STRENGTH[1]:
            raise InputError(FIELD, f"faces={value}: choose a strength from {FACE_STRENGTH[0]:g} to "
                                    f"{FACE_STRENGTH[1]:g} (e.g. faces=0.7, or faces=1:GFPGANv1.3.pth)")
        return Step(kind, float(strength), model)
    factor = _number(value, "upscale", int)
    if factor not in (2, 4):
        raise InputError(FIELD, f"upscale={value}: choose 2 or 4")
    return Step(kind, factor, model)


@dataclass(frozen=True)
class PostRequest:
    """What a post job does: its source videos (joined in order), its steps, what it exports."""
    sources: tuple[Path, ...]
    steps: tuple[Step, ...] = ()
    export: str = "mp4"
    frame: int = -1                         # export "frame": which output frame (-1: the last)
    crf: int = 16
    source_job: str = ""                    # the job the first source came from, for the record

    def settings(self) -> dict:
        """The request as job.json and the queue keep it (the sources by their files' paths)."""
        return {"kind": "post", "sources": [str(p) for p in self.sources], "steps": [s.text() for s in self.steps],
                "export": self.export, "frame": self.frame, "crf": self.crf, "source_job": self.source_job}

    @property
    def preserved_gb(self) -> float:
        """(A generation's setting: a post job's models are small and whole on the GPU, nothing is preserved.)"""
        return 0.0

    @property
    def interpolation(self) -> Step | None:
        return next((s for s in self.steps if s.kind == "interpolate"), None)

    @property
    def faces(self) -> Step | None:
        return next((s for s in self.steps if s.kind == "faces"), None)

    @property
    def upscale(self) -> Step | None:
        return next((s for s in self.steps if s.kind == "upscale"), None)

    @property
    def edits(self) -> tuple[Step, ...]:
        return tuple(s for s in self.steps if s.kind in EDITS)


def is_post(values) -> bool:
    return isinstance(values, dict) and values.get("kind") == "post"


def source_values(values: dict) -> list:
    """The sources a post job's values name ("sources": a list or one; or "source"), as given."""
    sources = values.get("sources") or ([values["source"]] if values.get("source") else [])
    return [sources] if isinstance(sources, (str, Path)) else list(sources)


def request_from(values: dict, base: Path | None = None) -> PostRequest:
    """A PostRequest from its values (the API's JSON, a batch line, job.json's settings, the queue's entry): every
    field checked, InputError naming it. `base`: relative source paths are relative to it (a jobs file's folder)."""
    sources = source_values(values)
    if base is not None:
        sources = [str(Path(base) / s) if isinstance(s, str) and not Path(s).is_absolute() else s for s in sources]
    if not sources:
        raise InputError("video", "give the video to work on (a finished job, a Past jobs entry or a file)")
    steps = values.get("steps") or []
    if isinstance(steps, str):
        steps = [s for s in steps.replace(",", " ").split() if s]
    parsed = tuple(parse_step(s) for s in steps)
    for kind in MODEL_STEPS:
        if sum(s.kind == kind for s in parsed) > 1:
            raise InputError(FIELD, f"{kind} is given twice; give it once")
    export = str(values.get("export") or "mp4").lower()
    if export not in EXPORTS:
        raise InputError("export", f"{export!r} is not a format; choose one of {', '.join(EXPORTS)}")
    if not parsed and export == "mp4" and len(sources) == 1:
        raise InputError(FIELD, "nothing to do: give at least one step, another export format, or several videos "
                                "to join")
    try:
        frame, crf = int(values.get("frame", -1)), int(values.get("crf", 16))
    except (TypeError, ValueError):
        raise InputError("frame", "frame and crf must be whole numbers") from None
    if not 0 <= crf <= 51:
        raise InputError("crf", f"{crf} is outside 0–51")
    return PostRequest(tuple(Path(s) for s in sources), parsed, export, frame, crf,
                       str(values.get("source_job") or ""))


@dataclass(frozen=True)
class Plan:
    """What the steps make of the sources: which source frame each edited frame is ((source, frame) pairs), and
    the output's frame rate, count and size."""
    order: tuple[tuple[int, int], ...]
    fps: Fraction
    out_fps: Fraction
    out_frames: int
    width: int
    height: int
    out_width: int
    out_height: int
    times: tuple[Fraction, ...] = field(default=(), repr=False)   # interpolation: position of each output frame


def edit_order(counts: list[int], fps: Fraction, edits: tuple[Step, ...]) -> list[tuple[int, int]]:
    """The edited sequence as (source, frame) pairs: the sources joined, then each edit in order."""
    seq = [(i, k) for i, n in enumerate(counts) for k in range(n)]
    for step in edits:
        if step.kind == "trim":
            a, b = (int(round(t * fps)) for t in step.value)
            seq = seq[a:min(b, len(seq))]
        elif step.kind == "speed":
            n = max(1, int(round(len(seq) / step.value)))
            seq = [seq[min(len(seq) - 1, int(k * step.value + 1e-9))] for k in range(n)]
        elif step.kind == "reverse":
            seq = seq[::-1]
        elif step.kind == "pingpong":
            seq = seq + seq[-2:0:-1]
        elif step.kind == "loop":
            seq = seq * step.value
        if not seq:
            raise InputError(FIELD, f"{step.text()} leaves no frames (the video has {sum(counts)} frames at "
                                    f"{float(fps):g} fps)")
    return seq


def interpolation_times(n: int, fps: Fraction, step: Step | None) -> tuple[Fraction, tuple[Fraction, ...]]:
    """(output fps, the edited-sequence position of each output frame): position p shows frame p when it is whole,
    else RIFE's frame at time p - floor(p) between floor(p) and floor(p) + 1."""
    if step is None:
        return fps, tuple(Fraction(k) for k in range(n))
    out = fps * step.value if isinstance(step.value, int) else Fraction(step.value)
    count = int((n - 1) * out / fps) + 1
    return out, tuple(Fraction(k) * fps / out for k in range(count))


def make_plan(request: PostRequest, counts: list[int], fps: Fraction, width: int, height: int) -> Plan:
    order = edit_order(counts, fps, request.edits)
    out_fps, times = interpolation_times(len(order), fps, request.interpolation)
    if len(times) > OUT_FRAMES_MAX:
        raise InputError(FIELD, f"the steps make {len(times)} frames, more than {OUT_FRAMES_MAX}; loop less or "
                                f"interpolate less")
    scale = request.upscale.value if request.upscale else 1
    return Plan(tuple(order), fps, out_fps, len(times), width, height, width * scale, height * scale, times)


CHUNKS_DIR = "chunks"    # in a post job's folder: one finished segment per chunk (removed when the job is done)
CHUNK = 16              # edited frames per chunk: the unit of work, of progress and of resume


def chunks(plan: Plan, chunk: int = CHUNK) -> list[tuple[int, int]]:
    """The output frames as [start, end) ranges, each from `chunk` edited frames (and the next one, for the
    frames between)."""
    out: list[tuple[int, int]] = []
    k = 0
    while k < plan.out_frames:
        limit = (len(out) + 1) * chunk
        end = k
        while end < plan.out_frames and plan.times[end] < limit:
            end += 1
        out.append((k, end))
        k = end
    return out
