"""Generation defaults (those of the original FramePack app) and the limits every request is checked against.

The controls' defaults and limits are declared in configs/controls.py (one row per control); `DEFAULTS` and
`LIMITS` give them by name (`DEFAULTS.seconds`, `LIMITS.seconds`), with the limits that are not a control's."""
from __future__ import annotations

from dataclasses import field, make_dataclass

from configs.controls import CONTROLS

# FramePack's 640 bucket table, (height, width).
BUCKETS_640: tuple[tuple[int, int], ...] = (
    (416, 960), (448, 864), (480, 832), (512, 768), (544, 704), (576, 672), (608, 640),
    (640, 608), (672, 576), (704, 544), (768, 512), (832, 480), (864, 448), (960, 416),
)

# Every control but the images, with its default (resolution: None = the preset's).
GenerationDefaults = make_dataclass(
    "GenerationDefaults", [(c.name, object, field(default=c.default)) for c in CONTROLS if not c.is_file],
    frozen=True)

# Each control's (lowest, highest), inclusive and the same everywhere (page, API, CLI, batch), and the limits on
# what a request brings in.
Limits = make_dataclass(
    "Limits", [(c.name, tuple, field(default=c.limits)) for c in CONTROLS if c.limits] + [
        ("image_side", tuple, field(default=(64, 8192))),
        ("image_pixels_max", int, field(default=8192 * 8192)),              # decompression-bomb guard
        ("upload_bytes_max", int, field(default=64 * 1024 * 1024)),
        ("prompt_chars_max", int, field(default=4000)),                     # longer prompts are cut, with a warning
    ], frozen=True)

DEFAULTS = GenerationDefaults()
LIMITS = Limits()
GenerationDefaults.__module__ = Limits.__module__ = __name__
