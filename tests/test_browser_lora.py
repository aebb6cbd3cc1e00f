"""Choosing a LoRA on the page (issue 13), in headless Chromium against the app on the tiny preset with a LoRA
folder (--lora-dir): pick the file and a strength, Add, Start; job.json records the LoRA (file, hash, strength);
Reuse settings puts it back in the LoRAs box."""
from __future__ import annotations

import pytest

from tests.browser_helpers import fill_job, require_browser, set_number, wait_status
from tests.server_helpers import job_info

pytestmark = pytest.mark.slow

expect = require_browser()


@pytest.fixture(scope="module")
def folder(tmp_path_factory, tiny_original):
    from tests.lora_helpers import write_comfy, write_diffusers

    d = tmp_path_factory.mktemp("loras")
    write_comfy(tiny_original.transformer, d / "style.safetensors")
    write_diffusers(tiny_original.transformer, d / "motion.safetensors")
    import torch
    from safetensors.torch import save_file

    save_file({"transformer.no_such_block.proj.lora_A.weight": torch.zeros(4, 32),       # keys that fit nothing
               "transformer.no_such_block.proj.lora_B.weight": torch.zeros(32, 4)}, str(d / "other.safetensors"))
    return d


@pytest.fixture(scope="module")
def server_argv(folder):
    """conftest's `server` with the LoRA folder (its runner's Config gets it too: tests/server_helpers.launched)."""
    return ("--lora-dir", str(folder))


def test_choose_a_lora_on_the_page(server, browser, folder, tmp_path):
    import hashlib

    from tests.conftest import make_image

    make_image(96, 80).save(tmp_path / "start.png")
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(120_000)
    try:
        page.goto(server.url)
        page.wait_for_selector("#start-btn")
        fill_job(page, tmp_path / "start.png", wait_image=True)
        box = page.locator("#loras textarea")
        expect(box).to_have_value("")
        page.locator("#lora-file input").click()
        page.get_by_role("option", name="style.safetensors").click()
        set_number(page, "lora-strength", -0.5)
        page.locator("#lora-add").click()
        expect(box).to_have_value("style.safetensors:-0.5")
        # a slider per LoRA in the box (Studio has one): moving it rewrites the box; the box is checked at once
        slot = page.locator("#lora-slot-0")
        expect(slot).to_contain_text("style.safetensors strength")
        set_number(page, "lora-slot-0", -0.75)
        expect(box).to_have_value("style.safetensors:-0.75")
        expect(page.locator("#lora-note")).to_contain_text("fit the transformer")
        box.fill("style.safetensors:-0.75, other.safetensors:1")           # keys that fit no layer: said now
        box.press("Tab")
        expect(page.locator("#lora-note")).to_contain_text("other.safetensors")
        expect(page.locator("#lora-note")).to_contain_text("⚠")
        expect(page.locator("#lora-slot-1")).to_contain_text("other.safetensors strength")
        box.fill("style.safetensors:-0.75")
        box.press("Tab")
        expect(page.locator("#lora-slot-1")).to_be_hidden()
        before = set(server.jobs())
        page.locator("#start-btn").click()
        status = wait_status(page, "Done", "Failed")
        assert "Done" in status, status
        job = (set(server.jobs()) - before).pop()
        info = job_info(job)
        assert info["settings"]["loras"] == "style.safetensors:-0.75"
        digest = hashlib.sha256((folder / "style.safetensors").read_bytes()).hexdigest()
        assert info["loras"] == [{"file": "style.safetensors", "sha256": digest,
                                  "strength": -0.75, "layers": 8}]

        page.locator("#lora-clear").click()
        expect(box).to_have_value("")
        page.locator("#past-jobs").get_by_text("Past jobs").click()
        page.locator("#jobs-gallery button.thumbnail-item").first.click()
        page.wait_for_function("() => document.querySelector('#job-details')?.innerText.includes('style.safetensors')")
        page.locator("#reuse-btn").click()
        expect(box).to_have_value("style.safetensors:-0.75")
    finally:
        page.close()


def test_the_api_takes_loras(server, tmp_path):
    """/video's `loras` parameter (the same setting as the page's box): recorded in job.json; a bad one is refused
    naming the setting and the file, and the server keeps serving."""
    from gradio_client import handle_file
    from gradio_client.exceptions import AppError

    from tests.conftest import make_image

    make_image(96, 80).save(tmp_path / "start.png")
    client = server.client(tmp_path / "downloads")
    try:
        values = dict(image=handle_file(str(tmp_path / "start.png")), prompt="a cat", seconds=1.2, steps=2)
        with pytest.raises(AppError, match="LoRAs: 'nope.safetensors' is not in the LoRA folder's list"):
            client.predict(**values, loras="motion.safetensors:0.5, nope.safetensors", api_name="/video")
        _, summary = client.predict(**values, loras="motion.safetensors:0.5", api_name="/video")
        assert summary["status"] == "done"
        info = job_info(server.outputs / summary["job_id"])
        assert [(lo["file"], lo["strength"]) for lo in info["loras"]] == [("motion.safetensors", 0.5)]
    finally:
        client.close()
