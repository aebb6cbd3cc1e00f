"""Resolution buckets: the (height, width) a start image is cropped to, for a target resolution, or a custom size.

FramePack's table is for a 640 target (configs/generation.py BUCKETS_640: 14 aspect ratios, each side a multiple of
16, area ≈ 640²). Other targets scale that table and round each side to a multiple of 16, which is what kijai's
ComfyUI wrapper does (its "find nearest bucket" node takes any base resolution in steps of 16 and scales the 640
bucket); FramePack-Studio scales the same table but rounds to multiples of 32. 16 is the model's own granularity
(VAE 8× and patch 2×), so any multiple of 16 is a valid size; a custom width × height (both multiples of 16) skips
the table. The bucket of an image is the one whose aspect ratio is closest: the least |h·bw − w·bh| (FramePack's
metric), first wins on ties.

Pure functions: tested without models.
"""
from __future__ import annotations

from functools import lru_cache

from configs.generation import BUCKETS_640

BASE_TARGET = 640
BUCKET_TARGETS = (640, 720, 960)        # the named tables (the README's, the page's ticks); any multiple of 16 works
GRANULARITY = 16                        # VAE 8× × patch 2×
MIN_SIDE = 64                           # the 4× compressed history needs 8 latent pixels (docs/FACTS.md)


def round_to(value: float, multiple: int = GRANULARITY) -> int:
    """The nearest multiple of `multiple` (at least `multiple`)."""
    return max(multiple, int(round(value / multiple)) * multiple)


@lru_cache(maxsize=64)
def bucket_table(target: int) -> tuple[tuple[int, int], ...]:
    """The bucket table of a target resolution, (height, width) in FramePack's order: the 640 table as it is, any
    other target the 640 table scaled by target/640 with each side rounded to a multiple of 16 (duplicates after
    rounding dropped)."""
    if target == BASE_TARGET:
        return BUCKETS_640
    scale = target / BASE_TARGET
    out: list[tuple[int, int]] = []
    for h, w in BUCKETS_640:
        b = (round_to(h * scale), round_to(w * scale))
        if b not in out:
            out.append(b)
    return tuple(out)


def nearest_bucket(height: int, width: int, target: int = BASE_TARGET) -> tuple[int, int]:
    """The bucket of `target` whose aspect ratio is closest to height × width's."""
    return min(bucket_table(target), key=lambda b: abs(height * b[1] - width * b[0]))


def scaled_sizes(height: int, width: int, multiple: int = GRANULARITY):
    """Sizes of the same aspect ratio as height × width, from that size down, each side a multiple of 16 and at
    least MIN_SIDE: the longer side shrinks by 16 at a time (for the nearest smaller size that fits)."""
    long_side, short_side = max(height, width), min(height, width)
    seen = set()
    for side in range(long_side, MIN_SIDE - 1, -multiple):
        other = max(MIN_SIDE, round_to(short_side * side / long_side, multiple))
        size = (side, other) if height >= width else (other, side)
        if size not in seen:
            seen.add(size)
            yield size
