"""Saved settings: a job's settings under a name, as plain JSON files in a settings folder (shareable: copy one to
another machine's folder), for the page (save, load, rename, delete, the one the page opens with), the command line
(`--settings NAME`) and the API.

The app's and the command line's folder is `<outputs>/.settings` (`in_outputs`). A file `<folder>/<name>.json` holds {"name": ..., "settings": {control: value} for every control of
configs/controls.py but the files, "images": {"image": path, "end_image": path} (by reference: the files are not
copied)}. `<folder>/default.txt` names the settings the page opens with. Values are checked when loaded
(pipeline.request.setting_problems): a value this version refuses, or a name it does not know, is left out and
reported, so an old or hand-edited file still loads. Light: no torch.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from common.errors import InputError
from common.files import atomic_write_bytes
from configs.controls import CONTROLS
from pipeline.request import setting_problems

FIELD = "settings name"
FOLDER = ".settings"                   # in the outputs folder (hidden there, as .queue and .examples are)
DEFAULT_FILE = "default.txt"
MAX_BYTES = 256 << 10                  # one file: a few kB
MAX_FILES = 500
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9 _.()+-]{0,59}")
SETTINGS = tuple(c.name for c in CONTROLS if not c.is_file)
IMAGES = tuple(c.name for c in CONTROLS if c.kind == "image")


@dataclass
class Loaded:
    """Saved settings read back: the values that can be used, the images' references, and what was left out."""
    name: str
    settings: dict[str, Any] = field(default_factory=dict)
    images: dict[str, str] = field(default_factory=dict)
    left_out: list[str] = field(default_factory=list)


def check_name(name) -> str:
    """A name usable as a file name on every system. Raises InputError naming FIELD."""
    if not isinstance(name, str) or not _NAME.fullmatch(name.strip()) or name.strip().endswith("."):
        raise InputError(FIELD, "give a name of 1 to 60 letters, digits, spaces or _ . ( ) + -, starting with a "
                                "letter or digit")
    return name.strip()


class SettingsFolder:
    """The settings folder (created when something is saved)."""

    def __init__(self, folder):
        self.folder = Path(folder)

    def path(self, name: str) -> Path:
        return self.folder / f"{check_name(name)}.json"

    def names(self) -> list[str]:
        """The saved names, sorted (case-insensitively)."""
        if not self.folder.is_dir():
            return []
        found = [p.stem for p in self.folder.glob("*.json") if p.is_file() and _NAME.fullmatch(p.stem)]
        return sorted(found, key=str.lower)[:MAX_FILES]

    def _existing(self, name: str) -> Path:
        path = self.path(name)
        if not path.is_file():
            raise InputError(FIELD, f"no saved settings named {check_name(name)!r}; saved: "
                                    f"{', '.join(self.names()) or 'none'}")
        return path

    def save(self, name: str, values: Mapping[str, Any], *, replace: bool = True) -> Path:
        """Save every control's value of `values` (missing ones: the table's defaults) and the images' paths.
        Raises InputError for a bad name, a name taken (replace=False), or a value the request checks refuse."""
        path = self.path(name)
        if path.exists() and not replace:
            raise InputError(FIELD, f"{check_name(name)!r} is saved already; choose another name")
        if not path.exists() and len(self.names()) >= MAX_FILES:
            raise InputError(FIELD, f"{MAX_FILES} saved settings already; delete some first")
        settings = {c.name: values.get(c.name, c.default) for c in CONTROLS if not c.is_file}
        problems = setting_problems(settings)
        if problems:
            raise InputError(next(iter(problems)), next(iter(problems.values())))
        images = {k: str(values[k]) for k in IMAGES if isinstance(values.get(k), (str, Path)) and values[k]}
        record = {"name": check_name(name), "settings": settings, "images": images}
        self.folder.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, json.dumps(record, indent=2, ensure_ascii=False).encode("utf-8"))
        return path

    def load(self, name: str) -> Loaded:
        """The saved settings of `name`, checked value by value. Raises InputError for a missing or unreadable
        file."""
        path = self._existing(name)
        if path.stat().st_size > MAX_BYTES:
            raise InputError(FIELD, f"{path.name} is larger than {MAX_BYTES >> 10} kB: not saved settings")
        try:
            record = json.loads(path.read_text("utf-8"))
        except (OSError, ValueError, RecursionError):
            raise InputError(FIELD, f"{path.name} is not readable JSON; delete it or fix it") from None
        settings = record.get("settings") if isinstance(record, dict) else None
        if not isinstance(settings, dict):
            raise InputError(FIELD, f"{path.name} holds no \"settings\" object")
        out = Loaded(check_name(name))
        problems = setting_problems(settings)
        for key, value in settings.items():
            if key not in SETTINGS:
                out.left_out.append(f"{str(key)[:40]}: not a setting of this version")
            elif key in problems:
                out.left_out.append(f"{key}: {problems[key]}")
            else:
                out.settings[key] = value
        images = record.get("images") if isinstance(record.get("images"), dict) else {}
        out.images = {k: v for k, v in images.items() if k in IMAGES and isinstance(v, str) and v}
        return out

    def rename(self, name: str, new: str) -> None:
        source, target = self._existing(name), self.path(new)
        if target.exists() and target != source:
            raise InputError(FIELD, f"{check_name(new)!r} is saved already; choose another name")
        was_default = self.default() == check_name(name)
        try:
            record = json.loads(source.read_text("utf-8"))
        except (OSError, ValueError, RecursionError):
            raise InputError(FIELD, f"{source.name} is not readable JSON; delete it or fix it") from None
        if not isinstance(record, dict):
            raise InputError(FIELD, f"{source.name} holds no saved settings")
        record["name"] = check_name(new)
        atomic_write_bytes(target, json.dumps(record, indent=2, ensure_ascii=False).encode("utf-8"))
        if target != source:
            source.unlink()
        if was_default:
            self.set_default(new)

    def delete(self, name: str) -> None:
        was_default = self.default() == check_name(name)
        self._existing(name).unlink()
        if was_default:
            self.set_default(None)

    def default(self) -> str | None:
        """The name the page opens with, if it is still saved."""
        try:
            name = (self.folder / DEFAULT_FILE).read_text("utf-8").strip()
        except OSError:
            return None
        return name if _NAME.fullmatch(name) and (self.folder / f"{name}.json").is_file() else None

    def set_default(self, name: str | None) -> None:
        """Mark `name` as what the page opens with (None: the table's defaults)."""
        marker = self.folder / DEFAULT_FILE
        if name is None:
            marker.unlink(missing_ok=True)
            return
        self._existing(name)
        self.folder.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(marker, check_name(name).encode("utf-8"))


def in_outputs(outputs) -> SettingsFolder:
    """The settings folder of an outputs folder (the app's and the command line's)."""
    return SettingsFolder(Path(outputs) / FOLDER)
