"""TeaCache's decisions, step by step, as FramePack makes them (pipeline/teacache.py lists what is the same)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.teacache import RESCALE, TeaCache, rescale

# FramePack's `teacache_rescale_func = np.poly1d([...])`, written out as it stands in its source.
FRAMEPACK_POLY = np.poly1d([7.33226126e+02, -4.01131952e+02, 6.75869174e+01, -3.14987800e+00, 9.61237896e-02])


def test_rescale_is_framepacks_polynomial():
    for x in (0.0, 0.01, 0.05, 0.1, 0.3, 1.0):
        assert rescale(x) == pytest.approx(float(FRAMEPACK_POLY(x)), rel=1e-15, abs=1e-15)
    assert len(RESCALE) == 5


def decisions(cache: TeaCache, inputs: list[torch.Tensor]) -> str:
    """'C' where the stack is computed, 'S' where it is skipped (the computed steps store a residual)."""
    out = ""
    for m in inputs:
        skip = cache.should_skip(m)
        if not skip:
            cache.store(torch.zeros_like(m))
        out += "S" if skip else "C"
    return out


# Identical inputs: every middle step adds rescale(0) = 0.0961237896 to the sum.
@pytest.mark.parametrize("threshold, expected", [
    (0.05, "CCCCCC"),      # 0.096 ≥ 0.05: computed every time
    (0.15, "CSCSCC"),      # 0.096 skip, 0.192 compute (sum zeroed), 0.096 skip, 0.192 compute, last step computed
    (0.2, "CSSCSC"),       # 0.096, 0.192 skip; 0.288 compute; 0.096 skip; last computed although 0.192 < 0.2
    (1.0, "CSSSSC"),       # first and last always computed
])
def test_decisions_accumulate_and_reset(threshold, expected):
    m = torch.full((1, 4, 8), 0.5)
    assert decisions(TeaCache(threshold, 6), [m] * 6) == expected


def test_a_sum_equal_to_the_threshold_computes():
    m = torch.full((1, 4, 8), 0.5)
    assert decisions(TeaCache(2 * rescale(0.0), 5), [m] * 5) == "CSCSC"


def test_the_change_is_the_mean_absolute_difference_over_the_mean_magnitude():
    """mean|m − m_prev| / mean|m_prev| (not the mean of per-element ratios): [1, 3] → [1.2, 3] is 0.1 / 2 = 0.05."""
    cache = TeaCache(1.0, 5)
    decisions(cache, [torch.tensor([[1.0, 3.0]]), torch.tensor([[1.2, 3.0]])])
    assert cache.accumulated == pytest.approx(rescale(0.05), rel=1e-5)
    assert abs(rescale(0.05) - rescale(0.1)) > 0.01


def test_reset_starts_a_new_section():
    m = torch.full((1, 2, 2), 1.0)
    cache = TeaCache(1.0, 4)
    assert decisions(cache, [m] * 4) == "CSSC" and cache.skipped == 2
    cache.reset()
    assert cache.step == 0 and cache.residual is None and cache.previous_input is None and cache.skipped == 0
    assert decisions(cache, [m] * 4) == "CSSC"


def test_skipped_steps_reuse_the_stack_residual_in_the_tiny_transformer(tiny_original):
    """With the denoiser: TeaCache skips every middle step at threshold 1 (the blocks do not run), the first step
    equals the uncached prediction, and a skipped step differs from it."""
    from pipeline import sections as sec
    from pipeline.denoiser import FramepackDenoiser
    from pipeline.text import TextEmbeddings

    tr = tiny_original.transformer
    plan = sec.make_plan("original", 1.2, 9)
    section = plan.sections[0]
    start = torch.randn(1, 16, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    ctx = sec.section_context(plan, section, sec.empty_history(plan, start), start, None)
    d = tr.config.text_embed_dim
    text = TextEmbeddings(torch.randn(1, 6, d, generator=torch.Generator().manual_seed(1)),
                          torch.ones(1, 6, dtype=torch.long),
                          torch.randn(1, tr.config.pooled_projection_dim, generator=torch.Generator().manual_seed(2)))
    texts = {"cond": text, "uncond": text}
    image = torch.randn(1, 729, tr.config.image_proj_dim, generator=torch.Generator().manual_seed(3))
    x = torch.randn(1, 16, plan.window, 8, 8, generator=torch.Generator().manual_seed(4))

    runs = []
    hook = tr.transformer_blocks[0].register_forward_hook(lambda *a: runs.append(1))
    try:
        outputs = {}
        for threshold in (0.0, 1.0):
            den = FramepackDenoiser(tr, threshold, steps=4)
            den.begin_section(ctx, plan.indices(section), (plan.window, 8, 8), image, texts, 10.0)
            runs.clear()
            outputs[threshold] = [den(x * (1 - 0.1 * k), torch.tensor([1000.0 - 200 * k])) for k in range(4)]
            outputs[threshold, "runs"] = len(runs)
    finally:
        hook.remove()
    assert outputs[0.0, "runs"] == 4 and outputs[1.0, "runs"] == 2          # steps 2 and 3 skipped the stack
    torch.testing.assert_close(outputs[1.0][0], outputs[0.0][0], atol=0, rtol=0)
    torch.testing.assert_close(outputs[1.0][3], outputs[0.0][3], atol=1e-5, rtol=1e-5)   # last step computed
    assert (outputs[1.0][1] - outputs[0.0][1]).abs().max() > 1e-4
