"""Timestamped prompts in the page (headless Chromium, the app on the tiny preset in this process): a timeline typed
into the Prompt box is explained under it, runs, and each section samples with its own prompt; a malformed one is
explained as it is typed and refused at Start with a message naming the Prompt."""
from __future__ import annotations

import pytest

from pipeline.denoiser import FramepackDenoiser
from tests.browser_helpers import fill_job, require_browser, status, wait_status
from tests.server_helpers import job_info

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
expect = require_browser()


def _page(browser, server):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(120_000)
    page.goto(server.url)
    page.wait_for_selector("#start-btn")
    page.wait_for_function("() => document.querySelector('#prompt-tokens')?.innerText.includes('tokens')")
    return page


def test_a_typed_timeline_runs_with_each_sections_prompt(browser, server, image, monkeypatch):
    seen = []
    begin = FramepackDenoiser.begin_section

    def recording(self, ctx, indices, shape, image_embeds, texts, guidance):
        seen.append(texts["cond"].llama.clone())
        return begin(self, ctx, indices, shape, image_embeds, texts, guidance)

    monkeypatch.setattr(FramepackDenoiser, "begin_section", recording)
    page = _page(browser, server)
    timeline = "[0s: a red boat] [1.3s: a storm at sea]"
    fill_job(page, image, prompt=timeline, seconds=2.4, steps=2, wait_image=True)
    page.wait_for_function("() => document.querySelector('#prompt-tokens').innerText.includes('timed prompt: 2 parts')")
    hints = page.locator("#hints")
    expect(hints).to_contain_text("Timed prompt, by section")
    expect(hints).to_contain_text("1.23–2.43 s: 'a storm at sea'")
    page.locator("#start-btn").click()
    assert "Done" in wait_status(page, "Done", "Failed", "⚠")
    (job,) = [d for d in server.outputs.iterdir() if d.is_dir() and (d / "job.json").exists()
              and job_info(d)["settings"]["prompt"] == timeline]
    info = job_info(job)
    assert info["status"] == "done" and info["settings"]["prompt_blend"] == 0
    assert len(seen) == 2 and not seen[0].equal(seen[1])          # the original mode: the storm first, then the boat
    page.close()


def test_a_malformed_timeline_is_explained_and_refused(browser, server, image):
    page = _page(browser, server)
    fill_job(page, image, prompt="[0s: a red boat] [9s: a storm]", seconds=2.4, steps=2, wait_image=True)
    expect(page.locator("#hints")).to_contain_text("⚠ Prompt: [9s: a storm] starts at or after the video's end")
    jobs_before = sorted(server.outputs.iterdir())
    page.locator("#start-btn").click()
    text = wait_status(page, "⚠", "Done", "Failed")
    text = text[text.find("⚠"):] if "⚠" in text else text     # (Gradio's text of an event in flight before it:
    assert text.startswith("⚠ Prompt: [9s: a storm] starts at or after the video's end (2.43 s"), text  # "1.2s", "processing | 0.0/0.1s")
    assert sorted(server.outputs.iterdir()) == jobs_before        # nothing started, nothing written

    page.locator("#prompt textarea").fill("[0s: a red boat] [0s: a storm]")
    expect(page.locator("#prompt-tokens")).to_contain_text("⚠ Prompt: two prompts start at 0s")
    assert "Done" not in status(page)
    page.close()
