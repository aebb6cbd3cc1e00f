"""Keyframes on the page (pipeline/keyframes.py): rows of image + time + strength under "Keyframes (original
mode)", which write the `keyframes` setting's box (the job's, job.json's, Reuse settings' and the /video API's
`keyframes` parameter: `[1.5s] file [3s, 0.5] file`). The box may be typed in too; the rows rewrite it whenever one
of them changes. The images are uploads (jobs/doors.py `admitted` checks them when the job is added)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import gradio as gr

from pipeline import keyframes
from ui import settings as st

ROWS = 4                      # rows on the page (the setting takes up to keyframes.MAX_KEYFRAMES, typed in the box)


@dataclass
class KeyframeRows:
    images: list
    times: list
    strengths: list


def place(widgets) -> KeyframeRows:
    """The accordion with the rows and the `keyframes` box of the table (inside gr.Blocks)."""
    images, times, strengths = [], [], []
    with gr.Accordion("Keyframes (original mode)", open=False, elem_id="keyframes-group"):
        gr.Markdown("An image the video passes at a time (seconds): each section from that time on is conditioned "
                    "on it (strength 1 = fully). The start image is the frame at 0 s, the end image the last.",
                    elem_id="keyframes-note")
        for i in range(ROWS):
            with gr.Row(elem_id=f"keyframe-row-{i}"):
                images.append(gr.Image(type="filepath", label=f"Keyframe {i + 1}", height=120, scale=2,
                                       elem_id=f"keyframe-image-{i}", sources=["upload", "clipboard"]))
                with gr.Column(scale=1):
                    times.append(gr.Number(None, label="Time (s)", minimum=0, elem_id=f"keyframe-time-{i}"))
                    strengths.append(gr.Slider(*keyframes.STRENGTH_RANGE, value=1.0, step=0.05, label="Strength",
                                               elem_id=f"keyframe-strength-{i}"))
        widgets.place("keyframes", lines=1, placeholder="none")
    return KeyframeRows(images, times, strengths)


def rows_spec(*values) -> str:
    """The setting from the rows' values (image, time, strength for each row): the rows with an image and a time
    (a time that is not a number is left out: the box then says what the job will use)."""
    items = []
    for i in range(ROWS):
        image, time, strength = values[i], values[ROWS + i], values[2 * ROWS + i]
        path = st.upload_path(image)
        if not path or isinstance(time, bool) or not isinstance(time, (int, float)) or not math.isfinite(time):
            continue
        if isinstance(strength, bool) or not isinstance(strength, (int, float)):
            strength = 1.0
        items.append(keyframes.Keyframe(float(time), path, float(strength)))
    return keyframes.spec(sorted(items, key=lambda k: k.time))


def _from_rows(i0, i1, i2, i3, t0, t1, t2, t3, s0, s1, s2, s3) -> str:
    """`rows_spec` with one parameter per value (ui/guard.py passes a session after them)."""
    return rows_spec(i0, i1, i2, i3, t0, t1, t2, t3, s0, s1, s2, s3)


def wire(rows: KeyframeRows, box: gr.Textbox, guard) -> None:
    """Every row's change rewrites the box (un-queued, so bounded by `guard`: ui/guard.py). One event for all the
    rows' changes, each call after the last one's answer, the last with the page's values then (`always_last`): with
    an event per row, a time's answer could come back after the strength's typed next and leave the box (and the job
    Start sent) at strength 1."""
    assert ROWS == 4, "_from_rows takes the values of 4 rows"
    inputs = rows.images + rows.times + rows.strengths
    gr.on([component.change for component in inputs], guard.wrap(_from_rows, gr.skip), inputs, box, queue=False,
          show_progress="hidden", trigger_mode="always_last")
