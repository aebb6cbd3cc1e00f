"""Resume in the app: a job stopped with End after its first section continues from its checkpoint (through the
runner, the /resume API and the Resume button in the browser) to the same final frames as an uninterrupted job with
the same settings and seed; folders that cannot be resumed are refused with the reason."""
from __future__ import annotations

import threading

import pytest

from common.errors import InputError
from jobfolder.checkpoint import CHECKPOINT, load_checkpoint
from jobs.runner import Busy
from pipeline.events import Done, SectionVideo
from pipeline.request import Request
from pipeline.sections import make_plan
from tests.conftest import make_image
from tests.server_helpers import Gate, api_job, browser_or_skip, job_info, tiny_runner
from ui.sessions import Sessions
from video.mp4 import read_frames

SETTINGS = dict(prompt="a lighthouse in a storm", seconds=3.6, steps=2, seed=11, teacache=0.1)
PLANNED = make_plan("original", 3.6, 9).frame_counts()[-1]        # 3 sections


def _events(sessions, job, on_event=None):
    out = []
    for batch in sessions.stream(job):
        for event in batch:
            out.append(event)
            if on_event:
                on_event(event)
    return out


def _last_hash(job_dir) -> str:
    return job_info(job_dir)["sections"][-1]["frames_sha256"]


def _assert_same_as(resumed_dir, full_dir):
    info = job_info(resumed_dir)
    assert info["status"] == "done" and info["resumed"] == 1 and info["final"] == "final.mp4"
    assert read_frames(resumed_dir / "final.mp4").shape[0] == PLANNED
    assert _last_hash(resumed_dir) == _last_hash(full_dir)     # the raw frames handed to the encoder
    assert [s["frames_sha256"] for s in info["sections"][-2:]] == \
        [s["frames_sha256"] for s in job_info(full_dir)["sections"][-2:]]


def test_runner_resumes_a_stopped_job_to_the_uninterrupted_result(tmp_path, tiny_original):
    runner = tiny_runner(tmp_path / "out", tiny_original).start()
    sessions = Sessions(runner)
    request = Request(image=make_image(128, 96, seed=5), **SETTINGS)
    full = _events(sessions, sessions.submit(request, session="tab-a"))[-1]
    assert isinstance(full, Done) and not full.stopped and full.frames == PLANNED

    with Gate(tiny_original.vae.decoder) as gate:                # End while section 1 is decoded
        job = sessions.submit(request, session="tab-b")
        stopper = threading.Thread(target=lambda: (gate.wait(), sessions.cancel("tab-b"), gate.release()))
        stopper.start()
        events = _events(sessions, job)
        stopper.join()
    stopped = events[-1]
    assert isinstance(stopped, Done) and stopped.stopped and job.job_dir == stopped.job_dir
    assert sum(isinstance(e, SectionVideo) for e in events) == 1
    assert job_info(stopped.job_dir)["status"] == "stopped" and load_checkpoint(stopped.job_dir)[1]["sections_done"] == 1

    job = sessions.submit_resume(stopped.job_dir, session="tab-b")
    assert job.work.folder == stopped.job_dir.resolve() and job.request.seed == 11
    with pytest.raises(Busy, match="already running or waiting"):    # one job per folder
        sessions.submit_resume(stopped.job_dir, session="tab-c")
    events = _events(sessions, job)
    done = events[-1]
    assert isinstance(done, Done) and not done.stopped and done.frames == PLANNED, done
    assert done.job_dir == stopped.job_dir and sum(isinstance(e, SectionVideo) for e in events) == 2
    _assert_same_as(done.job_dir, full.job_dir)
    assert not runner.busy and runner.store.entries() == []        # the pages' jobs left the queue

    damaged = {"not-json": "{status: stopped", "no-settings": '{"status": "stopped"}', "a-list": "[1, 2]"}
    for name, text in damaged.items():
        folder = tmp_path / "out" / name
        folder.mkdir()
        (folder / "job.json").write_text(text)
        (folder / CHECKPOINT).write_bytes(b"not a checkpoint")
        with pytest.raises(InputError, match=f"{name}/job.json is damaged or incomplete; .*start the job again"):
            sessions.submit_resume(folder, session="tab-d")
    for folder, reason in ((done.job_dir, "already complete"), (full.job_dir, "already complete"),
                           (tmp_path, "not a job folder of this app's outputs"),
                           (tmp_path / "out" / ".." / "out" / "nope", "not a job folder")):
        with pytest.raises(InputError, match=reason):
            sessions.submit_resume(folder, session="tab-d")
    runner.close(timeout=30)


def _job(image, **kw):
    return api_job(image, SETTINGS, **kw)


def _stopped_after_section_1(client, image, tiny_original) -> dict:
    """A /video job ended with /stop while its first section was decoded."""
    with Gate(tiny_original.vae.decoder) as gate:
        job = client.submit(**_job(image), api_name="/video")
        gate.wait()
        assert client.predict(api_name="/stop").startswith("■ Stopping")
    _, summary = job.result(timeout=120)
    assert summary["status"] == "stopped" and summary["frames"] == 33, summary
    return summary


@pytest.fixture(scope="module")
def uninterrupted(client, image, server):
    _, summary = client.predict(**_job(image), api_name="/video")
    assert summary["status"] == "done" and summary["frames"] == PLANNED
    return server.outputs / summary["job_id"]


def test_api_resume_continues_a_stopped_job(server, client, image, tiny_original, uninterrupted):
    from gradio_client.exceptions import AppError

    stopped = _stopped_after_section_1(client, image, tiny_original)
    folder = server.outputs / stopped["job_id"]
    assert (folder / CHECKPOINT).is_file() and job_info(folder)["status"] == "stopped"
    video, resumed = client.predict(stopped["job_id"], api_name="/resume")
    assert resumed["status"] == "done" and resumed["job_id"] == stopped["job_id"] and resumed["frames"] == PLANNED
    assert open(video, "rb").read() == (folder / "final.mp4").read_bytes()
    _assert_same_as(folder, uninterrupted)
    assert server.runner.store.entries() == []                  # API calls' jobs leave the queue when they end

    refusals = [(stopped["job_id"], "already complete"), (uninterrupted.name, "already complete"),
                ("../" + stopped["job_id"], "job_id: there is no job"), ("", "job_id: there is no job"),
                ("/etc", "job_id: there is no job"), ("x" * 500, "job_id: there is no job")]
    jobs = server.jobs()
    for job_id, reason in refusals:
        with pytest.raises(AppError, match=reason):
            client.predict(job_id, api_name="/resume")
    assert server.jobs() == jobs


def test_resume_button_in_the_browser(server, client, image, tiny_original, uninterrupted):
    from tests.browser_helpers import open_chromium, require_browser

    expect = require_browser()

    browser_or_skip()
    stopped = _stopped_after_section_1(client, image, tiny_original)   # the newest job: first in the gallery
    folder = server.outputs / stopped["job_id"]
    with open_chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1600})
        page.set_default_timeout(60_000)
        page.goto(server.url)
        page.locator("text=Past jobs").click()
        thumbnails = page.locator("#jobs-gallery button.thumbnail-item")
        details = "document.querySelector('#job-details')?.innerText"
        thumbnails.first.click()
        page.wait_for_function(f"() => {details}.includes('{stopped['job_id']}')")
        expect(page.locator("#resume-btn")).to_be_enabled()
        thumbnails.nth(1).click()                               # an older job: done or failed early
        page.wait_for_function(f"() => !{details}.includes('{stopped['job_id']}')")
        expect(page.locator("#resume-btn")).to_be_disabled()
        thumbnails.first.click()
        page.wait_for_function(f"() => {details}.includes('{stopped['job_id']}')")
        expect(page.locator("#resume-btn")).to_be_enabled()
        page.locator("#resume-btn").click()
        page.wait_for_function("() => /Done|Failed/.test(document.querySelector('#status').innerText)",
                               timeout=120_000)
        status = page.locator("#status").inner_text()
        assert "Done" in status and f"{PLANNED} frames" in status, status
        expect(page.locator("#start-btn")).to_be_enabled()
        expect(page.locator("#resume-btn")).to_be_disabled()   # the refreshed gallery has no selection
    _assert_same_as(folder, uninterrupted)
