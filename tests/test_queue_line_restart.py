"""Jobs started with /video (the Start button's path: Runner.submit) survive the app being killed:
`python app.py --preset tiny` with one /video job running and two waiting in its line is killed (SIGKILL), started
again on the same outputs folder, and all three finish from the queue; the interrupted one continues in its own folder
(from its last finished section, or from the start when it had none) and equals an uninterrupted run of the same job."""
from __future__ import annotations

import os
import signal

import pytest
import torch
from gradio_client import Client, handle_file

from jobs import store as qs
from pipeline.checkpoint import load_checkpoint
from tests.server_helpers import app_process, job_info, saved_image, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

LONG = dict(prompt="a lighthouse in a storm", seconds=4.8, steps=6, seed=12)     # 4 sections
SECTIONS = 4
SHORT = dict(seconds=1.2, steps=2)


def test_killed_with_video_jobs_running_and_waiting_all_finish_after_a_restart(tmp_path, tmp_path_factory):
    image = saved_image(tmp_path_factory, 96, 80, seed=4)
    outputs = tmp_path / "out"
    with app_process(outputs, log_path=tmp_path / "first.log", start_timeout=300) as (url, proc):
        clients = [Client(url, verbose=False, download_files=str(tmp_path / f"d{n}")) for n in range(3)]
        clients[0].submit(image=handle_file(str(image)), **LONG, api_name="/video")
        store = qs.QueueStore(outputs)
        wait_for(lambda: [e for e in store.entries() if e.status == qs.RUNNING], timeout=120, every=0.05,
                 what="the long job to start")
        for n, client in enumerate(clients[1:]):       # one at a time: two clients' submissions race otherwise
            client.submit(image=handle_file(str(image)), prompt=f"waiting {n}", seed=n, **SHORT, api_name="/video")
            wait_for(lambda: len(store.entries([qs.WAITING])) == n + 1, timeout=60, every=0.05,
                     what=f"job {n + 1} in line")
        job_id = wait_for(lambda: store.entries([qs.RUNNING])[0].job_dir, timeout=300, every=0.02,
                          what="the long job's folder (noted as soon as it is made)")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        store.close()
    job_dir = outputs / job_id
    killed = job_info(job_dir)
    assert killed["status"] == "running" and len(killed["sections"]) < SECTIONS, killed["sections"]

    with app_process(outputs, log_path=tmp_path / "second.log", start_timeout=300) as (url, proc):
        client = Client(url, verbose=False, download_files=str(tmp_path / "again"))
        entries = client.predict(api_name="/queue_list")
        assert [e["prompt"] for e in entries] == [LONG["prompt"], "waiting 0", "waiting 1"]   # shown again, in order
        assert entries[0]["job_id"] == job_id and [e["status"] for e in entries[1:]] == [qs.WAITING] * 2
        done = wait_for(lambda: (lambda es: es if all(e["status"] == "done" for e in es) else None)(
            client.predict(api_name="/queue_list")), timeout=600, every=1, what="the three jobs to finish")
        _, summary = client.predict(image=handle_file(str(image)), **LONG, api_name="/video")    # uninterrupted
    assert [e["id"] for e in done] == [e["id"] for e in entries]
    assert done[0]["job_id"] == job_id                                    # continued in its own folder
    resumed, full_dir = job_info(job_dir), outputs / summary["job_id"]
    assert resumed["status"] == "done" and resumed["resumed"] == 1 and len(resumed["sections"]) == SECTIONS
    torch.testing.assert_close(load_checkpoint(job_dir)[0]["real"], load_checkpoint(full_dir)[0]["real"], atol=0,
                               rtol=0)
    assert resumed["sections"][-1]["frames_sha256"] == job_info(full_dir)["sections"][-1]["frames_sha256"]
    assert (job_dir / "final.mp4").read_bytes() == (full_dir / "final.mp4").read_bytes()
    for e in done[1:]:
        assert job_info(outputs / e["job_id"])["settings"]["prompt"] == e["prompt"]
