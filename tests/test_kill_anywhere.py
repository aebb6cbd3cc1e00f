"""The same request gives the same video every run, and a job killed (SIGKILL) at any moment resumes to it.

Jobs run as command lines (`python -m cli generate|resume`) in processes forked from one fork server
(tests/kill_helpers.py), so killing them costs no start-up each time. Two uninterrupted runs must give the same
bytes (every section's video, final.mp4, and the raw frames' hashes before encoding); then a job is killed at a
seeded random schedule of moments spread over its whole run (measured from when its folder appears), and at the
moments a random time seldom hits (fault injection: right after a checkpoint, inside the video writer, inside a
decode, around the final file's copy); each is resumed and must give the uninterrupted run's bytes exactly.
An extension (F1, a video as input) is killed and resumed the same way.
"""
from __future__ import annotations

import hashlib
import json
import random
import time
from pathlib import Path

import pytest

from jobfolder.checkpoint import CHECKPOINT, load_checkpoint
from tests.kill_helpers import JobProcesses, KillAt, job_folder, tail, wait_for_folder
from tests.server_helpers import saved_image

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

JOB = ["--preset", "tiny", "--prompt", "a lighthouse in a storm", "--seconds", "3.3", "--steps", "3", "--seed",
       "11", "--teacache", "0.1", "-q"]
EXTEND = ["--preset", "tiny", "--mode", "f1", "--prompt", "the storm passes", "--seconds", "2.2", "--steps", "3",
          "--seed", "5", "-q"]
RANDOM_KILLS = 5
SCHEDULE_SEED = 27


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def outcome(job: Path) -> dict:
    """What must not depend on the run: every video's bytes and the frames handed to the encoder."""
    info = json.loads((job / "job.json").read_text())
    frames = {s["section"]: s["frames_sha256"] for s in info["sections"]}
    return {"status": info["status"], "final": _sha(job / "final.mp4") if (job / "final.mp4").exists() else None,
            "videos": {p.name: _sha(p) for p in sorted(job.glob("section_*.mp4"))}, "frames": frames,
            "temporary": sorted(p.name for p in job.glob(".*"))}


def sections_done(job: Path) -> int:
    try:
        return int(load_checkpoint(job)[1]["sections_done"])
    except (OSError, ValueError, KeyError):
        return 0


@pytest.fixture(scope="module")
def procs(tmp_path_factory):
    return JobProcesses(tmp_path_factory.mktemp("logs"))


def _uninterrupted(procs, out: Path, *argv) -> tuple[Path, float]:
    """Run a job to its end: (its folder, seconds from its folder's appearance to the process's exit)."""
    proc = procs.start("generate", *argv, "--out", out)
    folder, appeared = wait_for_folder(out, proc)
    proc.join(300)
    assert proc.exitcode == 0, tail(proc.log)
    return folder, time.monotonic() - appeared


@pytest.fixture(scope="module")
def image_128x96(tmp_path_factory):
    """The 128×96 start image (seed 5) this module's kill schedule was set with (not conftest's `image`): the random
    kills must land in every stage of the job, whose TeaCache skips depend on the picture."""
    return saved_image(tmp_path_factory, 128, 96, seed=5)


@pytest.fixture(scope="module")
def reference(procs, image_128x96, tmp_path_factory):
    """Two uninterrupted runs of the job: (the first's folder, its outcome, the second's, the run's length)."""
    first, seconds = _uninterrupted(procs, tmp_path_factory.mktemp("first"), "--image", image_128x96, *JOB)
    second, _ = _uninterrupted(procs, tmp_path_factory.mktemp("second"), "--image", image_128x96, *JOB)
    return first, outcome(first), outcome(second), seconds


def _kill_and_resume(procs, out: Path, argv, *, after_s: float | None = None, kill_at: KillAt | None = None):
    """Start the job, kill it `after_s` seconds after its folder appears (or let it kill itself, `kill_at`), then
    resume it: (its folder, sections finished when it died, the resume's exit code)."""
    proc = procs.start("generate", *argv, "--out", out, kill_at=kill_at)
    folder, appeared = wait_for_folder(out, proc)
    if after_s is not None:
        time.sleep(max(0.0, appeared + after_s - time.monotonic()))
        proc.kill()
    proc.join(300)
    folder = folder or job_folder(out)
    assert folder is not None, f"the job never made its folder:\n{tail(proc.log)}"
    done = sections_done(folder)
    code = procs.run("resume", folder, "-q")
    return folder, done, code


def test_the_same_request_gives_the_same_bytes_every_run(reference):
    first, one, two, _ = reference
    assert one["status"] == two["status"] == "done"
    assert len(one["videos"]) == len(one["frames"]) >= 3
    assert one["frames"] == two["frames"]             # the frames before encoding: a decode or blend change shows here
    assert one == two                                 # and every file's bytes


def test_a_job_killed_at_random_moments_resumes_to_the_same_video(procs, image_128x96, reference, tmp_path):
    _, expected, _, seconds = reference
    rng = random.Random(SCHEDULE_SEED)
    # one kill in each fifth of the uninterrupted run, and one the moment its folder appears
    schedule = [0.0] + [rng.uniform(i, i + 1) * seconds / RANDOM_KILLS for i in range(RANDOM_KILLS)]
    wrong, stages = [], []
    for n, after_s in enumerate(schedule):
        folder, done, code = _kill_and_resume(procs, tmp_path / f"kill{n}", ["--image", image_128x96, *JOB],
                                              after_s=after_s)
        stages.append(done)
        got = outcome(folder) if code == 0 else None
        if got != expected:
            wrong.append(f"killed {after_s:.2f} s after its folder appeared ({done} sections done): "
                         f"resume exit {code}, {got}")
    assert not wrong, "\n".join(wrong)
    assert 0 in stages and max(stages) >= 2, stages      # before the first section and later ones were hit


MOMENTS = {
    "right after a checkpoint, before its section's video": KillAt("pipeline.orchestrator:save_checkpoint", 2,
                                                                   after=True),
    "after the last checkpoint, before the last video": KillAt("pipeline.orchestrator:save_checkpoint", 3,
                                                               after=True),
    "inside the video writer": KillAt("video.section_writer:write_segments", 2),
    "inside a decode": KillAt("pipeline.orchestrator:JobRun._decode", 2),
    "before the final file's copy": KillAt("jobfolder.folder:atomic_copy", 1),
    "after the final file, before job.json says done": KillAt("jobfolder.folder:atomic_copy", 1, after=True),
}


@pytest.mark.parametrize("moment", list(MOMENTS))
def test_a_job_killed_at_a_named_moment_resumes_to_the_same_video(procs, image_128x96, reference, tmp_path, moment):
    _, expected, _, _ = reference
    folder, _, code = _kill_and_resume(procs, tmp_path / "out", ["--image", image_128x96, *JOB], kill_at=MOMENTS[moment])
    assert code == 0, tail(folder / "job.json")
    assert outcome(folder) == expected


def test_a_job_killed_while_its_folder_is_made_leaves_no_folder(procs, image_128x96, tmp_path):
    """Before job.json is written nothing under a job's name exists; there is nothing to resume and nothing lost."""
    out = tmp_path / "out"
    assert procs.run("generate", "--image", image_128x96, *JOB, "--out", out, kill_at=KillAt("jobfolder.folder:Job.save")) < 0
    assert job_folder(out) is None
    (partial,) = out.glob(".*.partial")               # only the hidden folder being made
    assert partial.name.startswith(".") and partial.name.endswith(".partial")


def test_an_extension_killed_at_any_moment_resumes_to_the_same_video(procs, reference, tmp_path):
    first = reference[0]
    argv = ["--input-video", first / "final.mp4", *EXTEND]
    folder, seconds = _uninterrupted(procs, tmp_path / "whole", *argv)
    expected = outcome(folder)
    assert expected["status"] == "done" and len(expected["videos"]) >= 2
    rng = random.Random(SCHEDULE_SEED + 1)
    moments = [rng.uniform(i, i + 1) * seconds / 2 for i in range(2)]
    for n, after_s in enumerate(moments):
        killed, done, code = _kill_and_resume(procs, tmp_path / f"kill{n}", argv, after_s=after_s)
        assert code == 0 and outcome(killed) == expected, (after_s, done)
    killed, _, code = _kill_and_resume(procs, tmp_path / "named", argv,
                                       kill_at=KillAt("pipeline.orchestrator:save_checkpoint", 1, after=True))
    assert code == 0 and outcome(killed) == expected
    assert (killed / CHECKPOINT).is_file()
