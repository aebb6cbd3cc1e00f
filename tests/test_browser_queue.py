"""The Queue panel in a real browser (Chromium through Playwright), the app launched in this process on the tiny
preset: add the page's job, add one job per uploaded image, pick a row, move it up, save the page's settings into
it, remove one (gone at once), export, and watch the queue run to its end in the new order. The first job is held
in its VAE decode (tests/server_helpers.Gate) while the others are changed."""
from __future__ import annotations

import json

import pytest

from jobs import store as qs
from tests.browser_helpers import fill_job, require_browser, set_number
from tests.browser_helpers import queue_table as _table
from tests.server_helpers import Gate, job_info, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

expect = require_browser()


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    from tests.conftest import make_image

    d = tmp_path_factory.mktemp("images")
    for n in range(3):
        make_image(96, 80, seed=20 + n).save(d / f"img{n}.png")
    return d


def _wait_rows(page, n, timeout=180):
    return wait_for(lambda: (lambda rows: rows if len(rows) == n else None)(_table(page)), timeout, every=0.3,
                    what=f"{n} rows in the queue table")


def _pick(page, entry_id):
    page.locator("#queue-table [role=gridcell][data-col='1']").filter(has_text=entry_id).first.click()
    page.wait_for_function(f"() => document.querySelector('#queue-pick input')?.value.includes('{entry_id}')")
    # the pick's own change event may still be on its way to the server (seen once on a loaded machine: the next
    # button acted on the previous pick); let it land before the next click
    page.wait_for_timeout(500)


def test_the_queue_panel(server, browser, images, tiny_original, tmp_path):
    store = qs.QueueStore(server.outputs)
    page = browser.new_page(viewport={"width": 1400, "height": 1600})
    page.set_default_timeout(120_000)
    page.goto(server.url)
    page.wait_for_selector("#queue-add")
    try:
        with Gate(tiny_original.vae.decoder) as gate:
            fill_job(page, images / "img0.png", prompt="the first job", seconds=1.2, steps=2, wait_image=True)
            page.locator("#queue-add").click()
            expect(page.locator("#queue-status")).to_contain_text("Added job")
            gate.wait()                                         # the first job runs, held in its decode
            page.locator("#prompt textarea").fill("one per image")
            page.locator("#queue-images input[type=file]").set_input_files([str(images / "img1.png"),
                                                                           str(images / "img2.png")])
            page.wait_for_selector("#queue-images .file-preview, #queue-images table")
            page.locator("#queue-add-images").click()
            expect(page.locator("#queue-status")).to_contain_text("Added 2 jobs")
            rows = _wait_rows(page, 3)
            assert [r[2] for r in rows] == ["running", "waiting", "waiting"]
            assert [r[3] for r in rows] == ["the first job", "one per image", "one per image"]
            first, second, third = (r[1] for r in rows)

            _pick(page, third)                                   # the last job moves up, before the second
            page.locator("#queue-up").click()
            wait_for(lambda: [r[1] for r in _table(page)] == [first, third, second], 180, what="the move")

            page.locator("#prompt textarea").fill("saved into the job")           # edit: the page's settings
            set_number(page, "seconds", 2.4)
            page.locator("#queue-save").click()
            expect(page.locator("#queue-status")).to_contain_text(f"Saved the settings into job {third}")
            assert store.get(third).settings["prompt"] == "saved into the job"
            assert store.get(third).settings["seconds"] == 2.4
            kept = qs.Path(store.get(third).images["image"])                  # the job kept its own image
            assert kept.read_bytes() == (images / "img2.png").read_bytes()

            page.locator("#queue-export-btn").click()
            link = page.locator("#queue-export a").first
            expect(link).to_be_visible()
            with page.expect_download() as download:
                link.click()
            lines = [json.loads(line) for line in open(download.value.path()).read().splitlines()]
            assert [line["prompt"] for line in lines] == ["the first job", "saved into the job", "one per image"]

            _pick(page, second)                                  # End on a waiting job: gone at once
            page.locator("#queue-remove").click()
            expect(page.locator("#queue-status")).to_contain_text(f"Removed job {second}")
            assert [r[1] for r in _wait_rows(page, 2)] == [first, third]
            gate.release()
        rows = wait_for(lambda: (lambda rs: rs if rs and all(r[2] == "done" for r in rs) else None)(_table(page)),
                        600, every=1, what="the queue to finish")
        assert [r[1] for r in rows] == [first, third]
        info = job_info(server.outputs / store.get(rows[1][1]).job_dir)
        assert info["settings"]["prompt"] == "saved into the job" and info["settings"]["seconds"] == 2.4
        page.locator("#queue-clear").click()                    # finished jobs leave the list (issue 33)
        expect(page.locator("#queue-status")).to_contain_text("Cleared 2 finished jobs")
        wait_for(lambda: not _table(page), 30, every=0.3, what="an empty queue table")
        assert store.entries() == [] and (server.outputs / info["id"]).is_dir()    # the job folders stay
    finally:
        page.close()
        store.close()
