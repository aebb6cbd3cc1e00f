"""One queue, one runner: jobs started through every door of `python app.py --preset tiny` (in its own process) —
the API (/video), the queue's API (/queue_add), the page's Start button (in Chromium), the command line
(`python -m cli generate`) and a batch file (`python -m cli batch`, two lines) — all wait in the outputs folder's
one stored queue while another process (the test) holds the queue's lease; the command lines follow their jobs
there. The command lines are killed, the lease is let go, the app's runner starts the first job, and the app is
killed (SIGKILL) as soon as that job has its folder. Started again on the same outputs folder, the app shows the six
jobs in their order and finishes every one; the interrupted one continues in its own folder and equals an
uninterrupted run of the same job."""
from __future__ import annotations

import json
import os
import re
import signal
import threading

import pytest
import torch
from gradio_client import handle_file

from jobfolder.checkpoint import load_checkpoint
from jobs import store as qs
from tests.browser_helpers import fill_job, require_browser
from tests.conftest import ROOT
from tests.kill_helpers import shared
from tests.server_helpers import api_client, app_process, job_info, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

require_browser()

LONG = dict(prompt="a lighthouse in a storm", seconds=4.8, steps=6, seed=12)     # 4 sections
SECTIONS = 4
SHORT = dict(seconds=1.2, steps=2)


def _cli(*argv):
    """`python -m cli ARGV` in a process of its own (forked from the tests' fork server: tests/kill_helpers.py)."""
    return shared().start(*argv, "--preset", "tiny", "-q", cwd=ROOT, env=dict(os.environ))


def test_jobs_from_every_door_finish_from_the_one_queue_after_the_app_is_killed(tmp_path, image, browser):
    outputs = tmp_path / "out"
    batch = tmp_path / "jobs.jsonl"
    batch.write_text("".join(json.dumps({"image": str(image), "prompt": f"batch {n}", "seed": 20 + n, **SHORT}) + "\n"
                             for n in (1, 2)))
    holder, _ = qs.QueueStore.open(outputs)        # the test holds the queue's lease: every job waits in it
    assert holder.take_lease("test")
    renewing = threading.Event()
    threading.Thread(target=lambda: [holder.renew_lease("test") for _ in iter(lambda: renewing.wait(3), True)],
                     daemon=True).start()
    with app_process(outputs, log_path=tmp_path / "first.log", start_timeout=300) as (url, proc):
        store = qs.QueueStore(outputs)
        api = api_client(url, tmp_path / "d0")
        api.submit(image=handle_file(str(image)), **LONG, api_name="/video")
        wait_for(lambda: len(store.entries()) == 1, timeout=60, what="the API's job in the queue")
        queue = api_client(url, tmp_path / "d1")
        queue.predict(image=handle_file(str(image)), prompt="queue", seed=1, **SHORT, api_name="/queue_add")
        page = browser.new_page()
        page.set_default_timeout(120_000)
        page.goto(url)
        page.wait_for_selector("#start-btn")
        fill_job(page, image, prompt="page", wait_image=True, **SHORT)
        page.locator("#start-btn").click()
        wait_for(lambda: len(store.entries()) == 3, timeout=60, what="the page's job in the queue")
        followers = [_cli("generate", "--image", image, "--prompt", "cli", "--seed", 3, "--seconds", 1.2,
                          "--steps", 2, "--out", outputs)]
        wait_for(lambda: len(store.entries()) == 4, timeout=120, what="the command line's job in the queue")
        followers.append(_cli("batch", batch, "--out", outputs))
        wait_for(lambda: len(store.entries()) == 6, timeout=120, what="the batch's jobs in the queue")
        before = store.entries()
        assert [e.status for e in before] == [qs.WAITING] * 6
        assert [e.origin for e in before] == ["api", "queue", "page", "cli", "batch", "batch"]
        assert all(f.is_alive() for f in followers)              # following their jobs in the queue
        for f in followers:                                       # killed: their jobs stay in the queue
            os.kill(f.pid, signal.SIGKILL)
            f.join(30)
        renewing.set()
        holder.release_lease("test")                             # the app's runner takes the queue over
        job_id = wait_for(lambda: (store.entries([qs.RUNNING]) or [None])[0] and store.entries([qs.RUNNING])[0].job_dir,
                          timeout=120, every=0.02, what="the long job's folder (noted as soon as it is made)")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        page.close()
        store.close()
        holder.close()
    job_dir = outputs / job_id
    killed = job_info(job_dir)
    assert killed["status"] == "running" and len(killed["sections"]) < SECTIONS, killed["sections"]

    with app_process(outputs, log_path=tmp_path / "second.log", start_timeout=300) as (url, proc):
        store = qs.QueueStore(outputs)
        entries = store.entries()
        assert [e.id for e in entries] == [e.id for e in before]        # shown again, in the same order
        prompts = [e.settings["prompt"] for e in entries]
        assert prompts == [LONG["prompt"], "queue", "page", "cli", "batch 1", "batch 2"]
        assert entries[0].job_dir == job_id and entries[0].status in (qs.WAITING, qs.RUNNING)    # first, in its folder
        done = wait_for(lambda: (lambda es: es if all(e.status == qs.DONE for e in es) else None)(store.entries()),
                        timeout=600, every=0.5, what="every job to finish")
        client = api_client(url, tmp_path / "again")
        _, summary = client.predict(image=handle_file(str(image)), **LONG, api_name="/video")    # uninterrupted
        store.close()
    assert [e.id for e in done] == [e.id for e in entries] and done[0].job_dir == job_id     # in its own folder
    folders = [outputs / e.job_dir for e in done]
    assert [job_info(d)["settings"]["prompt"] for d in folders] == prompts
    assert all(job_info(d)["status"] == "done" for d in folders)
    finished = re.findall(r"job (\S+) done:", (tmp_path / "second.log").read_text())     # the orchestrator's log
    assert finished[:len(folders)] == [d.name for d in folders]                          # run in line order
    resumed, full_dir = job_info(job_dir), outputs / summary["job_id"]
    assert resumed["resumed"] == 1 and len(resumed["sections"]) == SECTIONS
    torch.testing.assert_close(load_checkpoint(job_dir)[0]["real"], load_checkpoint(full_dir)[0]["real"], atol=0,
                               rtol=0)                                                 # the latents: bit-identical
    assert resumed["sections"][-1]["frames_sha256"] == job_info(full_dir)["sections"][-1]["frames_sha256"]
    assert (job_dir / "final.mp4").read_bytes() == (full_dir / "final.mp4").read_bytes()
    assert not any(qs.QueueStore(outputs).images_root.iterdir())         # the queue's copies are gone
