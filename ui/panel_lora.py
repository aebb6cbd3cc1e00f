"""The LoRA picker: the LoRA folder's files in a dropdown, a strength, "Add" into the LoRAs box (the setting the
job, job.json, Reuse settings and the /video API's `loras` parameter use: `file:strength, ...`). Under it, one
strength slider per LoRA in the box (as FramePack-Studio has; moving one rewrites the box) and the box checked
against the transformer's layers as soon as it changes (a LoRA whose keys do not fit is said then, not when the job
starts)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import gradio as gr

from common.errors import InputError
from configs.lora import LORA
from pipeline import lora
from ui import messages

SLOTS = LORA.max_count   # strength sliders: one for every LoRA the box may hold (hidden beyond the box's LoRAs)


@dataclass
class LoraPicker:
    folder: Path
    file: gr.Dropdown
    strength: gr.Slider
    add: gr.Button
    clear: gr.Button
    refresh: gr.Button
    sliders: list = field(default_factory=list)     # SLOTS strength sliders, labelled by their LoRA
    note: gr.Markdown = None       # the box checked: what each LoRA changes, or why it cannot be used


def place(widgets, folder) -> LoraPicker:
    """The LoRAs box of the table (configs/controls.py "loras") and the picker under it (inside gr.Blocks)."""
    folder = Path(folder) if folder else Path(LORA.folder)
    files = lora.lora_files(folder)
    with gr.Accordion("LoRAs", open=bool(files), elem_id="loras-panel"):
        widgets.place("loras", lines=1, placeholder="none")
        with gr.Row():
            file = gr.Dropdown(files, value=files[0] if files else None, label=f"LoRA file (in {folder})",
                               elem_id="lora-file", scale=3, allow_custom_value=False)
            strength = gr.Slider(LORA.strength_min, LORA.strength_max, value=1.0, step=0.05, label="Strength",
                                 elem_id="lora-strength", scale=2)
        with gr.Row():
            add = gr.Button("Add LoRA", size="sm", elem_id="lora-add")
            clear = gr.Button("No LoRAs", size="sm", elem_id="lora-clear")
            refresh = gr.Button("Refresh list", size="sm", elem_id="lora-refresh")
        sliders = [gr.Slider(LORA.strength_min, LORA.strength_max, value=1.0, step=0.05, visible=False,
                             label=f"LoRA {i + 1}", elem_id=f"lora-slot-{i}") for i in range(SLOTS)]
        note = gr.Markdown("", elem_id="lora-note")
    return LoraPicker(folder, file, strength, add, clear, refresh, sliders, note)


def slots(text) -> list:
    """The sliders for the box's LoRAs: label and strength for each, hidden beyond them (a box that does not parse
    hides them: the note says why)."""
    try:
        choices = lora.parse_spec(text or "") if isinstance(text, str) else ()
    except InputError:
        choices = ()
    out = []
    for i in range(SLOTS):
        if i < len(choices):
            c = choices[i]
            out.append(gr.update(visible=True, label=f"{c.name} strength", value=c.strength))
        else:
            out.append(gr.update(visible=False))
    return out


def moved(index: int, strength, text):
    """The box with the `index`-th LoRA's strength set to `strength` (a slider moved)."""
    if not isinstance(text, str) or isinstance(strength, bool) or not isinstance(strength, (int, float)) \
            or not LORA.strength_min <= strength <= LORA.strength_max:
        return gr.skip()
    try:
        choices = list(lora.parse_spec(text))
    except InputError:
        return gr.skip()
    if index >= len(choices):
        return gr.skip()
    choices[index] = lora.LoraChoice(choices[index].name, round(float(strength), 4))
    return lora.format_spec(choices)


def checked(text, mode, check, folder=None) -> str:
    """The note under the sliders: the box checked now by `check(spec, mode)` (the pre-flight's LoRA check:
    reads the files, matches their keys to the transformer's layers; raises InputError). Only bare names of the
    LoRA folder are looked at: any other path is refused before anything is read (pipeline/lora.py `names_only`),
    with the same words whether it exists or not, so the box says nothing about the server's other files; a name
    that is not in the folder's list (`folder`) is said so without reading anything."""
    if not isinstance(text, str) or not text.strip():
        return ""
    try:
        lora.names_only(text)
        if folder is not None:
            lora.listed_only(text, folder)
        check(text, mode if isinstance(mode, str) else "original")
    except InputError as e:
        return f"⚠ {messages.input_error(e)}"
    return f"✓ {len(lora.parse_spec(text))} LoRA(s) fit the transformer's layers."


def added(name, strength, text) -> str:
    """The LoRAs box with `name` at `strength` (replacing its earlier strength); a box that does not parse is
    left for the job's check to explain, with the new LoRA appended. Bounded: a name that is not a file of the
    folder's list, or a box over the setting's length limit, leaves the box as it is."""
    if not isinstance(text, str) or len(text) > LORA.max_text_chars:
        return gr.skip()
    if not name or not isinstance(name, str) or isinstance(strength, bool) or not isinstance(strength, (int, float)) \
            or not LORA.strength_min <= strength <= LORA.strength_max:
        return text or ""
    item = lora.LoraChoice(str(name), float(strength)).spec()
    try:
        choices = [c for c in lora.parse_spec(text or "") if c.name != name]
    except InputError:
        return f"{text}, {item}" if text else item
    return lora.format_spec([*choices, lora.LoraChoice(str(name), round(float(strength), 4))])


def wire(picker: LoraPicker, box: gr.Textbox, guard, check=None, mode=None) -> None:
    """The picker's buttons and sliders (un-queued, so bounded by `guard`: ui/guard.py); with `check(spec, mode)`
    (and the mode control) the box is checked whenever it changes."""
    hidden = dict(queue=False, show_progress="hidden")
    box.change(guard.wrap(slots, lambda *a: [gr.skip()] * SLOTS), box, picker.sliders, **hidden)
    for i, slider in enumerate(picker.sliders):        # user moves only (.input): the box's own updates do not loop
        slider.input(guard.wrap(lambda v, t, i=i: moved(i, v, t), gr.skip), [slider, box], box, **hidden)
    if check is not None and mode is not None:
        box.change(lambda text, m: checked(text, m, check, picker.folder), [box, mode], picker.note,
                   show_progress="hidden",
                   concurrency_limit=1, concurrency_id="lora-check")
    picker.add.click(guard.wrap(added, gr.skip), [picker.file, picker.strength, box], box, **hidden)
    picker.clear.click(guard.wrap(lambda: "", gr.skip), None, box, **hidden)

    def relist(current):
        files = lora.lora_files(picker.folder)
        return gr.update(choices=files, value=current if current in files else (files[0] if files else None))

    picker.refresh.click(guard.wrap(relist, gr.skip), picker.file, picker.file, **hidden)
