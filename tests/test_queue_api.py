"""The queue through the API of the app (launched in this process on the tiny preset): add, add one job per image,
import, list, move, edit, remove (a waiting job goes at once), export; two clients adding at once keep their
order; the worker runs the queue in its order. The first job is held in its VAE decode (tests/server_helpers.Gate)
while the others are changed, so nothing depends on timing."""
from __future__ import annotations

import json
import threading

import pytest
from gradio_client import handle_file

from jobs import store as qs
from tests.server_helpers import Gate, job_info, settled_client_class, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SHORT = dict(seconds=1.2, steps=2)


def listing(client):
    return client.predict(api_name="/queue_list")


def waiting(client):
    return [e for e in listing(client) if e["status"] == "waiting"]


def wait_all_finished(client, timeout=300):
    return wait_for(lambda: (lambda es: es if all(e["status"] in qs.FINISHED for e in es) else None)(listing(client)),
                    timeout=timeout, every=0.5, what="the queue to finish")


def hold_first_job(server, client, image, tiny_original, gate):
    first = client.predict(image=handle_file(str(image)), prompt="first", seed=1, **SHORT, api_name="/queue_add")
    gate.wait()
    top = listing(client)[0]
    assert top["id"] == first["id"] and top["status"] == "running"
    return first


def test_queue_actions_through_the_api(server, client, image, tiny_original, tmp_path):
    with Gate(tiny_original.vae.decoder) as gate:
        first = hold_first_job(server, client, image, tiny_original, gate)
        b, c = client.predict([handle_file(str(image)), handle_file(str(image))], {"prompt": "per image", **SHORT},
                              api_name="/queue_add_images")
        assert b["prompt"] == c["prompt"] == "per image" and "/" not in b["image"] + c["image"]   # names only
        store = qs.QueueStore(server.outputs)
        assert all(qs.Path(store.get(e["id"]).images["image"]).is_relative_to(store.images_root) for e in (b, c))
        exported = qs.Path(client.predict(api_name="/queue_export"))
        lines = [json.loads(line) for line in exported.read_text().splitlines()]
        assert [line["prompt"] for line in lines] == ["first", "per image", "per image"]
        jsonl = tmp_path / "jobs.jsonl"
        jsonl.write_text(json.dumps({**lines[1], "prompt": "imported", "seed": 4}) + "\n")
        (d,) = client.predict(handle_file(str(jsonl)), api_name="/queue_import")
        assert d["prompt"] == "imported" and d["status"] == "waiting"

        moved = client.predict(d["id"], 0, api_name="/queue_move")
        assert [e["id"] for e in moved] == [first["id"], d["id"], b["id"], c["id"]]
        edited = client.predict(c["id"], {"seconds": 2.4, "prompt": "edited"}, api_name="/queue_edit")
        assert edited["seconds"] == 2.4 and edited["prompt"] == "edited" and edited["image"] == c["image"]
        gone = client.predict(b["id"], api_name="/queue_remove")
        assert "Removed" in gone["message"]
        assert [e["id"] for e in waiting(client)] == [d["id"], c["id"]]        # removed at once, not at its turn
        assert not (qs.QueueStore(server.outputs).images_root / b["id"]).exists()

        from gradio_client.exceptions import AppError

        for call, where in (((first["id"], {"seconds": 2.4}), "only a waiting job"),          # running
                            (("nope", {"seconds": 2.4}), "no job"),
                            ((d["id"], {"seconds": 999}), "seconds"),
                            ((d["id"], {"image": "/etc/hostname"}), "a queued job keeps its files")):
            with pytest.raises(AppError, match=where):
                client.predict(*call, api_name="/queue_edit")
        bad = tmp_path / "bad.jsonl"
        bad.write_text(json.dumps({"image": str(image), "prompt": "outside"}) + "\n")
        with pytest.raises(AppError, match="line 1: image: a jobs file sent to the app may name no file but"):
            client.predict(handle_file(str(bad)), api_name="/queue_import")
        gate.release()
        done = wait_all_finished(client)
    assert [e["prompt"] for e in done] == ["first", "imported", "edited"]
    assert all(e["status"] == "done" for e in done)
    folders = [server.outputs / e["job_id"] for e in done]
    # ran in the queue's order, one after another: each final video written after the one before (a folder's name
    # has the second it was made in, and tiny jobs make several in one second)
    finals = [(f / "final.mp4").stat().st_mtime_ns for f in folders]
    assert finals == sorted(finals)
    assert job_info(folders[2])["settings"]["seconds"] == 2.4
    assert job_info(folders[1])["settings"]["seed"] == 4
    for e in done:
        client.predict(e["id"], api_name="/queue_remove")                      # finished ones can be cleared
    assert listing(client) == []


def test_two_clients_adding_at_once_keep_their_order(server, image, tiny_original, tmp_path):
    a, b = (server.client(tmp_path / name) for name in "ab")
    with Gate(tiny_original.vae.decoder) as gate:
        first = hold_first_job(server, a, image, tiny_original, gate)
        errors = []

        def add(client, name):
            try:
                for n in range(6):
                    client.predict(image=handle_file(str(image)), prompt=f"{name}{n}", **SHORT, api_name="/queue_add")
            except Exception as e:   # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=add, args=(c, name)) for c, name in ((a, "a"), (b, "b"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert not errors
        got = [e["prompt"] for e in waiting(a)]
        assert len(got) == 12
        for name in "ab":
            assert [p for p in got if p[0] == name] == [f"{name}{n}" for n in range(6)]
        for e in waiting(b):                                # End on each waiting job: gone at once
            b.predict(e["id"], api_name="/queue_remove")
        assert [e["id"] for e in listing(a)] == [first["id"]]
    wait_all_finished(a)
    a.predict(first["id"], api_name="/queue_remove")
    a.close()
    b.close()


def _readme_example() -> str:
    """The Python example of the README's section "The queue"."""
    from tests.conftest import ROOT

    readme = (ROOT / "README.md").read_text("utf-8")
    section = readme[readme.index("## The queue"):]
    return section[section.index("```python") + len("```python"):section.index("```", section.index("```python") + 3)]


def test_the_readmes_queue_example_runs_against_the_app(server, client, image, tiny_original, tmp_path, monkeypatch):
    """The README's gradio_client example, run as written (the address aside) while the app runs a job: every call
    answers, and the queue ends as the comments say."""
    import numpy as np

    from video.mp4 import write_mp4

    for name in ("start.png", "a.png", "b.png"):
        (tmp_path / name).write_bytes(image.read_bytes())
    write_mp4(np.zeros((40, 64, 96, 3), np.uint8), tmp_path / "clip.mp4")
    with Gate(tiny_original.vae.decoder) as gate:
        hold_first_job(server, client, image, tiny_original, gate)
        exported = qs.Path(client.predict(api_name="/queue_export"))     # an exported queue names its own copies
        (tmp_path / "waiting.jsonl").write_text(exported.read_text())   # the README imports what it exported
        monkeypatch.chdir(tmp_path)
        monkeypatch.setattr("gradio_client.Client", settled_client_class())     # less gradio_client's own race
        names: dict = {}
        exec(_readme_example().replace("http://127.0.0.1:7860/", server.url), names)      # noqa: S102
        jobs, after = names["jobs"], listing(client)
        assert [j["status"] for j in jobs] == ["running", "waiting", "waiting", "waiting"]
        moved, edited = jobs[-1]["id"], jobs[1]["id"]
        assert moved not in [e["id"] for e in after]                          # moved first, then removed
        assert next(e for e in after if e["id"] == edited)["seconds"] == 4
        assert [e["prompt"] for e in after[-2:]] == ["the sea", "first"]          # the extension, the import
        assert qs.Path(names["path"]).read_text().count("\n") == len(after)       # every unfinished job
        for e in after[1:]:
            client.predict(e["id"], api_name="/queue_remove")
    wait_all_finished(client)
