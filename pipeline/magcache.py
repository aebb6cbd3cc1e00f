"""MagCache: skip the transformer's block stack on steps whose residual is predicted to change little.

MagCache (Ma et al., "MagCache: Fast Video Generation with Magnitude-Aware Cache", arXiv:2506.09045) observes that the
ratio of the norms of two consecutive steps' residuals (output − input of the block stack) is nearly the same for
every prompt and image, so it is calibrated once per model and step count and stored (`RATIOS`). A skipped step adds
the last computed residual to the stack's input, as TeaCache does; unlike TeaCache, the decision reads no tensor: it
follows from the step index and the calibrated ratios alone.

Sources (read, not copied):
- https://github.com/Zehong-Ma/MagCache, MagCache4FramePack/magcache_demo_gradio.py (FramePack) and
  MagCache4FramePack/magcache_demo_gradio_f1.py (FramePack-F1): `initialize_magcache` (the published `mag_ratios`,
  calibrated at 25 steps, and `nearest_interp` to other step counts) and `magcache_framepack_forward` (the decision);
  the demos' defaults: magcache_thresh 0.10, K 3, retention_ratio 0.2 (their README's "E010K3R02"; the faster
  "E015K4R02" is threshold 0.15, K 4).
- https://github.com/colinurbs/FramePack-Studio, diffusers_helper/models/mag_cache.py: the same decision in a class
  (Studio's own defaults are threshold 0.1, 2 consecutive skips, retention 0.25, with ratios it calibrated per
  resolution in mag_cache_ratios.py; here the authors' ratios and defaults).

The decision, per step n of a section (n = 0 … steps − 1; the ratios interpolated to `steps`):
- steps n < max(1, int(retention · steps)) always compute;
- otherwise the accumulated ratio is multiplied by ratio[n], the error grows by |1 − accumulated ratio| and the run
  of skips by one; the step is skipped while error ≤ threshold, run ≤ K and |1 − ratio[n]| ≤ 0.06; else it computes
  and the ratio (1), error (0) and run (0) start again.
The state is reset at every section (the demos call `initialize_magcache` before each). As in pipeline/teacache.py,
each CFG branch (cond, uncond) has its own state and counts steps, where the demos keep one counter per model that
counts transformer calls; with cfg = 1 (FramePack's default; one call per step) the two are the same.
tests/test_magcache.py checks the decisions against a transcription of the demos' code.

Torch-free: pipeline/request.py calls `check_settings` (one cache at a time) before any model loads.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from common.errors import InputError

# `mag_ratios` published for 25 steps: ratio[n] = mean over tokens of |residual_n| / |residual_(n−1)|, ratio[0] = 1.
RATIOS = {
    "original": (1.0, 1.26562, 1.23438, 1.03125, 1.02344, 1.03906, 1.01562, 1.03906, 1.05469, 1.02344, 1.03906,
                 0.99609, 1.03125, 1.02344, 1.01562, 1.02344, 1.00781, 1.04688, 0.98828, 1.0, 1.00781, 0.98828,
                 0.94141, 0.94141, 0.78906),
    "f1": (1.0, 1.25781, 1.08594, 1.02344, 1.00781, 1.02344, 1.00781, 1.02344, 1.05469, 0.99609, 1.03906, 1.00781,
           1.01562, 1.00781, 1.02344, 1.01562, 0.98047, 1.05469, 0.98047, 0.96875, 1.03125, 0.97266, 0.9375, 0.96484,
           0.78516),
}
MAX_SKIPS = 3                # K: skips in a row at most
RETENTION = 0.2              # the first 20 % of the steps always compute
MAX_STEP_CHANGE = 0.06       # a step whose own ratio is further than this from 1 always computes


def interpolate(ratios: Sequence[float], steps: int) -> tuple[float, ...]:
    """The calibrated ratios for another step count: step k takes the entry nearest k · (len − 1) / (steps − 1),
    halves rounded to even (numpy's `np.round`, as the demos' `nearest_interp`); one step takes the last entry."""
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    if steps == 1:
        return (float(ratios[-1]),)
    scale = (len(ratios) - 1) / (steps - 1)
    return tuple(float(ratios[round(k * scale)]) for k in range(steps))


class MagCache:
    """The skip decisions of one CFG branch in one section at a time, and the residual it reuses."""

    def __init__(self, threshold: float, steps: int, mode: str = "original", *, max_skips: int = MAX_SKIPS,
                 retention: float = RETENTION, ratios: Sequence[float] | None = None):
        if mode not in RATIOS and ratios is None:
            raise ValueError(f"MagCache has no ratios for mode {mode!r}; known: {', '.join(RATIOS)}")
        self.threshold = threshold
        self.steps = steps
        self.max_skips = max_skips
        self.ratios = interpolate(RATIOS[mode] if ratios is None else ratios, steps)
        self.first = max(1, int(retention * steps))      # the first step that may be skipped
        self.reset()

    def reset(self) -> None:
        self.step = 0
        self.accumulated_ratio = 1.0
        self.accumulated_error = 0.0
        self.run = 0
        self.residual = None
        self.skipped = 0

    def state(self) -> tuple:
        return (self.step, self.accumulated_ratio, self.accumulated_error, self.run, self.skipped)

    def restore(self, state: tuple) -> None:
        """Undo the decision of a step that has to be run again (e.g. after an out-of-memory)."""
        self.step, self.accumulated_ratio, self.accumulated_error, self.run, self.skipped = state

    def should_skip(self) -> bool:
        """Decide for this step; call once per step, before running (or not) the stack."""
        if self.step == 0:                  # a new round of `steps` (the demos' counter wraps the same way)
            self.accumulated_ratio, self.accumulated_error, self.run = 1.0, 0.0, 0
        skip = False
        if self.step >= self.first and self.residual is not None:
            ratio = self.ratios[self.step]
            self.accumulated_ratio *= ratio
            self.accumulated_error += abs(1 - self.accumulated_ratio)
            self.run += 1
            skip = (self.accumulated_error <= self.threshold and self.run <= self.max_skips
                    and abs(1 - ratio) <= MAX_STEP_CHANGE)
            if not skip:
                self.accumulated_ratio, self.accumulated_error, self.run = 1.0, 0.0, 0
        self.step = (self.step + 1) % self.steps
        if skip:
            self.skipped += 1
        return skip

    def apply(self, hidden):
        return hidden + self.residual

    def store(self, residual) -> None:
        self.residual = residual


def check_settings(settings: Mapping[str, Any]) -> None:
    """One cache at a time: MagCache and TeaCache both on is refused, naming the MagCache field."""
    magcache, teacache = settings.get("magcache") or 0, settings.get("teacache") or 0
    if magcache > 0 and teacache > 0:
        raise InputError("MagCache threshold", f"{magcache:g} needs TeaCache off (its threshold is {teacache:g}); "
                                               f"set the TeaCache threshold to 0 (off) to use MagCache, or MagCache "
                                               f"to 0 to keep TeaCache")
