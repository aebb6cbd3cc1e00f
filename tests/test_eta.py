"""pipeline/eta.py: the ETA counts every remaining step and decode, and whole-job estimates from a finished job."""
from __future__ import annotations

import pytest

from pipeline import sections
from pipeline.eta import DECODE_PRIOR, JobRates, Remaining


def _plan(seconds=3.6, mode="original"):
    return sections.make_plan(mode, seconds, 9, 30)


def test_in_section_one_the_estimate_counts_the_later_sections_and_every_decode():
    plan = _plan()
    eta = Remaining.for_plan(plan, steps=10)
    eta.update("sampling", 1, 0, 0.0)
    for step in range(1, 5):                            # 1 s per step
        left = eta.update("sampling", 1, step, float(step))
    sampling_left = (10 - 4) + 2 * 10                   # this section's last 6 steps and two more sections
    # no decode measured yet: a section's decode is assumed to take about as long as its sampling (10 s)
    frames = [plan.decode_frames(s) for s in plan.sections]
    assert left == pytest.approx(sampling_left * 1.0 + sum(frames) * DECODE_PRIOR * 10 / frames[-1])
    assert left > sampling_left + 2 * 10


def test_measured_decode_time_per_frame_replaces_the_prior():
    plan = _plan()
    frames = [plan.decode_frames(s) for s in plan.sections]
    eta = Remaining.for_plan(plan, steps=2)
    t = 0.0
    for step in range(3):
        eta.update("sampling", 1, step, t)
        t += 1.0
    eta.update("VAE decode", 1, 2, t)                   # the decode takes 5 s
    t += 5.0
    left = eta.update("sampling", 2, 0, t)
    assert eta.decode_measured and eta.decode_per_frame() == pytest.approx(5.0 / frames[0])
    assert left == pytest.approx(2 * 2 * 1.0 + (frames[1] + frames[2]) * 5.0 / frames[0])
    during_last_decode = eta.update("VAE decode", 3, 2, t + 10)
    assert during_last_decode == pytest.approx(frames[2] * eta.decode_per_frame())


def test_no_estimate_before_a_step_is_timed():
    eta = Remaining.for_plan(_plan(), steps=4)
    assert eta.update("text encoders", 0, 0, 0.0) is None
    assert eta.update("sampling", 1, 0, 1.0) is None


def test_job_rates_from_a_finished_job_estimate_a_longer_one():
    plan, longer = _plan(2.4), _plan(4.8)
    frames = sum(plan.decode_frames(s) for s in plan.sections)
    rates = JobRates.from_timings({"transformer": 8.0, "VAE decode": 4.0, "total": 14.0}, plan, steps=4)
    assert rates.per_step == pytest.approx(1.0) and rates.per_frame == pytest.approx(4.0 / frames)
    assert rates.fixed == pytest.approx(2.0)
    assert rates.job_seconds(plan, 4) == pytest.approx(14.0)
    assert rates.job_seconds(longer, 4) > 2 * 8.0
    assert JobRates.from_timings({"total": 3}, plan, 4) is None


def test_before_the_first_decode_an_earlier_jobs_speed_or_the_encode_stage_is_used():
    plan = _plan()
    frames = [plan.decode_frames(s) for s in plan.sections]
    known = Remaining.for_plan(plan, steps=2, decode_prior=0.5)
    known.update("sampling", 1, 0, 0.0)
    left = known.update("sampling", 1, 1, 0.1)
    assert left == pytest.approx((1 + 2 * 2) * 0.1 + sum(frames) * 0.5)
    fresh = Remaining.for_plan(plan, steps=2)
    fresh.update("VAE encode", 0, 0, 0.0)
    fresh.update("image encoder", 0, 0, 3.0)             # the VAE encode stage took 3 s: decodes take no less
    fresh.update("sampling", 1, 0, 3.5)
    left = fresh.update("sampling", 1, 1, 3.6)
    assert fresh.encode_s == pytest.approx(3.0)
    assert left == pytest.approx((1 + 2 * 2) * 0.1 + sum(frames) * 3.0 / frames[-1])
