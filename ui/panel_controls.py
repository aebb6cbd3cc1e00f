"""The controls' live side: explanations next to them (sections, combinations, expected time), the memory plan
under the preserved-memory slider, the token count under the prompt, uploads checked on arrival, the random seed."""
from __future__ import annotations

import inspect
from typing import Callable

import gradio as gr

from configs import DEFAULTS
from pipeline import sections
from pipeline.request import Request
from ui import hints
from ui import settings as st
from ui.context import AppContext, preserved_text
from ui.uploads import check_upload
from ui.view import format_seconds

SCROLL_LOG_JS = "() => { const t = document.querySelector('#log textarea'); if (t) t.scrollTop = t.scrollHeight; }"
LONG_JOB_SECTIONS = 20          # more sections than this: Start asks for a confirmation, with the expected time
HIDDEN = dict(queue=False, show_progress="hidden")
RETRY_S = 2.0           # a live display whose last call was refused for want of a slot asks again this often


def live_display(guard, fn: Callable, inputs: list, output, triggers: list, *, on_load=None) -> None:
    """`fn`'s answer shown in `output` whenever one of `triggers` changes (and when the page loads, `on_load`: the
    app), through `guard` (latest_wins: ui/guard.py), so the display ends showing the values the page holds:

    - A call the guard refuses after its wait for a slot leaves the display as it was and turns on a timer of the
      tab that asks again every RETRY_S until a call is answered (a second tab's hints stayed at the plan before its
      seconds changed once the 5 s wait for a slot ran out on a busy machine: issue 44).
    - Every answer of a change turns that timer on too, and the timer's own answer turns it off: one more call
      RETRY_S after the last change, with the page's values then. The guard runs one call of a tab at a time, but
      the answers travel back on separate connections, so an older answer (the page load's default 5 s) can arrive
      after a newer one (9.6 s) and stay shown; the CI saw that ("never said 8 sections" for 120 s). The timer's
      call is sent after those answers arrived, so its answer is the last. The tick and the changes call one
      guarded handler (one call of a tab at a time, the newest values answered), told which call it is by their
      entry (`confirming`); the page sends the same values as before."""
    retry = gr.Timer(RETRY_S, active=False)
    params = list(inspect.signature(fn).parameters.values())
    flag = inspect.Parameter("confirming", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=False)

    def answered(*args):
        *values, confirming = args
        return fn(*values), gr.Timer(active=not confirming)

    answered.__name__ = getattr(fn, "__name__", "live_display")
    answered.__doc__ = fn.__doc__
    setattr(answered, "__signature__", inspect.Signature([*params, flag]))
    call = guard.wrap(answered, lambda: (gr.skip(), gr.Timer(active=True)), latest_wins=True)

    def entry(confirming: bool) -> Callable:
        """`call` for one kind of event: the inputs and the request Gradio passes (the request after fn's
        parameters), `confirming` added between."""
        def handler(*args):
            return call(*args[:len(params)], confirming, *args[len(params):])

        handler.__name__ = answered.__name__
        setattr(handler, "__signature__", inspect.Signature(
            [*params, inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None,
                                        annotation=gr.Request)]))
        setattr(handler, "guarded", call)          # (for tests: both kinds of event reach this one)
        return handler

    changed, ticked = entry(False), entry(True)
    for component in triggers:
        component.change(changed, inputs, [output, retry], preprocess=False, **HIDDEN)
    if on_load is not None:
        on_load.load(changed, inputs, [output, retry], preprocess=False, **HIDDEN)
    retry.tick(ticked, inputs, [output, retry], preprocess=False, **HIDDEN)


def expected_time(ctx: AppContext, seconds, window, mode, steps, resolution=None, width=0, height=0) -> str:
    """'expected time about 3 min (at the speed of this app's last job)', or '' when nothing can be said; at the
    size of the resolution / custom size controls (the learned speed scales with it: jobs/line.py)."""

    s, w, n = hints.number(seconds), hints.number(window), hints.number(steps)
    if s is None or w is None or n is None or not isinstance(mode, str) or w != int(w) or n != int(n):
        return ""
    r, cw, ch = hints.number(resolution), hints.number(width), hints.number(height)
    size = {"resolution": int(r)} if r is not None and 64 <= r <= 4096 else {}
    if cw is not None and ch is not None and 0 < cw <= 4096 and 0 < ch <= 4096:
        size.update(width=int(cw), height=int(ch))
    try:
        expected = ctx.sessions.expected_seconds(Request(image=None, seconds=s, latent_window=int(w), mode=mode,
                                                         steps=int(n), **size))
    except (TypeError, ValueError, OverflowError):
        return ""
    if expected is None:
        return ""
    return f"expected time about {format_seconds(expected)} (at the speed of this app's last job)"


def section_count(seconds, window, mode) -> int | None:
    s, w = hints.number(seconds), hints.number(window)
    if s is None or w is None:
        return None
    try:
        return sections.make_plan(mode if isinstance(mode, str) else "", s, w, DEFAULTS.fps).count
    except ValueError:
        return None


def long_job_note(ctx: AppContext, seconds, window, mode, steps, resolution=None, width=0, height=0) -> str:
    count = section_count(seconds, window, mode)
    expected = expected_time(ctx, seconds, window, mode, steps, resolution, width, height)
    if count is None or count <= LONG_JOB_SECTIONS:
        return f"ℹ {expected[0].upper()}{expected[1:]}." if expected else ""
    when = expected or "expected time not known yet (no job has been timed since the app started)"
    return f"⚠ **Long job: {count} sections**, {when}. Start asks you to confirm."


def extension_note(mode, has_video: bool, has_job: bool, has_end_image: bool) -> str:
    """Which way an extension goes (pipeline/extend.py), shown under the extension options; '' when nothing is
    extended."""
    if not (has_video or has_job):
        return ""
    if mode == "f1":
        end = " F1 has no end frame: remove the end image, or choose the original mode." if has_end_image else ""
        return f"ℹ F1: the new part continues after the last frame.{end}"
    if has_job:
        return ("⚠ A job to extend continues from its saved latents in F1 mode only: choose F1, or extend its "
                "final video (Video to extend) in the original mode.")
    if has_end_image:
        return "ℹ Original mode with an end image: the new part goes after the video and ends at the end image."
    return ("ℹ Original mode: the new part goes before the video (the result ends with it). Add an end image to "
            "extend after it toward that frame, or choose F1 to continue it.")


def wire(app: gr.Blocks, ctx: AppContext) -> None:
    ui, live, quick = ctx.ui, ctx.live, ctx.quick
    hint_inputs = [ui.mode, ui.end_image, ui.seconds, ui.latent_window, ui.cfg, ui.rescale, ui.negative_prompt,
                   ui.crf, ui.teacache, ui.steps, ui.prompt, ui.prompt_blend, ui.magcache, ui.resolution, ui.width,
                   ui.height]

    def show_hints(mode, end_image, seconds, window, cfg, rescale, negative, crf, teacache, steps, prompt, blend,
                   magcache, resolution=None, width=0, height=0):
        problems = hints.combination_problems(
            mode=mode, has_end_image=st.upload_path(end_image) is not None, cfg=cfg, rescale=rescale,
            negative_prompt=negative, crf=crf, teacache=teacache, magcache=magcache)
        text = hints.hints_markdown(hints.plan_hint(seconds, window, mode, DEFAULTS.fps), problems)
        note = long_job_note(ctx, seconds, window, mode, steps, resolution, width, height)
        timed = hints.timeline_hint(prompt, seconds, window, mode, blend, DEFAULTS.fps)
        return "\n\n".join(t for t in (text, timed, note) if t)

    live_display(quick, show_hints, hint_inputs, ui.hints, hint_inputs, on_load=app)

    if ui.extend_note is not None and "input_video" in ui.widgets and "source_job" in ui.widgets:
        note_inputs = [ui.mode, ui.input_video, ui.source_job, ui.end_image]

        def show_extension(mode, video, job, end_image):
            return extension_note(mode, st.upload_path(video) is not None, bool(str(job or "").strip()),
                                  st.upload_path(end_image) is not None)

        live_display(quick, show_extension, note_inputs, ui.extend_note, note_inputs)

    def memory_plan(preserved_gb, resolution, width, height, window, image):
        return preserved_text(ctx.preset, ctx.config, ctx.device, preserved_gb, ctx.preserved_max_gb, resolution,
                              width, height, window, image)

    plan_inputs = [ui.preserved_gb, ui.resolution, ui.width, ui.height, ui.latent_window, ui.image]
    live_display(live, memory_plan, plan_inputs, ui.preserved_info, plan_inputs)   # the size's cost too (ui/memory_plan.py)

    def token_count(prompt):
        return ctx.tokens.markdown(prompt)

    live_display(live, token_count, [ui.prompt], ui.prompt_tokens, [ui.prompt], on_load=app)
    ui.randomize.click(quick.wrap(st.random_seed, gr.skip), None, ui.seed, **HIDDEN)
    ui.log.change(None, None, None, js=SCROLL_LOG_JS, show_progress="hidden")   # newest line in view

    for control, box in (("image", ui.image), ("end_image", ui.end_image)):
        box.upload(upload_checker(control, ctx.keeper), box, [box, ui.status], preprocess=False, concurrency_limit=2,
                   concurrency_id="uploads", show_progress="hidden")


def upload_checker(control: str, keeper=None):
    def check_image(value):
        if keeper is not None:
            keeper.worked()                 # a decoded image's memory goes back to the OS after a burst
        kept, message = check_upload(value, control)
        if message is None:
            return gr.skip(), ""
        gr.Warning(message, title="Not a usable image")
        return None, f"⚠ {message}"

    return check_image
