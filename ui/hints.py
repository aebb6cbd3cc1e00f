"""Live explanations next to the controls: what the length gives, which combinations do not work or do nothing,
and what the preserved-memory slider means on this machine."""
from __future__ import annotations

import logging

from configs import DEFAULTS

log = logging.getLogger(__name__)


def plan_hint(seconds, latent_window, mode, fps: int = DEFAULTS.fps) -> str:
    """'2 sections of 9 latent frames → 73 frames (2.4 s at 30 fps)'."""
    from pipeline import sections

    try:
        plan = sections.make_plan(mode, float(seconds), int(latent_window), fps)
        frames = plan.frame_counts()[-1]
    except (TypeError, ValueError):
        return ""
    return (f"{plan.count} section{'s' if plan.count != 1 else ''} of {plan.window} latent frames → "
            f"{frames} frames ({frames / fps:.1f} s at {fps} fps); the video refreshes after each section.")


def combination_problems(*, mode, has_end_image, cfg, rescale, negative_prompt, crf, teacache) -> list[tuple[str, str]]:
    """(level, text) for settings that cannot work together ("error") or do nothing / cost more ("note")."""
    out = []
    if has_end_image and mode != "original":
        out.append(("error", "End image: only the **original** mode supports an end frame. Choose mode "
                             "'original' or remove the end image."))
    try:
        cfg = float(cfg)
        rescale = float(rescale)
    except (TypeError, ValueError):
        return out
    if cfg == 1.0 and (negative_prompt or "").strip():
        out.append(("note", "The negative prompt is ignored while CFG is 1 (set CFG > 1 under Advanced)."))
    if cfg == 1.0 and rescale > 0:
        out.append(("note", "CFG rescale only acts when CFG > 1."))
    if cfg > 1.0:
        out.append(("note", "CFG > 1 runs the negative prompt too: every step costs about twice as much."))
    try:
        if int(crf) == 0:
            out.append(("note", "MP4 CRF 0 is lossless, and most browsers cannot play such files; 16 is the "
                                "default."))
    except (TypeError, ValueError):
        pass
    try:
        if float(teacache) > 0.15:
            out.append(("note", f"TeaCache {float(teacache):g} is fast but visibly lossy (hands, fingers); 0.1–0.15 "
                                "is the usual choice, 0 turns it off."))
    except (TypeError, ValueError):
        pass
    return out


def hints_markdown(plan: str, problems: list[tuple[str, str]]) -> str:
    lines = [f"ℹ {plan}"] if plan else []
    lines += [("⚠ " if level == "error" else "• ") + text for level, text in problems]
    return "\n\n".join(lines)


def preserved_hint(preset, cap_gb: float, preserved_gb, device_type: str, host_ram_gb: float | None = None,
                   weight_storage: str = "native") -> str:
    """What the preserved-memory slider means here, GPU and host side (memory.plan.describe_preserved), never
    raising."""
    from memory.plan import describe_preserved

    try:
        return describe_preserved(preset, float(cap_gb), float(preserved_gb), device_type, host_ram_gb,
                                  weight_storage)
    except Exception as e:  # the hint must never break the page
        log.warning("could not describe the memory plan: %s", e, exc_info=True)
        return f"(the memory plan could not be computed: {type(e).__name__})"
