"""The queue on disk (jobs/store.py): order, reorder, remove, edit, export/import checked by the one pre-flight,
the runner's lease (a new holder puts an interrupted job first again), a damaged database, and adds from several
threads and processes."""
from __future__ import annotations

import argparse
import json
import sqlite3
import subprocess
import sys
import threading

import pytest

from common.errors import InputError
from configs.runtime import Config
from jobs import jsonl
from jobs import store as qs
from jobs.doors import LOCAL
from jobs.preflight import Preflight
from tests.conftest import make_image

ROOT = qs.Path(__file__).resolve().parents[1]


@pytest.fixture
def own_image(tmp_path):
    """A start image of this test's own, in a folder of its own, for the tests that delete it (a user's file may
    go) or write jobs files beside it (conftest's `image` is the module's, left as it is)."""
    path = tmp_path / "in" / "start.png"
    path.parent.mkdir()
    make_image(96, 80, seed=3).save(path)
    return path


@pytest.fixture
def store(tmp_path):
    s, found = qs.QueueStore.open(tmp_path / "out")
    assert found.warning is None
    yield s
    s.close()


def job(image, prompt="a cat", **kw):
    return {"image": str(image), "prompt": prompt, "seconds": 1.2, "steps": 2, **kw}


def prompts(store, statuses=None):
    return [e.settings["prompt"] for e in store.entries(statuses)]


def test_add_keeps_order_and_copies_the_images_under_outputs(store, own_image):
    a = store.add(job(own_image, "one"))
    store.add_many([job(own_image, "two"), job(own_image, "three")])
    assert prompts(store) == ["one", "two", "three"]
    staged = qs.Path(a.images["image"])
    assert staged.is_file() and staged.parent == store.images_root / a.id
    assert staged.read_bytes() == own_image.read_bytes()
    own_image.unlink()                                   # the user's file may go: the queue keeps its own copy
    assert staged.is_file() and a.status == qs.WAITING and a.settings["seconds"] == 1.2


PREFLIGHT = Preflight(Config(preset="tiny"))


def test_the_preflight_names_the_line_and_the_bad_field(image, tmp_path):
    for values, what in (({"image": str(image), "prompt": "x", "seconds": 999}, "seconds: 999 is out of range"),
                         ({"image": str(tmp_path / "missing.png"), "prompt": "x"}, "image: file not found"),
                         ({"image": str(image), "prompt": "x", "colour": 3}, "colour: unknown setting")):
        with pytest.raises(InputError) as e:
            jsonl.prepare_lines([(1, {"image": str(image), "seconds": 1.2}), (2, values)], PREFLIGHT)
        assert e.value.field == "line 2" and e.value.message.startswith(what), e.value.message


def test_a_preserved_memory_above_the_cap_is_refused_not_run(image):
    """Issue 33 item 6: the page's hint said "50 GB cannot work" and Start ran the job anyway."""
    from pipeline.request import Request

    on_gpu = Preflight(Config(preset="tiny", vram_cap_gb=20), device_type="cuda")
    with pytest.raises(InputError) as e:
        on_gpu.prepare(Request(image=str(image), prompt="x", seconds=1.2, preserved_gb=50))
    assert e.value.field == "preserved memory" and "at most 20 GB" in e.value.message
    assert on_gpu.prepare(Request(image=str(image), prompt="x", seconds=1.2, preserved_gb=6)).request.preserved_gb == 6


def test_move_reorders_only_the_waiting_jobs(store, image):
    ids = [e.id for e in store.add_many([job(image, p) for p in "abcd"])]
    assert store.claim(ids[0])                             # a: running, stays first
    store.move(ids[3], 0)
    assert prompts(store) == ["a", "d", "b", "c"]
    store.move(ids[1], 99)                                 # past the end: last
    assert prompts(store) == ["a", "d", "c", "b"]
    with pytest.raises(InputError, match="only a waiting job"):
        store.move(ids[0], 2)
    with pytest.raises(InputError, match="no job"):
        store.move("nope", 0)


def test_remove_a_waiting_job_at_once_but_not_a_running_one(store, image):
    a, b = store.add_many([job(image, "a"), job(image, "b")])
    assert store.take_lease("a live runner")             # (an entry running with no live runner is interrupted:
    store.claim(a.id)                                     # removable, tests/test_cli_interrupted.py)
    with pytest.raises(InputError, match="running"):
        store.remove(a.id)
    store.remove(b.id)
    assert prompts(store) == ["a"] and not (store.images_root / b.id).exists()
    store.update(a.id, status=qs.DONE, progress=1.0)
    assert store.clear_finished() == 1 and store.entries() == []


def test_edit_changes_a_waiting_job_only(store, image, tmp_path):
    a, b = store.add_many([job(image, "a"), job(image, "b")])
    other = tmp_path / "other.jpg"
    make_image(64, 64, seed=9).save(other)
    edited = store.edit(a.id, job(other, "a2", seconds=2.4))
    assert edited.settings["prompt"] == "a2" and edited.settings["seconds"] == 2.4
    assert qs.Path(edited.images["image"]).name == "start.jpg"
    assert sorted(f.name for f in (store.images_root / a.id).iterdir()) == ["start.jpg"]   # the old copy is gone
    store.claim(b.id)
    with pytest.raises(InputError, match="only a waiting job"):
        store.edit(b.id, job(image, "b2"))
    assert store.get(b.id).settings["prompt"] == "b"


def test_export_then_import_gives_the_same_jobs(store, image, tmp_path):
    store.add_many([job(image, "a", seed=5), job(image, "b", steps=3)])
    text = store.export_jsonl()
    lines = [json.loads(line) for line in text.splitlines()]
    assert [line["prompt"] for line in lines] == ["a", "b"] and lines[0]["seed"] == 5
    other, _ = qs.QueueStore.open(tmp_path / "elsewhere")
    added = other.add_many([values for _, values in jsonl.read_lines(text, door=LOCAL)])
    assert [e.settings for e in added] == [e.settings for e in store.entries()]
    assert all(qs.Path(e.images["image"]).parent.parent == other.images_root for e in added)
    other.close()


def test_an_export_into_another_folder_can_be_read_back_from_there(image, tmp_path, monkeypatch):
    """Issue 33 item 12: a queue under a relative outputs folder exported its images' paths relative to the current
    folder, which `batch` then read relative to the file's folder: export to sub/w.jsonl, then batch it, failed."""
    monkeypatch.chdir(tmp_path)
    relative, _ = qs.QueueStore.open(qs.Path("outputs") / ".queue")
    relative.add_many([job(image, "a")])
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "w.jsonl").write_text(relative.export_jsonl())
    relative.close()
    monkeypatch.chdir(tmp_path / "sub")
    (_, values), = jsonl.read_lines((tmp_path / "sub" / "w.jsonl").read_text(), door=LOCAL)
    assert (qs.Path.cwd() / values["image"]).is_file()          # the file's folder is where batch resolves it


def test_import_refuses_the_whole_file_and_names_the_line(store, own_image):
    good = json.dumps({"image": str(own_image), "prompt": "ok"})
    for text, where, what in ((good + "\n{not json\n", "line 2", "not JSON"),
                              (good + "\n[1, 2]\n", "line 2", "JSON object"),
                              ("# comment\n\n" + json.dumps({"image": str(own_image), "prompt": "x", "steps": 0}),
                               "line 3", "steps"),
                              ("\n# nothing\n", "jobs file", "no job")):
        with pytest.raises(InputError) as e:
            jsonl.prepare_lines(jsonl.read_lines(text, door=LOCAL), PREFLIGHT)
        assert e.value.field == where and what in e.value.message
    assert store.entries() == []
    rel = own_image.parent / "jobs.jsonl"
    rel.write_text(json.dumps({"image": own_image.name, "prompt": "relative"}) + "\n")
    (prepared,) = jsonl.prepare_lines(jsonl.read_lines(rel.read_text(), door=LOCAL), PREFLIGHT, base=rel.parent)
    assert qs.Path(prepared.request.image) == own_image


def test_the_next_runner_puts_the_interrupted_job_first_again(tmp_path, image):
    s, _ = qs.QueueStore.open(tmp_path / "out")
    assert s.take_lease("first") and s.runner_alive()
    a, b, c = s.add_many([job(image, p) for p in "abc"])
    s.claim(a.id)
    s.update(a.id, job_dir="20250101-000000-abcdef", progress=0.5)
    assert not s.take_lease("second")                      # the first runner (this live process) holds it
    s.release_lease("first")                               # as a process that ended leaves it
    s.close()
    again, _ = qs.QueueStore.open(tmp_path / "out")
    assert again.get(a.id).status == qs.RUNNING            # opening changes nothing ...
    assert again.take_lease("second")                      # ... the next runner puts it first in line again
    first = again.next_waiting()
    assert first.id == a.id and first.job_dir == "20250101-000000-abcdef" and "interrupted" in first.message
    assert prompts(again, [qs.WAITING]) == ["a", "b", "c"]
    again.close()


@pytest.mark.parametrize("damage", ["garbage", "truncated", "newer"])
def test_a_damaged_database_is_moved_aside_with_a_warning(tmp_path, image, damage, caplog):
    out = tmp_path / "out"
    s, _ = qs.QueueStore.open(out)
    s.add(job(image))
    s.close()
    db = s.path
    if damage == "garbage":
        db.write_bytes(b"this is not a database" * 100)
    elif damage == "truncated":
        db.write_bytes(db.read_bytes()[:1500])
        for suffix in ("-wal", "-shm"):
            qs.Path(str(db) + suffix).unlink(missing_ok=True)
    else:
        with sqlite3.connect(db) as c:
            c.execute("UPDATE meta SET value = '99' WHERE key = 'schema'")
    before = db.read_bytes()
    with caplog.at_level("WARNING"):
        s, found = qs.QueueStore.open(out)
    assert found.warning and "moved to" in found.warning and found.warning in caplog.text
    aside = sorted(db.parent.glob(qs.DB_NAME + ".damaged-*"))
    assert aside and aside[0].read_bytes()[:100] == before[:100]
    assert prompts(s) == ["a cat"]                 # the waiting job recovered (issue 47: it was dropped)
    s.add(job(image, "new"))                       # the new queue works
    assert prompts(s) == ["a cat", "new"]
    s.close()


def test_adds_from_threads_keep_each_clients_order(store, image):
    def client(name):
        for n in range(10):
            store.add(job(image, f"{name}{n}"))

    threads = [threading.Thread(target=client, args=(name,)) for name in "xy"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = prompts(store)
    assert len(got) == 20 and len({e.position for e in store.entries()}) == 20
    for name in "xy":
        assert [p for p in got if p[0] == name] == [f"{name}{n}" for n in range(10)]


def test_another_process_sees_the_same_queue(store, image):
    store.add(job(image, "here"))
    code = ("import sys; from jobs import store as qs; s, _ = qs.QueueStore.open(qs.Path(sys.argv[1])); "
            "s.add({'image': sys.argv[2], 'prompt': 'there'}); "
            "print(len(s.entries()))")
    out = subprocess.run([sys.executable, "-c", code, str(store.outputs), str(image)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "2" and prompts(store) == ["here", "there"]


def test_the_command_line_adds_lists_moves_exports_and_removes(tmp_path, own_image, capsys):
    from cli import queue as cli

    out = tmp_path / "out"
    jobs = own_image.parent / "jobs.jsonl"
    jobs.write_text("".join(json.dumps({"image": own_image.name, "prompt": p, "seconds": 1.2}) + "\n" for p in "abc"))
    assert cli.main(["add", str(jobs), "--outputs", str(out), "--preset", "tiny"]) == 0
    ids = [line.split()[1].rstrip(":") for line in capsys.readouterr().out.splitlines()]
    assert len(ids) == 3
    assert cli.main(["move", ids[2], "0", "--outputs", str(out)]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == [ids[2], ids[0], ids[1]]
    assert cli.main(["remove", ids[0], "--outputs", str(out)]) == 0
    assert cli.main(["list", "--json", "--outputs", str(out)]) == 0
    listed = [json.loads(line) for line in capsys.readouterr().out.splitlines()[1:]]
    assert [e["prompt"] for e in listed] == ["c", "b"] and all(e["status"] == "waiting" for e in listed)
    exported = tmp_path / "q.jsonl"
    assert cli.main(["export", str(exported), "--outputs", str(out)]) == 0
    assert [json.loads(line)["prompt"] for line in exported.read_text().splitlines()] == ["c", "b"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"image": own_image.name, "prompt": "x"}) + "\n")  # relative to bad.jsonl: missing
    assert cli.main(["add", str(bad), "--outputs", str(out)]) == 2
    err = capsys.readouterr().err
    assert "line 1" in err and "image" in err
    assert cli.main(["remove", "nope", "--outputs", str(out)]) == 2
    assert "queued job" in capsys.readouterr().err


def test_python_m_pipeline_queue_runs(tmp_path):
    out = subprocess.run([sys.executable, "-m", "cli", "queue", "list", "--outputs", str(tmp_path / "o")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout == "", out.stderr
    assert not qs.QueueStore(tmp_path / "o").path.exists()       # a reader writes nothing (issue 47)
    help_text = subprocess.run([sys.executable, "-m", "cli", "-h"], cwd=ROOT, capture_output=True, text=True,
                               timeout=120).stdout
    assert "queue" in help_text


@pytest.mark.parametrize("version", ["1", "2"])
def test_a_queue_of_an_older_version_is_brought_up_to_date(tmp_path, image, version):
    """Schema 1 (no owners) and 2 (no clients): a reader reads it as it is; opened by this version, its entries keep
    everything and have no owner (1) and no client (1, 2)."""
    import sqlite3

    store, _ = qs.QueueStore.open(tmp_path)
    entry = store.add({"image": str(image), "prompt": "old"}, owner="ann" if version == "2" else None)
    store.close()
    db = sqlite3.connect(qs.QueueStore(tmp_path).path)
    older = "ALTER TABLE entries DROP COLUMN owner; ALTER TABLE entries DROP COLUMN origin; " if version == "1" else ""
    db.executescript(f"{older}ALTER TABLE entries DROP COLUMN client; "
                     f"UPDATE meta SET value = '{version}' WHERE key = 'schema';")
    db.close()
    (read,), warning = qs.QueueStore.read(tmp_path)
    assert warning is None and read.id == entry.id and read.client is None
    store, found = qs.QueueStore.open(tmp_path)
    try:
        (kept,) = store.entries()
        assert found.warning is None and kept.id == entry.id and kept.settings["prompt"] == "old"
        assert kept.owner == ("ann" if version == "2" else None) and kept.client is None
        added = store.add({"image": str(image)}, owner="bob", client="login bob")
        assert (added.owner, added.client) == ("bob", "login bob")
    finally:
        store.close()


def test_queue_add_and_start_are_checked_by_the_same_pre_flight(tmp_path, own_image, capsys, monkeypatch, tiny_original):
    """`queue add` builds the app's pre-flight (jobs/preflight.py preflight_for) from the same options: on a GPU
    it refuses the preserved memory Start refuses, with the same words, and it checks LoRAs in --lora-dir."""
    import torch

    import app
    import memory.manager
    from cli import queue as cli
    from configs.options import add_process_options, config_from
    from pipeline.request import Request
    from tests.lora_helpers import write_comfy

    loras = tmp_path / "loras"
    loras.mkdir()
    write_comfy(tiny_original.transformer, loras / "style.safetensors")
    monkeypatch.setattr(memory.manager, "default_device", lambda: torch.device("cuda"))    # as on a GPU machine
    options = ["--preset", "tiny", "--outputs", str(tmp_path / "out"), "--vram-cap-gb", "8", "--lora-dir", str(loras)]
    parser = argparse.ArgumentParser()
    add_process_options(parser)
    runner, _ = app.app_runner(config_from(parser, parser.parse_args(options)), torch.device("cuda"))
    too_much = dict(prompt="x", seconds=1.2, preserved_gb=10)
    with pytest.raises(InputError) as start:
        runner.submit(Request(image=str(own_image), **too_much), waited_on=True)  # Start
    jobs = own_image.parent / "jobs.jsonl"
    jobs.write_text(json.dumps({"image": own_image.name, **too_much}) + "\n")
    assert cli.main(["add", str(jobs), *options]) == 2
    said = capsys.readouterr().err
    assert start.value.field == "preserved memory" and start.value.message in said, said
    for name, code in (("style.safetensors", 0), ("missing.safetensors", 2)):
        jobs.write_text(json.dumps({"image": own_image.name, "prompt": "x", "seconds": 1.2, "loras": f"{name}:1"}) + "\n")
        assert cli.main(["add", str(jobs), *options]) == code
        assert (code == 0) == ("not in the LoRA folder" not in capsys.readouterr().err)
    assert [e.settings["loras"] for e in runner.store.entries()] == ["style.safetensors:1"]
    runner.store.close()


def test_a_batch_and_the_queue_import_read_a_jobs_file_with_the_one_reader(own_image):
    """jobs/jsonl.py job_lines reads every jobs file: the queue's import refuses the file at its first bad line, a
    batch skips that line; both say the same thing about it."""
    from cli.commands import read_batch
    from jobs.doors import LOCAL
    from pipeline.request import prepare

    path = own_image.parent / "jobs.jsonl"
    good = json.dumps({"image": own_image.name, "prompt": "x", "seconds": 1.2})
    path.write_text(f"{good}\n{{not json\n# a comment\n[1, 2]\n{good}\n")
    with pytest.raises(InputError) as refused:
        jsonl.read_lines(path.read_text(), door=LOCAL)
    jobs, invalid = read_batch(path, lambda request: prepare(request, 640))
    assert [number for number, _ in jobs] == [1, 5]
    assert invalid[0] == (2, "invalid", refused.value.message) and refused.value.field == "line 2"
    assert invalid[1][0] == 4 and invalid[1][2] == "each line must be a JSON object with a job's settings"
