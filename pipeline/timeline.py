"""Timestamped prompts: `[0s: a cat sits] [2s: the cat jumps] [4s: the cat lands]` (FramePack-Studio's syntax).

A prompt is a timeline when it holds a block that opens with a number: `[` time `:` — `[2s: …]`, `[1.5 s: …]`
(also a malformed one such as `[2x: …]`, which is refused with the reason). Any other prompt is plain and is used
exactly as typed, brackets and all ("a cat [fluffy] sits").

When a section uses which prompt — pure bookkeeping, no models:
- Times are places in the FINAL video, whatever the generation order: the original mode generates its sections from
  the end backwards, F1 forwards; both put the section of video position p (0 = the first after the start image)
  on pixel frames 4·p·w + 1 … 4·(p + 1)·w (w = the latent window; frame 0 is the start image). See
  `section_frames`.
- A section is conditioned on the prompt in effect at its MIDDLE frame (the middle of that span, in seconds at the
  video's fps): a prompt change thus lands on the section boundary nearest to its time. A prompt whose span holds
  no section's middle would never be used, and is refused (so are times at or past the video's end).
- Blend over N sections (`prompt_blend`): the N sections from a change on mix the prompt before the change (as the
  section before the change was conditioned) and the new one, with the new one's share 1/(N+1), 2/(N+1), …,
  N/(N+1); the next section has the new prompt alone. A change that comes before a blend is complete starts from
  where the blend stood. N = 0: no blend, each section has exactly one prompt.

Every section's conditioning is a tuple of weights over the timeline's distinct prompts (a text repeated at two
times is encoded once). pipeline/timeline_text.py encodes them and mixes the embeddings.
"""
from __future__ import annotations

import bisect
import math
import re
from dataclasses import dataclass

from common.errors import InputError

FIELD = "prompt"           # configs/controls.py's field name of the prompt; the page shows it as "Prompt"
SHOWN = 40                 # characters of a prompt's text quoted in a message

# A block that opens with something number-like before its colon makes the prompt a timeline.
_TIMELINE = re.compile(r"\[\s*[-+.\d][^\[\]:]*:")
_BLOCK = re.compile(r"\[([^\[\]:]*):([^\[\]]*)\]")
_TIME = re.compile(r"(\d+(?:\.\d+)?|\.\d+)\s*s", re.IGNORECASE)


@dataclass(frozen=True)
class Segment:
    start: float               # seconds from the video's start
    text: str
    written: str               # the block as typed (for messages)


@dataclass(frozen=True)
class Timeline:
    segments: tuple[Segment, ...]
    timed: bool                # False: a plain prompt (one segment at 0 s, the text unchanged)

    @property
    def texts(self) -> tuple[str, ...]:
        """The distinct prompt texts, in order of first appearance (each is encoded once)."""
        return tuple(dict.fromkeys(s.text for s in self.segments))


def _quote(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= SHOWN else text[: SHOWN - 1] + "…"


def _error(message: str) -> InputError:
    return InputError(FIELD, message)


def is_timeline(prompt: str) -> bool:
    return isinstance(prompt, str) and _TIMELINE.search(prompt) is not None


def _time(raw: str, block: str) -> float:
    m = _TIME.fullmatch(raw.strip())
    if "-" in raw.strip().lstrip("-") and not raw.strip().startswith("-"):
        raise _error(f"{block}: time ranges are not supported; give each prompt's start time only, like "
                     f"[0s: …] [2s: …] (a prompt lasts until the next one starts)")
    if m is None:
        raise _error(f"{block}: {raw.strip()!r} is not a time; write the start in seconds, like [0s: …] or "
                     f"[1.5s: …]")
    value = float(m.group(1))
    if not math.isfinite(value):
        raise _error(f"{block}: {raw.strip()!r} is not a finite time")
    return value


def parse(prompt: str) -> Timeline:
    """The prompt's timeline; a plain prompt is one segment at 0 s with its text exactly as given. Raises InputError
    (field "prompt") for a malformed timeline: text outside the blocks, a bad or unsorted or repeated time, an empty
    block, a first block after 0 s. Bounded work (one pass over at most the request's prompt length)."""
    if not is_timeline(prompt):
        return Timeline((Segment(0.0, prompt, prompt),), timed=False)
    segments, pos = [], 0
    for m in _BLOCK.finditer(prompt):
        _outside(prompt[pos:m.start()])
        pos = m.end()
        block = f"[{_quote(m.group(1).strip())}: {_quote(m.group(2).strip())}]"
        start, text = _time(m.group(1), block), m.group(2).strip()
        if not text:
            raise _error(f"{block} has no text; write what happens from {start:g}s, or remove the block")
        if segments and start == segments[-1].start:
            raise _error(f"two prompts start at {start:g}s; give each time once")
        if segments and start < segments[-1].start:
            raise _error(f"the times must increase from left to right: {block} comes after "
                         f"{segments[-1].written}; put the blocks in time order")
        segments.append(Segment(start, text, block))
    _outside(prompt[pos:])
    if segments[0].start != 0:
        raise _error(f"the timeline starts at {segments[0].start:g}s; the first prompt must start at 0s, like "
                     f"[0s: …]")
    return Timeline(tuple(segments), timed=True)


def _outside(text: str) -> None:
    """Text between or around the blocks: only spaces may stand there."""
    stray = text.strip()
    if not stray:
        return
    if "[" in stray or "]" in stray:
        raise _error(f"{_quote(stray)!r}: a bracket is unmatched or a block is malformed; write every part as "
                     f"[time: text], with no brackets inside the text")
    raise _error(f"{_quote(stray)!r} stands outside the [time: text] blocks; put every part of a timed prompt "
                 f"inside a block, like [0s: {_quote(stray)}]")


# ---- sections ----------------------------------------------------------------------------------------------------


def video_position(mode: str, count: int, index: int) -> int:
    """A section's place in the final video (0 = the first after the start image) from its generation index:
    the original mode generates from the end backwards."""
    return count - 1 - index if mode == "original" else index


def section_frames(window: int, position: int) -> tuple[int, int]:
    """(first, last) pixel frame of the section at video `position` in the final video (frame 0 = start image).
    Both modes: the start latent is latent 0, the section at `position` the latents 1 + p·w … (p + 1)·w, and the
    causal VAE turns latent j ≥ 1 into frames 4(j − 1) + 1 … 4j."""
    return 4 * position * window + 1, 4 * (position + 1) * window


def section_middle(window: int, position: int, fps: int) -> float:
    first, last = section_frames(window, position)
    return (first + last) / 2 / fps


def video_seconds(window: int, count: int, fps: int) -> float:
    """The final video's length: 4·w·count + 1 frames (sections.SectionPlan.total_frames)."""
    return (4 * window * count + 1) / fps


def segment_positions(timeline: Timeline, window: int, count: int, fps: int) -> list[int]:
    """The segment index of each video position (the prompt in effect at the section's middle). Raises InputError
    for a time at or past the video's end, or a prompt that no section's middle falls in."""
    end = video_seconds(window, count, fps)
    section_s = 4 * window / fps
    for seg in timeline.segments:
        if seg.start >= end:
            raise _error(f"{seg.written} starts at or after the video's end ({end:.2f} s: {count} section"
                         f"{'s' if count != 1 else ''} of {section_s:.2f} s); use earlier times or a longer video")
    starts = [s.start for s in timeline.segments]
    chosen = [bisect.bisect_right(starts, section_middle(window, p, fps)) - 1 for p in range(count)]
    used = set(chosen)
    for i, seg in enumerate(timeline.segments):
        if i not in used:
            until = f"{starts[i + 1]:g}s" if i + 1 < len(starts) else "the end"
            raise _error(f"{seg.written} (from {seg.start:g}s until {until}) holds no section's middle, so no "
                         f"section would use it: each section lasts {section_s:.2f} s and takes the prompt in effect "
                         f"at its middle; space the times at least {section_s:.2f} s apart")
    return chosen


Weights = tuple[float, ...]


def position_weights(timeline: Timeline, chosen: list[int], blend: int) -> list[Weights]:
    """Each video position's weights over `timeline.texts` (they sum to 1), with the blend described above."""
    texts = timeline.texts
    n, index = len(texts), {t: k for k, t in enumerate(texts)}
    out: list[Weights] = []
    change = 0                                    # the first position of the current segment
    for p, seg in enumerate(chosen):
        if p > 0 and seg != chosen[p - 1]:
            change = p
        pure = tuple(1.0 if k == index[timeline.segments[seg].text] else 0.0 for k in range(n))
        step = p - change
        if change == 0 or step >= blend:
            out.append(pure)
            continue
        share = (step + 1) / (blend + 1)
        before = out[change - 1]
        out.append(tuple((1 - share) * b + share * q for b, q in zip(before, pure)))
    return out


@dataclass(frozen=True)
class Schedule:
    """The conditioning of every section of a job: `weights[i]` for the section of generation index i."""
    timeline: Timeline
    weights: tuple[Weights, ...]
    mode: str
    window: int
    fps: int

    @property
    def texts(self) -> tuple[str, ...]:
        return self.timeline.texts

    def describe(self) -> list[str]:
        """One line per section in video order: its time span and its prompt(s), for the log."""
        lines = []
        count = len(self.weights)
        for p in range(count):
            w = self.weights[count - 1 - p] if self.mode == "original" else self.weights[p]
            first, last = section_frames(self.window, p)
            mix = " + ".join(f"{share:.2f}·{_quote(self.texts[k])!r}" if share < 1 else repr(_quote(self.texts[k]))
                             for k, share in enumerate(w) if share > 0)
            lines.append(f"{first / self.fps:.2f}–{(last + 1) / self.fps:.2f} s: {mix}")
        return lines


def schedule(prompt: str, mode: str, window: int, count: int, fps: int, blend: int = 0) -> Schedule:
    """The prompt's conditioning per section, in generation order. Raises InputError (field "prompt")."""
    timeline = parse(prompt)
    chosen = segment_positions(timeline, window, count, fps)
    by_position = position_weights(timeline, chosen, blend)
    order = [by_position[video_position(mode, count, i)] for i in range(count)]
    return Schedule(timeline, tuple(order), mode, window, fps)


def check_request(settings: dict) -> None:
    """The request checks' hook (pipeline/request.py): a timed prompt must fit the video of these settings."""
    from pipeline.sections import make_plan

    prompt = settings.get("prompt")
    if not is_timeline(prompt):
        return
    plan = make_plan(settings["mode"], settings["seconds"], settings["latent_window"], settings["fps"])
    schedule(prompt, plan.mode, plan.window, plan.count, settings["fps"], settings.get("prompt_blend") or 0)
