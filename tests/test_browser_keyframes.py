"""Keyframes and saved settings driven from the page (issue 43), in headless Chromium against the app on the tiny
preset: a keyframe row (image + time + strength) writes the keyframes box, Start runs the job with it (job.json
and the job folder's copy), and the named settings are saved, listed and loaded back."""
from __future__ import annotations

import pytest

from tests.browser_helpers import fill_job, require_browser, set_number, wait_status
from tests.server_helpers import job_info

pytestmark = pytest.mark.slow

expect = require_browser()


def test_a_keyframe_row_on_the_page(server, browser, tmp_path):
    from tests.conftest import make_image

    make_image(96, 80, seed=1).save(tmp_path / "start.png")
    make_image(96, 80, seed=7).save(tmp_path / "middle.png")
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(120_000)
    try:
        page.goto(server.url)
        page.wait_for_selector("#start-btn")
        fill_job(page, tmp_path / "start.png", seconds=2.4, steps=2, wait_image=True)
        page.locator("#keyframes-group").get_by_text("Keyframes (original mode)").first.click()
        page.locator("#keyframe-image-0 input[type=file]").set_input_files(str(tmp_path / "middle.png"))
        page.wait_for_selector("#keyframe-image-0 img")
        set_number(page, "keyframe-time-0", 1.2)
        set_number(page, "keyframe-strength-0", 0.75)
        box = page.locator("#keyframes textarea")
        expect(box).to_have_value(__import__("re").compile(r"^\[1\.2s, 0\.75\] .*middle\.png$"))
        before = set(server.jobs())
        page.locator("#start-btn").click()
        status = wait_status(page, "Done", "Failed")
        assert "Done" in status, status
        job = (set(server.jobs()) - before).pop()
        info = job_info(job)
        assert info["keyframes"] == [{"time": 1.2, "file": "keyframe_1.png", "strength": 0.75}]
        assert (job / "keyframe_1.png").is_file() and info["settings"]["keyframes"].startswith("[1.2s, 0.75] ")
    finally:
        page.close()


def test_saved_settings_on_the_page(server, browser, tmp_path):
    from pipeline.saved_settings import in_outputs

    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(60_000)
    try:
        page.goto(server.url)
        page.wait_for_selector("#start-btn")
        prompt = page.locator("#prompt textarea")
        prompt.fill("a lighthouse at dusk")
        set_number(page, "seed", 4242)
        page.locator("#saved-settings").get_by_text("Saved settings").first.click()
        page.locator("#saved-new-name textarea, #saved-new-name input").first.fill("dusk")
        page.locator("#saved-save").click()
        expect(page.locator("#saved-note")).to_contain_text("Saved dusk")
        folder = in_outputs(server.outputs)
        assert folder.names() == ["dusk"]
        assert folder.load("dusk").settings["prompt"] == "a lighthouse at dusk"
        assert folder.load("dusk").settings["seed"] == 4242
        prompt.fill("something else")
        set_number(page, "seed", 1)
        page.locator("#saved-load").click()                       # the saved one is selected after Save
        expect(prompt).to_have_value("a lighthouse at dusk")
        expect(page.locator("#seed input[type=number]")).to_have_value("4242")
        page.locator("#saved-new-name textarea, #saved-new-name input").first.fill("dusk 2")
        page.locator("#saved-rename").click()
        expect(page.locator("#saved-note")).to_contain_text("Renamed dusk to dusk 2")
        page.locator("#saved-default").click()
        expect(page.locator("#saved-note")).to_contain_text("opens with dusk 2")
        assert folder.names() == ["dusk 2"] and folder.default() == "dusk 2"
        page.reload()                                               # the page opens with the marked settings
        page.wait_for_selector("#start-btn")
        expect(page.locator("#prompt textarea")).to_have_value("a lighthouse at dusk")
        page.locator("#saved-settings").get_by_text("Saved settings").first.click()
        page.locator("#saved-delete").click()
        expect(page.locator("#saved-note")).to_contain_text("Deleted dusk 2")
        assert folder.names() == [] and folder.default() is None
    finally:
        page.close()
