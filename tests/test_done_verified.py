"""Issue 47 item 2: a job is complete only when its final video (and every section video it lists) is the file that
was written; a resume rebuilds what is missing or damaged from the checkpoint, to the same bytes, or says which
file to delete. Before, a truncated final.mp4 was "already complete" (exit 0), a deleted one refused ("already
complete (final.mp4)", exit 2), and a missing or truncated section video stayed missing after a resume."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from jobfolder.folder import CHECKPOINT, finished_video
from tests.conftest import ROOT, make_image
from tests.kill_helpers import job_folder, shared

JOB = ["--preset", "tiny", "--prompt", "a harbour at dawn", "--seconds", "2.4", "--steps", "2", "--seed", "4"]


def cli(*args):
    env = dict(os.environ, HF_HUB_OFFLINE="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    return shared().completed([str(a) for a in args], env=env, timeout=300)


def files(job: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(job.glob("*.mp4"))}


@pytest.fixture(scope="module")
def done_job(tmp_path_factory):
    """A finished tiny job (2 sections) and its videos' hashes."""
    root = tmp_path_factory.mktemp("done")
    image = root / "in.png"
    make_image(128, 96, seed=3).save(image)
    r = cli("generate", "--image", image, *JOB, "--out", root / "out", "-q")
    assert r.returncode == 0, r.stderr
    job = job_folder(root / "out")
    assert sorted(files(job)) == ["final.mp4", "section_01.mp4", "section_02.mp4"]
    return job, files(job)


@pytest.fixture
def job(done_job, tmp_path):
    """A copy of the finished job to damage."""
    source, _ = done_job
    copy = tmp_path / "out" / source.name
    shutil.copytree(source, copy)
    return copy


def _truncate(path: Path, size: int = 2000) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)


DAMAGE = {
    "truncated final.mp4": (lambda job: _truncate(job / "final.mp4"),
                            "final.mp4 is damaged (not the bytes that were written)"),
    "deleted final.mp4": (lambda job: (job / "final.mp4").unlink(), "final.mp4 is missing"),
    "deleted section video": (lambda job: (job / "section_01.mp4").unlink(), "section_01.mp4 is missing"),
    "truncated section video": (lambda job: _truncate(job / "section_02.mp4"),
                                "section_02.mp4 is damaged (not the bytes that were written)"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_done_job_is_not_complete_and_resume_rebuilds_it(done_job, job, damage):
    _, expected = done_job
    harm, why = DAMAGE[damage]
    harm(job)
    assert finished_video(job) is None                             # not "done" any more
    r = cli("resume", job, "-q")
    assert r.returncode == 0, r.stderr
    assert f"job {job.name}: {why}: written again from the checkpoint" in r.stderr
    assert r.stdout.strip().splitlines()[-1].startswith(f"done: {job / 'final.mp4'} (73 frames)")
    assert files(job) == expected                                  # the uninterrupted run's bytes, every file
    info = json.loads((job / "job.json").read_text())
    assert info["status"] == "done" and info["videos"] == ["section_01.mp4", "section_02.mp4"]
    assert [s["section"] for s in info["sections"]] == [1, 2]      # one record a section, not two
    assert finished_video(job) == job / "final.mp4"


def test_a_complete_job_is_still_said_complete_at_once(done_job):
    job, _ = done_job
    r = cli("resume", job)
    assert r.returncode == 0
    assert r.stdout.strip() == f"job {job.name} is already complete; its video is {(job / 'final.mp4').resolve()}"


def test_a_damaged_checkpoint_is_named_with_the_file_to_delete_before_the_models_load(job):
    _truncate(job / "final.mp4")
    _truncate(job / CHECKPOINT, 100)
    r = cli("resume", job)
    assert r.returncode == 2, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"error: job folder: {job / CHECKPOINT} is damaged (")
    assert line.endswith("); delete that file and resume again: the job starts again in its folder from its "
                         "settings and seed (the same video)")
    assert "loading" not in r.stdout + r.stderr and json.loads((job / "job.json").read_text())["status"] == "done"
    (job / CHECKPOINT).unlink()                                     # as it says: then it starts again
    r = cli("resume", job, "-q")
    assert r.returncode == 0, r.stderr
    assert finished_video(job) == job / "final.mp4"


def test_an_older_record_without_hashes_is_checked_by_its_frame_counts(tmp_path):
    """A record from before the hashes (frames only) is checked by decoding: the right count passes, a wrong count
    or a file that does not decode is named; a record naming no final video, or other section names, too."""
    import numpy as np

    from jobfolder.folder import incomplete, result_of
    from video.mp4 import write_mp4

    frames = np.zeros((5, 16, 16, 3), np.uint8)
    write_mp4(frames, tmp_path / "final.mp4")
    write_mp4(frames[:3], tmp_path / "section_01.mp4")
    (tmp_path / "section_02.mp4").write_bytes(b"not a video")
    info = {"status": "done", "final": "final.mp4", "frames": 5,
            "videos": ["section_01.mp4", "section_02.mp4", "section_xx.mp4", "../outside.mp4", 7],
            "sections": [{"section": 1, "frames": 4}, {"section": 2, "frames": 3}, "junk"]}
    problems = incomplete(tmp_path, info)
    assert problems[0] == "section_01.mp4 is damaged (3 frames decode, 4 were written)"
    assert problems[1].startswith("section_02.mp4 is damaged (it cannot be decoded: ") and len(problems) == 2
    assert incomplete(tmp_path, {**info, "final": "../final.mp4", "videos": []}) == ["its record names no final video"]
    assert incomplete(tmp_path, {"final": "final.mp4", "sections": [{"section": 1, "frames": 5}]}) == []
    (tmp_path / "job.json").write_text(json.dumps({**info, "videos": [], "frames": True}))
    assert result_of(tmp_path) == (tmp_path / "final.mp4", 0)       # a count that is no count: none
    (tmp_path / "job.json").write_text(json.dumps({"final": "gone.mp4", "frames": 9}))
    assert result_of(tmp_path) == (None, 9)
