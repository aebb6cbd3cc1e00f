"""MagCache's decisions against a transcription of its authors' FramePack code, its ratios at other step counts, the
control, and a tiny job with it on and off (pipeline/magcache.py says what is the same and gives the sources)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from cli import commands as cli
from common.errors import InputError
from pipeline.events import Done, LogLine
from pipeline.magcache import MAX_SKIPS, RATIOS, RETENTION, MagCache, interpolate
from pipeline.request import Request, check_settings
from tests.conftest import make_image, run_job

# The authors' FramePack `mag_ratios`, as they stand in MagCache4FramePack/magcache_demo_gradio.py (original) and
# magcache_demo_gradio_f1.py (F1) of https://github.com/Zehong-Ma/MagCache.
PUBLISHED = {
    "original": np.array([1.0] + [1.26562, 1.23438, 1.03125, 1.02344, 1.03906, 1.01562, 1.03906, 1.05469, 1.02344,
                                  1.03906, 0.99609, 1.03125, 1.02344, 1.01562, 1.02344, 1.00781, 1.04688, 0.98828, 1.0,
                                  1.00781, 0.98828, 0.94141, 0.94141, 0.78906]),
    "f1": np.array([1.0] + [1.25781, 1.08594, 1.02344, 1.00781, 1.02344, 1.00781, 1.02344, 1.05469, 0.99609, 1.03906,
                            1.00781, 1.01562, 1.00781, 1.02344, 1.01562, 0.98047, 1.05469, 0.98047, 0.96875, 1.03125,
                            0.97266, 0.9375, 0.96484, 0.78516]),
}
# Ratios recorded by FramePack-Studio's calibration (diffusers_helper/models/mag_cache_ratios.py, "Original", 640,
# 25 steps): another recorded sequence of residual-norm ratios.
STUDIO_640 = np.array([1.0] + [1.30469, 1.22656, 1.05469, 1.02344, 1.03906, 1.02344, 1.03906, 1.05469, 1.02344,
                               1.03906, 0.99609, 1.02344, 1.03125, 1.01562, 1.02344, 1.00781, 1.03906, 0.98828, 1.0,
                               1.0, 0.98828, 0.94531, 0.93359, 0.78516])


# ---- the reference, written from the demos' code (`nearest_interp`, `initialize_magcache` and the skip block of
# `magcache_framepack_forward`): one counter per model that wraps at num_steps ----------------------------------------
def nearest_interp(src_array, target_length):
    src_length = len(src_array)
    if target_length == 1:
        return np.array([src_array[-1]])
    scale = (src_length - 1) / (target_length - 1)
    mapped_indices = np.round(np.arange(target_length) * scale).astype(int)
    return src_array[mapped_indices]


def reference_skips(mag_ratios, num_steps, magcache_thresh, K, retention_ratio, calls=None) -> str:
    """'S' where the demo skips the blocks, 'C' where it computes, for `calls` forward calls (default num_steps)."""
    if len(mag_ratios) != num_steps:
        mag_ratios = nearest_interp(mag_ratios, num_steps)
    cnt, out = 0, ""
    for _ in range(calls or num_steps):
        if cnt == 0:
            accumulated_ratio, accumulated_steps, accumulated_err = 1.0, 0, 0
        skip_forward = False
        if cnt >= int(retention_ratio * num_steps) and cnt >= 1:
            cur_mag_ratio = mag_ratios[cnt]
            accumulated_ratio = accumulated_ratio * cur_mag_ratio
            cur_skip_err = np.abs(1 - accumulated_ratio)
            accumulated_err += cur_skip_err
            accumulated_steps += 1
            if accumulated_err <= magcache_thresh and accumulated_steps <= K and np.abs(1 - cur_mag_ratio) <= 0.06:
                skip_forward = True
            else:
                accumulated_ratio, accumulated_steps, accumulated_err = 1.0, 0, 0
        out += "S" if skip_forward else "C"
        cnt += 1
        if cnt == num_steps:
            cnt = 0
    return out


def skips(cache: MagCache, calls: int | None = None) -> str:
    out = ""
    for _ in range(calls or cache.steps):
        skip = cache.should_skip()
        if not skip:
            cache.store(0.0)                 # a computed step stores its residual
        out += "S" if skip else "C"
    return out


def test_the_ratios_and_defaults_are_the_published_ones():
    for mode, ratios in PUBLISHED.items():
        assert np.array_equal(np.array(RATIOS[mode]), ratios)
    assert (MAX_SKIPS, RETENTION) == (3, 0.2)            # the demos' sliders: K 3, retention ratio 0.2


def test_the_published_schedule_at_25_steps():
    """Written out once, so that a change of the algorithm shows here even if the reference changed with it."""
    assert skips(MagCache(0.1, 25, "original")) == "CCCCCSSCSCSSCSSCSSCSSSCSC"
    assert skips(MagCache(0.1, 25, "f1")) == "CCCCCSSCSCSSCSSSCSSSCSCSC"
    assert skips(MagCache(0.15, 25, "original", max_skips=4)) == "CCCCCSSCSSCSSSCSSSCSSSSCC"    # E015K4R02


@pytest.mark.parametrize("name", ["original", "f1", "studio_640", "random_walk"])
def test_decisions_equal_the_reference(name):
    """Every step count 1–50 and 75, several thresholds, K and retention ratios, on the published ratios and on
    recorded ones: Studio's calibration and a random walk of residual norms (ratio = |r_n| / |r_(n−1)|)."""
    if name == "random_walk":
        norms = np.cumprod(np.random.default_rng(32).normal(1.0, 0.04, 25))
        ratios = np.concatenate([[1.0], norms[1:] / norms[:-1]])
    else:
        ratios = {"studio_640": STUDIO_640, **PUBLISHED}[name]
    checked = skipped = 0
    for steps in [*range(1, 51), 75]:
        for thresh in (0.0, 0.03, 0.1, 0.15, 0.3, 1.0):
            for k in (1, 3, 5):
                for retention in (0.0, 0.2, 0.25, 0.5):
                    ours = skips(MagCache(thresh, steps, ratios=ratios, max_skips=k, retention=retention))
                    assert ours == reference_skips(ratios, steps, thresh, k, retention), (steps, thresh, k, retention)
                    checked += 1
                    skipped += ours.count("S")
    assert checked == 51 * 6 * 3 * 4 and skipped > 1000          # the comparison covered many skips


def test_the_counter_wraps_as_the_reference_and_reset_starts_a_section():
    cache = MagCache(0.1, 25)
    assert skips(cache, 60) == reference_skips(PUBLISHED["original"], 25, 0.1, MAX_SKIPS, RETENTION, calls=60)
    assert cache.skipped == skips(MagCache(0.1, 25), 60).count("S")
    cache.reset()
    assert cache.step == 0 and cache.skipped == 0 and cache.residual is None
    assert skips(cache) == reference_skips(PUBLISHED["original"], 25, 0.1, MAX_SKIPS, RETENTION)


def test_restore_undoes_a_decision():
    cache = MagCache(0.1, 25)
    skips(cache, 6)
    saved = cache.state()
    first = cache.should_skip()
    cache.restore(saved)
    assert cache.should_skip() == first and cache.state() != saved


@pytest.mark.parametrize("mode", ["original", "f1"])
def test_interpolation_to_other_step_counts_is_the_demos(mode):
    ratios = PUBLISHED[mode]
    for steps in range(1, 101):
        assert interpolate(RATIOS[mode], steps) == tuple(nearest_interp(ratios, steps).tolist()), steps
    assert interpolate(RATIOS[mode], 25) == RATIOS[mode]
    assert interpolate(RATIOS[mode], 13) == RATIOS[mode][::2]
    assert interpolate(RATIOS[mode], 1) == (RATIOS[mode][-1],)
    # 17 steps: k · 1.5, halves to even as np.round: 1.5 → 2, 4.5 → 4, 7.5 → 8
    picked = interpolate(tuple(range(25)), 17)
    assert picked[1] == 2 and picked[3] == 4 and picked[5] == 8 and picked[-1] == 24


def test_the_control_and_one_cache_at_a_time():
    assert Request(image="a.png").magcache == 0.0                        # off by default
    args = cli.build_parser().parse_args(["generate", "--image", "a.png", "--magcache", "0.1", "--teacache", "0"])
    request = cli.request_from_args(args)
    assert request.magcache == 0.1 and Request.from_mapping(request.settings(), image="a.png") == request
    values, _ = check_settings({"magcache": 0.1, "teacache": 0.0}, {"resolution": 64})
    assert values["magcache"] == 0.1
    with pytest.raises(InputError) as e:
        check_settings({"magcache": 0.1}, {"resolution": 64})            # TeaCache's default 0.15 is on
    assert e.value.field == "MagCache threshold" and "TeaCache threshold to 0" in str(e.value)
    assert cli.cli_message(e.value, cli.OPTION_OF_FIELD).startswith("--magcache: ")
    with pytest.raises(InputError, match="^MagCache threshold: 1.5 is out of range"):
        check_settings({"magcache": 1.5, "teacache": 0.0}, {"resolution": 64})


def test_the_denoiser_skips_the_blocks_and_computed_steps_equal_the_uncached_ones(tiny_original):
    """6 steps at 0.1 decide CSCSSC: the blocks run on the 3 computed steps, each of which equals the uncached
    prediction bit for bit (keeping residuals changes nothing), and a skipped step adds the last residual instead:
    where every step has the same input, so the same residual, a skipped step gives the uncached prediction."""
    from pipeline import sections as sec
    from pipeline.denoiser import FramepackDenoiser
    from pipeline.text import TextEmbeddings

    tr = tiny_original.transformer
    plan = sec.make_plan("original", 1.2, 9)
    section = plan.sections[0]
    g = torch.Generator().manual_seed(0)
    start = torch.randn(1, 16, 1, 8, 8, generator=g)
    ctx = sec.section_context(plan, section, sec.empty_history(plan, start), start, None)
    text = TextEmbeddings(torch.randn(1, 6, tr.config.text_embed_dim, generator=g), torch.ones(1, 6, dtype=torch.long),
                          torch.randn(1, tr.config.pooled_projection_dim, generator=g))
    image = torch.randn(1, 729, tr.config.image_proj_dim, generator=g)
    x = torch.randn(1, 16, plan.window, 8, 8, generator=g)
    schedule = reference_skips(PUBLISHED["original"], 6, 0.1, MAX_SKIPS, RETENTION)
    assert schedule == "CSCSSC"

    def begin(threshold):
        den = FramepackDenoiser(tr, 0.0, 6, magcache_threshold=threshold)
        den.begin_section(ctx, plan.indices(section), (plan.window, 8, 8), image, {"cond": text}, 10.0)
        return den

    def step(den, k):
        return den(x * (1 - 0.1 * k), torch.tensor([1000.0 - 150 * k]))

    runs = []
    hook = tr.transformer_blocks[0].register_forward_pre_hook(lambda *a: runs.append(1))
    try:
        plain = begin(0.0)
        uncached = {k: step(plain, k) for k in (0, 1, 2, 5)}           # the computed steps and a skipped one
        den = begin(0.1)
        runs.clear()
        cached = [step(den, k) for k in range(6)]
        assert len(runs) == 3 and den.magcache["cond"].skipped == 3 and den.teacache is None and plain.magcache is None
        den.begin_section(ctx, plan.indices(section), (plan.window, 8, 8), image, {"cond": text}, 10.0)
        same_input = [den(x, torch.tensor([700.0])) for _ in range(6)]
        uncached_same = plain(x, torch.tensor([700.0]))
    finally:
        hook.remove()
    for k in (0, 2, 5):
        assert torch.equal(cached[k], uncached[k]), k
    assert (cached[1] - uncached[1]).abs().max() > 1e-3
    for out in same_input:
        torch.testing.assert_close(out, uncached_same, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="cannot both be on"):
        FramepackDenoiser(tr, 0.15, 6, magcache_threshold=0.1)


def test_a_tiny_job_with_magcache_skips_steps_and_off_is_the_plain_job(tiny_original, tmp_path, monkeypatch):
    """Off (the default): no MagCache is made, the blocks run every step. On at 0.1, 6 steps: they run on the 3
    computed steps, the log and job.json say so, and the latents differ from the plain job's. On but made never to
    skip: the plain job bit for bit (MagCache's bookkeeping changes no computed step)."""
    import pipeline.magcache as magcache
    from jobfolder.checkpoint import load_checkpoint

    made = []
    real_init = magcache.MagCache.__init__

    def counting_init(self, *args, **kwargs):
        made.append(args)
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(magcache.MagCache, "__init__", counting_init)
    tr = tiny_original.transformer
    runs = []
    hook = tr.transformer_blocks[0].register_forward_pre_hook(lambda *a: runs.append(1))
    results = {}
    real_skip = magcache.MagCache.should_skip

    def never_skip(self):
        if real_skip(self):
            self.skipped -= 1
        return False

    try:
        for name, kw in {"plain": {}, "on": dict(magcache=0.1), "never": dict(magcache=0.1)}.items():
            if name == "never":
                monkeypatch.setattr(magcache.MagCache, "should_skip", never_skip)
            runs.clear()
            made.clear()
            request = Request(image=make_image(64, 64), prompt="a boat", seconds=1.2, steps=6, seed=3, teacache=0.0,
                              resolution=64, **kw)
            events, last = run_job(request, tiny_original, tmp_path / name)
            assert isinstance(last, Done) and not last.stopped
            results[name] = dict(
                runs=len(runs), made=list(made), real=load_checkpoint(last.job_dir)[0]["real"],
                lines=[e.message for e in events if isinstance(e, LogLine) and "MagCache" in e.message],
                settings=json.loads((last.job_dir / "job.json").read_text())["settings"])
    finally:
        hook.remove()
    plain, on, never = results["plain"], results["on"], results["never"]
    assert plain["made"] == [] and plain["lines"] == [] and plain["runs"] == 6 and plain["settings"]["magcache"] == 0
    assert on["made"] == [(0.1, 6, "original")] * 2                        # one per CFG branch
    assert on["lines"] == ["MagCache skipped 3 of 6 steps"] and on["runs"] == 3
    assert on["settings"]["magcache"] == 0.1
    assert not torch.equal(on["real"], plain["real"])
    assert never["lines"] == ["MagCache skipped 0 of 6 steps"] and never["runs"] == 6 and len(never["made"]) == 2
    assert torch.equal(never["real"], plain["real"])
