"""TeaCache: skip the transformer's block stack on steps where its input barely changed.

Per step, the relative L1 change of block 0's modulated input, mean|m − m_prev| / mean|m_prev|, is rescaled by a
polynomial fitted for HunyuanVideo and accumulated; while the sum stays under the threshold, the stack is skipped
and the last computed residual (output − input of the stack) is added instead. Thresholds: 0.1 ≈ 1.6×, 0.15 ≈ 2.1×
faster. Not lossless (fine detail such as fingers can suffer).

Against FramePack's TeaCache (`HunyuanVideoTransformer3DModelPacked.initialize_teacache` and its forward), the same:
- the rescale polynomial with FramePack's coefficients to every digit it gives (`RESCALE`), in float64;
- the input: block 0's `norm1` of the packed sequence (context tokens + the noisy window), the change measured in
  the model's dtype and read back as a float;
- the decision: the first and the last step of a section always compute and zero the sum; otherwise the sum grows by
  rescale(change) and the step computes (and zeroes the sum) when sum ≥ threshold, else skips;
- the state is reset at every section (FramePack calls `initialize_teacache` before each section);
- a skipped step adds the residual of the last computed step to the stack's input.
The one difference: FramePack keeps one counter per model, so with real CFG (cfg > 1: two transformer calls per
step) its "first/last step" and counter wrap-around count calls, not steps, and the positive and negative branches
share one sum and one residual. Here each branch has its own state and counts steps. With cfg = 1 (FramePack's
default; one call per step) the two are the same. tests/test_teacache.py checks the decisions step by step.
"""
from __future__ import annotations

import torch

# FramePack's np.poly1d coefficients, highest power first.
RESCALE = (7.33226126e+02, -4.01131952e+02, 6.75869174e+01, -3.14987800e+00, 9.61237896e-02)


def rescale(x: float) -> float:
    out = 0.0
    for c in RESCALE:
        out = out * x + c
    return out


class TeaCache:
    def __init__(self, threshold: float, steps: int):
        self.threshold = threshold
        self.steps = steps
        self.reset()

    def reset(self) -> None:
        self.step = 0
        self.accumulated = 0.0
        self.previous_input: torch.Tensor | None = None
        self.residual: torch.Tensor | None = None
        self.skipped = 0

    def state(self) -> tuple:
        return (self.step, self.accumulated, self.previous_input, self.skipped)

    def restore(self, state: tuple) -> None:
        """Undo the decision of a step that has to be run again (e.g. after an out-of-memory)."""
        self.step, self.accumulated, self.previous_input, self.skipped = state

    def should_skip(self, modulated: torch.Tensor) -> bool:
        """Decide for this step; call once per step, before running (or not) the stack."""
        edge = self.step == 0 or self.step == self.steps - 1 or self.residual is None
        if edge or self.previous_input is None:
            skip = False
            self.accumulated = 0.0
        else:
            prev = self.previous_input
            change = ((modulated - prev).abs().mean() / prev.abs().mean().clamp_min(1e-12)).item()
            self.accumulated += rescale(change)
            skip = self.accumulated < self.threshold
            if not skip:
                self.accumulated = 0.0
        self.previous_input = modulated
        self.step += 1
        if skip:
            self.skipped += 1
        return skip

    def apply(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden + self.residual

    def store(self, residual: torch.Tensor) -> None:
        self.residual = residual
