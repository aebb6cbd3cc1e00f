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


def test_a_jobs_stage_trims_scan_only_the_job_and_the_job_end_trim_everything(tiny_original, tmp_path, monkeypatch):
    seen = []
    collect = gc.collect

    def recording(*args, **kwargs):
        seen.append(gc.get_freeze_count())
        return collect(*args, **kwargs)

    monkeypatch.setattr(gc, "collect", recording)
    _, last = run_job(Request(image=make_image(), prompt="a fox", seconds=1, steps=2, seed=1), tiny_original,
                      tmp_path)
    assert isinstance(last, Done)
    stage_trims, job_end = seen[:-1], seen[-1]
    assert len(stage_trims) >= 5 and all(n > 0 for n in stage_trims)    # encoders, transformer, decode: frozen
    assert job_end == 0                                                 # the job-end trim sees the whole heap
