"""One check for every door (jobs/doors.py, ui/doors.py): every key naming a file, a job or a LoRA — by its name or
any alias of the table of controls — passes the same rules at every route of the app that takes a job's values;
under --auth two users cannot reach each other's jobs through any of them. A new alias or a new route that takes
job values fails here until it is probed."""
from __future__ import annotations

import json
import re
from pathlib import Path

import gradio as gr
import pytest

from common.errors import InputError
from configs.controls import CONTROLS
from jobs import doors as jd
from pipeline.request import canonical
from tests.conftest import make_image, uploaded
from tests.server_helpers import api_client, launched
from ui import doors
from ui.access import Access
from ui.settings import default_values

# The controls whose values name something on the server: a file, a job (by its id), LoRA files.
NAMING = tuple(c for c in CONTROLS if c.is_file or c.name in ("source_job", "loras", "keyframes"))
REFUSALS = ("only a file uploaded to this app", "there is no job", "may name no file but the queue's copies",
            "keeps its files", "keeps what it extends", "name a file of the LoRA folder", "is a job id",
            "one job is added per image",
            "validation error for")        # (Gradio's own: a file control given a bare path, before any handler)


def _value(c, target: str):
    """A hostile value of control `c` reaching `target` (another user's job folder or a file on the server)."""
    if c.name == "loras":
        return f"{target}:1"
    if c.name == "keyframes":
        return f"[1s] {target}"
    if c.name == "source_job":
        return Path(target).name if Path(target).is_dir() else Path(target).parent.name      # the job's id
    return target


def _bobs_job(outputs):
    job = outputs / "20250101-000000-b0b0b0"
    job.mkdir(parents=True)
    (job / "job.json").write_text(json.dumps({"status": "done", "owner": "bob", "settings": {"mode": "f1"}}))
    (job / "final.mp4").write_bytes(b"bob's video")
    (job / "latents.safetensors").write_bytes(b"bob's latents")
    return job


def test_every_alias_in_the_table_is_resolved_first():
    aliases = [(c, key) for c in CONTROLS for key in c.keys if key != c.name]
    assert {key for _, key in aliases} >= {"video", "extend", "lora"}
    for c, key in aliases:
        assert canonical({key: 1, "prompt": "x"}) == {c.name: 1, "prompt": "x"}
        with pytest.raises(InputError, match="given twice"):
            canonical({c.name: 1, key: 2})                    # never resolved by the keys' order


def test_every_door_refuses_every_spelling_of_a_server_path(tmp_path):
    outputs = tmp_path / "outputs"
    bob = _bobs_job(outputs)
    access = Access.of([("alice", "a"), ("bob", "b")])

    class Store:                                              # the queue: no entries (its copies' folder only)
        outputs = tmp_path / "outputs"                            # (a job to extend: looked up there, as alice)
        images_root = outputs / ".queue" / "images"

        @staticmethod
        def get(entry_id):
            return None

    app_doors = {"uploads": doors.UPLOADS, "client": doors.client(access, "alice", outputs),
                 "jobs file": doors.queue_copies(Store, access, "alice"), "edit": doors.no_files()}
    tried = 0
    for name, door in app_doors.items():
        for c in NAMING:
            for key in c.keys:
                for target in (str(bob), str(bob / "final.mp4"), str(bob / "latents.safetensors")):
                    with pytest.raises(InputError) as e:
                        jd.admitted({key: _value(c, target), "mode": "f1"}, door)
                    assert any(r in e.value.message for r in REFUSALS), (name, key, e.value.message)
                    tried += 1
    assert tried == len(app_doors) * sum(len(c.keys) for c in NAMING) * 3
    # the command line's door takes its own user's paths, under any spelling too
    assert jd.admitted({"extend": str(bob), "lora": "/x/y.safetensors:1"}, jd.LOCAL) == \
        {"input_video": str(bob), "loras": "/x/y.safetensors:1"}


PROBED = {"video", "queue_add", "queue_add_images", "queue_import", "queue_edit", "resume", "post",   # the API
          "submit", "add", "add_images", "save", "import_jsonl", "import_studio", "run_post"}    # the page's handlers
# Handlers that take these controls but run no job: what they do with a file is checked in test_server_abuse.py
# (memory_plan, check_image: uploads only, the same refusal), the LoRA box's handlers (test_lora_box below), and
# frame_as_start (puts an exported frame, an upload, into the start image box, which Start then checks).
SHOWS_ONLY = {"show_hints", "show_extension", "memory_plan", "check_image", "slots", "lambda", "added",
              "frame_as_start",
              # saved settings: stored, not run (aliases resolved, files only uploads, LoRAs by name: probed
              # below); loading them fills the page, whose Start passes the door
              "settings_save", "save_page"}


def test_two_users_cannot_reach_each_others_jobs_through_any_route_or_alias(tmp_path, tiny_original):
    from gradio_client import handle_file
    from gradio_client.exceptions import AppError

    start = tmp_path / "start.png"
    make_image(96, 80).save(start)
    argv = ["--auth", "alice:a-pass", "--auth", "bob:b-pass"]
    with launched(tmp_path / "outputs", tiny_original, *argv) as server:
        bob = _bobs_job(server.outputs)
        targets = (str(bob), str(bob / "final.mp4"), str(bob / "latents.safetensors"))
        # every route that takes a job's files, job ids or LoRAs is probed below
        naming_ids = {c.element_id for c in NAMING}
        takes = set()
        for fn in server.blocks.fns.values():
            if any(getattr(b, "elem_id", None) in naming_ids or isinstance(b, (gr.File, gr.JSON, gr.UploadButton)) or
                   getattr(b, "label", None) in ("job_id", "job") for b in fn.inputs):
                takes.add(fn.api_name.rstrip("0123456789").rstrip("_"))
        assert takes - SHOWS_ONLY - {"queue_move", "queue_remove"} == PROBED, takes   # (those two: ids, below)

        alice = api_client(server.url, tmp_path / "dl", auth=("alice", "a-pass"))
        try:
            entry = alice.predict(image=handle_file(str(start)), seconds=1.2, steps=1, api_name="/queue_add")
            paths = [v for v in entry.values() if isinstance(v, str) and "/" in v]   # answers carry names only
            assert not paths and entry["image"], paths
            refused = []

            def refuse(call, **kwargs):
                with pytest.raises(AppError) as e:
                    alice.predict(**kwargs, api_name=call)
                refused.append((call, str(e.value)))

            for c in NAMING:                                    # (every target at every door: the test above)
                for target in (targets[2],) if c.name == "loras" else (targets[1],):
                    value = _value(c, target)
                    api_value = value                              # (a plain path: no upload marker)
                    if c.api_name:                                     # (a control on the page: /video's)
                        given = {"mode": "f1", "seconds": 1.2, "steps": 1, c.api_name: api_value}
                        if c.name == "loras":
                            given["image"] = handle_file(str(start))
                        refuse("/video", **given)
                        refuse("/queue_add", **given)
                    for key in c.keys:                                  # the JSON doors: every spelling
                        refuse("/queue_add_images", images=[handle_file(str(start))], settings={key: value})
                        refuse("/queue_edit", job=entry["id"], settings={key: value})
                        lines = tmp_path / "jobs.jsonl"
                        lines.write_text(json.dumps({key: value, "mode": "f1"}) + "\n")
                        refuse("/queue_import", jobs_file=handle_file(str(lines)))
            refuse("/post", job_id=bob.name, steps="loop=2", export="mp4", frame=-1)      # after the video: the same door
            refuse("/post", video=str(bob / "final.mp4"), steps="loop=2", export="mp4", frame=-1)
            for key in ("lora", "loras"):
                refuse("/settings_save", name="mine", settings={key: f"{targets[2]}:1"})
            for call in (dict(job_id=bob.name, api_name="/resume"), dict(job=bob.name, api_name="/queue_remove"),
                         dict(job=bob.name, position=0, api_name="/queue_move")):
                with pytest.raises(AppError, match="there is no job|no queued job"):
                    alice.predict(**call)
            # the page's own handlers, as alice's page calls them (the same door)
            page = {fn.api_name: fn.fn for fn in server.blocks.fns.values()}
            request = gr.Request(username="alice", session_hash="alice-page")
            names = [c.name for c in CONTROLS if c.widget]
            for c in (c for c in NAMING if c.widget):             # (the page's controls)
                defaults = {**default_values(64), "seconds": 1.2, "steps": 1, "mode": "f1"}
                values = [_value(c, targets[1]) if n == c.name else defaults.get(n) for n in names]
                for handler in ("submit", "add", "save"):
                    before = len(server.runner.store.entries())
                    out = _page_call(page[handler], request, values, entry["id"] if handler == "save" else None)
                    assert len(server.runner.store.entries()) == before, (handler, c.name, out)
                if c.name != "image":                          # (one job per image: the box is not used)
                    _page_call(page["add_images"], request, values, [uploaded(start)])
                    assert len(server.runner.store.entries()) == before, c.name
            for c in NAMING:
                for key in c.keys:
                    lines = tmp_path / "page.jsonl"
                    lines.write_text(json.dumps({key: _value(c, targets[1]), "mode": "f1"}) + "\n")
                    answer = _page_call(lambda r, path: page["import_jsonl"](path, r), request, [], uploaded(lines))
                    assert any(r in str(answer) for r in REFUSALS), answer
            with pytest.raises(gr.Error, match="only a file uploaded"):
                page["import_studio"](targets[1], request)
            # the LoRA box's live check: the same words whether another path exists or not, nothing read
            live, = (fn.fn for fn in server.blocks.fns.values() if fn.concurrency_id == "lora-check")
            said = {re.sub(r"'[^']*'", "<name>", live(f"{path}:1", "original"))
                    for path in (targets[2], str(bob / "nope.safetensors"), "/etc/hostname", "../x.safetensors")}
            assert len(said) == 1 and "name a file of the LoRA folder" in said.pop()
            post, = (fn.fn for fn in server.blocks.fns.values()           # the After the video panel's Run
                     if getattr(fn.fn, "__qualname__", "") == "PostPanel.run_post")
            for job_id, video in ((bob.name, None), (None, str(bob / "final.mp4"))):
                (answer, *_), = list(post(job_id, video, "off", 60, "off", None, 0, 0, 1, 1, False, False, "mp4", -1,
                                          request=request))
                assert any(r in answer for r in REFUSALS), answer
            assert len(server.runner.store.entries()) == 1
        finally:
            alice.close()
        bad = [(call, text) for call, text in refused if not any(r in text for r in REFUSALS)]
        assert not bad, [(call, text[:600]) for call, text in bad[:3]]
        entries = server.runner.store.entries()
        assert [e.id for e in entries] == [entry["id"]] and entries[0].settings.get("loras", "") == ""
        made = [d.name for d in server.jobs() if d != bob]                  # only alice's own queued job ran
        assert made in ([], [Path(entries[0].job_dir or "").name]), (made, entries[0].job_dir)
        assert (bob / "final.mp4").read_bytes() == b"bob's video"


def _page_call(fn, request, values, first):
    """A page handler called as Gradio calls it (request first; a picked job or images before the controls);
    returns its answer (a refusal is an answer on the page, or a gr.Error)."""
    try:
        return fn(request, *([first] if first is not None else []), *values)
    except gr.Error as e:
        assert any(r in str(e.message) for r in REFUSALS), e.message
        return e.message


def test_a_jobs_file_of_500_lines_ending_in_a_newline_is_500_lines(tmp_path, tiny_original):
    from tests.server_helpers import tiny_runner
    from ui.queue_api import IMPORT_LINES_MAX, QueueActions

    runner = tiny_runner(tmp_path / "out", tiny_original)             # not started: nothing runs
    try:
        actions = QueueActions(runner)
        for count, refused in ((IMPORT_LINES_MAX, "missing"), (IMPORT_LINES_MAX + 1, f"at most {IMPORT_LINES_MAX}")):
            jobs = tmp_path / f"{count}.jsonl"
            jobs.write_text('{"prompt": "x"}\n' * count)                  # no image: refused at line 1, not queued
            with pytest.raises(InputError) as e:
                actions.import_jsonl(uploaded(jobs))
            assert refused in e.value.message and (count > IMPORT_LINES_MAX) == ("lines" in e.value.message), \
                e.value.message
    finally:
        runner.store.close()


def test_the_lora_box_checks_names_of_the_lora_folder_only(tmp_path):
    from ui.panel_lora import checked

    folder = tmp_path / "loras"
    folder.mkdir()
    (folder / "style.safetensors").write_bytes(b"listed")
    secret = tmp_path / "latents.safetensors"
    secret.write_bytes(b"another user's")
    looked = []

    def check(spec, mode):                               # the pre-flight's check: reads the files
        looked.append(spec)

    said = set()
    for path in (str(secret), str(tmp_path / "missing.safetensors"), "../latents.safetensors", "~/x.safetensors",
                 f"{folder.name}/style.safetensors"):
        said.add(re.sub(r"'[^']*'", "<name>", checked(f"{path}:1", "original", check, folder)))
    assert len(said) == 1 and "name a file of the LoRA folder" in said.pop() and looked == []
    from jobs.doors import admitted
    from ui import doors as app_doors

    door = app_doors.client(Access(), None, tmp_path, folder)          # a job added by a client: the same rule
    with pytest.raises(InputError, match="not in the LoRA folder's list") as e:
        admitted({"lora": "latents.safetensors:1"}, door)
    assert str(tmp_path) not in str(e.value)
    assert admitted({"lora": "style.safetensors:1"}, door) == {"loras": "style.safetensors:1"}
    missing = checked("latents.safetensors:1", "original", check, folder)
    assert "not in the LoRA folder's list" in missing and str(tmp_path) not in missing and looked == []
    assert checked("style.safetensors:0.5", "original", check, folder).startswith("✓") and looked == ["style.safetensors:0.5"]


def test_a_job_id_to_extend_is_looked_up_by_the_apps_doors_only_and_alone(tmp_path):
    """The command line's door has no job ids (it takes the job's folder); a client's door takes one job to extend,
    not a job and a video or an image besides."""
    with pytest.raises(InputError) as e:
        jd.admitted({"source_job": "20250101-000000-abc123", "prompt": "x"}, jd.LOCAL)
    assert e.value.field == "job to extend" and "the command line takes the job's folder" in e.value.message
    door = doors.client(Access(), None, tmp_path)
    make_image().save(tmp_path / "start.png")
    image = uploaded(tmp_path / "start.png")
    with pytest.raises(InputError, match="give one of a job to extend, a video to extend or a start image"):
        jd.admitted({"source_job": "20250101-000000-abc123", "image": image}, door)


def test_a_jobs_file_with_no_job_is_refused_whole():
    from jobs.jsonl import read_lines

    with pytest.raises(InputError) as e:
        read_lines("# my jobs\n\n   \n", door=jd.LOCAL)
    assert e.value.field == "jobs file" and e.value.message.startswith("no job in it; each line must be a JSON")
    with pytest.raises(InputError) as e:
        read_lines('{"prompt": "a"}\n{"prompt": \n', door=jd.LOCAL)                # the first bad line, by number
    assert e.value.field == "line 2" and e.value.message.startswith("not JSON (")
