"""Past jobs' "After the video" (issue 42): a finished job selected in Past jobs is sent to the post panel in one
click (its final video chosen there, the panel opened); an unfinished job's button is greyed out saying why; a job
of another user is refused naming the field. Through the Blocks' own functions (JobsPanel.select_id,
PostPanel.from_past_job) and the click wiring of the real page layout."""
from __future__ import annotations

import json
from types import SimpleNamespace

import gradio as gr
import pytest
import torch

from post.job import PostFolders, prepare, run_post
from tests.post_helpers import pattern_video
from ui.access import Access
from ui.panel_jobs import JobsPanel
from ui.panel_post import PostPanel


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """An outputs folder with one finished job (a post job of the tiny preset, owned by alice) and one stopped."""
    from memory.manager import MemoryManager

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("jobs")
    source = pattern_video(root / "src.mp4", frames=6)
    folders = PostFolders(root / "ups", root / "ips", tiny=True)
    out = root / "outputs"
    done = list(run_post(prepare({"source": str(source), "steps": "reverse"}, folders), MemoryManager(
        device=torch.device("cpu")), outputs=out, folders=folders, owner="alice"))[-1].job_dir
    stopped = list(run_post(prepare({"source": str(source), "steps": "loop=2"}, folders), MemoryManager(
        device=torch.device("cpu")), outputs=out, folders=folders, owner="alice"))[-1].job_dir
    info = json.loads((stopped / "job.json").read_text())
    info["status"] = "stopped"
    (stopped / "job.json").write_text(json.dumps(info))
    return out, done.name, stopped.name


def _panels(out, access):
    ui = SimpleNamespace(post_job=object(), selected_job=None, image=None)
    ctx = SimpleNamespace(outputs=out, access=access, runner=None, sessions=None, ui=ui,
                          config=SimpleNamespace(upscaler_dir=out / "ups"))
    return JobsPanel(ctx), PostPanel(ctx)


def test_a_finished_job_goes_to_the_post_panel_in_one_click(outputs):
    out, done, stopped = outputs
    jobs, post = _panels(out, Access.of(None))
    selected = jobs.select_id(done)
    assert len(selected) == 7 and selected[0] == done
    assert selected[-1]["interactive"] is True and selected[-1]["value"] == "After the video"
    job, upload, panel, note = post.from_past_job(done)
    assert job["value"] == done and done in job["choices"] and stopped not in job["choices"]
    assert upload is None and panel["open"] is True and done in note
    unfinished = jobs.select_id(stopped)[-1]
    assert unfinished["interactive"] is False and "finished jobs only" in unfinished["value"]
    with pytest.raises(gr.Error) as e:
        post.from_past_job(stopped)
    assert "has no finished video yet" in str(e.value)
    with pytest.raises(gr.Error) as e:
        post.from_past_job(None)
    assert "select a finished job in Past jobs first" in str(e.value)


def test_another_users_job_is_refused_naming_the_job(outputs):
    out, done, _ = outputs
    jobs, post = _panels(out, Access.of([("alice", "a"), ("bob", "b")]))
    alice, bob = SimpleNamespace(username="alice"), SimpleNamespace(username="bob")
    assert post.from_past_job(done, alice)[0]["value"] == done
    with pytest.raises(gr.Error) as e:
        post.from_past_job(done, bob)
    assert "job" in str(e.value) and "there is no job" in str(e.value)
    assert jobs.select_id(done, bob)[-1]["interactive"] is False


def test_the_page_wires_the_button_to_the_post_panel():
    """The real layout: Past jobs' button exists next to Resume, and its click fills the post panel's job,
    upload, panel and status (the function above), then brings the panel into view."""
    from configs.presets import get_preset
    from ui.layout import build_layout

    with gr.Blocks() as app:
        ui = build_layout(get_preset("tiny"), "CPU", "")
        ctx = SimpleNamespace(outputs=None, access=Access.of(None), runner=None, sessions=None, ui=ui,
                              config=SimpleNamespace(upscaler_dir="/nonexistent"))
        panel = PostPanel(ctx)
        panel.build(app)
    assert ui.post_job.elem_id == "post-from-job-btn" and ui.post_job.interactive is False
    deps = [d for d in app.config["dependencies"] if any(t[0] == ui.post_job._id for t in d["targets"])]
    assert deps and [c for c in deps[0]["outputs"]] == [panel.job._id, panel.upload._id, panel.accordion._id,
                                                          panel.status._id]
    assert deps[0]["inputs"] == [ui.selected_job._id]


def test_the_panels_post_request_names_what_is_missing_or_unfinished(outputs, tmp_path):
    """The page's and the API's values as a post request (ui/panel_post.py post_request): a finished job's final
    video, or a video uploaded; both, neither, an unfinished job or another user's job refused naming the field."""
    from common.errors import InputError
    from tests.conftest import uploaded
    from tests.post_helpers import pattern_video
    from ui.panel_post import post_request

    out, done, stopped = outputs
    owners = Access.of([("alice", "a"), ("bob", "b")])
    request = post_request({"job_id": done, "steps": ["reverse"], "export": "gif"}, out, owners, "alice")
    assert [p.resolve() for p in request.sources] == [(out / done / "final.mp4").resolve()]
    assert request.source_job == done and request.export == "gif"
    clip = uploaded(pattern_video(tmp_path / "clip.mp4", frames=4))
    assert post_request({"video": clip, "steps": "loop=2"}, out, owners, "alice").source_job == ""
    refused = [({"job_id": done, "video": clip, "steps": "reverse"}, "alice", "video", "not both"),
               ({"steps": "reverse"}, "alice", "video", "pick a finished job or upload a video"),
               ({"job_id": stopped, "steps": "reverse"}, "alice", "job", "has no finished video yet"),
               ({"job_id": done, "steps": "reverse"}, "bob", "job", "")]
    for values, user, field, words in refused:
        with pytest.raises(InputError) as e:
            post_request(values, out, owners, user)
        assert e.value.field == field and words in e.value.message, e.value.message
