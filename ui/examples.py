"""Example images with matching prompts, drawn in code (no files to license, nothing downloaded): one click on the
page loads an image and its prompt. The drawings are simple on purpose; they show how the controls work."""
from __future__ import annotations

import math
from pathlib import Path

from PIL import Image, ImageDraw

from common.files import atomic_path

SIZE = (640, 480)


def _gradient(draw: ImageDraw.ImageDraw, top, bottom, y0: int, y1: int) -> None:
    """Rows y0..y1-1 shaded from colour `top` to `bottom`."""
    for y in range(y0, y1):
        t = (y - y0) / max(y1 - y0 - 1, 1)
        draw.line([(0, y), (SIZE[0], y)], fill=tuple(round(a + (b - a) * t) for a, b in zip(top, bottom)))


def _sky(draw: ImageDraw.ImageDraw, top, bottom, height: int) -> None:
    _gradient(draw, top, bottom, 0, height)


def red_balloon() -> Image.Image:
    img = Image.new("RGB", SIZE)
    d = ImageDraw.Draw(img)
    _sky(d, (90, 150, 230), (200, 225, 250), 330)
    d.rectangle([0, 330, SIZE[0], SIZE[1]], fill=(70, 150, 70))
    d.ellipse([90, 300, 420, 380], fill=(60, 135, 60))
    d.line([(330, 250), (335, 360)], fill=(60, 60, 60), width=2)
    d.ellipse([280, 120, 380, 250], fill=(210, 30, 40))
    d.ellipse([300, 140, 325, 175], fill=(240, 120, 120))
    return img


def lighthouse() -> Image.Image:
    img = Image.new("RGB", SIZE)
    d = ImageDraw.Draw(img)
    _sky(d, (40, 40, 90), (240, 150, 90), 300)
    for y in range(300, SIZE[1]):
        shade = 60 + 40 * math.sin(y / 6.0)
        d.line([(0, y), (SIZE[0], y)], fill=(30, 60, round(110 + shade / 3)))
    d.polygon([(380, 330), (470, 330), (450, 110), (400, 110)], fill=(235, 235, 225))
    for y in (150, 220, 290):
        d.rectangle([380, y, 470, y + 22], fill=(200, 40, 40))
    d.rectangle([395, 80, 455, 110], fill=(250, 230, 120))
    d.polygon([(390, 80), (460, 80), (425, 55)], fill=(60, 40, 40))
    d.polygon([(300, 340), (560, 340), (600, 380), (260, 380)], fill=(90, 80, 70))
    return img


def paper_boat() -> Image.Image:
    img = Image.new("RGB", SIZE)
    d = ImageDraw.Draw(img)
    _sky(d, (150, 200, 220), (180, 215, 230), 200)
    _gradient(d, (40, 110, 160), (70, 150, 190), 200, SIZE[1])                 # the water
    for i in range(6):
        y = 240 + 40 * i
        d.arc([-40 + 30 * i, y, 260 + 30 * i, y + 30], 200, 340, fill=(200, 230, 240), width=2)
    d.polygon([(220, 300), (440, 300), (400, 340), (260, 340)], fill=(245, 245, 240))
    d.polygon([(300, 300), (340, 200), (380, 300)], fill=(230, 230, 225))
    return img


EXAMPLES = (
    ("balloon.png", red_balloon, "The red balloon drifts slowly upwards and sways in a gentle breeze."),
    ("lighthouse.png", lighthouse, "Waves roll in at dusk while the lighthouse lamp glows, the camera slowly "
                                   "pushes in."),
    ("boat.png", paper_boat, "The paper boat bobs on small waves and drifts to the right."),
)


def write_examples(folder: Path) -> list[list[str]]:
    """Draw the example images into `folder` (once; existing files are kept); returns [image path, prompt] rows for
    gr.Examples."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, draw, prompt in EXAMPLES:
        path = folder / name
        if not path.is_file():
            with atomic_path(path, fsync=False) as tmp:
                draw().save(tmp, format="PNG")
        rows.append([str(path), prompt])
    return rows
