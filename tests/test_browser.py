"""The real UI in headless Chromium (Playwright) against `python app.py --preset tiny` on 127.0.0.1.

Covers the issue's "done when": a broken upload is refused with a message and the same session then runs a good job whose
latent preview changes while sampling, whose section videos arrive before the end and whose final video loads;
End stops a running job and keeps its video while a second tab's job waits in the queue (and is told its
position); Start works again afterwards; the job appears in "Past jobs" and "Reuse settings" fills the controls.
Screenshots go to test-artifacts/browser/.

Skipped only when /usr/bin/chromium (or Playwright) is missing and STEADYFRAME_REQUIRE_BROWSER is not set;
CI sets it, so a missing browser fails there instead of skipping silently.
"""
from __future__ import annotations

import pytest

from tests.browser_helpers import fill_job, require_browser
from tests.browser_helpers import wait_status as _wait_status
from tests.server_helpers import ROOT, app_process

ARTIFACTS = ROOT / "test-artifacts" / "browser"

expect = require_browser()

# Records every change of the preview image and of the video, with the status shown at that moment.
OBSERVER_JS = """() => {
  const rec = window.__sf = {previews: [], videos: []};
  const note = (list, src) => {
    if (src && (list.length === 0 || list[list.length - 1].src !== src))
      list.push({src, status: document.querySelector('#status')?.innerText || '',
                 stage: document.querySelector('#progress .sf-progress')?.dataset.stage || ''});
  };
  const check = () => {
    note(rec.previews, document.querySelector('#preview img')?.getAttribute('src'));
    note(rec.videos, document.querySelector('#result-video video')?.getAttribute('src'));
  };
  new MutationObserver(check).observe(document.body, {subtree: true, childList: true, attributes: true,
                                                      attributeFilter: ['src']});
  check();
}"""
RESET_JS = "() => { window.__sf.previews = []; window.__sf.videos = []; }"
VIDEO_LOADED_JS = """() => { const v = document.querySelector('#result-video video');
  return !!v && v.readyState >= 1 && v.duration > 0; }"""


@pytest.fixture(scope="module")
def app_in_own_process(tmp_path_factory):
    """`python app.py --preset tiny` as a user starts it, on a free port, writing into a temporary outputs/."""
    outputs = tmp_path_factory.mktemp("outputs")
    with app_process(outputs, log_path=ARTIFACTS / "app.log") as (url, _proc):
        yield url, outputs


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    from tests.conftest import make_image

    d = tmp_path_factory.mktemp("images")
    make_image(96, 80).save(d / "start.png")
    (d / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"definitely not the rest of a PNG file")
    return d


def _open(browser, url):
    page = browser.new_page(viewport={"width": 1400, "height": 1500})
    page.set_default_timeout(120_000)   # generous: CI machines may be busy
    page.goto(url)
    page.wait_for_selector("#start-btn")
    page.evaluate(OBSERVER_JS)
    return page


def _fill_job(page, image, *, seconds=2.4, steps=6, **kw):
    fill_job(page, image, seconds=seconds, steps=steps, **kw)


def _shot(page, name):
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def test_broken_image_then_a_good_job_streams_previews_and_videos(app_in_own_process, browser, images):
    url, outputs = app_in_own_process
    page = _open(browser, url)
    try:
        # 1. a broken upload: refused as it arrives, with a short message next to the controls (and a toast)
        _fill_job(page, images / "broken.png")
        status = _wait_status(page, "Start image:")
        assert "not a readable image" in status
        assert page.locator(".toast-body, [class*=toast-message]").filter(has_text="not a readable image").count()
        expect(page.locator("#start-btn")).to_be_enabled()
        _shot(page, "01_broken_image_message")

        # 2. a good job in the same session: 3 sections × 6 steps (sections 1 and 2 are surely intermediate;
        #    the last section's video may be replaced by final.mp4 within one browser frame)
        _fill_job(page, images / "start.png", seconds=3.6)
        page.evaluate(RESET_JS)
        page.locator("#start-btn").click()
        page.wait_for_function("() => window.__sf.previews.length >= 2")
        _shot(page, "02_sampling_preview")
        status = _wait_status(page, "Done", "Failed")
        assert "Done" in status, status
        page.wait_for_function(VIDEO_LOADED_JS, timeout=60_000)
        _shot(page, "03_done")
        rec = page.evaluate("() => window.__sf")

        sampling_previews = {r["src"] for r in rec["previews"] if r["stage"] == "sampling"}
        assert len(sampling_previews) >= 2, rec["previews"]
        videos = [r["src"] for r in rec["videos"]]
        sections = [v for v in videos if "section_" in v]
        assert len(set(sections)) >= 2, videos
        final_at = max(i for i, v in enumerate(videos) if "final" in v)
        assert all(videos.index(v) < final_at for v in sections), videos
        assert page.evaluate("document.querySelector('#result-video video').duration") > 0

        # progress bar, log panel, memory timeline and timings
        assert "section 3/3" in page.locator("#progress").inner_text()
        log_text = page.locator("#log textarea").input_value()
        assert "CPU run" in log_text and "VAE decode" in log_text
        page.locator("#timings").scroll_into_view_if_needed()       # the report opened by itself after the job
        expect(page.locator("#memory-plot img")).to_be_visible()
        assert "transformer" in page.locator("#timings").inner_text()
        _shot(page, "04_memory_and_timings")

        # past jobs: the gallery lists the job; "Reuse settings" fills the controls from its job.json
        page.locator("#prompt textarea").fill("something else")
        page.locator("text=Past jobs").click()
        page.locator("#jobs-gallery button.thumbnail-item").first.click()
        page.wait_for_function("() => document.querySelector('#job-details')?.innerText.includes('a cat walks')")
        page.locator("#reuse-btn").click()
        page.wait_for_function("() => document.querySelector('#prompt textarea').value.includes('a cat walks')")
        assert page.locator("#steps input[type=number]").input_value() == "6"
        _shot(page, "05_past_jobs_reuse")
    finally:
        page.close()


def test_end_stops_a_running_job_while_another_tab_waits(app_in_own_process, browser, images):
    url, _ = app_in_own_process
    a, b = _open(browser, url), _open(browser, url)
    try:
        # long (8 sections of 25 steps): End lands long before its end, also on a loaded machine (with 8 steps a
        # section it once finished first)
        _fill_job(a, images / "start.png", seconds=9.6, steps=25)
        _fill_job(b, images / "start.png", prompt="the second tab", seconds=1.2, steps=3)
        a.locator("#start-btn").click()
        a.wait_for_function("() => window.__sf.previews.length >= 1")
        b.locator("#start-btn").click()
        # the second tab is told it waits: Gradio's queue position on the progress area, our note in the status
        b.wait_for_function("() => /queue|Waiting/i.test(document.querySelector('#progress').innerText)")
        # (before its Start the second tab showed the first one's job, "Running…": issue 44, the page follows the runner)
        assert "Waiting for the GPU" in _wait_status(b, "Waiting for the GPU", "Done", "Failed")
        _shot(b, "06_second_tab_waiting")

        # End once the first section's video is there; the job stops at its next step and keeps that video
        a.wait_for_function("() => window.__sf.videos.some(v => v.src.includes('section_01'))", timeout=180_000)
        a.locator("#end-btn").click()
        status = _wait_status(a, "Stopped", "Done", "Failed")
        assert "Stopped" in status and "kept the video" in status, status
        a.wait_for_function(VIDEO_LOADED_JS, timeout=60_000)
        expect(a.locator("#start-btn")).to_be_enabled()
        expect(a.locator("#end-btn")).to_be_disabled()
        _shot(a, "07_stopped_video_kept")

        # the waiting tab runs next; the first tab can start again right away (and queues behind it)
        assert "Done" in _wait_status(b, "Done", "Failed")
        a.evaluate(RESET_JS)
        _fill_job(a, images / "start.png", seconds=1.2, steps=3)
        a.locator("#start-btn").click()
        assert "Done" in _wait_status(a, "Done", "Failed")
        a.wait_for_function(VIDEO_LOADED_JS, timeout=60_000)
        _shot(a, "08_started_again")
    finally:
        a.close()
        b.close()
