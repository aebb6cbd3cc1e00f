"""Live explanations next to the controls: what the length gives, which combinations do not work or do nothing,
and what the preserved-memory slider means on this machine."""
from __future__ import annotations

import logging
import math
from typing import Any

from common.errors import InputError
from configs import DEFAULTS, LIMITS, MEMORY
from memory.estimate import describe_preserved
from ui.messages import input_error, label

log = logging.getLogger(__name__)


TEXT_MAX = 64        # characters of a number sent as text that are looked at (the live hints get raw values)


def number(value) -> float | None:
    """A raw control value as a finite float, or None (wrong type, too long, NaN, inf). Never slow, never raises."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, str):
        if len(value) > TEXT_MAX:
            return None
    elif not isinstance(value, (int, float)):
        return None
    try:
        v = float(value)
    except (ValueError, OverflowError):
        return None
    return v if math.isfinite(v) else None


def on_page(error: ValueError) -> str:
    """'seconds: 200 is not between 1 and 120' -> 'Total video length: …' (the field by its label on the page)."""
    if isinstance(error, InputError):
        return input_error(error)
    field, sep, text = str(error).partition(": ")
    return f"{label(field)}: {text}" if sep and label(field) != field else str(error)


def plan_hint(seconds, latent_window, mode, fps: int = DEFAULTS.fps) -> str:
    """'2 sections of 9 latent frames → 73 frames (2.4 s at 30 fps)', or what is wrong with the length or window.
    Bounded work at any input: the planner refuses values beyond the limits before it counts anything."""
    from pipeline import sections

    s, w = number(seconds), number(latent_window)
    if s is None or w is None:
        return ""
    # a number typed past a slider's end: the page sets the slider to that end when the box loses focus (Start
    # does that too), so say which value the job will get instead of an error that Start would contradict
    s, s_note = _slider_end(s, LIMITS.seconds, "seconds")
    w, w_note = _slider_end(w, LIMITS.latent_window, "latent_window")
    try:
        plan = sections.make_plan(mode if isinstance(mode, str) else "", s, w, fps)
    except ValueError as e:
        return f"⚠ {on_page(e)}"
    frames = plan.total_frames
    rounded = (f"{s:g} s is rounded to whole sections: " if abs(frames / fps - s) >= 0.05 else "")
    return (f"{s_note}{w_note}{rounded}{plan.count} section{'s' if plan.count != 1 else ''} of {plan.window} latent "
            f"frames → {frames} frames ({frames / fps:.1f} s at {fps} fps); the video refreshes after each section.")


def _slider_end(value: float, limits: tuple, name: str) -> tuple[float, str]:
    lo, hi = limits
    if lo <= value <= hi:
        return value, ""
    end = hi if value > hi else lo
    return end, f"⚠ {label(name)}: {value:g} is beyond the slider ({lo:g}–{hi:g}); the job gets {end:g}. "


def timeline_hint(prompt, seconds, latent_window, mode, blend, fps: int = DEFAULTS.fps) -> str:
    """For a timed prompt ([0s: …] [2s: …], pipeline/timeline.py): which prompt each section gets, or what is wrong
    with the timeline for this video ('' for a plain prompt). Bounded work; never raises."""
    from pipeline import sections, timeline

    s, w, b = number(seconds), number(latent_window), number(blend)
    if not isinstance(prompt, str) or not timeline.is_timeline(prompt[: LIMITS.prompt_chars_max]) or s is None \
            or w is None:
        return ""
    try:
        plan = sections.make_plan(mode if isinstance(mode, str) else "", s, w, fps)
        schedule = timeline.schedule(prompt[: LIMITS.prompt_chars_max], plan.mode, plan.window, plan.count, fps,
                                     int(b) if b is not None and 0 <= b <= 16 else 0)
    except InputError as e:
        return f"⚠ Prompt: {e.message}"
    except ValueError:
        return ""                                        # the length or window: plan_hint says what is wrong
    lines = schedule.describe()
    shown = lines if len(lines) <= 8 else lines[:4] + [f"… {len(lines) - 6} more sections …"] + lines[-2:]
    return "ℹ Timed prompt, by section:\n" + "\n".join(f"- {line}" for line in shown)


def combination_problems(*, mode, has_end_image, cfg, rescale, negative_prompt, crf, teacache,
                         magcache=0) -> list[tuple[str, str]]:
    """(level, text) for settings that cannot work together ("error") or do nothing / cost more ("note")."""
    out = []
    cfg, rescale, crf, teacache = number(cfg), number(rescale), number(crf), number(teacache)
    magcache = number(magcache)
    if teacache and magcache:            # the pre-flight refuses this pair: say so before Start
        out.append(("error", f"MagCache {magcache:g} needs TeaCache off: set TeaCache to off under Advanced (one "
                             f"cache at a time)."))
    if has_end_image and mode != "original":
        out.append(("error", "End image: only the **original** mode supports an end frame. Choose mode "
                             "'original' or remove the end image."))
    if cfg is None or rescale is None:
        return out
    if cfg == 1.0 and isinstance(negative_prompt, str) and negative_prompt.strip():
        out.append(("note", "The negative prompt is ignored while CFG is 1 (set CFG > 1 under Advanced)."))
    if cfg == 1.0 and rescale > 0:
        out.append(("note", "CFG rescale only acts when CFG > 1."))
    if cfg > 1.0:
        out.append(("note", "CFG > 1 runs the negative prompt too: every step costs about twice as much."))
    if crf == 0:
        out.append(("note", "MP4 CRF 0 is lossless, and most browsers cannot play such files; 16 is the default."))
    if teacache is not None and teacache > 0.15:
        out.append(("note", f"TeaCache {teacache:g} is fast but visibly lossy (hands, fingers); 0.1–0.15 "
                            "is the usual choice, 0 turns it off."))
    return out


def hints_markdown(plan: str, problems: list[tuple[str, str]]) -> str:
    lines = [plan if plan.startswith("⚠") else f"ℹ {plan}"] if plan else []
    lines += [("⚠ " if level == "error" else "• ") + text for level, text in problems]
    return "\n\n".join(lines)


def preserved_hint(preset, cap_gb: float, preserved_gb, device_type: str, host_ram_gb: float | None = None,
                   weight_storage: str = "native", max_gb: float | None = None,
                   size: tuple[int, int] | None = None, window: int = 9, fp8_compute: bool = False) -> str:
    """What the preserved-memory slider means here, GPU and host side (memory.estimate.describe_preserved), never
    raising. A value that cannot work (more than the cap or the card holds, or a plan that runs out of memory)
    starts with "⚠ … cannot work" and says why."""

    top = MEMORY.preserved_max_gb if max_gb is None else max_gb
    value = number(preserved_gb)
    if value is None or value < 0:
        return f"(enter a number between 0 and {top:g} GB)"
    if value > top:
        return (f"⚠ **{value:g} GB cannot work:** the most that can be preserved is {top:g} GB (the VRAM cap "
                f"{cap_gb:g} GB, or your card's memory if smaller). Choose a value up to {top:g} GB.")
    try:
        sized: dict[str, Any] = {"size": size, "window": window} if size else {}
        text = describe_preserved(preset, float(cap_gb), value, device_type, host_ram_gb, weight_storage, **sized,
                                  fp8_compute=fp8_compute)
    except Exception:  # the hint must never break the page
        log.warning("could not describe the memory plan", exc_info=True)
        return "(the memory plan could not be computed; see the log)"
    plan, _, warning = text.partition(". Warning: ")
    if not warning:
        return text
    warning, host, rest = warning.partition(". Host")
    return f"⚠ **{value:g} GB cannot work as intended:** {warning}.\n\n{plan}. {host.lstrip('. ')}{rest}"
