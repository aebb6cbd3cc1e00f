"""Saved settings (pipeline/saved_settings.py): every control of the table round-trips through a saved file, by
name; rename, delete and the page's default; a value this version refuses is left out and said; the command line's
--settings NAME, its own options winning. Fast: no models."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.errors import InputError
from configs.controls import CONTROLS
from pipeline.saved_settings import SettingsFolder, in_outputs
from tests.conftest import make_image


def _changed() -> dict:
    """A value other than the default for every control that is not a file (each one the request checks accept)."""
    out = {}
    for c in CONTROLS:
        if c.is_file:
            continue
        if c.kind == "choice":
            out[c.name] = next(v for v in c.choices if v != c.default)
        elif c.kind == "text":
            out[c.name] = {"prompt": "[0s: a boat] [2s: a storm]", "keyframes": "",
                           "loras": "style.safetensors:0.5"}.get(c.name, f"{c.name} text")
        elif c.is_number:
            lo, hi = c.limits
            if c.choices:
                value = next(v for v in c.choices if v != c.default)
            elif c.multiple_of:
                value = c.multiple_of * 4 if lo <= c.multiple_of * 4 <= hi else lo
            else:
                value = lo + 1 if c.kind == "int" and lo + 1 != c.default else (lo + hi) / 2
            out[c.name] = int(value) if c.kind == "int" else float(value)
    out.update(magcache=0.0, teacache=0.1, width=0, height=0, mode="original", seconds=5.0, latent_window=9, fps=30)
    return out


def test_every_control_round_trips(tmp_path):
    folder = SettingsFolder(tmp_path / "settings")
    values = {**_changed(), "image": str(tmp_path / "start.png"), "end_image": str(tmp_path / "end.png")}
    folder.save("storm at sea", values)
    loaded = folder.load("storm at sea")
    assert loaded.left_out == []
    assert loaded.settings == {k: v for k, v in values.items() if k not in ("image", "end_image")}
    assert {c.name for c in CONTROLS if not c.is_file} == set(loaded.settings)            # every control
    assert loaded.images == {"image": str(tmp_path / "start.png"), "end_image": str(tmp_path / "end.png")}
    record = json.loads((tmp_path / "settings" / "storm at sea.json").read_text())       # plain JSON
    assert record["name"] == "storm at sea" and record["settings"]["prompt"] == values["prompt"]


def test_names_rename_delete_and_the_default(tmp_path):
    folder = SettingsFolder(tmp_path / "s")
    assert folder.names() == [] and folder.default() is None
    folder.save("b", {"seed": 1})
    folder.save("A", {"seed": 2})
    assert folder.names() == ["A", "b"]
    folder.set_default("b")
    assert folder.default() == "b"
    folder.rename("b", "c")
    assert folder.names() == ["A", "c"] and folder.default() == "c" and folder.load("c").settings["seed"] == 1
    with pytest.raises(InputError, match="is saved already"):
        folder.rename("c", "A")
    folder.delete("c")
    assert folder.names() == ["A"] and folder.default() is None
    for bad in ("", "../x", ".hidden", "a/b", "x" * 61):
        with pytest.raises(InputError) as e:
            folder.save(bad, {})
        assert e.value.field == "settings name"
    with pytest.raises(InputError, match="no saved settings named 'nope'"):
        folder.load("nope")
    with pytest.raises(InputError) as e:
        folder.save("bad", {"steps": 10**9})
    assert e.value.field == "steps"


def test_an_old_or_hand_edited_file_loads_what_it_can(tmp_path):
    folder = SettingsFolder(tmp_path)
    (tmp_path / "old.json").write_text(json.dumps({"settings": {"seed": 5, "steps": -3, "wobble": 1}}))
    loaded = folder.load("old")
    assert loaded.settings == {"seed": 5}
    assert any(line.startswith("steps:") for line in loaded.left_out)
    assert "wobble: not a setting of this version" in loaded.left_out


def test_the_command_line_takes_saved_settings_its_options_winning(tmp_path):
    from cli.commands import build_parser, given_controls, request_from_args

    make_image(64, 64).save(tmp_path / "start.png")
    folder = in_outputs(tmp_path / "outputs")
    folder.save("calm", {"prompt": "a calm lake", "seed": 77, "steps": 9, "fps": 24, "image": str(tmp_path / "start.png")})
    argv = ["generate", "--settings", "calm", "--steps", "4", "--out", str(tmp_path / "outputs")]
    args = build_parser().parse_args(argv)
    request = request_from_args(args, folder.load(args.saved_settings), given_controls(argv))
    assert (request.prompt, request.seed, request.steps, request.fps) == ("a calm lake", 77, 4, 24)
    assert str(request.image) == str(tmp_path / "start.png")
    from cli.commands import main

    assert main(["generate", "--settings", "missing", "--out", str(tmp_path / "outputs"), "--preset", "tiny"]) == 2


def test_the_pages_handlers_round_trip_every_control(tmp_path):
    """Save from the page's controls (ui/panel_saved.py) and Load: every control comes back as it was, the start
    image (an upload) by reference; a path that is not an upload is not saved."""
    from tests.conftest import uploaded
    from ui import settings as st
    from ui.panel_saved import SavedSettings

    make_image(64, 64).save(tmp_path / "start.png")
    start = uploaded(tmp_path / "start.png")
    values = {**_changed(), "image": start, "end_image": None, "input_video": None}
    handlers = SavedSettings(tmp_path / "outputs", 640)
    _, _, note = handlers.save_page(None, "every control", *[values.get(n) for n in st.CONTROLS])
    assert "Saved **every control**" in note
    out = handlers.load_page("every control")
    loaded = dict(zip(st.CONTROLS, out))
    for name in st.CONTROLS:
        assert loaded[name] == values.get(name), name
    _, _, note = handlers.save_page(None, "server path", *[{**values, "image": str(tmp_path / "start.png")}.get(n)
                                                           for n in st.CONTROLS])
    assert "Not saved: image (not an upload)" in note
    assert handlers.api_load("every control")["images"] == {"image": Path(start).name}      # no server path
