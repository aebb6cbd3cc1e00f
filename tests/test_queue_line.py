"""Jobs started with /video (and Start: the same Runner.submit) are entries of the one queue while they wait or run
(jobs/runner.py); End on a waiting one removes it at once and it never runs; a queued job with a video to extend
keeps its own copy of the video (by hash) and runs. The app is launched in this process on the tiny preset; the
first job is held in its VAE decode (tests/server_helpers.Gate), so nothing depends on timing."""
from __future__ import annotations

import json

import numpy as np
import pytest
from gradio_client import handle_file
from gradio_client.exceptions import AppError

from common.files import file_sha256
from jobs import jsonl
from jobs import store as qs
from pipeline.request import Request, prepare
from tests.extend_helpers import COMMON, OVERLAP, moving_frames, write_video
from tests.server_helpers import Gate, job_info, wait_for
from video.mp4 import encode_segment, read_frames

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SHORT = dict(seconds=1.2, steps=2)


def listing(client):
    return client.predict(api_name="/queue_list")


def test_video_jobs_are_kept_in_the_queue_and_end_removes_a_waiting_one_at_once(server, image, tiny_original,
                                                                                  tmp_path):
    a, b, c = (server.client(tmp_path / name) for name in "abc")
    store = qs.QueueStore(server.outputs)
    with Gate(tiny_original.vae.decoder) as gate:
        first = a.submit(image=handle_file(str(image)), prompt="first", seed=1, **SHORT, api_name="/video")
        gate.wait()
        (running,) = listing(a)
        assert running["status"] == qs.RUNNING and running["prompt"] == "first"
        copy = qs.Path(store.get(running["id"]).images["image"])      # (the API answers its name only)
        assert running["image"] == copy.name
        assert copy.parent == store.images_root / running["id"] and copy.read_bytes() == image.read_bytes()

        second = b.submit(image=handle_file(str(image)), prompt="second", **SHORT, api_name="/video")
        third = c.submit(image=handle_file(str(image)), prompt="third", **SHORT, api_name="/video")
        entries = wait_for(lambda: (lambda es: es if len(es) == 3 else None)(listing(a)), what="3 jobs kept")
        assert [e["status"] for e in entries] == [qs.RUNNING, qs.WAITING, qs.WAITING]
        by_prompt = {e["prompt"]: e for e in entries}

        # End from the tab (its session) on a waiting job: out of the queue at once, while the first still runs
        assert "will not run" in b.predict(api_name="/stop")
        assert [e["prompt"] for e in listing(a)] == ["first", "third"]
        assert not (store.images_root / by_prompt["second"]["id"]).exists()
        # and End from the queue's list on the other waiting job
        assert "will not run" in a.predict(by_prompt["third"]["id"], api_name="/queue_remove")["message"]
        assert [e["prompt"] for e in listing(a)] == ["first"]
        assert not gate.released.is_set()                                  # the first job is still held
        gate.release()
        video, summary = first.result(timeout=300)
    for job in (second, third):
        with pytest.raises(AppError, match="cancelled before it started"):
            job.result(timeout=60)
    assert summary["status"] == "done"
    assert listing(a) == []                                                # a finished job leaves the queue
    assert [d.name for d in server.jobs()] == [summary["job_id"]]          # the two ended ones never ran
    assert not any(store.images_root.iterdir())
    store.close()
    for client in (a, b, c):
        client.close()


def test_a_queued_extension_keeps_its_video_and_runs(server, client, tmp_path):
    clip = write_video(tmp_path / "clip.mp4", moving_frames(50), codec="libx264")
    settings = {**COMMON, "seconds": 1.2, "steps": 2, "crf": 10}
    entry = client.predict(input_video=handle_file(str(clip)), **settings, api_name="/queue_add")
    store = qs.QueueStore(server.outputs)
    copy = qs.Path(store.get(entry["id"]).images["input_video"])             # (the API answers its name only)
    assert entry["input_video"] == copy.name
    assert copy.parent == store.images_root / entry["id"] and copy.read_bytes() == clip.read_bytes()
    assert store.get(entry["id"]).images[jsonl.VIDEO_SHA256] == file_sha256(clip)
    done = wait_for(lambda: (lambda e: e if e["status"] in qs.FINISHED else None)(
        next(e for e in listing(client) if e["id"] == entry["id"])), timeout=300, every=0.5, what="the job")
    assert done["status"] == qs.DONE, done["message"]
    job_dir = server.outputs / done["job_id"]
    info = job_info(job_dir)
    assert info["source"]["kind"] == "video" and info["source"]["sha256"] == file_sha256(clip)
    frames_in = prepare(Request(input_video=clip, **settings), 64).source.frames
    out = read_frames(job_dir / "final.mp4")
    assert out.shape[0] == len(frames_in) + 4 * COMMON.get("latent_window", 9)
    kept = len(frames_in) - OVERLAP
    alone = tmp_path / "alone.mp4"
    alone.write_bytes(encode_segment(frames_in[:kept], crf=10))
    assert np.array_equal(out[:kept], read_frames(alone))          # the output starts with the input's frames
    client.predict(entry["id"], api_name="/queue_remove")
    store.close()


def test_a_changed_copy_of_a_queued_video_is_noticed(tmp_path):
    clip = write_video(tmp_path / "clip.mp4", moving_frames(40), codec="libx264")
    store, _ = qs.QueueStore.open(tmp_path / "out")
    entry = store.add({"input_video": str(clip), **COMMON})
    assert jsonl.copy_problem(entry.images) is None
    edited = store.edit(entry.id, {**entry.values(), "prompt": "edited"})      # the same copy, the same hash
    assert edited.images[jsonl.VIDEO_SHA256] == file_sha256(clip) and jsonl.copy_problem(edited.images) is None
    qs.Path(entry.images["input_video"]).write_bytes(b"not the video")
    assert "changed since the job was queued" in jsonl.copy_problem(entry.images)
    assert json.loads(store.export_jsonl())["input_video"] == entry.images["input_video"]
    store.close()


def test_a_finished_job_is_extended_by_its_id_through_the_api(server, client, image):
    settings = dict(prompt="a lighthouse in a storm", steps=2, seed=7, mode="f1", teacache=0.0)
    _, short = client.predict(image=handle_file(str(image)), seconds=2.4, **settings, api_name="/video")
    _, longer = client.predict(image=handle_file(str(image)), seconds=4.8, **settings, api_name="/video")
    _, extended = client.predict(source_job=short["job_id"], seconds=2.4, **settings, api_name="/video")
    ext_dir, long_dir = (server.outputs / s["job_id"] for s in (extended, longer))
    info = job_info(ext_dir)
    assert info["source"]["kind"] == "job" and info["source"]["path"] == str(server.outputs / short["job_id"])
    assert extended["frames"] == longer["frames"]
    assert (ext_dir / "final.mp4").read_bytes() == (long_dir / "final.mp4").read_bytes()   # its latents, reused
    with pytest.raises(AppError, match="job to extend: there is no job 'nope'"):
        client.predict(source_job="nope", seconds=1.2, **settings, api_name="/video")
    with pytest.raises(AppError, match="job to extend: give one of"):
        client.predict(image=handle_file(str(image)), source_job=short["job_id"], **settings, api_name="/video")
    queued = client.predict(source_job=short["job_id"], seconds=1.2, **{**settings, "steps": 1},
                            api_name="/queue_add")
    assert queued["input_video"] == short["job_id"] and queued["source_job"] == ""          # (no server path)
    client.predict(queued["id"], api_name="/queue_remove")
