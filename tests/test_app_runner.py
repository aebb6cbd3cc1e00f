"""The job runner: streaming batches, End (running and waiting jobs), one job at a time, loading errors."""
from __future__ import annotations

import threading
import time

import pytest
import torch

from pipeline.errors import WeightsNotFound
from pipeline.events import Done, Failed, Preview, Progress, SectionVideo
from pipeline.request import Request
from tests.conftest import make_image
from ui.models import ComponentCache
from ui.runner import Cancelled, JobRunner, MemoryReport, SessionBusy


def _runner(tmp_path, loader):
    return JobRunner(ComponentCache("tiny", loader=loader), tmp_path, vram_cap_gb=20, device=torch.device("cpu"))


@pytest.fixture
def runner(tmp_path, tiny_original):
    return _runner(tmp_path, lambda preset, mode, model_dir: tiny_original)


def _request(**kw):
    base = dict(image=make_image(), prompt="a cat", seconds=2.4, steps=2, seed=1)
    base.update(kw)
    return Request(**base)


def test_runs_a_job_in_batches(runner):
    ticket = runner.reserve("s1", _request())
    batches = list(runner.run(ticket))
    events = [e for b in batches for e in b]
    for b in batches:                                   # at most one video per batch, and it comes last
        videos = [i for i, e in enumerate(b) if isinstance(e, SectionVideo)]
        assert videos in ([], [len(b) - 1])
    assert sum(isinstance(e, SectionVideo) for e in events) == 2
    assert sum(isinstance(e, Preview) for e in events) == 4
    assert events[0].stage == "loading models"
    assert isinstance(events[-2], MemoryReport) and events[-2].records
    assert isinstance(events[-1], Done) and not events[-1].stopped and events[-1].video.is_file()
    assert ticket.finished and not runner.busy
    runner.reserve("s1", _request())                     # the session may start again


def test_end_stops_the_running_job_and_keeps_the_video(runner):
    ticket = runner.reserve("s1", _request(seconds=3.6))
    assert runner.cancel("s2") == "Nothing to stop."
    events = []
    stopped = False
    for batch in runner.run(ticket):
        events += batch
        # End once section 2 samples (section 1's video is written meanwhile, on the writer thread)
        if not stopped and any(isinstance(e, Progress) and e.stage == "sampling" and e.section == 2 for e in batch):
            assert runner.cancel("s1").startswith("Stopping at the next step")
            stopped = True
    done = events[-1]
    assert isinstance(done, Done) and done.stopped and done.video is not None and done.video.is_file()
    assert sum(isinstance(e, SectionVideo) for e in events) == 1 and done.frames == 33
    assert runner.cancel("s1") == "Nothing to stop."


def test_end_on_a_waiting_job_drops_it(runner):
    ticket = runner.reserve("s1", _request())
    with pytest.raises(SessionBusy):
        runner.reserve("s1", _request())
    assert runner.cancel("s1").startswith("Cancelled")
    assert ticket.finished
    events = [e for b in runner.run(ticket) for e in b]
    assert len(events) == 1 and isinstance(events[0], Cancelled)
    runner.reserve("s1", _request())                     # Start works again right away


def test_closed_tab_drops_its_waiting_job(runner):
    ticket = runner.reserve("s1", _request())
    runner.drop_waiting("s1")
    assert ticket.cancel.cancelled and runner.current("s1") is None


def test_one_job_at_a_time(runner):
    a = runner.reserve("tab-a", _request(seconds=1.2, steps=2))
    b = runner.reserve("tab-b", _request(seconds=1.2, steps=2, seed=2))
    log: list[tuple[str, float, object]] = []
    a_sampling = threading.Event()

    def consume(name, ticket):
        for batch in runner.run(ticket):
            for e in batch:
                log.append((name, time.monotonic(), e))
                if isinstance(e, Preview):
                    a_sampling.set()

    ta = threading.Thread(target=consume, args=("a", a))
    ta.start()
    assert a_sampling.wait(60)
    tb = threading.Thread(target=consume, args=("b", b))
    tb.start()
    ta.join(120)
    tb.join(120)
    b_events = [e for n, _, e in log if n == "b"]
    assert isinstance(b_events[0], Progress) and b_events[0].stage == "waiting for the GPU"
    a_done = next(t for n, t, e in log if n == "a" and isinstance(e, Done))
    b_first_work = next(t for n, t, e in log if n == "b" and isinstance(e, Progress) and e.stage == "text encoders")
    assert b_first_work > a_done
    assert isinstance(b_events[-1], Done) and not b_events[-1].stopped


def test_missing_weights_and_loader_crashes_end_the_job_not_the_app(tmp_path, tiny_original):
    calls = []

    def loader(preset, mode, model_dir):
        calls.append(mode)
        if len(calls) == 1:
            raise WeightsNotFound("transformer: the weights of x are not in the cache. Try --preset tiny.")
        if len(calls) == 2:
            raise RuntimeError("disk on fire")
        return tiny_original

    runner = _runner(tmp_path, loader)
    for expected in ("Try --preset tiny", "RuntimeError: disk on fire"):
        ticket = runner.reserve("s", _request())
        events = [e for b in runner.run(ticket) for e in b]
        assert isinstance(events[-1], Failed) and expected in events[-1].message and events[-1].detail
    ticket = runner.reserve("s", _request(seconds=1.2))
    assert isinstance([e for b in runner.run(ticket) for e in b][-1], Done)


def test_component_cache_keeps_one_set_for_real_weights():
    loads = []
    cache = ComponentCache("hunyuan", loader=lambda p, mode, d: loads.append(mode) or f"models-{mode}")
    assert cache.get("original") == "models-original" and cache.get("original") == "models-original"
    assert cache.get("f1") == "models-f1" and cache.loaded_modes() == ["f1"]
    assert loads == ["original", "f1"]
    tiny = ComponentCache("tiny", loader=lambda p, mode, d: mode)
    tiny.get("original"), tiny.get("f1")
    assert tiny.loaded_modes() == ["original", "f1"]
