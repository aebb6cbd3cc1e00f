"""Saved settings on the page and in the API (pipeline/saved_settings.py, the outputs folder's .settings/): save the
controls under a name (the images by reference: the uploads they are), load, rename, delete, and mark the settings
the page opens with. The API: /settings_list, /settings_save (a name and a JSON object of settings),
/settings_load (a name: its settings, and the names of its images), /settings_rename, /settings_delete,
/settings_default. One folder for the app (with several users, they share it)."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr

from common.errors import InputError
from jobs.doors import admitted
from pipeline.request import canonical
from pipeline.saved_settings import in_outputs
from ui import messages
from ui import settings as st

log = logging.getLogger(__name__)

ENDPOINTS = ("settings_list", "settings_save", "settings_load", "settings_rename", "settings_delete",
             "settings_default")


@dataclass
class SavedPanel:
    name: gr.Dropdown
    new_name: gr.Textbox
    save: gr.Button
    load: gr.Button
    rename: gr.Button
    delete: gr.Button
    default: gr.Button
    note: gr.Markdown


def place() -> SavedPanel:
    with gr.Accordion("Saved settings", open=False, elem_id="saved-settings"):
        with gr.Row():
            name = gr.Dropdown([], value=None, label="Saved settings", elem_id="saved-name", scale=2,
                               allow_custom_value=False)
            new_name = gr.Textbox("", label="Name (to save or rename)", elem_id="saved-new-name", scale=2)
        with gr.Row():
            save = gr.Button("Save", size="sm", elem_id="saved-save")
            load = gr.Button("Load", size="sm", elem_id="saved-load")
            rename = gr.Button("Rename", size="sm", elem_id="saved-rename")
            delete = gr.Button("Delete", size="sm", elem_id="saved-delete")
            default = gr.Button("Open the page with these", size="sm", elem_id="saved-default")
        note = gr.Markdown("_Every control of the page, saved by name (the images by reference)._",
                           elem_id="saved-note")
    return SavedPanel(name, new_name, save, load, rename, delete, default, note)


def _error(e: InputError) -> gr.Error:
    return gr.Error(messages.input_error(e), title="Saved settings", print_exception=False)


class SavedSettings:
    """The handlers (the page's and the API's) over the app's settings folder."""

    def __init__(self, outputs: Path, default_resolution: int):
        self.folder = in_outputs(outputs)
        self.default_resolution = default_resolution

    def _choices(self, value: str | None = None):
        names = self.folder.names()
        return gr.update(choices=names, value=value if value in names else None)

    # ---- the page ---------------------------------------------------------------------------------------------
    def save_page(self, selected, new_name, *values):
        """Save the page's controls under the new name (or the selected one's)."""
        name = (new_name or "").strip() or selected
        controls = dict(zip(st.CONTROLS, values))
        kept = {k: v for k, v in controls.items() if k not in st.IMAGES}
        skipped = []
        for image in ("image", "end_image"):
            try:
                path = st.client_file(controls.get(image), image)
            except InputError:
                path = None
                skipped.append(image)
            if path:
                kept[image] = path
        try:
            if kept.get("keyframes"):               # keyframe images: uploads only (jobs/doors.py)
                kept["keyframes"] = admitted({"keyframes": kept["keyframes"]}, st.UPLOADS)["keyframes"]
            self.folder.save(name or "", kept)
        except InputError as e:
            raise _error(e) from None
        note = f"Saved **{name}** ({len(kept)} settings)." + (
            f" Not saved: {', '.join(skipped)} (not an upload)." if skipped else "")
        return self._choices(name), "", note

    def load_page(self, name):
        """The controls from the settings `name` (missing ones and refused values: the table's defaults)."""
        try:
            loaded = self.folder.load(name or "")
        except InputError as e:
            raise _error(e) from None
        values = st.values_from_settings(loaded.settings, self.default_resolution)
        missing = []
        for image in st.IMAGES:
            path = loaded.images.get(image)
            try:
                values[image] = st.client_file(path, image) if path else None
            except InputError:                   # gone, or not an upload of this app: left empty, said
                values[image] = None
                missing.append(image)
        note = f"Loaded **{loaded.name}**." + "".join(f"\n- left out {messages.plain(line)}"
                                                       for line in loaded.left_out + [
                                                           f"{m}: the file is no longer here" for m in missing])
        return [values[name] for name in st.CONTROLS] + [note]

    def rename_page(self, name, new_name):
        try:
            self.folder.rename(name or "", new_name or "")
        except InputError as e:
            raise _error(e) from None
        return self._choices(new_name.strip()), "", f"Renamed **{name}** to **{new_name.strip()}**."

    def delete_page(self, name):
        try:
            self.folder.delete(name or "")
        except InputError as e:
            raise _error(e) from None
        return self._choices(), f"Deleted **{name}**."

    def default_page(self, name):
        try:
            self.folder.set_default(name or None)
        except InputError as e:
            raise _error(e) from None
        return (f"The page opens with **{name}**." if name else
                "The page opens with the default settings.")

    def opened(self):
        """When the page opens: the list, and the controls from the default settings (if one is marked)."""
        name = self.folder.default()
        if name is None:
            return [gr.skip() for _ in st.CONTROLS] + [self._choices(), gr.skip()]
        try:
            values = self.load_page(name)
        except gr.Error:
            log.warning("the default saved settings %r cannot be loaded", name)
            return [gr.skip() for _ in st.CONTROLS] + [self._choices(), gr.skip()]
        return values[:-1] + [self._choices(name), values[-1]]

    # ---- the API ----------------------------------------------------------------------------------------------
    def api_list(self) -> dict:
        """{"names": [...], "default": name or null}"""
        return {"names": self.folder.names(), "default": self.folder.default()}

    def api_save(self, name: str, settings: Any) -> dict:
        """Save a JSON object of settings (control names; missing ones: the defaults) under `name`; images are not
        taken here (use the page)."""
        if not isinstance(settings, dict):
            raise gr.Error("settings: give a JSON object of settings by name, e.g. {\"seed\": 1}",
                           print_exception=False)
        try:
            values = {k: v for k, v in canonical(settings).items() if k not in st.IMAGES}    # (aliases too)
            named = {k: values[k] for k in ("keyframes", "loras") if values.get(k)}
            values.update(admitted(named, st.UPLOADS))      # the one door check: uploads, LoRA names
            self.folder.save(name, values)
        except InputError as e:
            raise _error(e) from None
        return self.api_list()

    def api_load(self, name: str) -> dict:
        """{"settings": {...}, "images": {control: file name}, "left_out": [...]}"""
        try:
            loaded = self.folder.load(name)
        except InputError as e:
            raise _error(e) from None
        return {"settings": loaded.settings, "images": {k: Path(v).name for k, v in loaded.images.items()},
                "left_out": loaded.left_out}

    def api_rename(self, name: str, new_name: str) -> dict:
        try:
            self.folder.rename(name, new_name)
        except InputError as e:
            raise _error(e) from None
        return self.api_list()

    def api_delete(self, name: str) -> dict:
        try:
            self.folder.delete(name)
        except InputError as e:
            raise _error(e) from None
        return self.api_list()

    def api_default(self, name: str | None) -> dict:
        try:
            self.folder.set_default(name or None)
        except InputError as e:
            raise _error(e) from None
        return self.api_list()


def wire(app: gr.Blocks, panel: SavedPanel, handlers: SavedSettings, controls: list) -> None:
    hidden = dict(show_progress="hidden")
    panel.save.click(handlers.save_page, [panel.name, panel.new_name, *controls],
                     [panel.name, panel.new_name, panel.note], **hidden)
    panel.load.click(handlers.load_page, panel.name, [*controls, panel.note], **hidden)
    panel.rename.click(handlers.rename_page, [panel.name, panel.new_name], [panel.name, panel.new_name, panel.note],
                       **hidden)
    panel.delete.click(handlers.delete_page, panel.name, [panel.name, panel.note], **hidden)
    panel.default.click(handlers.default_page, panel.name, panel.note, **hidden)
    app.load(handlers.opened, None, [*controls, panel.name, panel.note], **hidden)
    # the API (documented endpoints; the page's handlers above stay undocumented)
    name, new_name = gr.Textbox(visible=False), gr.Textbox(visible=False)
    settings, result = gr.JSON(visible=False), gr.JSON(visible=False)
    trigger = gr.Button(visible=False)
    trigger.click(handlers.api_list, None, result, api_name="settings_list", **hidden)
    trigger.click(handlers.api_save, [name, settings], result, api_name="settings_save", **hidden)
    trigger.click(handlers.api_load, name, result, api_name="settings_load", **hidden)
    trigger.click(handlers.api_rename, [name, new_name], result, api_name="settings_rename", **hidden)
    trigger.click(handlers.api_delete, name, result, api_name="settings_delete", **hidden)
    trigger.click(handlers.api_default, name, result, api_name="settings_default", **hidden)
