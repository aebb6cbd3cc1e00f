"""Extending a video from the page (issues 14, 32), in headless Chromium against the app on the tiny preset: a clip is
dropped into "Video to extend" (no start image), mode F1, Start; the job finishes with the clip's frames followed
by the new section, and job.json names the clip and its hash. The note under the extension options says which way
the job extends (the original mode: before the video; F1: after it); then the same clip in the original mode ends
the video made before it."""
from __future__ import annotations

import numpy as np
import pytest

from common.files import file_sha256
from tests.browser_helpers import require_browser, set_number, wait_status
from tests.extend_helpers import W, moving_frames, write_video
from tests.server_helpers import job_info
from video.mp4 import read_frames

pytestmark = pytest.mark.slow
expect = require_browser()


SERVER_MODE = "f1"          # conftest's `server`: the app on the tiny F1 models


def _page(browser, server, clip):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(120_000)
    page.goto(server.url)
    page.wait_for_selector("#start-btn")
    page.locator("#extend-group").get_by_text("Extend a video").first.click()     # the group under Start
    page.locator("#extend-video input[type=file]").set_input_files(str(clip))
    page.wait_for_selector("#extend-video video")
    page.locator("#prompt textarea").fill("the waves keep rolling in")
    set_number(page, "seconds", 1.2)
    set_number(page, "steps", 2)
    return page


def test_extend_a_video_from_the_page(server, browser, tmp_path):
    clip = write_video(tmp_path / "holiday.mp4", moving_frames(45))
    page = _page(browser, server, clip)
    note = page.locator("#extend-note")          # the original mode would put the new part before the video
    note.filter(has_text="goes before the video").wait_for()
    page.locator("#mode label").filter(has_text="F1").click()
    note.filter(has_text="continues after the last frame").wait_for()
    set_number(page, "context-frames", 5)        # the control reaches job.json
    before = {d.name for d in server.outputs.iterdir()}
    page.locator("#start-btn").click()
    status = wait_status(page, "Done", "Failed", "⚠", timeout=300_000)
    assert "Done" in status, status
    (job,) = [d for d in server.outputs.iterdir() if d.name not in before and not d.name.startswith(".")]
    info = job_info(job)
    assert info["status"] == "done" and info["source"]["sha256"] == file_sha256(clip)
    assert info["settings"]["context_frames"] == 5
    assert info["source"]["path"].endswith(".mp4") and info["source"]["frames"] == 45
    forward = read_frames(job / "final.mp4")
    assert forward.shape[0] == 45 + 4 * W

    # the original mode extends backwards (issue 32): the new part goes before the clip, the video ends with it
    page.locator("#mode label").filter(has_text="Original").click()
    note.filter(has_text="goes before the video").wait_for()
    before = {d.name for d in server.outputs.iterdir()}
    page.locator("#start-btn").click()
    page.wait_for_function("() => !document.querySelector('#status').innerText.includes('Done')")
    status = wait_status(page, "Done", "Failed", "⚠", timeout=300_000)
    assert "Done" in status, status
    (job,) = [d for d in server.outputs.iterdir() if d.name not in before and not d.name.startswith(".")]
    assert job_info(job)["settings"]["mode"] == "original"
    backward = read_frames(job / "final.mp4")
    assert backward.shape[0] > 45
    # the clip's last frames (kept as they are; its first ones cross-fade into the new part) close the video: close to
    # the clip as the job read it (re-encoded: close, not equal); a forward extension's last frames are new ones
    from pipeline.request import Request, prepare

    clip_in = prepare(Request(input_video=clip, prompt="x", seconds=1.2, steps=2), 64).source.frames.astype(int)

    def off(video):
        return float(np.abs(video[-8:].astype(int) - clip_in[-8:]).mean())

    assert off(backward) < 6 < off(forward), (off(backward), off(forward))

    # with an end image the original mode goes the other way: after the clip, toward the end image
    from tests.conftest import make_image

    make_image(96, 72, seed=9).save(tmp_path / "end.png")
    page.locator("#end-image input[type=file]").set_input_files(str(tmp_path / "end.png"))
    note.filter(has_text="ends at the end image").wait_for()
    before = {d.name for d in server.outputs.iterdir()}
    page.locator("#start-btn").click()
    page.wait_for_function("() => !document.querySelector('#status').innerText.includes('Done')")
    assert "Done" in wait_status(page, "Done", "Failed", "⚠", timeout=300_000)
    (job,) = [d for d in server.outputs.iterdir() if d.name not in before and not d.name.startswith(".")]
    assert job_info(job)["source"]["direction"] == "to end frame"
    assert read_frames(job / "final.mp4").shape[0] == 45 + 4 * W
    page.close()
