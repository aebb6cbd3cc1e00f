"""Past jobs from outputs/ (job.json) for the gallery and "reuse settings"."""
from __future__ import annotations

import json
import os

from jobfolder.folder import Job
from pipeline.request import Request
from tests.conftest import make_image
from ui import jobs_gallery as jg
from ui import settings as st


def _job(outputs, name, status, prompt="a cat", final=True, sections=2):
    settings = Request(image=None, prompt=prompt, seconds=2.4, seed=7, steps=3, resolution=64).settings()
    job = Job.create(outputs, settings, {"preset": "tiny"})
    job.save_image("input.png", make_image(64, 48))
    videos = []
    for n in range(1, sections + 1):
        (job.dir / f"section_{n:02d}.mp4").write_bytes(b"mp4")
        videos.append(f"section_{n:02d}.mp4")
    job.update(videos=videos)
    last = job.dir / videos[-1] if (final and videos) else None
    job.finish(status, last, error="boom" if status == "failed" else None, timings={"total": 1.0})
    target = job.dir.with_name(name)
    os.rename(job.dir, target)
    return target


def test_list_jobs_newest_first_and_skips_unreadable(tmp_path):
    old = _job(tmp_path, "20250101-000000-aaaaaa", "done")
    new = _job(tmp_path, "20250102-000000-bbbbbb", "stopped", prompt="x" * 80)
    (tmp_path / "20250103-000000-cccccc").mkdir()                          # no job.json
    bad = tmp_path / "20250104-000000-dddddd"
    bad.mkdir()
    (bad / "job.json").write_text("{not json")
    (tmp_path / "stray.txt").write_text("hi")
    entries = jg.list_jobs(tmp_path)
    assert [e.dir for e in entries] == [new, old]
    assert jg.list_jobs(tmp_path / "missing") == []
    assert len(jg.list_jobs(tmp_path, limit=1)) == 1

    items = jg.gallery_items(entries)
    assert items[0][0] == str(new / "input.png")                  # its "video" cannot be read: the start image
    assert items[0][1].startswith("■ stopped · no video · ")
    assert items[1][1].startswith("✓ done · no video · ")


def test_entry_video_details_and_reuse(tmp_path):
    done = jg.read_job(_job(tmp_path, "20250101-000000-aaaaaa", "done"))
    assert done.video.name == "final.mp4" and done.status == "done"
    details = done.details()
    assert details["settings"]["prompt"] == "a cat" and details["timings"] == {"total": 1.0}
    assert "versions" not in details
    values = st.values_from_settings(done.settings, 64)
    assert values["prompt"] == "a cat" and values["seed"] == 7 and values["steps"] == 3 and values["seconds"] == 2.4

    failed = jg.read_job(_job(tmp_path, "20250102-000000-bbbbbb", "failed", final=False))
    assert failed.video.name == "section_02.mp4"                              # newest section video
    assert failed.caption().startswith("✗")
    none = jg.read_job(_job(tmp_path, "20250103-000000-cccccc", "failed", final=False, sections=0))
    assert none.video is None


def test_entry_ignores_paths_in_job_json(tmp_path):
    d = tmp_path / "20250101-000000-eeeeee"
    d.mkdir()
    (tmp_path / "secret.mp4").write_bytes(b"x")
    (d / "job.json").write_text(json.dumps({"status": "done", "final": "../secret.mp4",
                                            "videos": ["/etc/passwd"], "settings": "not a dict"}))
    entry = jg.read_job(d)
    assert entry.video is None and entry.settings == {} and entry.thumbnail is None
    assert jg.gallery_items([entry]) == []


def _write_video(path, colours, size=(64, 48)):
    import av
    import numpy as np

    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=30)
        stream.width, stream.height, stream.pix_fmt = size[0], size[1], "yuv420p"
        for colour in colours:
            frame = np.zeros((size[1], size[0], 3), np.uint8)
            frame[:] = colour
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)


def test_the_gallery_shows_a_frame_of_the_video_with_status_length_and_time(tmp_path):
    """The picture is the middle of the video (not the start image); a job stopped before its first video shows
    its last preview; the caption has the status, the length made and the time."""
    from PIL import Image

    d = _job(tmp_path, "20250101-120000-aaaaaa", "done")
    _write_video(d / "final.mp4", [(255, 0, 0)] * 5 + [(0, 0, 255)] * 5 + [(0, 255, 0)] * 5)
    info = json.loads((d / "job.json").read_text())
    info.update(sections=[{"section": 1, "frames": 15}], created="2025-01-01T12:00:00+0000")
    (d / "job.json").write_text(json.dumps(info))
    entry = jg.read_job(d)
    picture, caption = jg.gallery_items([entry])[0]
    assert picture == str(d / jg.THUMBNAIL)
    r, g, b = Image.open(picture).convert("RGB").getpixel((32, 24))
    assert b > 200 and r < 60 and g < 60, (r, g, b)                # the blue middle, not the red start
    assert caption == "✓ done · 0.5 s · 01 Jan 12:00\n“a cat” · seed 7"      # what it was, at a glance
    assert entry.matches("CAT 7") and entry.matches("done 20250101") and not entry.matches("cat dog")
    before = os.stat(picture).st_mtime_ns
    assert jg.read_job(d).thumbnail == d / jg.THUMBNAIL and os.stat(picture).st_mtime_ns == before   # kept

    stopped = _job(tmp_path, "20250102-120000-bbbbbb", "stopped", final=False, sections=0)
    Image.new("RGB", (64, 48), (0, 200, 0)).save(stopped / jg.PREVIEW)
    assert jg.read_job(stopped).thumbnail == stopped / jg.PREVIEW


def test_the_upload_kept_by_the_job_is_what_reuse_restores(tmp_path):
    d = _job(tmp_path, "20250101-120000-aaaaaa", "done")
    job = Job(d, json.loads((d / "job.json").read_text()))
    source = tmp_path / "mine.JPG"
    make_image(300, 200).save(source, format="JPEG")
    kept = job.keep_upload("upload", str(source))
    job.save()
    assert kept.name == "upload.jpg" and kept.read_bytes() == source.read_bytes()
    entry = jg.read_job(d)
    assert entry.original_image == kept and entry.original_end_image is None
    assert job.keep_upload("upload_end", make_image()) is None          # not a file of the user's: nothing kept
