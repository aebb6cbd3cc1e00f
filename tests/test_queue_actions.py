"""The queue's API handlers (ui/queue_api.py) with hostile values: each refusal is a gr.Error naming the field,
never another exception, and nothing is added or left behind."""
from __future__ import annotations

import math

import gradio as gr
import pytest

from jobs import store as qs
from tests.conftest import uploaded
from tests.server_helpers import tiny_runner
from ui.queue_api import QueueActions, QueueApi


@pytest.fixture
def api(tmp_path, tiny_original):
    runner = tiny_runner(tmp_path / "out", tiny_original)              # not started: nothing runs
    yield QueueApi(QueueActions(runner)), runner.store
    runner.store.close()


HOSTILE = [None, "", 5, -1, math.nan, math.inf, True, [], {}, [[[1]]], "x" * 100_000, "\x00", "../../etc/passwd",
           {"path": 5}, {"path": "\x00"}]


def test_hostile_values_get_a_clear_refusal(api, image, tmp_path):
    handlers, store = api
    entry = store.add({"image": str(image), "prompt": "kept"})
    calls = []
    for bad in HOSTILE:
        calls += [(handlers.move, (bad, 0)), (handlers.move, (entry.id, bad)), (handlers.edit, (bad, {})),
                  (handlers.edit, (entry.id, bad)), (handlers.edit, (entry.id, {"seconds": bad})),
                  (handlers.edit, (entry.id, {"image": bad})), (handlers.remove, (bad,)),
                  (handlers.add_images, (bad, {"prompt": "x"})), (handlers.add_images, ([bad], {"prompt": "x"})),
                  (handlers.import_jsonl, (bad,))]
        if bad not in (None, {}):               # no settings: the defaults (a valid job)
            calls.append((handlers.add_images, ([str(image)], bad)))
    passed = []
    for fn, args in calls:
        try:
            fn(*args, None)                     # (Gradio's request: no logins)
            passed.append((fn.__name__, repr(args)))
        except gr.Error as e:
            assert ":" in str(e.message), e.message            # "field: what is wrong"
    # what is not refused is harmless: a move past either end (clamped), an edit to nothing or to a valid length
    assert sorted(passed) == sorted([("edit", repr((entry.id, {}))), ("edit", repr((entry.id, {"seconds": None}))),
                                     ("edit", repr((entry.id, {"seconds": 5}))),
                                     ("edit", repr((entry.id, {"image": None}))), ("move", repr((entry.id, 5))),
                                     ("move", repr((entry.id, -1)))])
    (kept,) = store.entries()
    assert kept.id == entry.id and kept.settings["prompt"] == "kept" and kept.status == qs.WAITING
    assert sorted(p.name for p in store.images_root.iterdir()) == [entry.id]


def test_a_jsonl_upload_may_name_only_the_queues_own_copies(api, image, tmp_path):
    handlers, store = api
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text('{"image": "%s", "prompt": "outside"}\n' % image)
    with pytest.raises(gr.Error, match="line 1: image: a jobs file sent to the app may name no file but the queue's"):
        handlers.import_jsonl(uploaded(jobs), None)
    with pytest.raises(gr.Error, match="jobs file: only a file uploaded to this app"):
        handlers.import_jsonl(str(jobs), None)                      # the jobs file itself: an upload only
    inside = store.add({"image": str(image), "prompt": "inside"})
    jobs.write_text(store.export_jsonl())
    (again,) = handlers.import_jsonl(uploaded(jobs), None)
    assert again["prompt"] == "inside" and again["id"] != inside.id
    assert [e.settings["prompt"] for e in store.entries()] == ["inside", "inside"]


def test_exports_and_answers_name_no_server_path(api, image, tmp_path):
    """Issue 41: what a client gets of the queue (the export, the list) never carries a server path: the queue's
    copies by their names in the queue (the export: <entry id>/start.png, which /queue_import takes back), a job
    extended by its id, a post job's videos by their file names."""
    import json
    from pathlib import Path

    handlers, store = api
    job = store.outputs / "20250101-000000-abc123"
    job.mkdir(parents=True)
    extends = store.add({"input_video": str(job), "mode": "f1", "prompt": "more"})
    pictured = store.add({"image": str(image), "prompt": "a cat"})
    store.add({"kind": "post", "sources": [str(job / "final.mp4")], "steps": ["loop=2"], "export": "mp4"},
              origin="api")
    text = Path(handlers.actions.export_path(None)).read_text("utf-8")
    lines = [json.loads(line) for line in text.splitlines()]
    assert lines[0]["source_job"] == job.name and "input_video" not in lines[0]
    assert lines[1]["image"] == f"{pictured.id}/start.png" and lines[2]["sources"] == ["final.mp4"]
    listed = json.dumps(handlers.actions.listing(None))
    for said in (text, listed):
        assert str(tmp_path) not in said and qs.QUEUE_DIR not in said, said
    assert handlers.actions.listing(None)[0]["input_video"] == job.name and extends.images["input_video"] == str(job)
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(json.dumps(lines[1]) + "\n")
    (again,) = handlers.import_jsonl(uploaded(jobs), None)               # the export's name of a copy: taken back
    assert again["image"] == "start.png" and store.get(again["id"]).images["image"] != pictured.images["image"]
