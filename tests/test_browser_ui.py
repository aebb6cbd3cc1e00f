"""The page as a new user meets it (issue 18), in headless Chromium against the app on the tiny preset: one test per
problem found in a real browser, on a desktop (1280×900) and, where the layout matters, a phone (390×844) viewport.
Screenshots of both layouts go to test-artifacts/browser-ui/.

The app runs in this process (tests/server_helpers.launched) so that a test can hold a job at an exact point (a
Gate on a model) and read the job folders. Skipped only without Chromium/Playwright and without
STEADYFRAME_REQUIRE_BROWSER (CI sets it: a missing browser fails there).
"""
from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from tests.browser_helpers import (
    PageTimeout,
    fill_job,
    open_newest_past_job,
    require_browser,
    set_number,
    wait_ready,
)
from tests.browser_helpers import status as _status
from tests.browser_helpers import wait_status as _wait_status
from tests.server_helpers import ROOT, Gate, job_info, wait_for

pytestmark = pytest.mark.slow
ARTIFACTS = ROOT / "test-artifacts" / "browser-ui"
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}

expect = require_browser()


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    from tests.conftest import make_image

    d = tmp_path_factory.mktemp("images")
    make_image(96, 80).save(d / "start.png")           # the tiny preset crops it to 64×48: below the 64-pixel minimum
    (d / "notes.txt").write_text("these are my notes, not a picture\n")
    (d / "fake.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"not the rest of a PNG")
    return d


def _open(browser, server, viewport=DESKTOP):
    page = browser.new_page(viewport=viewport)
    page.set_default_timeout(120_000)
    page.goto(server.url)
    wait_ready(page)
    return page


def _shot(page, name, full=True):
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=full)


def _fill(page, image, **kw):
    fill_job(page, image, wait_image=True, **kw)


def _start_and_wait(page, *words):
    """Start, wait until the previous job's status is gone, then for one of `words`."""
    page.locator("#start-btn").click()
    page.wait_for_function("() => !/Done|Stopped|Failed/.test(document.querySelector('#status').innerText)")
    return _wait_status(page, *words)


def _progress(page) -> str:
    return page.locator("#progress").inner_text()


def _eta_seconds(text: str) -> float | None:
    m = re.search(r"ETA (?:(\d+) h )?(?:(\d+) min )?(\d+) s|ETA (\d+) h (\d+) min", text)
    if not m:
        return None
    if m.group(4):
        return int(m.group(4)) * 3600 + int(m.group(5)) * 60
    return int(m.group(1) or 0) * 3600 + int(m.group(2) or 0) * 60 + int(m.group(3))


def _in_view(page, selector) -> bool:
    return page.evaluate(f"""() => {{ const r = document.querySelector({selector!r}).getBoundingClientRect();
        return r.height > 0 && r.bottom > 0 && r.top < window.innerHeight; }}""")


def _first_block(server):
    """The transformer's first block: called once per sampling step (the top module is not called as a whole)."""
    return server.runner.models.get("original").transformer.transformer_blocks[0]


def _newest_job(server, before: set):
    return wait_for(lambda: next(iter(sorted(set(server.jobs()) - before)), None), 60, what="a new job folder")


# ---- 1. Reuse settings, then Start ---------------------------------------------------------------------------------
def test_reuse_settings_restores_the_upload_and_the_reused_job_starts(server, browser, images):
    page = _open(browser, server)
    try:
        before = set(server.jobs())
        _fill(page, images / "start.png", prompt="the job to reuse")
        page.locator("#start-btn").click()
        assert "Done" in _wait_status(page, "Done", "Failed")
        job = _newest_job(server, before)
        assert (job / "upload.png").read_bytes() == (images / "start.png").read_bytes()   # the user's file, kept

        # 9d: the memory and timings report opened by itself after the job
        page.locator("#timings").scroll_into_view_if_needed()            # (the plot is a lazy image)
        expect(page.locator("#timings")).to_be_visible()
        expect(page.locator("#memory-plot img")).to_be_visible()
        assert "transformer" in page.locator("#timings").inner_text()

        page.locator("#prompt textarea").fill("something else")
        page.locator("#past-jobs").get_by_text("Past jobs").click()
        page.locator("#jobs-gallery button.thumbnail-item").first.click()
        page.wait_for_function("() => document.querySelector('#job-details')?.innerText.includes('the job to reuse')")
        page.locator("#reuse-btn").click()
        page.wait_for_function("() => document.querySelector('#prompt textarea').value === 'the job to reuse'")
        # the start image back in the box is the upload (96×80), not the job's 64×48 crop
        page.wait_for_function("() => document.querySelector('#start-image img')?.naturalWidth === 96")
        before = set(server.jobs())
        status = _start_and_wait(page, "Done", "Failed", "⚠")
        assert "Done" in status, status
        reused = _newest_job(server, before)
        assert job_info(reused)["settings"]["prompt"] == "the job to reuse"
        assert (reused / "upload.png").read_bytes() == (images / "start.png").read_bytes()
        _shot(page, "desktop_after_reuse")
    finally:
        page.close()


# ---- 2. the phone layout ---------------------------------------------------------------------------------------------
def test_phone_start_shows_progress_and_preview_and_end_stays_reachable(server, browser, images):
    page = _open(browser, server, PHONE)
    try:
        _shot(page, "phone_idle", full=False)
        _fill(page, images / "start.png", seconds=3.6, steps=6)
        page.locator("#start-btn").scroll_into_view_if_needed()
        with Gate(_first_block(server), call=2) as gate:              # holds the second sampling step
            page.locator("#start-btn").click()
            gate.wait()
            page.wait_for_function("() => document.querySelector('#preview img')")
            time.sleep(1.0)                                            # the smooth scroll
            assert _in_view(page, "#progress") and _in_view(page, "#preview"), "progress and preview not in view"
            assert _in_view(page, "#end-btn")
            _shot(page, "phone_running", full=False)
            page.mouse.wheel(0, 3000)                                  # scrolled far down: End is still there
            time.sleep(0.3)
            assert _in_view(page, "#end-btn") and _in_view(page, "#progress")
            page.locator("#end-btn").click()
        status = _wait_status(page, "Stopped", "Done", "Failed")
        assert "Stopped" in status, status
        _shot(page, "phone_stopped", full=False)
    finally:
        page.close()


def test_a_refused_start_leaves_no_idle_line_under_its_message(server, browser):
    """Start without an image: the status names the field, and the progress line agrees (it said "Idle: upload an
    image, write a prompt, press Start." under "⚠ Start image: …")."""
    page = _open(browser, server)
    try:
        page.locator("#prompt textarea").fill("a cat")
        page.locator("#start-btn").click()
        assert "no image given" in _wait_status(page, "Start image:")
        page.wait_for_function("() => document.querySelector('#progress').innerText.includes('Not started')")
        assert "Idle" not in page.locator("#progress").inner_text()
    finally:
        page.close()


def _bottom(page, selector) -> float:
    return page.evaluate(f"() => document.querySelector({selector!r}).getBoundingClientRect().bottom")


def test_desktop_start_and_progress_in_one_screen(server, browser):
    """One screen for a job (issue 33): at 1280×900 the images, the prompt, the length, Start, the preview and the
    video are all within the first 900 px; the memory plan sits right under Advanced → Resolution (it was 287 px
    above the screen while the resolution was edited)."""
    page = _open(browser, server, DESKTOP)
    try:
        for selector in ("#start-image", "#prompt", "#seconds", "#mode", "#start-btn", "#preview", "#result-video"):
            assert _bottom(page, selector) <= DESKTOP["height"], (selector, _bottom(page, selector))
        assert _in_view(page, "#progress")
        _shot(page, "desktop_idle", full=False)
        page.locator("#advanced").get_by_text("Advanced").first.click()
        page.locator("#resolution input[type=number]").first.scroll_into_view_if_needed()
        assert _in_view(page, "#resolution") and page.evaluate(
            "() => document.querySelector('#preserved-info').getBoundingClientRect().top < window.innerHeight - 80")
        _shot(page, "desktop_resolution_and_memory_plan", full=False)
    finally:
        page.close()


def test_phone_shows_every_part_without_sideways_scrolling(server, browser):
    """At 390×844 nothing is wider than the screen: the queue list (five columns), Past jobs (two tiles a row)."""
    page = _open(browser, server, PHONE)
    try:
        page.locator("#past-jobs").get_by_text("Past jobs").click()
        page.wait_for_timeout(500)
        wide = page.evaluate("""() => [...document.querySelectorAll('#queue-table, #past-jobs, #jobs-gallery, #queue')]
            .filter(e => e.getBoundingClientRect().right > window.innerWidth + 1).map(e => e.id)""")
        assert wide == [] and page.evaluate("() => document.documentElement.scrollWidth") <= PHONE["width"]
        _shot(page, "phone_past_jobs_and_queue")
    finally:
        page.close()


# ---- 3. the ETA ------------------------------------------------------------------------------------------------------
def _eta_samples(page, image, **job):
    """Start a job on `page` and return [(seconds before the status said Done, the progress text)] for every change
    of the progress bar (a MutationObserver: the page's own clock, not this process's)."""
    _fill(page, image, **job)
    page.evaluate("""() => { window.__eta = []; const seen = () => { const t = document.querySelector('#progress')
          .innerText; window.__eta.push([performance.now(), t]); };
          new MutationObserver(seen).observe(document.querySelector('#progress'),
                                             {subtree: true, childList: true, characterData: true});
          new MutationObserver(() => { if (/Done/.test(document.querySelector('#status').innerText)
                                           && !window.__done) window.__done = performance.now(); })
              .observe(document.querySelector('#status'), {subtree: true, childList: true, characterData: true}); }""")
    page.locator("#start-btn").click()
    assert "Done" in _wait_status(page, "Done", "Failed")
    done = page.wait_for_function("() => window.__done").json_value()
    return [((done - t) / 1000, text) for t, text in page.evaluate("() => window.__eta")]


def _eta_shown(text: str) -> float | None:
    return 0.0 if "ETA: any moment" in text else _eta_seconds(text)


@pytest.mark.solo                       # the other worker waits meanwhile (tests/conftest.py): "quiet" is quiet
@pytest.mark.parametrize("busy", [False, True], ids=["quiet", "half-speed"])
def test_eta_holds_from_the_end_of_section_one(server, browser, images, busy):
    """Issue 44 item 3: from the end of section 1 on (section 2's first progress) every ETA the page shows is within
    1.5x of the time really left until Done, give or take the page's 1 s (it shows whole seconds and moves its clock
    once a second; below 4 s left, within 3 s will do too: the margin that holds at half this machine's speed, where
    that clock's tick itself came up to a second late, and the one both variants use, since `quiet` too runs at
    half speed when another process shares its core: the CI's busy-core run once showed "ETA 4 s" with 1.99 s left,
    and the other worker's tests once made section 2 slow and section 3's "ETA 6 s" with 3.9 s left was within 1.5x
    and its second but not within 2 s), on this machine and at half its speed: `half-speed` pins this
    process's threads (the job, its video writer, the server) and a process that keeps its core busy to one core,
    so the job has half a core whatever else the machine runs (in the whole suite the other worker uses the second
    core; without the pinning both cores were busy and the test measured the scheduler rather than the ETA). `quiet`
    pins this process's threads to one core alone: unpinned, with another process keeping a core busy the whole run
    (the CI's busy-core run), section 1 once took 2 s and the later ones 1.2 s each ("ETA 9 s" with 4.3 s left at
    section 2): the job's share of the cores changed under it, which no estimate from section 1 can foresee.
    Before, the ETA undercounted the time between a section's last step and its decode, the last file and the job's
    end (the suite's ETA test failed on a slower machine), and counted a job's first decode, which allocates the
    decode's memory, as the speed of every later one (3x too high at section 2); with one core busy it said 'ETA
    3 s' with 10.5 s left in section 2 (the later sections share the CPU with the previous section's video writer:
    pipeline/eta.py's `section_s`). The job runs after one other job of this app (its decode speed known, as for
    every job but the app's first). PyTorch runs on one thread here, as in each of the suite's two workers
    (tests/conftest.py): two threads on a machine with a busy core made section 1's steps 30-200x slower than the
    later sections' (an OpenMP effect, not the ETA's; no estimate from section 1's speed can hold then)."""
    import subprocess
    import sys

    import torch

    page = _open(browser, server)
    hog, pinned, threads = None, None, torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        if "decode per frame and pixel" not in server.runner.models.get("original").warm:    # no job timed yet
            _fill(page, images / "start.png", seconds=2.4, steps=3)
            _start_and_wait(page, "Done", "Failed")
        core = {min(os.sched_getaffinity(0))}
        if busy:
            hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        pinned = _pin_threads(core, *([hog.pid] if hog is not None else []))
        samples = _eta_samples(page, images / "start.png", seconds=4.8, steps=30)
    finally:
        torch.set_num_threads(threads)
        if hog is not None:
            hog.kill()
            hog.wait()
        if pinned is not None:
            _pin_threads(pinned)           # the CPUs this process had
        page.close()
    # (what the progress bar still drew after the status said Done is no ETA of a running job: the whole job now
    # takes a few seconds, and under load its last progress texts came up to 1.5 s after Done)
    later = [(left, text) for left, text in samples
             if re.search(r"section [234]/4", text) and _eta_shown(text) is not None and left >= 0]
    assert len(later) >= 6, samples
    off = [(round(left, 2), _eta_shown(text), text.splitlines()[0]) for left, text in later
           if not (left / 1.5 - 1 <= _eta_shown(text) <= left * 1.5 + 1
                   or left < 4 and abs(_eta_shown(text) - left) <= 3)]
    assert not off, off


def _pin_threads(cpus: set, *pids) -> set:
    """Pin every thread of this process (sched_setaffinity(0) moves only the calling thread; threads started later
    inherit their starter's) and the processes `pids` to `cpus`; returns the CPUs the process had (pass them back to
    undo)."""
    had = os.sched_getaffinity(0)
    for task in Path("/proc/self/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cpus)
        except OSError:                        # a thread that ended meanwhile
            pass
    for pid in pids:
        os.sched_setaffinity(pid, cpus)
    return had


def test_eta_keeps_moving_during_a_long_decode(server, browser, images):
    page = _open(browser, server)
    try:
        _fill(page, images / "start.png", seconds=2.4, steps=3)
        with Gate(server.runner.models.get("original").vae.decoder, call=1) as gate:
            page.locator("#start-btn").click()
            gate.wait()
            page.wait_for_function("() => document.querySelector('#progress').innerText.includes('VAE decode')")
            seen = set()
            for _ in range(8):
                seen.add(_progress(page))
                time.sleep(0.5)
            gate.release()
        texts = [t for t in seen if "VAE decode" in t]
        etas = {_eta_seconds(t) for t in texts} | {t.count("ETA: any moment") for t in texts}
        assert len(texts) >= 3, seen               # the elapsed time moved on while nothing came from the job
        assert len(etas) >= 2, texts               # and so did the ETA
        assert "Done" in _wait_status(page, "Done", "Failed")
    finally:
        page.close()


# ---- 4. the queue ------------------------------------------------------------------------------------------------------
def test_queue_runs_in_click_order_and_tells_each_waiting_tab_its_place(server, browser, images):
    tabs = [_open(browser, server) for _ in range(3)]
    try:
        for i, page in enumerate(tabs):
            _fill(page, images / "start.png", prompt=f"tab {i}", seconds=1.2, steps=2)
        before = set(server.jobs())
        with Gate(_first_block(server), call=1) as gate:
            tabs[0].locator("#start-btn").click()
            gate.wait()                                                # tab 0 holds the GPU
            tabs[1].locator("#start-btn").click()
            _wait_status(tabs[1], "in line")
            tabs[2].locator("#start-btn").click()
            waiting = [_wait_status(p, "in line") for p in tabs[1:]]
            assert "2nd in line (1 job ahead of yours)" in waiting[0], waiting
            assert "3rd in line (2 jobs ahead of yours)" in waiting[1], waiting
            for page in tabs[1:]:                                       # said once: the progress line is other
                progress = page.locator("#progress").inner_text()
                assert "in line" not in progress and "Queued" in progress, progress
            if server.blocks.sessions.line.speed.rates is not None:      # a job has been timed: a wait in seconds
                assert all("It should start in about" in w for w in waiting), waiting
            _shot(tabs[2], "desktop_third_in_line", full=False)
        for page in tabs:
            assert "Done" in _wait_status(page, "Done", "Failed")
        jobs = sorted(set(server.jobs()) - before)
        runs = sorted(jobs, key=lambda d: (d / "final.mp4").stat().st_mtime_ns)    # (tiny jobs: several a second)
        assert [job_info(d)["settings"]["prompt"] for d in runs] == ["tab 0", "tab 1", "tab 2"]
    finally:
        for page in tabs:
            page.close()


# ---- 5. the prompt's token count ------------------------------------------------------------------------------------
def test_prompt_shows_its_token_count_and_warns_before_start(server, browser):
    page = _open(browser, server)
    try:
        page.locator("#prompt textarea").fill("a cat")
        page.wait_for_function("() => document.querySelector('#prompt-tokens').innerText.includes('5 / 255 tokens')")
        page.locator("#prompt textarea").fill("a cat walks " * 30)              # 360 bytes: 360 tiny tokens
        page.wait_for_function("() => document.querySelector('#prompt-tokens').innerText.includes('too long')")
        text = page.locator("#prompt-tokens").inner_text()
        assert "360 / 255 tokens" in text and "Only the first 255 tokens are used" in text
        _shot(page, "desktop_prompt_too_long", full=False)
    finally:
        page.close()


# ---- 6. examples ---------------------------------------------------------------------------------------------------
def test_one_click_loads_an_example_image_and_prompt_that_run(server, browser):
    from ui.examples import EXAMPLES

    page = _open(browser, server)
    try:
        page.locator("#examples").get_by_text(EXAMPLES[0][2][:30]).first.click()
        page.wait_for_function("() => document.querySelector('#start-image img')?.naturalWidth === 640")
        assert page.locator("#prompt textarea").input_value() == EXAMPLES[0][2]
        set_number(page, "seconds", 1.2)
        set_number(page, "steps", 2)
        page.wait_for_function("() => document.querySelector('#hints').innerText.includes('1 section')")
        page.locator("#start-btn").click()
        assert "Done" in _wait_status(page, "Done", "Failed", "⚠")
    finally:
        page.close()


# ---- 7. uploads -------------------------------------------------------------------------------------------------------
def test_a_file_that_is_not_an_image_is_refused_on_upload(server, browser, images):
    """A file named like an image but not one is refused the moment it arrives: the box is emptied (no broken
    picture) and the message names the box by its label, without Python class names. (A file not named like an
    image, e.g. notes.txt, never leaves the browser: Gradio's own check refuses it with a pop-up.)"""
    page = _open(browser, server)
    try:
        for box, label in (("#start-image", "Start image"), ("#end-image", "End image")):
            page.locator(f"{box} input[type=file]").set_input_files(str(images / "fake.png"))
            page.wait_for_function(f"() => document.querySelector('#status').innerText.includes('{label}:')")
            status = _status(page)
            assert "fake.png is not a PNG, JPEG or WebP image" in status and "Upload a PNG, JPEG or WebP" in status, status
            assert not re.search(r"\w+(Error|Exception)\b", status), status
            page.wait_for_function(f"() => !document.querySelector('{box} img')")     # emptied, no broken icon
        _shot(page, "desktop_upload_refused", full=False)
        page.locator("#start-image input[type=file]").set_input_files(str(images / "notes.txt"))
        expect(page.locator(".toast-body, [class*=toast]").filter(has_text="notes.txt").first).to_be_visible()
        assert page.locator("#start-image img").count() == 0
    finally:
        page.close()


# ---- 8. preserved memory --------------------------------------------------------------------------------------------
def test_preserved_memory_slider_ends_at_the_cap(server, browser):
    page = _open(browser, server)
    try:
        slider = page.locator("#preserved-gb input[type=range]")
        assert float(slider.get_attribute("max")) == server.config.vram_cap_gb == 20
        assert "Memory plan" in page.locator("#preserved-info").inner_text()
    finally:
        page.close()


# ---- 9. past jobs, Resume, long jobs ------------------------------------------------------------------------------------
def test_past_jobs_show_a_video_frame_status_length_and_time(server, browser, images):
    page = _open(browser, server)
    try:
        page.locator("#past-jobs").get_by_text("Past jobs").click()
        page.locator("#jobs-refresh").click()
        page.wait_for_selector("#jobs-gallery button.thumbnail-item img")
        srcs = page.eval_on_selector_all("#jobs-gallery button.thumbnail-item img", "els => els.map(e => e.src)")
        assert srcs and all("thumbnail.jpg" in s or "preview.png" in s for s in srcs), srcs
        captions = page.locator("#jobs-gallery").inner_text()
        assert re.search(r"✓ done · \d+\.\d s · \d\d \w{3} \d\d:\d\d", captions), captions
        assert re.search(r"“[^”]+” · seed \d+", captions), captions         # what each job was, at a glance
        _shot(page, "desktop_past_jobs")
        count = len(srcs)
        page.locator("#jobs-filter textarea, #jobs-filter input").first.fill("no-such-words-anywhere")
        page.wait_for_function("() => !document.querySelector('#jobs-gallery button.thumbnail-item')")
        page.locator("#jobs-filter textarea, #jobs-filter input").first.fill("")
        page.wait_for_function(f"() => document.querySelectorAll('#jobs-gallery button.thumbnail-item').length "
                               f"== {count}")
    finally:
        page.close()


def test_details_refresh_after_resume(server, browser, images):
    page = _open(browser, server)
    try:
        before = set(server.jobs())
        _fill(page, images / "start.png", prompt="stopped then resumed", seconds=3.6, steps=3)
        with Gate(server.runner.models.get("original").vae.decoder, call=2) as gate:   # section 2's decode
            page.locator("#start-btn").click()
            gate.wait()
            page.locator("#end-btn").click()
        assert "Stopped" in _wait_status(page, "Stopped", "Done", "Failed")
        job = _newest_job(server, before)
        open_newest_past_job(page, job.name)     # (a click before the refreshed gallery came selected an older job)
        assert "stopped then" in page.locator("#job-details").inner_text()
        assert '"stopped"' in page.locator("#job-details").inner_text()
        page.locator("#resume-btn").scroll_into_view_if_needed()
        assert not _in_view(page, "#actions")                   # Start, End and the progress: out of view, above
        page.locator("#resume-btn").click()
        # the resumed job's progress is brought into view by Start (issue 44 item 6: it ran out of view)
        page.wait_for_function("""() => { const r = document.querySelector('#actions').getBoundingClientRect();
                                  return r.height > 0 && r.top >= 0 && r.bottom <= innerHeight; }""", timeout=60_000)
        assert "Done" in _wait_status(page, "Done", "Failed")
        page.wait_for_function("() => document.querySelector('#job-details').innerText.includes('\"done\"')")
        assert job_info(job)["status"] == "done"
        expect(page.locator("#resume-btn")).to_be_disabled()
    finally:
        page.close()


def test_a_long_job_shows_its_expected_time_and_asks_before_it_starts(server, browser, images):
    page = _open(browser, server)
    try:
        _fill(page, images / "start.png", prompt="a very long video", seconds=1.2, steps=2)
        set_number(page, "seconds", 30)
        page.wait_for_function("() => document.querySelector('#hints').innerText.includes('Long job')")
        hint = page.locator("#hints").inner_text()
        assert re.search(r"Long job: \d+ sections", hint) and "confirm" in hint, hint
        before = set(server.jobs())
        page.locator("#start-btn").click()
        question = _wait_status(page, "Start again")
        assert re.search(r"This video has \d+ sections", question), question
        if server.blocks.sessions.line.speed.rates is not None:
            assert "expected time about" in question, question
        time.sleep(1.0)
        assert set(server.jobs()) == before                     # nothing started
        expect(page.locator("#start-btn")).to_be_enabled()
        _shot(page, "desktop_long_job_question", full=False)
        page.locator("#start-btn").click()                      # confirmed: it starts
        page.wait_for_function("() => document.querySelector('#progress').innerText.includes('section 1/')")
        page.locator("#end-btn").click()
        assert "Stopped" in _wait_status(page, "Stopped", "Done", "Failed")
    finally:
        page.close()


# ---- 10. original mode -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["original", "f1"])
def test_progress_says_the_original_mode_makes_the_end_first(server, browser, images, mode):
    page = _open(browser, server)
    try:
        _fill(page, images / "start.png", seconds=2.4, steps=3, mode=mode)
        page.evaluate("""() => { window.__notes = []; new MutationObserver(() => window.__notes.push(
              document.querySelector('#progress').innerText)).observe(document.querySelector('#progress'),
              {subtree: true, childList: true, characterData: true}); }""")
        page.locator("#start-btn").click()
        assert "Done" in _wait_status(page, "Done", "Failed")
        texts = page.evaluate("() => window.__notes")
        noted = [t for t in texts if "makes the end of the video first" in t]
        sampling = [t for t in texts if "sampling" in t]
        assert sampling
        if mode == "original":
            assert noted, texts[:10]
        else:
            assert not noted, noted[:3]
    finally:
        page.close()


# ---- issue 32: text-to-video and "keep only the final video" from the page ------------------------------------------
def test_text_to_video_from_the_page_keeps_only_the_final_video(server, browser):
    """No start image: "Start from" noise runs text-to-video; with "Keep only the final video" on, the job folder
    ends with final.mp4 and no section videos; the same settings again give the same video (same seed)."""
    page = _open(browser, server)
    try:
        page.locator("#prompt textarea").fill("a red fox runs through fresh snow")
        set_number(page, "seconds", 1.2)
        set_number(page, "steps", 2)
        page.locator("#start-from label").filter(has_text="noise").click()
        page.locator("#advanced").get_by_text("Advanced").first.click()
        page.locator("#keep-final-only label").filter(has_text="on").click()
        finals = []
        for _ in range(2):
            before = set(server.jobs())
            page.locator("#start-btn").click()
            page.wait_for_function("() => !document.querySelector('#status').innerText.includes('Done')")
            assert "Done" in _wait_status(page, "Done", "Failed", "⚠")
            job = _newest_job(server, before)
            info = wait_for(lambda: (lambda i: i if i["status"] != "running" else None)(job_info(job)), 30,
                            what="the job's record")
            assert info["status"] == "done", info
            assert info["settings"]["start_from"] == "noise" and info["settings"]["keep_final_only"] == "on"
            assert (job / "final.mp4").is_file() and not list(job.glob("section_*.mp4"))
            finals.append([s.get("frames_sha256") for s in info["sections"]])
        assert finals[0] == finals[1] and finals[0] and all(finals[0]), finals   # the same frames, hashed
        _shot(page, "desktop_text_to_video", full=False)
    finally:
        page.close()


def test_a_new_seed_for_each_job_then_delete_it_from_past_jobs(server, browser, images):
    """"New seed for each job" on: the job runs with a fresh seed, recorded in job.json (the page's stays); Past
    jobs → Delete asks first, then the folder is gone (issue 32)."""
    page = _open(browser, server)
    try:
        _fill(page, images / "start.png", seconds=1.2, steps=1)
        page.locator("#new-seed label").filter(has_text="on").click()
        before = set(server.jobs())
        page.locator("#start-btn").click()
        assert "Done" in _wait_status(page, "Done", "Failed", "⚠")
        job = _newest_job(server, before)
        info = wait_for(lambda: (lambda i: i if i["status"] != "running" else None)(job_info(job)), 30,
                        what="the job's record")
        shown = int(page.locator("#seed input").input_value())
        assert info["settings"]["seed"] != shown == 31337       # the job's own seed (Reuse gives that one back)
        page.locator("#past-jobs").get_by_text("Past jobs").click()
        page.locator("#jobs-refresh").click()
        page.locator("#jobs-filter textarea, #jobs-filter input").first.fill(job.name)   # only this job
        page.wait_for_function("() => document.querySelectorAll('#jobs-gallery button.thumbnail-item').length == 1")
        for attempt in range(4):        # a click on the tile before the filtered gallery replaced it selects nothing
            page.locator("#jobs-gallery button.thumbnail-item").first.click()
            try:
                page.wait_for_function(
                    f"() => document.querySelector('#job-details')?.innerText.includes('{job.name}')", timeout=20_000)
                break
            except PageTimeout:
                if attempt == 3:
                    raise
        page.locator("#delete-job-btn").click()
        expect(page.locator("#delete-job-note")).to_contain_text(f"Delete job {job.name}")
        assert job.is_dir()                                   # asked, not deleted
        page.locator("#delete-job-confirm").click()
        expect(page.locator("#delete-job-note")).to_contain_text(f"Job {job.name} deleted")
        assert not job.exists()
        page.locator("#jobs-filter textarea, #jobs-filter input").first.fill("")
    finally:
        page.close()


def test_the_page_items_on_a_phone(server, browser):
    """Issue 33's page items at 390×844 too: a refused Start says "Not started" (not "Idle"), the memory plan sits under
    Advanced → Resolution, Past jobs' captions and filter, the LoRA box's note and sliders have room."""
    page = _open(browser, server, PHONE)
    try:
        page.locator("#prompt textarea").fill("a cat")
        page.locator("#start-btn").click()
        assert "no image given" in _wait_status(page, "Start image:")
        page.wait_for_function("() => document.querySelector('#progress').innerText.includes('Not started')")
        page.locator("#advanced").get_by_text("Advanced").first.click()
        page.wait_for_selector("#resolution input[type=number]")
        page.evaluate("() => document.querySelector('#resolution').scrollIntoView({block: 'start'})")
        page.wait_for_timeout(300)
        assert page.evaluate("() => document.querySelector('#preserved-info').getBoundingClientRect().top "
                             "< window.innerHeight * 0.6")         # above the bar that holds Start, End, progress
        page.locator("#past-jobs").get_by_text("Past jobs").click()
        page.locator("#jobs-refresh").click()
        page.wait_for_selector("#jobs-gallery button.thumbnail-item img")
        assert re.search(r"· seed \d+", page.locator("#jobs-gallery").inner_text())
        page.locator("#jobs-filter textarea, #jobs-filter input").first.fill("no-such-words-anywhere")
        page.wait_for_function("() => !document.querySelector('#jobs-gallery button.thumbnail-item')")
        assert page.evaluate("() => document.documentElement.scrollWidth") <= PHONE["width"]
        _shot(page, "phone_page_items")
    finally:
        page.close()
