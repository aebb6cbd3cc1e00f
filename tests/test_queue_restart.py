"""The queue survives the app being killed: `python app.py --preset tiny` in its own process with one queued job
running and three waiting is killed (SIGKILL) as soon as the running one has its folder, started again on the same
outputs folder, and all four jobs finish; the interrupted one continues in its folder (from its last finished section,
or from the start when it had none) and equals an uninterrupted run of the same job.
A damaged queue database is moved aside with a warning and the app starts."""
from __future__ import annotations

import os
import signal

import pytest
import torch

from jobs import store as qs
from pipeline.checkpoint import load_checkpoint
from video.mp4 import read_frames
from tests.server_helpers import app_process, job_info, saved_image, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

LONG = dict(prompt="a lighthouse in a storm", seconds=7.2, steps=3, seed=11)     # 6 sections
SECTIONS = 6
SHORT = dict(seconds=1.2, steps=2)


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    return saved_image(tmp_path_factory, 96, 80, seed=5)


def _client(url, tmp_path):
    from gradio_client import Client

    return Client(url, verbose=False, download_files=str(tmp_path / "downloads"))


def _listing(client) -> list[dict]:
    return client.predict(api_name="/queue_list")


def test_killed_with_one_running_and_three_waiting_all_four_finish(tmp_path, image):
    from gradio_client import handle_file

    outputs = tmp_path / "out"
    with app_process(outputs, log_path=tmp_path / "first.log", start_timeout=300) as (url, proc):
        client = _client(url, tmp_path)
        first = client.predict(image=handle_file(str(image)), **LONG, api_name="/queue_add")
        for n in range(3):
            client.predict(image=handle_file(str(image)), prompt=f"waiting {n}", seed=n, **SHORT,
                           api_name="/queue_add")
        # killed as soon as the queue knows the long job's folder (it notes it when the folder is made, before the
        # first section), read from the database itself (no round trip through the app)
        store = qs.QueueStore(outputs)
        job_id = wait_for(lambda: store.get(first["id"]).job_dir, timeout=300, every=0.02,
                          what="the long job's folder")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        store.close()
    job_dir = outputs / job_id
    killed = job_info(job_dir)
    assert killed["status"] == "running" and len(killed["sections"]) < SECTIONS, killed["sections"]

    with app_process(outputs, log_path=tmp_path / "second.log", start_timeout=300) as (url, proc):
        client = _client(url, tmp_path)
        entries = _listing(client)
        assert [e["id"] for e in entries][0] == first["id"]         # shown again, the interrupted one first
        assert [e["prompt"] for e in entries[1:]] == [f"waiting {n}" for n in range(3)]
        done = wait_for(lambda: (lambda es: es if all(e["status"] == "done" for e in es) else None)(_listing(client)),
                        timeout=600, every=1, what="all four queued jobs to finish")
        # the uninterrupted run of the long job, on the same app
        _, summary = client.predict(image=handle_file(str(image)), **LONG, api_name="/video")
    assert [e["id"] for e in done] == [e["id"] for e in entries]
    assert done[0]["job_id"] == job_id                                # continued in its own folder
    resumed, full = job_info(job_dir), job_info(outputs / summary["job_id"])
    assert resumed["status"] == "done" and resumed["resumed"] == 1 and len(resumed["sections"]) == SECTIONS
    full_dir = outputs / summary["job_id"]
    torch.testing.assert_close(load_checkpoint(job_dir)[0]["real"], load_checkpoint(full_dir)[0]["real"], atol=0,
                               rtol=0)                                   # the latents: bit-identical
    assert resumed["sections"][-1]["frames_sha256"] == full["sections"][-1]["frames_sha256"]   # the raw frames
    assert (job_dir / "final.mp4").read_bytes() == (full_dir / "final.mp4").read_bytes()
    assert read_frames(job_dir / "final.mp4").shape[0] == resumed["sections"][-1]["frames"]
    finished = [outputs / e["job_id"] for e in done[1:]]
    assert all(job_info(d)["status"] == "done" for d in finished)
    assert sorted(d.name for d in finished) == [d.name for d in finished]            # run in line order
    assert not any(qs.QueueStore(outputs).images_root.iterdir())         # the queue's copies are gone


def test_a_damaged_queue_database_is_moved_aside_and_the_app_starts(tmp_path, image):
    outputs = tmp_path / "out"
    outputs.mkdir()
    qs.QueueStore(outputs).folder.mkdir()
    qs.QueueStore(outputs).path.write_bytes(b"\x00garbage, not SQLite\x00" * 64)
    with app_process(outputs, log_path=tmp_path / "app.log", start_timeout=300) as (url, proc):
        client = _client(url, tmp_path)
        assert _listing(client) == []
    log = (tmp_path / "app.log").read_text()
    assert "WARNING" in log and "could not be read" in log and "moved to" in log
    aside = list(qs.QueueStore(outputs).folder.glob(qs.DB_NAME + ".damaged-*"))
    assert len(aside) == 1 and aside[0].read_bytes().startswith(b"\x00garbage")
