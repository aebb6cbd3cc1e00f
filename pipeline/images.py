"""Input images: safe loading, mode conversion, bucketing, resize + center crop, tensors.

Every problem a user can cause raises InputError naming the field, before any model is loaded.
"""
from __future__ import annotations

import io
import logging
import os
import warnings
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from common.errors import InputError
from common.units import MIB
from configs.generation import LIMITS
from pipeline.buckets import bucket_table

log = logging.getLogger(__name__)

ImageInput = "str | os.PathLike | Image.Image | np.ndarray"


def buckets_for(resolution: int) -> list[tuple[int, int]]:
    """The bucket table for a target resolution (pipeline/buckets.py)."""
    return list(bucket_table(resolution))


FORMATS = ("PNG", "JPEG", "WEBP")        # what the app and the command line take (README); Pillow tries no other
BAND_PIXELS = 1 << 18                    # pixels of a 16/32-bit image scaled at a time (bounded memory)


def _rows(img: Image.Image):
    """The image's rows as arrays, a band of about BAND_PIXELS at a time: (first row, array)."""
    w, h = img.size
    rows = max(1, BAND_PIXELS // max(w, 1))
    for y in range(0, h, rows):
        yield y, np.asarray(img.crop((0, y, w, min(y + rows, h))))


def _to_eight_bits(img: Image.Image) -> Image.Image:
    """A 16/32-bit or float single-channel image scaled to 8 bits, a band of rows at a time: memory is the 8-bit
    result and one band (a float64 copy of the whole image was 8 bytes a pixel: 0.5 GB for 8192×8192). The bytes
    are those of scaling the whole image at once."""
    top = None if img.mode.startswith("I;16") else max(float(a.max()) for _, a in _rows(img))
    hi = 65535.0 if top is None or top > 255 else 255.0
    if img.mode == "F" and top is not None and top <= 1.0:
        hi = 1.0
    out = np.empty((img.size[1], img.size[0]), np.uint8)
    for y, a in _rows(img):
        out[y:y + len(a)] = np.clip(a.astype(np.float64) / hi * 255.0 + 0.5, 0, 255).astype(np.uint8)
    return Image.fromarray(out, mode="L")


def _to_rgb(img: Image.Image) -> Image.Image:
    """RGB 8-bit from any PIL mode: alpha composited on white, 16/32-bit and float scaled, CMYK/palette converted."""
    if img.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I", "F"):
        img = _to_eight_bits(img)
    if img.mode == "P":
        img = img.convert("RGBA")
    if img.mode in ("LA", "La", "PA"):
        img = img.convert("RGBA")
    if img.mode in ("RGBA", "RGBa"):
        background = Image.new("RGBA", img.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, img.convert("RGBA")).convert("RGB")
    return img.convert("RGB")


def _open(source, field: str, sides: tuple[int, int] | None = None) -> Image.Image:
    """The image of `source`, decoded. A file or bytes: only PNG, JPEG or WebP (FORMATS: Pillow runs no other
    decoder), and its size read from the header is checked (`sides`: (shortest, longest) allowed side) before
    anything is decoded."""
    if isinstance(source, Image.Image):
        return source
    if isinstance(source, np.ndarray):
        a = source
        if a.dtype != np.uint8:
            if not np.isfinite(a).all():
                raise InputError(field, "the image array contains NaN or infinite values")
            a = np.clip(a * (255.0 if a.max() <= 1.0 else 1.0), 0, 255).astype(np.uint8)
        if a.ndim == 2 or (a.ndim == 3 and a.shape[2] in (1, 3, 4)):
            return Image.fromarray(a.squeeze(-1) if a.ndim == 3 and a.shape[2] == 1 else a)
        raise InputError(field, f"an image array must be H×W, H×W×3 or H×W×4, not {a.shape}")
    path = None if isinstance(source, (bytes, bytearray)) else Path(os.fspath(source))

    def refused(template: str, advice: str = "") -> InputError:
        """The error for this file: named by the error (page: its name; terminal: its full path)."""
        if path is None:
            return InputError(field, template.replace("{file}", "the uploaded data"), advice=advice)
        return InputError(field, template, path=path, advice=advice)

    readable = "Upload a PNG, JPEG or WebP image."
    data: io.BytesIO | Path
    if path is None:
        data = io.BytesIO(source)
    else:
        if not path.exists():
            raise refused("file not found: {file}", "Upload or choose an existing image file.")
        if not path.is_file():
            raise refused("{file} is not a file")
        size = path.stat().st_size
        if size == 0:
            raise refused("{file} is empty (0 bytes)", readable)
        if size > LIMITS.upload_bytes_max:
            raise refused(f"{{file}} is {size / MIB:.0f} MB; the limit is {LIMITS.upload_bytes_max // MIB} MB")
        data = path
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(data, formats=FORMATS)
            w, h = img.size                          # (from the header: nothing decoded yet)
            if w * h > LIMITS.image_pixels_max:
                raise refused(f"{{file}} is {w}×{h} pixels; the limit is {LIMITS.image_side[1]}×{LIMITS.image_side[1]}")
            if sides is not None and min(w, h) < sides[0]:
                raise refused(f"{{file}} is {w}×{h}; each side needs at least {sides[0]} pixels")
            if sides is not None and max(w, h) > sides[1]:
                raise refused(f"{{file}} is {w}×{h}; each side may have at most {sides[1]} pixels")
            img.load()
    except InputError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise refused("{file} is too large to decode safely (decompression bomb guard)") from None
    except UnidentifiedImageError:
        raise refused("{file} is not a PNG, JPEG or WebP image (or is damaged)", readable) from None
    except (OSError, SyntaxError, ValueError):       # a known format whose data breaks off or is damaged
        raise refused("{file} is not a readable image (damaged or cut short)", readable) from None
    return img


def header_pixels(path) -> int:
    """An image file's pixels as its header says (nothing decoded; one of FORMATS only); 0 for a file that is not
    one (its own check, `load_image`, refuses it with the reason)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(Path(os.fspath(path)), formats=FORMATS) as img:
                w, h = img.size
    except (OSError, SyntaxError, ValueError, TypeError, Image.DecompressionBombError):
        return 0
    return w * h


def load_image(source, field: str = "image", check_size: bool = True) -> Image.Image:
    """Open and check an image; returns an RGB 8-bit PIL image with EXIF orientation applied."""
    if source is None:
        raise InputError(field, "no image given", advice="Upload a start image." if field == "image" else "")
    lo, hi = LIMITS.image_side if check_size else (1, LIMITS.image_side[1])
    img = _open(source, field, (lo, hi))
    if getattr(img, "n_frames", 1) > 1:
        img.seek(0)
    try:
        img = ImageOps.exif_transpose(img)
    except (OSError, ValueError, TypeError):
        log.debug("%s: could not read EXIF orientation", field)
    w, h = img.size
    if min(w, h) < lo:
        raise InputError(field, f"the image is {w}×{h}; each side needs at least {lo} pixels")
    if max(w, h) > hi:
        raise InputError(field, f"the image is {w}×{h}; each side may have at most {hi} pixels")
    return _to_rgb(img)


def resize_center_crop(img: Image.Image, height: int, width: int) -> Image.Image:
    """Scale to cover (height, width) and cut the middle out."""
    scale = max(width / img.width, height / img.height)
    size = (max(width, round(img.width * scale)), max(height, round(img.height * scale)))
    img = img.resize(size, Image.LANCZOS) if size != img.size else img
    left, top = (img.width - width) // 2, (img.height - height) // 2
    return img.crop((left, top, left + width, top + height))


def to_model_tensor(img: Image.Image):
    """(1, 3, H, W) float32 in [-1, 1]."""
    import torch

    a = np.asarray(img, dtype=np.float32) / 255.0
    t = torch.from_numpy(a).permute(2, 0, 1).unsqueeze(0)
    return t * 2.0 - 1.0
