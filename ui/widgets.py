"""The page's controls, made from the table of controls (configs/controls.py): each row's widget kind, label,
range, step, default and note become a Gradio component. The layout says where each goes; a row it does not place
goes under "Advanced" (or above it), so a new row of the table shows on the page without touching the layout."""
from __future__ import annotations

from typing import Any

import gradio as gr

from configs.controls import Control


def choices_of(c: Control) -> list:
    """The widget's (text, value) choices: the row's labels where it has them, else the value itself."""
    labels = dict(c.choice_labels)
    return [(labels.get(v, f"{v:g}" if isinstance(v, float) else str(v)), v) for v in c.choices]


def make_widget(c: Control, value: Any, limits: tuple | None = None, **extra) -> gr.components.Component:
    """The Gradio component of one control (call inside the gr.Blocks being built). `limits`: the range when it
    is not the row's (the preserved-memory slider stops at the card's memory); `extra`: the layout's own
    arguments (placeholder, height, scale ...)."""
    common = dict(label=c.widget_label or c.label, elem_id=c.element_id)
    if c.info:
        common["info"] = c.info
    common.update(extra)
    lo, hi = limits or c.widget_range() or (None, None)
    if c.widget == "image":
        common.pop("info", None)
        return gr.Image(**{"type": "filepath", "image_mode": None, "sources": ["upload", "clipboard"],
                           "height": 300, **common})
    if c.widget == "video":
        common.pop("info", None)
        return gr.Video(**{"sources": ["upload"], "height": 240, "format": None, **common})
    if c.widget == "textbox":
        return gr.Textbox(value=value, **common)
    if c.widget == "number":
        return gr.Number(value=value, precision=0 if c.kind == "int" else None, minimum=lo, maximum=hi, **common)
    if c.widget == "slider":
        step = c.step or (1 if c.kind == "int" else 0.01)
        return gr.Slider(lo, hi, value=value, step=step, **common)
    if c.widget == "radio":
        return gr.Radio(choices_of(c), value=value, **common)
    if c.widget == "dropdown":
        return gr.Dropdown(choices_of(c), value=value, **common)
    raise ValueError(f"control {c.name}: unknown widget {c.widget!r}")


class Widgets:
    """The page's controls, made as the layout places them. `place(name)` makes one where the layout stands;
    `place_rest(advanced)` makes those of the table not placed yet (a new row of the table)."""

    def __init__(self, table: tuple[Control, ...], values: dict[str, Any], limits: dict[str, tuple]):
        self.rows = {c.name: c for c in table if c.widget}
        self.values, self.limits = values, limits
        self.made: dict[str, gr.components.Component] = {}

    def place(self, name: str, **extra) -> gr.components.Component:
        c = self.rows[name]
        widget = make_widget(c, self.values.get(name), self.limits.get(name), **extra)
        self.made[name] = widget
        return widget

    def place_rest(self, advanced: bool, keep: tuple[str, ...] = ()) -> None:
        """The controls of the group not placed yet (but those in `keep`: the caller places them after)."""
        for name, c in self.rows.items():
            if name not in self.made and c.advanced == advanced and name not in keep:
                self.place(name)

    def in_order(self) -> dict[str, gr.components.Component]:
        """Every control by name, in the table's order (the handlers' and the /video API's)."""
        missing = set(self.rows) - set(self.made)
        if missing:
            raise RuntimeError(f"controls not placed on the page: {', '.join(sorted(missing))}")
        return {name: self.made[name] for name in self.rows}
