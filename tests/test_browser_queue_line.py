"""The line and the Past jobs panel in a real browser (Chromium through Playwright), the app launched in this process
on the tiny preset (issue 14):
1. a finished F1 job's *Extend* button fills "Job to extend" with its id and picks F1; Start makes a longer video
   that starts from it, and job.json names the job it extended;
2. a job started with Start while another runs shows in the Queue panel as "in line"; End on its tab removes it from
   the queue at once, and it never runs (no job folder). The running job is held in its VAE decode
   (tests/server_helpers.Gate), so nothing depends on timing."""
from __future__ import annotations

import pytest

from jobs import store as qs
from tests.browser_helpers import fill_job, open_newest_past_job, queue_table, require_browser, wait_status
from tests.server_helpers import Gate, job_info, wait_for
from video.mp4 import read_frames

pytestmark = pytest.mark.timeout(600)
expect = require_browser()

SHORT = dict(seconds=1.2, steps=1, mode="f1")        # one section, one step: the shortest job the page runs


SERVER_MODE = "f1"          # conftest's `server`: the app on the tiny F1 models


def _open(browser, server):
    page = browser.new_page(viewport={"width": 1400, "height": 1600})
    page.set_default_timeout(120_000)
    page.goto(server.url)
    page.wait_for_selector("#start-btn")
    return page


def _new_job(server, before: set):
    return wait_for(lambda: (lambda new: new[0] if len(new) == 1 else None)(sorted(set(server.jobs()) - before)),
                    60, what="one new job folder")


def test_extend_button_continues_a_finished_job(server, browser, image):
    page = _open(browser, server)
    try:
        before = set(server.jobs())
        fill_job(page, image, prompt="a lighthouse in a storm", wait_image=True, **SHORT)
        page.locator("#start-btn").click()
        status = wait_status(page, "Done", "Failed", "⚠")
        assert "Done" in status, status
        first = _new_job(server, before)
        assert job_info(first)["status"] == "done"

        page.locator("#mode label").filter(has_text="Original").click()       # Extend must pick F1 again
        open_newest_past_job(page, first.name)
        expect(page.locator("#extend-btn")).to_be_enabled()
        page.locator("#extend-btn").scroll_into_view_if_needed()
        assert page.evaluate("() => document.querySelector('#extend-group').getBoundingClientRect().bottom < 0")
        page.locator("#extend-btn").click()
        # the filled "Extend a video" group is brought into view (issue 44 item 6: it was filled out of view, above)
        page.wait_for_function("""() => { const r = document.querySelector('#extend-group').getBoundingClientRect();
                                  return r.height > 0 && r.top >= 0 && r.top < innerHeight; }""", timeout=60_000)
        expect(page.locator("#extend-job textarea, #extend-job input").first).to_have_value(first.name)
        expect(page.locator("#mode label").filter(has_text="F1").locator("input")).to_be_checked()
        expect(page.locator("#start-image img")).to_have_count(0)                 # no start image with it

        before = set(server.jobs())
        page.locator("#start-btn").click()
        page.wait_for_function("() => !/Done|Stopped|Failed/.test(document.querySelector('#status').innerText)")
        status = wait_status(page, "Done", "Failed", "⚠")
        assert "Done" in status, status
        extended = _new_job(server, before)
        info = job_info(extended)
        assert info["status"] == "done" and info["settings"]["mode"] == "f1"
        assert info["source"]["kind"] == "job" and info["source"]["path"] == str(first)
        short, longer = (read_frames(d / "final.mp4").shape[0] for d in (first, extended))
        assert longer > short, (short, longer)
    finally:
        page.close()


def _rows(page, n):
    return wait_for(lambda: (lambda rows: rows if len(rows) == n else None)(queue_table(page)), 60, every=0.3,
                    what=f"{n} rows in the queue table")


def test_end_removes_a_start_job_waiting_in_line(server, browser, image, tiny_f1):
    store = qs.QueueStore(server.outputs)
    a, b = _open(browser, server), _open(browser, server)
    try:
        before = set(server.jobs())
        fill_job(a, image, prompt="the running job", **SHORT)
        fill_job(b, image, prompt="the waiting job", **SHORT)
        with Gate(tiny_f1.vae.decoder) as gate:
            a.locator("#start-btn").click()
            gate.wait()                                                   # the first job runs, held in its decode
            b.locator("#start-btn").click()
            rows = _rows(b, 2)
            assert [(r[2], r[3]) for r in rows] == [(qs.RUNNING, "the running job"), (qs.WAITING, "the waiting job")]
            waiting = rows[1][1]
            expect(b.locator("#end-btn")).to_be_enabled()

            b.locator("#end-btn").click()
            wait_status(b, "Cancelled", timeout=30_000)         # "…will not run", then "…before it started"
            assert [e.id for e in store.entries()] == [rows[0][1]]            # out of the queue at once
            assert not (store.images_root / waiting).exists()
            assert [r[1] for r in _rows(b, 1)] == [rows[0][1]]                # and off the page's list
            expect(b.locator("#start-btn")).to_be_enabled()                  # the tab may start another job
            assert not gate.released.is_set()                                 # the first job is still held
            gate.release()
        status = wait_status(a, "Done", "Failed", "⚠")
        assert "Done" in status, status
        wait_for(lambda: server.runner.idle, 60, what="the runner to be idle")
        (job,) = set(server.jobs()) - before                                    # the waiting job never ran
        assert job_info(job)["settings"]["prompt"] == "the running job"
        wait_for(lambda: not queue_table(b), 60, every=0.3, what="an empty queue table")
        assert "Cancelled" in b.locator("#status").inner_text()
    finally:
        a.close()
        b.close()
        store.close()
