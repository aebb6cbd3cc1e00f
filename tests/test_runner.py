"""The one runner (jobs/runner.py): every job goes through the queue on disk; streams in batches, End on running
and waiting jobs, one job at a time in the order they were queued, the place in line, loading errors."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from common.errors import WeightsNotFound
from jobs import store as qs
from jobs.line import Waiting
from jobs.models import ComponentCache
from jobs.runner import Stop
from pipeline.events import Cancelled, Done, Failed, MemoryReport, Preview, Progress, SectionVideo
from pipeline.request import Request
from tests.conftest import make_image
from tests.server_helpers import Gate, tiny_runner, wait_for
from ui.sessions import SessionBusy, Sessions


@pytest.fixture
def runner(tmp_path, tiny_original):
    r = tiny_runner(tmp_path, tiny_original).start()
    yield r
    r.close(timeout=60)


@pytest.fixture
def sessions(runner):
    return Sessions(runner)


def _request(**kw):
    base = dict(image=make_image(), prompt="a cat", seconds=2.4, steps=2, seed=1)
    base.update(kw)
    return Request(**base)


def _events(sessions, job):
    return [e for b in sessions.stream(job) for e in b]


def test_runs_a_job_in_batches_through_the_queue(runner, sessions):
    job = sessions.submit(_request(), session="s1")
    entry = runner.store.get(job.entry)
    assert entry.status in (qs.WAITING, qs.RUNNING) and entry.origin == "page"
    assert Path(entry.images["image"]).is_file()               # the queue's own copy of the image (given as data)
    batches = list(sessions.stream(job))
    events = [e for b in batches for e in b]
    for b in batches:                                   # at most one video per batch, and it comes last
        videos = [i for i, e in enumerate(b) if isinstance(e, SectionVideo)]
        assert videos in ([], [len(b) - 1])
    assert sum(isinstance(e, SectionVideo) for e in events) == 2
    assert sum(isinstance(e, Preview) for e in events) == 4
    assert events[0].stage == "loading models"
    assert isinstance(events[-2], MemoryReport) and events[-2].records
    assert isinstance(events[-1], Done) and not events[-1].stopped and events[-1].video.is_file()
    assert job.finished and not runner.busy
    assert runner.store.get(job.entry) is None                 # a page's job leaves the queue when it ends
    sessions.submit(_request(), session="s1")                     # the session may start again


def test_end_stops_the_running_job_and_keeps_the_video(runner, sessions):
    job = sessions.submit(_request(seconds=3.6), session="s1")
    assert sessions.cancel("s2") == "Nothing to stop."
    events = []
    stopped = False
    for batch in sessions.stream(job):
        events += batch
        # End once section 2 samples (section 1's video is written meanwhile, on the writer thread)
        if not stopped and any(isinstance(e, Progress) and e.stage == "sampling" and e.section == 2 for e in batch):
            assert sessions.cancel("s1").startswith("Stopping at the next step")
            stopped = True
    done = events[-1]
    assert isinstance(done, Done) and done.stopped and done.video is not None and done.video.is_file()
    assert sum(isinstance(e, SectionVideo) for e in events) == 1 and done.frames == 33
    assert sessions.cancel("s1") == "Nothing to stop."


def test_end_on_a_waiting_job_drops_it_and_a_closed_tab_too(runner, sessions, tmp_path):
    first = sessions.submit(_request(seconds=3.6), session="s0")         # holds the runner
    job = sessions.submit(_request(), session="s1")
    with pytest.raises(SessionBusy):
        sessions.submit(_request(), session="s1")
    assert sessions.cancel("s1").startswith("Cancelled")
    assert job.finished and runner.store.get(job.entry) is None
    events = _events(sessions, job)
    assert len(events) == 1 and isinstance(events[0], Cancelled)
    again = sessions.submit(_request(), session="s1")                     # Start works again right away
    sessions.drop_waiting("s1")                                           # its tab was closed while it waited
    assert again.finished and runner.store.get(again.entry) is None
    assert runner.stop(first.entry) is Stop.STOPPING and runner.stop("no-such-entry") is Stop.NOTHING   # typed
    assert isinstance(_events(sessions, first)[-1], Done)


def test_jobs_run_one_at_a_time_in_the_order_they_were_queued_and_waiting_ones_hear_their_place(runner, sessions,
                                                                                                 tiny_original,
                                                                                                 monkeypatch):
    """The streams are opened in the opposite order: the first queued job still runs first; a waiting job hears
    how many jobs are ahead and, once a job has been timed, the expected wait."""
    first = sessions.submit(_request(seconds=1.2, steps=2), session="tab-1")
    _events(sessions, first)                               # a finished job: the runner knows the speed now
    ran: list = []                     # what the executor ran, in its own order (a tab hears it a moment later)
    run = runner.executor.run

    def recording(work, cancel, split=None):
        ran.append(("start", work.entry))
        yield from run(work, cancel, split)
        ran.append(("end", work.entry))

    monkeypatch.setattr(runner.executor, "run", recording)
    assert sessions.line.speed.rates is not None and sessions.expected_seconds(_request(seconds=1.2, steps=2)) > 0
    log: list = []

    def consume(name, job):
        for batch in sessions.stream(job):
            for e in batch:
                log.append((name, time.monotonic(), e))

    # the first job is held in its VAE decode until the last one has heard its place (a tiny job takes less than
    # the second a waiting job waits before it is told: the line would be empty before anyone waited)
    with Gate(tiny_original.vae.decoder) as gate:
        a = sessions.submit(_request(seconds=1.2, steps=2), session="tab-a")
        b = sessions.submit(_request(seconds=1.2, steps=2, seed=2), session="tab-b")
        c = sessions.submit(_request(seconds=1.2, steps=2, seed=3), session="tab-c")
        threads = [threading.Thread(target=consume, args=(n, j)) for n, j in (("c", c), ("b", b), ("a", a))]
        for t in threads:
            t.start()
            time.sleep(0.2)
        gate.wait()
        wait_for(lambda: any(n == "c" and isinstance(e, Waiting) for n, _, e in list(log)), 60, 0.05,
                 what="the last job to hear its place")
    for t in threads:
        t.join(180)
    assert all(isinstance(next(e for m, _, e in reversed(log) if m == n), Done) for n in "abc")
    assert ran == [(when, j.entry) for j in (a, b, c) for when in ("start", "end")]     # in order, one at a time
    c_waits = [e for n, _, e in log if n == "c" and isinstance(e, Waiting)]
    assert c_waits and c_waits[0].ahead >= 1 and c_waits[0].wait_s is not None
    pairs = list(zip(c_waits, c_waits[1:]))
    assert all(b.ahead <= a.ahead for a, b in pairs)                            # its place never goes back
    assert all((a.ahead, a.wait_s) != (b.ahead, b.wait_s) for a, b in pairs)    # told again when its place or its
                                                                                # expected wait changed, only then


def test_missing_weights_and_loader_crashes_end_the_job_not_the_runner(tmp_path, tiny_original):
    calls = []

    def loader(preset, mode, model_dir):
        calls.append(mode)
        if len(calls) == 1:
            raise WeightsNotFound("transformer: the weights of x are not in the cache. Try --preset tiny.")
        if len(calls) == 2:
            raise RuntimeError("disk on fire")
        return tiny_original

    runner = tiny_runner(tmp_path, tiny_original)
    runner.executor.models = ComponentCache("tiny", loader=loader)
    runner.start()
    sessions = Sessions(runner)
    try:
        for expected in ("Try --preset tiny", "RuntimeError: disk on fire"):
            job = sessions.submit(_request(), session="s")
            events = _events(sessions, job)
            assert isinstance(events[-1], Failed) and expected in events[-1].message
        job = sessions.submit(_request(seconds=1.2), session="s")
        assert isinstance(_events(sessions, job)[-1], Done)
    finally:
        runner.close(timeout=60)


def test_component_cache_keeps_one_set_for_real_weights():
    loads = []
    cache = ComponentCache("hunyuan", loader=lambda p, mode, d: loads.append(mode) or f"models-{mode}")
    assert cache.get("original") == "models-original" and cache.get("original") == "models-original"
    assert cache.get("f1") == "models-f1" and cache.loaded_modes() == ["f1"]
    assert loads == ["original", "f1"]
    tiny = ComponentCache("tiny", loader=lambda p, mode, d: mode)
    tiny.get("original"), tiny.get("f1")
    assert tiny.loaded_modes() == ["original", "f1"]


def test_the_images_are_copied_when_the_job_is_queued(runner, sessions, tmp_path):
    """A job's upload may be deleted (Gradio's temp sweeper) while the job waits: the job reads the queue's copy,
    and its folder keeps the user's file untouched."""
    upload = tmp_path / "upload-dir" / "photo.PNG"
    upload.parent.mkdir()
    make_image(100, 90, seed=4).save(upload, format="PNG")
    job = sessions.submit(_request(image=str(upload), seconds=1.2), session="s1")
    copy = Path(runner.store.get(job.entry).images["image"])
    assert copy.is_file() and copy != upload and copy.read_bytes() == upload.read_bytes()
    original = upload.read_bytes()
    upload.unlink()                                                   # swept while waiting
    done = _events(sessions, job)[-1]
    assert isinstance(done, Done), done
    assert (done.job_dir / "upload.png").read_bytes() == original
    assert not copy.exists() and not copy.parent.exists()             # deleted with the entry


def test_a_queued_job_of_another_process_runs_here_and_stays_listed(runner, tmp_path, image_file=None):
    """An entry added straight to the store (the command line's `queue add`, another app) is prepared when its turn
    comes, run, and stays in the queue with its status."""
    path = tmp_path / "in.png"
    make_image(96, 80).save(path)
    (entry,) = runner.store.add_many([{"image": str(path), "prompt": "from elsewhere", "seconds": 1.2, "steps": 2}])
    runner.wake()
    deadline = time.monotonic() + 120
    while runner.store.get(entry.id).status not in qs.FINISHED and time.monotonic() < deadline:
        time.sleep(0.2)
    done = runner.store.get(entry.id)
    assert done.status == qs.DONE and done.job_dir and (tmp_path / done.job_dir / "final.mp4").is_file()


def test_an_entry_of_a_complete_job_folder_ends_done_and_says_what_it_made(runner, tmp_path):
    """A queue entry continuing a folder whose job is done (its runner died after the end) is over: the runner knows
    it by the refusal's type (pipeline.resume.AlreadyComplete), and the command line following it reads the video
    and its frames from job.json, not from the entry's message."""
    from cli.commands import _as_event
    from jobfolder.folder import Job
    from pipeline.resume import AlreadyComplete, prepare_resume

    settings = _request().settings()
    job = Job.create(tmp_path, settings, {"preset": "tiny"})
    job.path("final.mp4").write_bytes(b"a video")
    job.finish("done", job.path("final.mp4"), frames=37)
    with pytest.raises(AlreadyComplete):
        prepare_resume(job.dir)
    entry = runner.store.add(settings, origin="cli", job_dir=job.dir.name)
    runner.store.update(entry.id, message="done: 99 frames, other.mp4")        # whatever the message says
    runner.wake()
    deadline = time.monotonic() + 60
    while runner.store.get(entry.id).status not in qs.FINISHED and time.monotonic() < deadline:
        time.sleep(0.1)
    ended = runner.store.get(entry.id)
    assert ended.status == qs.DONE
    assert _as_event(ended, tmp_path) == Done(job.dir, job.dir / "final.mp4", 37, False)
