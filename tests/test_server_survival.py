"""The server survives what users do: a tab closed mid-job (the job runs to its end, its output is kept), two
clients submitting at once (queued: one job after the other), End while the stage is VAE decode (stopped after
that decode, its video kept), a failing job followed by a good one. Exact moments are held with hooks on the
tiny models (tests/server_helpers.Gate), so nothing depends on timing."""
from __future__ import annotations

import pytest

from tests.server_helpers import (
    Fault,
    Gate,
    api_job,
    browser_or_skip,
    job_info,
    temp_leftovers,
    wait_for,
)


def _job(image, **kw):
    return api_job(image, dict(prompt="a paper boat in the rain", seconds=1.2, steps=2, seed=7), **kw)


def _assert_good_job_runs(server, client, image):
    video, summary = client.predict(**_job(image, seed=99), api_name="/video")
    assert summary["status"] == "done" and job_info(server.outputs / summary["job_id"])["status"] == "done"
    assert not server.runner.busy and not temp_leftovers(server.outputs)


def test_a_tab_closed_mid_job_lets_the_job_finish_and_keeps_its_output(server, client, image, tiny_original):
    from tests.browser_helpers import open_chromium

    browser_or_skip()
    before = set(server.jobs())
    with open_chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1400})
        page.set_default_timeout(60_000)
        page.goto(server.url)
        page.locator("#start-image input[type=file]").set_input_files(str(image))
        page.locator("#prompt textarea").fill("the tab that was closed")
        for elem_id, value in (("seconds", 2.4), ("steps", 2)):
            box = page.locator(f"#{elem_id} input[type=number]")
            box.fill(str(value))
            box.press("Enter")
        page.wait_for_function("() => document.querySelector('#hints').innerText.includes('2 section')")
        first_block = tiny_original.transformer.single_transformer_blocks[0]
        with Gate(first_block) as gate:                    # holds the first sampling step
            page.locator("#start-btn").click()
            gate.wait()
            page.close()                                    # the tab goes away mid-job
    (job,) = wait_for(lambda: [d for d in set(server.jobs()) - before if job_info(d)["status"] != "running"],
                      120, what="the job to end")
    info = job_info(job)
    assert info["status"] == "done" and info["final"] == "final.mp4" and (job / "final.mp4").is_file()
    assert info["settings"]["prompt"] == "the tab that was closed" and len(info["sections"]) == 2
    wait_for(lambda: server.runner.store.entries() == [], 10, what="the closed tab's job to leave the queue")
    _assert_good_job_runs(server, client, image)


def test_two_clients_at_once_run_one_after_the_other(server, image, tmp_path):
    a, b = server.client(tmp_path / "a"), server.client(tmp_path / "b")
    try:
        jobs = [a.submit(**_job(image, seed=1), api_name="/video"), b.submit(**_job(image, seed=2), api_name="/video")]
        results = [j.result(timeout=180) for j in jobs]
    finally:
        a.close()
        b.close()
    assert [r[1]["status"] for r in results] == ["done", "done"]
    first, second = sorted((server.outputs / r[1]["job_id"] for r in results),
                           key=lambda d: (d / "input.png").stat().st_mtime_ns)
    # The second job's folder was made after the first job's last write (its job.json at the end): no overlap.
    assert (first / "job.json").stat().st_mtime_ns <= (second / "input.png").stat().st_mtime_ns
    assert job_info(first)["finished"] <= job_info(second)["created"]
    assert {job_info(d)["settings"]["seed"] for d in (first, second)} == {1, 2}


def test_end_during_vae_decode_stops_after_the_decode_and_keeps_the_video(server, client, image, tiny_original):
    with Gate(tiny_original.vae.decoder) as gate:               # holds section 1's decode
        job = client.submit(**_job(image, seconds=2.4), api_name="/video")
        gate.wait()

        def stage():
            return " ".join(u.desc or "" for u in (job.status().progress_data or []))

        assert "VAE decode · section 1/2" in wait_for(lambda: "VAE decode" in stage() and stage(), 30,
                                                      what="the client to see the VAE decode stage")
        assert client.predict(api_name="/stop").startswith("■ Stopping at the next step")
    video, summary = job.result(timeout=120)
    assert summary["status"] == "stopped" and summary["frames"] == 33, summary
    folder = server.outputs / summary["job_id"]
    info = job_info(folder)
    assert info["status"] == "stopped" and info["videos"] == ["section_01.mp4"] and info["final"] == "final.mp4"
    assert (folder / "final.mp4").read_bytes() == (folder / "section_01.mp4").read_bytes() == open(video, "rb").read()
    assert client.predict(api_name="/stop") == "■ Nothing to stop."
    _assert_good_job_runs(server, client, image)


def test_a_failing_job_then_a_good_one(server, client, image, tiny_original):
    from gradio_client.exceptions import AppError

    failure = RuntimeError("injected failure: the GPU went away")
    with Fault(tiny_original.transformer.single_transformer_blocks[0], failure):
        with pytest.raises(AppError) as e:
            client.predict(**_job(image), api_name="/video")
    message = str(e.value)
    assert message.startswith("RuntimeError: injected failure: the GPU went away (job "), message
    job_id = message.split("(job ")[1].rstrip(")")
    info = job_info(server.outputs / job_id)
    assert info["status"] == "failed" and info["error"] == "RuntimeError: injected failure: the GPU went away"
    _assert_good_job_runs(server, client, image)
