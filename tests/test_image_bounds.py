"""What an image costs the server before it is refused or used (pipeline/images.py): only PNG, JPEG and WebP are
opened (no other decoder runs), the sides are checked from the header before anything is decoded, and 16/32-bit
images are scaled to 8 bits without a float64 copy of the whole image, to the same bytes as before."""
from __future__ import annotations

import io
import tracemalloc

import numpy as np
import pytest
from PIL import BmpImagePlugin, Image, ImageFile, TiffImagePlugin

from common.errors import InputError
from pipeline import images


def _png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def test_only_png_jpeg_and_webp_are_opened(tmp_path, monkeypatch):
    opened = []
    for plugin in (BmpImagePlugin.BmpImageFile, TiffImagePlugin.TiffImageFile):
        original = plugin._open
        monkeypatch.setattr(plugin, "_open", lambda self, o=original: (opened.append(type(self).__name__), o(self)))
    picture = Image.fromarray(np.full((80, 96, 3), 120, np.uint8))
    for fmt in ("BMP", "TIFF", "GIF", "EPS", "ICO"):
        path = tmp_path / f"x.{fmt.lower()}"
        try:
            picture.save(path, format=fmt)
        except (OSError, KeyError):            # (EPS: Pillow writes it; an older build may not)
            continue
        with pytest.raises(InputError, match="not a PNG, JPEG or WebP image"):
            images.load_image(path)
    assert opened == []                                                   # no decoder of another format ran
    for fmt in ("PNG", "JPEG", "WEBP"):
        path = tmp_path / f"ok.{fmt.lower()}"
        picture.save(path, format=fmt)
        assert images.load_image(path).size == (96, 80)


def test_the_sides_are_checked_before_decoding(tmp_path, monkeypatch):
    tall = tmp_path / "tall.png"
    tall.write_bytes(_png(Image.new("L", (64, 1 << 20))))               # 64×1,048,576: 64 Mpixels to decode
    decoded = []
    original = ImageFile.ImageFile.load
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda self: (decoded.append(self.size), original(self))[1])
    with pytest.raises(InputError, match="at most 8192 pixels"):
        images.load_image(tall)
    assert decoded == []


def _old_scaling(img: Image.Image) -> np.ndarray:
    """The scaling as it was (a float64 copy of the whole image): the reference for the bytes."""
    a = np.asarray(img, dtype=np.float64)
    hi = 65535.0 if img.mode.startswith("I;16") or a.max() > 255 else 255.0
    if img.mode == "F" and a.max() <= 1.0:
        hi = 1.0
    return np.clip(a / hi * 255.0 + 0.5, 0, 255).astype(np.uint8)


def test_deep_images_are_scaled_in_bands_to_the_same_bytes():
    rng = np.random.default_rng(1)
    cases = [Image.fromarray(rng.integers(0, 65536, (700, 300), dtype=np.uint16), "I;16"),
             Image.fromarray(rng.integers(0, 70000, (600, 310), dtype=np.int32), "I"),
             Image.fromarray(rng.integers(0, 200, (600, 310), dtype=np.int32), "I"),
             Image.fromarray(rng.random((520, 330), dtype=np.float32), "F")]
    for img in cases:
        got = np.asarray(images._to_rgb(img))
        assert got.shape[2] == 3 and np.array_equal(got[..., 0], _old_scaling(img)), img.mode
    big = Image.fromarray(rng.integers(0, 65536, (2048, 2048), dtype=np.uint16), "I;16")
    tracemalloc.start()
    try:
        images._to_eight_bits(big)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    pixels = 2048 * 2048
    assert peak < 4 * pixels, f"{peak / pixels:.1f} bytes a pixel (a float64 copy is 8)"
