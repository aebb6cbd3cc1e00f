"""The LoRA picker: the LoRA folder's files in a dropdown, a strength, "Add" into the LoRAs box (the setting the
job, job.json, Reuse settings and the /video API's `loras` parameter use: `file:strength, ...`)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from configs.lora import LORA
from pipeline import lora
from common.errors import InputError


@dataclass
class LoraPicker:
    folder: Path
    file: gr.Dropdown
    strength: gr.Slider
    add: gr.Button
    clear: gr.Button
    refresh: gr.Button


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
    return LoraPicker(folder, file, strength, add, clear, refresh)


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


def wire(picker: LoraPicker, box: gr.Textbox, guard) -> None:
    """The picker's buttons (un-queued, so bounded by `guard`: ui/guard.py)."""
    hidden = dict(queue=False, show_progress="hidden")
    picker.add.click(guard.wrap(added, gr.skip), [picker.file, picker.strength, box], box, **hidden)
    picker.clear.click(guard.wrap(lambda: "", gr.skip), None, box, **hidden)

    def relist(current):
        files = lora.lora_files(picker.folder)
        return gr.update(choices=files, value=current if current in files else (files[0] if files else None))

    picker.refresh.click(guard.wrap(relist, gr.skip), picker.file, picker.file, **hidden)
