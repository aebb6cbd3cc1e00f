"""Issue 32's small video modes: keep only the final video, delete a past job, a new seed for each job, the
end-frame strength on the page. Handler-level tests, no browser."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import gradio as gr
import pytest

from configs.controls import CONTROLS, control
from jobfolder.folder import Job, load_job
from jobs.runner import NEW_SEED_MAX, with_new_seed, with_new_seed_switch
from pipeline.request import Request
from tests.conftest import make_image, run_job
from ui.access import Access
from ui.panel_jobs import JobsPanel


@dataclasses.dataclass
class _Prepared:
    request: Request
    source: object = None


# ---- keep only the final video ----------------------------------------------------------------------------------
def _sections(tiny_original, tmp_path, keep: str, seconds: float = 2.0):
    r = Request(image=make_image(), prompt="a fox", seconds=seconds, steps=1, seed=1, keep_final_only=keep,
                teacache=0.0)
    _, last = run_job(r, tiny_original, tmp_path)
    return Path(last.job_dir)


def test_keep_final_only_deletes_the_section_videos_once_final_is_written(tiny_original, tmp_path):
    job_dir = _sections(tiny_original, tmp_path / "on", "on")
    info = load_job(job_dir)
    assert info["status"] == "done" and info["settings"]["keep_final_only"] == "on"
    assert (job_dir / "final.mp4").is_file()
    assert sorted(p.name for p in job_dir.glob("*.mp4")) == ["final.mp4"]
    assert info["videos"] == [] and len(info["sections"]) >= 2


def _job_with_sections(tmp_path, keep="on") -> Job:
    job = Job.create(tmp_path, {"keep_final_only": keep}, {})
    for n in (1, 2):
        job.path(f"section_{n:02d}.mp4").write_bytes(b"v")
    job.update(videos=["section_01.mp4", "section_02.mp4"])
    return job


def test_a_stopped_or_failed_job_keeps_its_sections_and_nothing_goes_before_the_final(tmp_path):
    for status in ("stopped", "failed"):
        job = _job_with_sections(tmp_path)
        job.finish(status, job.path("section_02.mp4") if status == "stopped" else None)
        assert job.path("section_01.mp4").is_file() and load_job(job.dir)["videos"] == ["section_01.mp4",
                                                                                       "section_02.mp4"]
    job = _job_with_sections(tmp_path)
    job.info["status"] = "done"                  # done, but no final.mp4 yet: nothing is deleted
    job.drop_section_videos()
    assert job.path("section_01.mp4").is_file()
    job.finish("done", job.path("section_02.mp4"))
    assert job.path("final.mp4").read_bytes() == b"v" and not job.path("section_01.mp4").exists()
    kept = _job_with_sections(tmp_path, keep="off")           # off (the default) keeps every section's video
    kept.finish("done", kept.path("section_02.mp4"))
    assert kept.path("section_01.mp4").is_file() and len(load_job(kept.dir)["videos"]) == 2


# ---- a new seed for each job ------------------------------------------------------------------------------------
def test_new_seed_gives_each_queued_job_a_fresh_seed_recorded_with_the_switch_off():
    prepared = _Prepared(Request(image="a.png", seed=7, new_seed="on"))
    seeds = {with_new_seed(prepared).request.seed for _ in range(6)}
    assert len(seeds) > 1 and all(0 <= s <= NEW_SEED_MAX for s in seeds)
    assert with_new_seed(prepared).request.new_seed == "off"          # job.json makes the same video again
    off = dataclasses.replace(prepared, request=dataclasses.replace(prepared.request, new_seed="off"))
    assert with_new_seed(off) is off


def test_new_seed_through_the_queue_and_the_command_line(tmp_path):
    from cli import queue as cli_queue
    from cli.commands import build_parser
    from jobs import store as qs
    from jobs.runner import enqueue

    for argv in (["generate", "--image", "a.png", "--new-seed", "on"], ["batch", "jobs.jsonl", "--new-seed", "on"]):
        assert build_parser().parse_args(argv).new_seed == "on"
    assert build_parser().parse_args(["batch", "jobs.jsonl"]).new_seed is None      # each line's own then
    assert cli_queue.build_parser().parse_args(["add", "jobs.jsonl", "--new-seed", "on"]).new_seed == "on"
    assert Request.from_mapping({"image": "a.png", "new_seed": "on"}).new_seed == "on"
    image = tmp_path / "a.png"
    make_image().save(image)
    store, _ = qs.QueueStore.open(tmp_path / "out")
    preflight = SimpleNamespace(prepare=_Prepared)
    line = _Prepared(Request(image=str(image), seed=5))
    queued = enqueue(store, preflight, [with_new_seed_switch(line, "on")] * 3, checked=True)
    seeds = [e.values()["seed"] for e, _ in queued]
    assert len(set(seeds)) > 1 and all(e.values()["new_seed"] == "off" for e, _ in queued)


# ---- end-frame strength on the page -----------------------------------------------------------------------------
def test_end_frame_strength_and_the_switches_are_page_controls():
    c = control("end_embed_weight")
    assert c.widget == "slider" and c.advanced and "End-frame strength" in c.widget_label
    for name in ("keep_final_only", "new_seed"):
        assert control(name).widget and control(name).default == "off"
    assert [c.name for c in CONTROLS].index("end_embed_weight") < [c.name for c in CONTROLS].index("new_seed")


# ---- delete a past job ------------------------------------------------------------------------------------------
def _job(outputs: Path, status: str, owner: str | None = None, checkpoint: bool = False) -> Path:
    job = Job.create(outputs, {"mode": "original"}, {})
    job.update(status=status, **({"owner": owner} if owner else {}))
    if checkpoint:
        job.path("latents.safetensors").write_bytes(b"x")
    return job.dir


def _panel(outputs: Path, access: Access = Access()) -> JobsPanel:
    return JobsPanel(SimpleNamespace(ui=None, outputs=outputs, access=access, default_resolution=640))


def _who(name):
    return SimpleNamespace(username=name)


def test_delete_a_finished_job_asks_first_then_removes_its_folder(tmp_path):
    done = _job(tmp_path, "done")
    panel = _panel(tmp_path)
    text, confirm, pending = panel.ask_delete(done.name)
    assert done.name in text and "resumed" not in text and confirm["visible"] is True and pending == done.name
    out = panel.delete_job(pending)
    assert not done.exists() and out[1] == [] and "deleted" in out[2] and out[4] is None
    assert not any(tmp_path.iterdir())           # the hidden folder went too


def test_delete_warns_for_a_resumable_job_and_refuses_a_running_one(tmp_path):
    stopped = _job(tmp_path, "stopped", checkpoint=True)
    panel = _panel(tmp_path)
    assert "can no longer be resumed" in panel.ask_delete(stopped.name)[0]
    running = _job(tmp_path, "running")
    for handler in (panel.ask_delete, panel.delete_job):
        with pytest.raises(gr.Error, match="running"):
            handler(running.name)
    assert running.is_dir()
    # a stopped job whose Resume waits in the queue is refused too
    from jobs import store as qs

    store, _ = qs.QueueStore.open(tmp_path)
    store.add({"prompt": "x"}, job_dir=stopped.name)
    panel.ctx.runner = SimpleNamespace(store=store)
    with pytest.raises(gr.Error, match="queue"):
        panel.delete_job(stopped.name)
    assert stopped.is_dir()


@pytest.mark.parametrize("job_id", ["nope", "../outside", "..", "", None, ".hidden", "/etc", "a/../b"])
def test_delete_refuses_unknown_and_traversal_ids(tmp_path, job_id):
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    (tmp_path / "outside").mkdir()
    (outputs / ".hidden").mkdir()
    keep = _job(outputs, "done")
    with pytest.raises(gr.Error):
        _panel(outputs).delete_job(job_id)
    assert (tmp_path / "outside").is_dir() and (outputs / ".hidden").is_dir() and keep.is_dir()


def test_delete_is_only_for_the_jobs_owner_when_there_are_several_users(tmp_path):
    bobs = _job(tmp_path, "done", owner="bob")
    access = Access.of([("alice", "1"), ("bob", "2"), ("carol", "3")], ["carol"])
    panel = _panel(tmp_path, access)
    for user in ("alice", "carol"):              # another user, an admin too: refused
        with pytest.raises(gr.Error):
            panel.delete_job(bobs.name, _who(user))
    assert bobs.is_dir()
    panel.delete_job(bobs.name, _who("bob"))
    assert not bobs.exists()
