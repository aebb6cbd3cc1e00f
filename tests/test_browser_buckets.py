"""Any resolution on the page (issue 13), in headless Chromium against the app on the tiny preset under a 6.5 GB
cap: choosing the 960 bucket and a custom size changes the memory plan, a size over the cap is refused at Start
(naming the field, with the nearest size that fits, nothing written), and a custom size runs a job of that size."""
from __future__ import annotations

import pytest

from tests.browser_helpers import fill_job, require_browser, type_numbers, wait_status
from tests.server_helpers import job_info, launched, wait_for

pytestmark = pytest.mark.slow
expect = require_browser()
CAP = "6.5"        # the tiny models at 960 need ≈ 2 GB (the VAE decode's output), at 2048×2048 ≈ 7.4 GB


def _plan(page) -> str:
    return page.locator("#preserved-info").inner_text()


def _set(page, typed: dict, *words):
    """Type the sizes and wait until the memory plan says `words` (a value the box lost is typed again)."""
    type_numbers(page, typed, "preserved-info", list(words))


def test_960_and_custom_sizes_change_the_plan_and_an_over_cap_size_is_refused(browser, tiny_original, tmp_path):
    from tests.conftest import make_image

    image = tmp_path / "start.png"
    make_image(96, 80).save(image)
    outputs = tmp_path / "outputs"
    with launched(outputs, tiny_original, "--vram-cap-gb", CAP) as server:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(120_000)
        page.goto(server.url)
        page.wait_for_selector("#start-btn")
        fill_job(page, image, seconds=1.2, steps=2, wait_image=True)
        page.locator("#advanced").get_by_text("Advanced").first.click()
        page.wait_for_selector("#resolution input[type=number]")

        _set(page, {"resolution": 960},               # the 96×80 image's bucket at 960: 1008×864 (W×H)
             "(the bucket of 960)", "fits under the 6.5 GB cap", "tokens per step")
        at_960 = _plan(page)
        assert "1008×864" in at_960 and "cannot fit" not in at_960

        _set(page, {"width": 2048, "height": 2048}, "2048×2048 (custom) cannot fit",
             "nearest size of the same shape that fits")
        assert _plan(page) != at_960

        page.locator("#start-btn").click()             # refused before anything loads
        text = wait_status(page, "cannot fit", timeout=60_000)
        assert "Custom width" in text and "nearest size of the same shape that fits" in text
        assert not server.runner.models.is_loaded("original")
        assert not outputs.exists() or not [d for d in outputs.iterdir() if not d.name.startswith(".")]

        _set(page, {"width": 96, "height": 64}, "96×64 (custom)", "fits under the 6.5 GB cap")   # a size that fits
        page.locator("#start-btn").click()
        assert "Done" in wait_status(page, "Done", "Failed", timeout=300_000)
        jobs = wait_for(lambda: [d for d in outputs.iterdir() if (d / "final.mp4").exists()], what="a finished job")
        settings = job_info(jobs[0])["settings"]
        assert (settings["width"], settings["height"], settings["resolution"]) == (96, 64, 960)
        from video.mp4 import read_frames

        assert read_frames(jobs[0] / "final.mp4").shape[1:3] == (64, 96)
