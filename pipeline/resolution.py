"""The size of a job: the bucket of its start image at the target resolution, or a custom width × height; and the
check, before any model loads, that the size fits under the VRAM cap (memory/resolution.py), with the nearest size
that does when it does not. The one pre-flight (jobs/preflight.py: every job of the page, the API, the queue and
the command line) calls `check_fits`; the page's memory plan shows `plan_text`."""
from __future__ import annotations

from dataclasses import dataclass

from common.errors import InputError
from configs.memory import MEMORY
from pipeline.buckets import MIN_SIDE, nearest_bucket, scaled_sizes

WIDTH, HEIGHT, RESOLUTION = "custom width", "custom height", "resolution"      # the fields the messages name


@dataclass(frozen=True)
class JobSize:
    height: int
    width: int
    custom: bool            # a custom width × height (else the bucket of `resolution`)
    resolution: int

    def describe(self) -> str:
        return (f"{self.width}×{self.height} (custom)" if self.custom
                else f"{self.width}×{self.height} (the bucket of {self.resolution})")


def custom_size(width, height) -> tuple[int, int] | None:
    """(height, width) when a custom size is asked for, None for the bucket (both 0 or unset). Raises InputError
    naming the field for half a pair or a side under MIN_SIDE (the values were range-checked before)."""
    w, h = int(width or 0), int(height or 0)
    if not w and not h:
        return None
    if not w or not h:
        missing = WIDTH if not w else HEIGHT
        raise InputError(missing, f"set both the custom width and the custom height (or both to 0 for the "
                                  f"bucket of the resolution); only the {HEIGHT if not w else WIDTH} is {w or h}")
    for field, v in ((WIDTH, w), (HEIGHT, h)):
        if v < MIN_SIDE:
            raise InputError(field, f"{v} is too small; use at least {MIN_SIDE} (or 0 for the bucket)")
    return h, w


def job_size(image_height: int, image_width: int, resolution: int, width=0, height=0) -> JobSize:
    """The size a start image of image_height × image_width is cropped to."""
    custom = custom_size(width, height)
    if custom is not None:
        return JobSize(custom[0], custom[1], True, resolution)
    h, w = nearest_bucket(image_height, image_width, resolution)
    return JobSize(h, w, False, resolution)


def _cost(preset, cap_gb: float, window: int, weight_storage: str, fp8_compute: bool):
    from memory.manager import default_device
    from memory.resolution import model_figures, resolution_cost
    from memory.vae import cudnn_workspace_reserve, streamed_decode

    figures = model_figures(preset, weight_storage, fp8_compute)
    device = default_device()                                     # the tiles the job on this machine starts with
    reserve, stream = cudnn_workspace_reserve(device), streamed_decode(device)
    return lambda hw: resolution_cost(figures, hw[0], hw[1], window, cap_gb, MEMORY.prefetch_depth, reserve, stream)


def refusal(size: JobSize, image_hw: tuple[int, int], preset, cap_gb: float, window: int,
            weight_storage: str = "native", fp8_compute: bool = False) -> InputError | None:
    """Why `size` cannot fit under the cap (an InputError naming the field, with the nearest size that fits), or
    None when it fits. `weight_storage`, `fp8_compute`: the process's (Config), which set what the transformer's
    blocks take on the GPU (--fp8-compute keeps its Linears there in fp8: a lower floor)."""
    cost = _cost(preset, cap_gb, window, weight_storage, fp8_compute)
    here = cost((size.height, size.width))
    return None if here.fits else _refused(size, image_hw, cap_gb, cost, here)


def _refused(size: JobSize, image_hw: tuple[int, int], cap_gb: float, cost, here) -> InputError:
    """The refusal of `size`, whose cost `here` does not fit, with the nearest size that does under `cost`."""
    from memory.resolution import largest_fitting

    advice = f"or raise the VRAM cap (now {cap_gb:g} GB) if your card has more memory"
    if size.custom:
        found = largest_fitting(scaled_sizes(size.height, size.width), cost)
        near = (f"The nearest size of the same shape that fits is {found[0][1]}×{found[0][0]} "
                f"(width {found[0][1]}, height {found[0][0]}); use it, {advice}" if found else
                f"No size fits; {advice}")
        return InputError(WIDTH, f"{size.width}×{size.height} cannot fit: {here.short_of()}. {near}.")
    targets = range(size.resolution - 16, MIN_SIDE - 1, -16)
    found = largest_fitting(((r, *nearest_bucket(*image_hw, r)) for r in targets),
                            lambda rhw: cost(rhw[1:]))
    near = (f"The largest resolution that fits is {found[0][0]} (bucket {found[0][2]}×{found[0][1]}); choose it, "
            f"{advice}" if found else f"No resolution fits; {advice}")
    return InputError(RESOLUTION, f"{size.resolution} ({size.width}×{size.height}) cannot fit: {here.short_of()}. "
                                  f"{near}.")


def check_fits(prepared, preset, cap_gb: float, weight_storage: str = "native", fp8_compute: bool = False) -> None:
    """Raise the refusal of a prepared request whose size cannot fit under the cap (before any model loads)."""
    r = prepared.request
    size = JobSize(prepared.height, prepared.width, bool(custom_size(r.width, r.height)), r.resolution)
    error = refusal(size, (prepared.image.height, prepared.image.width), preset, cap_gb, r.latent_window,
                    weight_storage, fp8_compute)
    if error is not None:
        raise error


def plan_text(preset, cap_gb: float, resolution, width, height, window, image_hw: tuple[int, int] | None = None,
              weight_storage: str = "native", fp8_compute: bool = False) -> str:
    """The memory plan's resolution line for the page: the size, what it costs, or why it cannot fit and the
    nearest size that does. `image_hw`: the start image's size (None: a square image); `weight_storage`,
    `fp8_compute`: as `refusal`, so the page and the pre-flight give the same answer."""
    hw = image_hw or (1, 1)
    try:
        size = job_size(hw[0], hw[1], int(resolution), width, height)
    except InputError as e:
        return f"⚠ {e}"
    cost = _cost(preset, cap_gb, int(window), weight_storage, fp8_compute)
    here = cost((size.height, size.width))
    if here.fits:
        return f"Size {size.describe()}: {here.describe()}."
    return f"⚠ **Size {size.describe()} cannot fit:** {_refused(size, hw, cap_gb, cost, here).message}"
