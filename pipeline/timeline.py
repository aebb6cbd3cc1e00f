"""Timestamped prompts: `[0s: a cat sits] [2s: the cat jumps] [4s: the cat lands]` (FramePack-Studio's syntax).

A prompt is a timeline when it holds a block that opens with a number: `[` time `:` — `[2s: …]`, `[1.5 s: …]`
(also a malformed one such as `[2x: …]`, which is refused with the reason). Any other prompt is plain and is used
exactly as typed, brackets and all ("a cat [fluffy] sits").

Two more forms of FramePack-Studio's, with its meaning (its parser: modules/prompt_handler.py,
`parse_timestamped_prompt`, and the lookup of a section's prompt in modules/pipelines/worker.py):
- A time range `[2.2s-3.3s: …]`: the prompt is in effect from its start to its end, not until the next block. After
  the end, until the next block starts (or the video ends), the default prompt is: the base text below, else the
  timeline's first prompt (Studio's lookup falls back to its first prompt section where none is in effect).
  A range that runs past the next block's start is refused (which would win is unclear).
- Text outside the blocks, anywhere (`a cat on a sofa [2s: the cat jumps]`): the base prompt, the parts joined by a
  space. It is a prompt of its own — not added to the timed ones: it is in effect from 0 s until the first block
  (which may then start after 0 s), and wherever a range leaves a gap. Base text that no time is left for (the
  first block starts at 0 s and no range ends early) is refused, as any prompt that would never be used.

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
from typing import TypeGuard

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
    filler: bool = False       # the default prompt after a range's end: not refused when no section uses it


@dataclass(frozen=True)
class _Block:
    start: float
    end: float | None          # a range's end; None: until the next block
    text: str
    written: str


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


def is_timeline(prompt: object) -> TypeGuard[str]:
    return isinstance(prompt, str) and _TIMELINE.search(prompt) is not None


def _time(raw: str, block: str, shape: str) -> float:
    m = _TIME.fullmatch(raw.strip())
    if m is None:
        raise _error(f"{block}: {raw.strip()!r} is not a time; write {shape}")
    value = float(m.group(1))
    if not math.isfinite(value):
        raise _error(f"{block}: {raw.strip()!r} is not a finite time")
    return value


def _times(raw: str, block: str) -> tuple[float, float | None]:
    """(start, end or None) of a block's time: `2s`, or a range `2s-4s` (FramePack-Studio's)."""
    text = raw.strip()
    first, dash, second = text.partition("-")
    if not dash or not first.strip():          # no range ("-1s" too: a negative time is not a time)
        return _time(text, block, "the start in seconds, like [0s: …] or [1.5s: …]"), None
    shape = "a range in seconds, like [2s-4s: …]"
    start, end = _time(first, block, shape), _time(second, block, shape)
    if end < start:
        raise _error(f"{block}: the range ends at {end:g}s, before its start {start:g}s; write the earlier time "
                     f"first, like [{end:g}s-{start:g}s: …]")
    if end == start:
        raise _error(f"{block}: the range ends where it starts; give it an end after {start:g}s, or write "
                     f"[{start:g}s: …] for a prompt that lasts until the next one")
    return start, end


def _blocks(prompt: str) -> tuple[list[_Block], str]:
    """The blocks in the order written, and the base text (the parts outside the blocks, joined by a space)."""
    blocks: list = []
    outside: list[str] = []
    pos = 0
    for m in _BLOCK.finditer(prompt):
        outside.append(_outside(prompt[pos:m.start()]))
        pos = m.end()
        block = f"[{_quote(m.group(1).strip())}: {_quote(m.group(2).strip())}]"
        (start, end), text = _times(m.group(1), block), m.group(2).strip()
        if not text:
            raise _error(f"{block} has no text; write what happens from {start:g}s, or remove the block")
        if blocks and start == blocks[-1].start:
            raise _error(f"two prompts start at {start:g}s; give each time once")
        if blocks and start < blocks[-1].start:
            raise _error(f"the times must increase from left to right: {block} comes after "
                         f"{blocks[-1].written}; put the blocks in time order")
        if blocks and blocks[-1].end is not None and blocks[-1].end > start:
            raise _error(f"{blocks[-1].written} lasts until {blocks[-1].end:g}s, past the start of {block} at "
                         f"{start:g}s; end the range at {start:g}s or earlier, or start the next prompt later")
        blocks.append(_Block(start, end, text, block))
    outside.append(_outside(prompt[pos:]))
    return blocks, " ".join(part for part in outside if part)


def parse(prompt: str) -> Timeline:
    """The prompt's timeline; a plain prompt is one segment at 0 s with its text exactly as given. Raises InputError
    (field "prompt") for a malformed timeline: a bad, unsorted or repeated time, a range that ends before it starts
    or runs into the next block, an empty block, an unmatched bracket, a first block after 0 s without base text,
    base text left no time. Bounded work (one pass over at most the request's prompt length)."""
    if not is_timeline(prompt):
        return Timeline((Segment(0.0, prompt, prompt),), timed=False)
    blocks, base = _blocks(prompt)
    default = base or blocks[0].text
    segments = []
    if blocks[0].start != 0:
        if not base:
            raise _error(f"the timeline starts at {blocks[0].start:g}s; the first prompt must start at 0s, like "
                         f"[0s: …] (or write the prompt until then outside the blocks: 'a cat sits "
                         f"[{blocks[0].start:g}s: …]')")
        segments.append(Segment(0.0, base, f"the base text {_quote(base)!r}"))
    for i, b in enumerate(blocks):
        segments.append(Segment(b.start, b.text, b.written))
        after = blocks[i + 1].start if i + 1 < len(blocks) else None
        if b.end is not None and (after is None or b.end < after):
            segments.append(Segment(b.end, default, f"{_quote(default)!r} after {b.written}", filler=True))
    if base and blocks[0].start == 0 and not any(s.filler for s in segments):
        raise _error(f"{_quote(base)!r} stands outside the [time: text] blocks; such text is the base prompt, used "
                     f"where no block is in effect, but the blocks leave no time for it (the first starts at 0s); "
                     f"put it inside a block, like [0s: {_quote(base)}], or start the first block later")
    return Timeline(tuple(segments), timed=True)


def _outside(text: str) -> str:
    """Text between or around the blocks (part of the base prompt), stripped; a bracket there is refused."""
    stray = text.strip()
    if "[" in stray or "]" in stray:
        raise _error(f"{_quote(stray)!r}: a bracket is unmatched or a block is malformed; write every part as "
                     f"[time: text], with no brackets inside the text")
    return stray


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
    for a time at or past the video's end, or a prompt that no section's middle falls in (the default prompt after
    a range's end is left unused then: the range simply lasts to the video's end)."""
    end = video_seconds(window, count, fps)
    section_s = 4 * window / fps
    for seg in timeline.segments:
        if seg.start >= end and not seg.filler:
            raise _error(f"{seg.written} starts at or after the video's end ({end:.2f} s: {count} section"
                         f"{'s' if count != 1 else ''} of {section_s:.2f} s); use earlier times or a longer video")
    starts = [s.start for s in timeline.segments]
    chosen = [bisect.bisect_right(starts, section_middle(window, p, fps)) - 1 for p in range(count)]
    used = set(chosen)
    for i, seg in enumerate(timeline.segments):
        if i not in used and not seg.filler:
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
            start = 0 if p == 0 else first                # the first section's span includes the start image
            lines.append(f"{start / self.fps:.2f}–{(last + 1) / self.fps:.2f} s: {mix}")
        return lines


def schedule(prompt: str, mode: str, window: int, count: int, fps: int, blend: int = 0) -> Schedule:
    """The prompt's conditioning per section, in generation order. Raises InputError (field "prompt")."""
    timeline = parse(prompt)
    chosen = segment_positions(timeline, window, count, fps)
    if len(set(chosen)) < len(timeline.segments):     # a range's default prompt no section uses: not encoded
        kept = sorted(set(chosen))
        timeline = Timeline(tuple(timeline.segments[i] for i in kept), timed=True)
        chosen = [kept.index(i) for i in chosen]
    by_position = position_weights(timeline, chosen, blend)
    order = [by_position[video_position(mode, count, i)] for i in range(count)]
    return Schedule(timeline, tuple(order), mode, window, fps)


def check_request(settings: dict) -> None:
    """The request checks' hook (pipeline/request.py): a timed prompt must fit the video of these settings."""
    prompt = settings.get("prompt")
    if not is_timeline(prompt):
        return
    from pipeline.sections import make_plan  # (torch): a plain prompt's request is checked without it

    plan = make_plan(settings["mode"], settings["seconds"], settings["latent_window"], settings["fps"])
    schedule(prompt, plan.mode, plan.window, plan.count, settings["fps"], settings.get("prompt_blend") or 0)


# ---- FramePack-Studio's leniency (imports only) -------------------------------------------------------------------

@dataclass(frozen=True)
class Relaxed:
    """A prompt rewritten so the rules above accept it, as FramePack-Studio would have read it, and one note per
    change (the import report says each). `prompt` is the given one, unchanged, when nothing had to change or when
    the prompt is malformed beyond what Studio's own parser reads (then the strict check says why)."""
    prompt: str
    notes: tuple[str, ...] = ()


def _written(start: float, end: float | None, text: str) -> str:
    return f"[{start:g}s-{end:g}s: {text}]" if end is not None else f"[{start:g}s: {text}]"


def relax(prompt: str, mode: str, window: int, count: int, fps: int) -> Relaxed:
    """What FramePack-Studio accepts and the page refuses, made explicit (for a Studio import; the page's own
    prompts keep the strict rules). Studio's parser (modules/prompt_handler.py) sorts its blocks by time, its lookup
    falls back to the first prompt where none is in effect, and a block that no section reaches is simply never
    used. So: empty blocks are dropped; the blocks are sorted; a repeated time keeps the first block written; a
    range that runs into the next block ends there; a first block after 0 s starts at 0 s (without base text); a
    block that holds no section's middle (or starts after the video's end) is dropped. Pure, bounded (at most one
    pass per block)."""
    if not is_timeline(prompt):
        return Relaxed(prompt)
    try:
        schedule(prompt, mode, window, count, fps)
        return Relaxed(prompt)                          # the strict rules accept it: kept exactly as written
    except InputError:
        pass
    notes: list[str] = []
    blocks, outside, pos = [], [], 0
    try:
        for m in _BLOCK.finditer(prompt):
            outside.append(prompt[pos:m.start()].strip())
            pos = m.end()
            shown = f"[{_quote(m.group(1).strip())}: {_quote(m.group(2).strip())}]"
            start, end = _times(m.group(1), shown)
            blocks.append(_Block(start, end, m.group(2).strip(), shown))
    except InputError:
        return Relaxed(prompt)                          # not a time Studio's parser reads either: the check says why
    outside.append(prompt[pos:].strip())
    base = " ".join(part for part in outside if part)
    for b in [b for b in blocks if not b.text]:
        notes.append(f"{b.written} has no text: dropped")
    blocks = [b for b in blocks if b.text]
    ordered = sorted(blocks, key=lambda b: b.start)
    if ordered != blocks:
        notes.append("the blocks were not in time order: sorted by their times (as Studio does)")
    blocks = []
    for b in ordered:
        if blocks and b.start == blocks[-1].start:
            notes.append(f"{b.written} starts at {b.start:g}s as {blocks[-1].written} does: dropped (the first "
                         f"written is kept)")
            continue
        blocks.append(b)
    for i in range(len(blocks) - 1):
        b, after = blocks[i], blocks[i + 1]
        if b.end is not None and b.end > after.start:
            notes.append(f"{b.written} lasts past the start of {after.written}: it ends at {after.start:g}s")
            blocks[i] = _Block(b.start, None if b.end is None else after.start, b.text, b.written)
    end_s = video_seconds(window, count, fps)
    for _ in range(len(blocks) + 1):
        if blocks and blocks[0].start > 0 and not base:
            first = blocks[0]
            notes.append(f"{first.written}: the first block starts at {first.start:g}s; Studio uses the first "
                         f"prompt until then, so it starts at 0s")
            blocks[0] = _Block(0.0, first.end, first.text, first.written)
        text = " ".join(filter(None, [base, *(_written(b.start, b.end, b.text) for b in blocks)]))
        try:
            timeline = parse(text)
        except InputError:
            return Relaxed(prompt, tuple(notes))       # what remains is refused by the check, with its reason
        starts = [s.start for s in timeline.segments]
        used = {bisect.bisect_right(starts, section_middle(window, p, fps)) - 1 for p in range(count)}
        unused = {timeline.segments[i].start for i in range(len(starts))
                  if i not in used and not timeline.segments[i].filler}
        drop = [b for b in blocks if b.start in unused]
        if not drop:
            return Relaxed(text, tuple(notes))
        for b in drop:
            why = (f"starts at or after the video's end ({end_s:.2f} s)" if b.start >= end_s else
                   f"holds no section's middle (each section lasts {4 * window / fps:.2f} s and takes the prompt in "
                   f"effect at its middle)")
            notes.append(f"{b.written} {why}: dropped, as Studio never uses it")
        blocks = [b for b in blocks if b.start not in unused]
    return Relaxed(prompt, tuple(notes))


def relax_request(settings: dict) -> Relaxed:
    """`relax` for a request's settings (prompt, mode, seconds, latent_window, fps): the plan from them."""
    prompt = settings.get("prompt")
    if not is_timeline(prompt):
        return Relaxed(prompt if isinstance(prompt, str) else "")      # (no prompt: nothing to relax)
    from pipeline.sections import make_plan  # (torch), as check_request

    plan = make_plan(settings["mode"], settings["seconds"], settings["latent_window"], settings["fps"])
    return relax(prompt, plan.mode, plan.window, plan.count, settings["fps"])
