"""The heap a job's trims scan (rocm/allocator.py job_heap): only what the job made; everything again after it."""
from __future__ import annotations

import gc

import pytest

import rocm
from pipeline.events import Done
from pipeline.request import Request
from tests.conftest import make_image, run_job


def test_the_heap_is_frozen_inside_the_block_and_given_back_whatever_ends_it():
    before = gc.get_freeze_count()
    with rocm.job_heap():
        assert gc.get_freeze_count() > before           # what existed at the start is left out of collections
    assert gc.get_freeze_count() == 0
    with pytest.raises(RuntimeError):
        with rocm.job_heap():
            raise RuntimeError("a failed stage")
    assert gc.get_freeze_count() == 0


def test_a_jobs_trims_scan_only_the_job_and_a_full_pass_ends_a_job_every_30_s(tiny_original, tmp_path, monkeypatch):
    """Every trim of a job (its stages', its end's) leaves the old heap frozen; the heap given back at its end is
    collected whole when the last full pass is 30 s old (or there was none): not after a job right behind another."""
    from rocm import allocator

    seen = []
    collect = gc.collect
    clock = [1000.0]

    def recording(*args, **kwargs):
        seen.append(gc.get_freeze_count())
        return collect(*args, **kwargs)

    monkeypatch.setattr(gc, "collect", recording)
    monkeypatch.setattr(allocator, "_last_full_pass", None)
    monkeypatch.setattr(allocator, "_clock", lambda: clock[0])

    def job(seed):
        seen.clear()
        _, last = run_job(Request(image=make_image(), prompt="a fox", seconds=1, steps=2, seed=seed), tiny_original,
                          tmp_path / str(seed))
        assert isinstance(last, Done)
        return list(seen)

    first = job(1)
    trims, full = first[:-1], first[-1]
    assert len(trims) >= 6 and all(n > 0 for n in trims)     # encoders, transformer, decode, the job's end: frozen
    assert full == 0                                          # then the whole heap, once
    clock[0] += allocator.FULL_PASS_EVERY_S - 1
    assert all(n > 0 for n in job(2))                         # a job right behind it: no full pass
    clock[0] += 1
    assert job(3)[-1] == 0                                    # 30 s after the last one: a full pass again
