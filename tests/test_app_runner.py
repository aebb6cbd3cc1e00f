"""The job runner: streaming batches, End (running and waiting jobs), one job at a time, loading errors."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from common.errors import WeightsNotFound
from pipeline.events import Done, Failed, Preview, Progress, SectionVideo
from pipeline.request import Request
from tests.conftest import make_image
from jobs.models import ComponentCache
from ui.runner import Cancelled, JobRunner, MemoryReport, SessionBusy, Waiting


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
    # one job ahead, whose own ETA (it is sampling) is the wait
    assert isinstance(b_events[0], Waiting) and b_events[0].ahead == 1 and b_events[0].wait_s is not None
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


def _consume(runner, ticket, log, name):
    for batch in runner.run(ticket):
        for e in batch:
            log.append((name, time.monotonic(), e))


def test_jobs_run_in_the_order_they_were_reserved_and_waiting_ones_hear_their_place(runner):
    """The streams are opened in the opposite order (as Gradio may hand the events over): the first reserved
    job still runs first; each waiting job hears how many jobs are ahead and, once a job has been timed, the
    estimated wait."""
    first = runner.reserve("tab-1", _request(seconds=1.2, steps=2))
    list(runner.run(first))                               # a finished job: the runner knows the speed now
    assert runner.rates is not None and runner.expected_seconds(_request(seconds=1.2, steps=2)) > 0
    a = runner.reserve("tab-a", _request(seconds=1.2, steps=2))
    b = runner.reserve("tab-b", _request(seconds=1.2, steps=2, seed=2))
    c = runner.reserve("tab-c", _request(seconds=1.2, steps=2, seed=3))
    assert runner.waiting(a) is None
    assert runner.waiting(b).ahead == 1 and runner.waiting(c).ahead == 2
    assert 0 < runner.waiting(b).wait_s < runner.waiting(c).wait_s
    log: list = []
    threads = [threading.Thread(target=_consume, args=(runner, t, log, n)) for n, t in (("c", c), ("b", b))]
    for t in threads:
        t.start()
        time.sleep(0.3)
    time.sleep(0.5)
    assert not any(isinstance(e, Progress) for _, _, e in log)     # b and c wait for a, whose stream is not open
    _consume(runner, a, log, "a")
    for t in threads:
        t.join(120)
    done_at = {n: t for n, t, e in log if isinstance(e, Done)}
    assert done_at["a"] < done_at["b"] < done_at["c"]
    c_waits = [e.ahead for n, _, e in log if n == "c" and isinstance(e, Waiting)]
    assert c_waits[0] == 2 and c_waits[-1] == 1                      # told again when its place changed


def test_the_images_are_copied_when_the_job_is_reserved(runner, tmp_path):
    """A job's upload may be deleted (Gradio's temp sweeper) while the job waits: the job reads the runner's own
    copy, and its folder keeps the user's file untouched."""
    upload = tmp_path / "upload-dir" / "photo.PNG"
    upload.parent.mkdir()
    make_image(100, 90, seed=4).save(upload, format="PNG")
    ticket = runner.reserve("s1", _request(image=str(upload), seconds=1.2))
    staged = Path(ticket.request.image)
    assert staged.is_file() and staged != upload and staged.read_bytes() == upload.read_bytes()
    original = upload.read_bytes()
    upload.unlink()                                                   # swept while waiting
    events = [e for b in runner.run(ticket) for e in b]
    done = events[-1]
    assert isinstance(done, Done), events[-1]
    kept = done.job_dir / "upload.png"
    assert kept.read_bytes() == original
    assert not staged.exists() and not staged.parent.exists()         # deleted with the ticket
    cancelled = runner.reserve("s2", _request(image=str(kept), seconds=1.2))
    runner.cancel("s2")
    assert not Path(cancelled.request.image).exists()
